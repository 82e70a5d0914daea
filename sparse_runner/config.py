"""The typed schema of a run and its validation.

Hydra composes YAML; this module checks the result against dataclasses (types, unknown keys) and
then against the rules the types cannot express (positive sizes, head geometry, known normalisers,
existing paths). Every problem becomes a `ConfigError` whose message is ONE line naming the key,
what is wrong and the valid choices; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Optional, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sparse_runner.checks import ConfigError, choice, fail, in_unit_interval, positive
from sparse_runner.models.config import ModelConfig, block_pattern_names, check_attention_layers, check_model_config, check_model_keys
from sparse_runner.identity import CONF_DIR, register_resolvers
from sparse_runner.run_metrics import lower_is_better
from sparse_runner.tasks import Task, task_families
from sparse_runner.training.regularisers import check_regulariser_config
from sparse_runner.training.trainer import COMPILE_MODES, PRECISIONS



register_resolvers()  # conf/hydra/default.yaml reads them; registered wherever configs are composed


# ----------------------------------------------------------------------------------------- schema
# Types only: every default is written once, in conf/ (conf/trainer/default.yaml, conf/config.yaml ...), and
# `identity.default_values` reads them from the composed default config.
@dataclass
class TrainerConfig:
    device: str
    precision: str
    activation_checkpointing: bool
    compile: Any  # false, true or a mode (training.trainer.COMPILE_MODES)
    num_threads: Optional[int]
    cpu_block_cache_mb: int
    deterministic: bool
    max_steps: int
    batch_size: int
    batch_tokens: Optional[int]
    accumulate: int
    bucket_size: int
    lr: float
    weight_decay: float
    alpha_lr_scale: float
    betas: list[float]
    schedule: str
    warmup_steps: int
    min_lr_ratio: float
    clip_grad_norm: Optional[float]
    label_smoothing: float
    eval_every: int
    eval_max_batches: Optional[int]
    analysis_max_batches: Optional[int]
    monitor: str
    monitor_mode: str
    patience: Optional[int]
    analysis: bool
    log_every: int
    progress: str
    progress_every_s: Optional[float]
    resume: bool
    test_topology_shift: Any  # 0 (off), a shift N or a list of shifts (_check_test_shifts); Any: OmegaConf has no int | list[int]


@dataclass
class PathsConfig:
    output_dir: str
    cache_dir: str


@dataclass
class PretrainConfig:
    """A pre-training stage run before this run (conf/pretrain/): same model, its own task and trainer.

    With a task, the run first trains (or finds finished) the pre-training run of this model, then
    starts from its encoder, as `model.init_from` would (run.py `pretrain_stage`). Without one (pretrain=none)
    both are null."""

    task: Any  # a pre-training task node (family mlm)
    trainer: Optional[TrainerConfig]


@dataclass
class RunConfig:
    model: ModelConfig
    task: Any  # checked against the schema its task.family registered (tasks/registry.py)
    trainer: TrainerConfig
    paths: PathsConfig
    pretrain: PretrainConfig
    seed: int


# numpy's generator takes seeds in [0, 2**32): one range for every library the run seeds.
SEED_RANGE = (0, 2**32 - 1)


SCHEDULES = ("constant", "linear", "inverse_sqrt", "cosine")
PROGRESS = ("auto", "true", "false")
MONITOR_MODES = ("auto", "min", "max")


# ------------------------------------------------------------------------------------- validation
def validate(cfg: DictConfig) -> DictConfig:
    """Check a composed config (without its `hydra` node); return it typed and read-only.

    Raises ConfigError (one line) on the first problem found.
    """
    plain = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"]) if "hydra" in cfg else cfg
    try:
        container = OmegaConf.to_container(plain, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(describe_omegaconf_error(exc)) from None
    families = task_families()
    family = (container.get("task") or {}).get("family")
    if family not in families:
        raise ConfigError(f"task.family: unknown task family {family!r}; valid: {', '.join(sorted(families))}")
    task_class = families[family]
    try:
        typed = OmegaConf.merge(OmegaConf.structured(RunConfig), {"task": OmegaConf.structured(task_class.config_class)})
        typed = OmegaConf.merge(typed, container)
    except OmegaConfBaseException as exc:
        raise ConfigError(describe_omegaconf_error(exc, family)) from None
    _check_values(typed, task_class)
    _resolve_monitor(typed, task_class)
    _check_pretrain(typed)
    OmegaConf.set_readonly(typed, True)
    return typed


PRETRAIN_FAMILIES = ("mlm",)


def pretrain_config(cfg: DictConfig) -> DictConfig:
    """The run config of `cfg`'s pre-training stage: the same model (without init_from), paths and seed,
    with the stage's task and trainer. Untyped; `validate` it."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    model = {**plain["model"], "init_from": None}
    no_stage = {"task": None, "trainer": None}  # a stage has no stage of its own (conf/pretrain/none.yaml)
    return OmegaConf.create({"model": model, "task": plain["pretrain"]["task"], "trainer": plain["pretrain"]["trainer"], "paths": plain["paths"],
                             "pretrain": no_stage, "seed": plain["seed"]})


def _check_pretrain(cfg: DictConfig) -> None:
    """A pre-training stage must be a valid run of a pre-training family, and excludes model.init_from."""
    if cfg.pretrain.task is None:
        return
    family = cfg.pretrain.task.get("family") if hasattr(cfg.pretrain.task, "get") else None
    if family not in PRETRAIN_FAMILIES:
        fail("pretrain.task.family", f"{family!r} is not a pre-training task", ", ".join(PRETRAIN_FAMILIES))
    if cfg.model.init_from is not None:
        fail("model.init_from", f"is set ({cfg.model.init_from}) and so is a pretrain stage: start from one or the other", "pretrain=none, or model.init_from=null")
    try:
        validate(pretrain_config(cfg))
    except ConfigError as exc:  # name the key as the user writes it
        message = str(exc)
        for node in ("task.", "trainer."):
            if message.startswith(node):
                message = "pretrain." + message
        raise ConfigError(message) from None


def monitor_choices(task_class: type[Task]) -> tuple[str, ...]:
    """What trainer.monitor may select for a task family: its validation metrics."""
    return tuple(f"val/{name}" for name in task_class.val_metrics)


def _check_values(cfg: DictConfig, task_class: type[Task]) -> None:
    m, t, tr = cfg.model, cfg.task, cfg.trainer
    if not SEED_RANGE[0] <= cfg.seed <= SEED_RANGE[1]:
        fail("seed", f"must be an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {cfg.seed}")
    check_model_config(m)
    check_regulariser_config(m)
    check_model_keys(m, task_class.model_keys, f"task family {task_class.family!r}")
    check_attention_layers(m, task_class.model_keys)
    positive("task.max_length", t.max_length)
    task_class.check_config(t)

    positive("trainer.batch_tokens", tr.batch_tokens, allow_none=True)
    for key in ("max_steps", "batch_size", "accumulate", "bucket_size", "eval_every", "log_every"):
        positive(f"trainer.{key}", tr[key])
    positive("trainer.warmup_steps", tr.warmup_steps, allow_zero=True)
    positive("trainer.num_threads", tr.num_threads, allow_none=True)
    positive("trainer.cpu_block_cache_mb", tr.cpu_block_cache_mb, allow_zero=True)
    positive("trainer.eval_max_batches", tr.eval_max_batches, allow_none=True)
    positive("trainer.analysis_max_batches", tr.analysis_max_batches, allow_none=True)
    positive("trainer.patience", tr.patience, allow_none=True)
    positive("trainer.clip_grad_norm", tr.clip_grad_norm, allow_none=True)
    positive("trainer.lr", tr.lr)
    positive("trainer.weight_decay", tr.weight_decay, allow_zero=True)
    positive("trainer.alpha_lr_scale", tr.alpha_lr_scale, allow_zero=True)
    in_unit_interval("trainer.min_lr_ratio", tr.min_lr_ratio, closed=True)
    in_unit_interval("trainer.label_smoothing", tr.label_smoothing)
    if len(tr.betas) != 2 or not all(0.0 <= b < 1.0 for b in tr.betas):
        fail("trainer.betas", f"must be two numbers in [0, 1), got {list(tr.betas)}")
    choice("trainer.precision", tr.precision, PRECISIONS)
    if not isinstance(tr.compile, bool) and tr.compile not in COMPILE_MODES:
        fail("trainer.compile", f"unknown value {tr.compile!r}", ", ".join(("false", "true") + COMPILE_MODES))
    choice("trainer.schedule", tr.schedule, SCHEDULES)
    choice("trainer.monitor", tr.monitor, ("auto",) + monitor_choices(task_class))
    _check_test_shifts(tr, m)
    positive("trainer.progress_every_s", tr.progress_every_s, allow_none=True, allow_zero=True)
    choice("trainer.monitor_mode", tr.monitor_mode, MONITOR_MODES)
    choice("trainer.progress", str(tr.progress).lower(), PROGRESS)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", tr.device):
        fail("trainer.device", f"unknown device {tr.device!r}", "auto, cpu, cuda, cuda:N")


def _check_test_shifts(tr: DictConfig, m: DictConfig) -> None:
    """`trainer.test_topology_shift`: 0 (off) or one shift N > 0, checked as they always were, or a list of
    distinct shifts, each below the pattern's block size (a whole block moves every boundary onto the next)."""
    key, value = "trainer.test_topology_shift", tr.test_topology_shift
    value = OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
    shifts = value if isinstance(value, list) else [value]
    if not shifts or not all(isinstance(shift, int) and not isinstance(shift, bool) for shift in shifts):
        fail(key, f"must be an int or a non-empty list of ints, got {value!r}", "0 (off), a shift N > 0, or a list of shifts like [1,2,3]")
    if not isinstance(value, list):
        positive(key, value, allow_zero=True)
    if value and m.pattern not in block_pattern_names():
        fail(key, f"pattern {m.pattern!r} has no block boundaries to shift", f"0, or a block pattern ({', '.join(block_pattern_names())})")
    if isinstance(value, list):
        from sparse_runner.attention import PATTERNS

        block_size = getattr(PATTERNS[m.pattern].Options(**(m.pattern_options or {})), "block_size", None)
        valid = "distinct ints in 1 .. block_size - 1" + (f" = {block_size - 1}" if block_size else "")
        for shift in value:
            if shift < 1 or (block_size is not None and shift >= block_size):
                fail(key, f"shift {shift} is out of range", valid)
        if len(set(value)) < len(value):
            fail(key, f"{value} repeats a shift", valid)


def _resolve_monitor(cfg: DictConfig, task_class: type[Task]) -> None:
    """`auto` -> the task family's main validation metric; mode `auto` -> min for losses, else max."""
    tr = cfg.trainer
    if tr.monitor == "auto":
        tr.monitor = monitor_choices(task_class)[0]
    if tr.monitor_mode == "auto":
        tr.monitor_mode = "min" if lower_is_better(tr.monitor) else "max"


# ------------------------------------------------------------------------------- error messages
# Keys the schema does not have, and the key that holds each setting (the regulariser and the normaliser are
# axes whose own options are checked by the registered class, as a pattern's are).
RENAMED_KEYS = {
    "model.sar": "regulariser=sar, with model.regulariser_options.weight / shift / random_shift",
    "trainer.regulariser": "regulariser=NAME (model.regulariser)",
    "trainer.regulariser_weight": "model.regulariser_options.weight",
    "trainer.rdrop_task_loss": "model.regulariser_options.task_loss (regulariser=rdrop)",
    "model.alpha": "model.normaliser_options.alpha (normaliser=alpha_entmax)",
    "model.alpha_init": "model.normaliser_options.alpha_init (normaliser=alpha_entmax)",
}


def renamed_key(full_key: str) -> str | None:
    """The key (or group choice) that holds the setting `full_key` names when it is one of RENAMED_KEYS (a
    pre-training stage's `pretrain.trainer.*` as the run's own), else None."""
    key = full_key.removeprefix("pretrain.")
    for old, new in RENAMED_KEYS.items():
        if key == old or key.startswith(old + "."):
            return new
    return None


def describe_omegaconf_error(exc: OmegaConfBaseException, family: str | None = None) -> str:
    """One line from an OmegaConf error: the full key, the problem, and the valid keys if relevant."""
    full_key = getattr(exc, "full_key", None) or ""
    msg = str(exc).split("\n")[0].strip()
    missing = re.match(r"Key '([^']+)' (?:not in|is not in struct)", msg)
    if missing and renamed_key(full_key):
        return f"{full_key}: not a key; the setting is {renamed_key(full_key)}"
    for options in ("pattern_options", "normaliser_options", "regulariser_options"):
        if missing and full_key.startswith(f"model.{options}."):
            # A preset sets only some options: another one is a new key, which Hydra only adds with '+'
            # ('++' adds or overrides, so it also works across a sweep of presets).
            owner = options.split("_")[0]
            return f"{full_key}: a {owner} option the preset does not set is a new key; add it with '++{full_key}=VALUE' (the {owner} checks it)"
    if missing:
        return f"{full_key or missing.group(1)}: unknown key; valid keys: {', '.join(valid_keys(full_key, family))}"
    conversion = re.match(r"Value '(.*?)' (?:of type '(\w+)' )?could not be converted to (\w+)", msg)
    if conversion:
        return f"{full_key}: {conversion.group(1)!r} is not a valid {conversion.group(3).lower()}"
    if "Missing mandatory value" in msg:
        return f"{full_key}: a value is required"
    return f"{full_key}: {msg}" if full_key else msg


def valid_keys(full_key: str, family: str | None = None) -> list[str]:
    """Keys allowed next to `full_key` (e.g. 'model.foo' -> fields of ModelConfig; 'task.foo' -> fields
    of the task family's schema, ListOps when the family is unknown)."""
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node: Any = RunConfig
    for part in filter(None, parent.split(".")):
        if part == "task":
            node = task_families().get(family or "", task_families()["listops"]).config_class
            continue
        hint = _dataclass_in(get_type_hints(node).get(part)) if hasattr(node, "__dataclass_fields__") else None
        if hint is None:
            return []
        node = hint
    return [f.name for f in fields(node)] if hasattr(node, "__dataclass_fields__") else []


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field's type names (`TrainerConfig`, `Optional[TrainerConfig]`), else None."""
    for candidate in (hint, *getattr(hint, "__args__", ())):
        if hasattr(candidate, "__dataclass_fields__"):
            return candidate
    return None


def group_options(group: str) -> list[str]:
    """The options of a config group, i.e. the YAML files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
