"""The typed schema of a run and its validation.

Hydra composes YAML; this module checks the result against dataclasses (types, unknown keys) and
then against the rules the types cannot express (positive sizes, head geometry, known normalisers,
existing paths). Every problem becomes a `ConfigError` whose message is ONE line naming the key,
what is wrong and the valid choices; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sparse_runner.checks import ConfigError, choice as _choice, fail as _fail, positive as _positive
from sparse_runner.models.config import ModelConfig, check_model_config

CONF_DIR = Path(__file__).resolve().parent / "conf"


# ----------------------------------------------------------------------------------------- schema
@dataclass
class ListOpsGeneratorConfig:
    num_train: int = 20000
    num_val: int = 1000
    num_test: int = 1000
    min_length: int = 10
    max_length: int = 100
    max_depth: int = 10
    max_args: int = 10
    seed: int = 0


@dataclass
class ListOpsTaskConfig:
    name: str = "listops"
    family: str = "listops"
    data_dir: Optional[str] = None
    max_length: int = 100
    generator: ListOpsGeneratorConfig = field(default_factory=ListOpsGeneratorConfig)


@dataclass
class DecodingConfig:
    beam_size: int = 4
    length_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: int = 10


@dataclass
class TranslationTaskConfig:
    name: str = "bible_es_en"
    family: str = "translation"
    source: str = "embedded"
    src_lang: str = "es"
    tgt_lang: str = "en"
    data_dir: Optional[str] = None
    file_format: str = "auto"
    hf_path: Optional[str] = None
    hf_name: Optional[str] = None
    hf_revision: Optional[str] = None
    hf_data_dir: Optional[str] = None
    hf_splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "val": "validation", "test": "test"})
    vocab_size: int = 8000
    character_coverage: float = 1.0
    max_length: int = 128
    max_train_pairs: Optional[int] = None
    max_eval_pairs: Optional[int] = None
    val_beam_size: int = 1
    decoding: DecodingConfig = field(default_factory=DecodingConfig)


# task.family -> schema of the task node; each task family adds its entry here.
TASK_SCHEMAS: dict[str, type] = {"listops": ListOpsTaskConfig, "translation": TranslationTaskConfig}
# task.family -> the metrics trainer.monitor may select; the first is what `auto` picks.
MONITORS: dict[str, tuple[str, ...]] = {
    "listops": ("val/accuracy", "val/loss"),
    "translation": ("val/bleu", "val/sacrebleu", "val/chrf", "val/loss", "val/ppl"),
}
TRANSLATION_SOURCES = ("embedded", "files", "hf")
FILE_FORMATS = ("auto", "aligned", "tsv", "jsonl")


@dataclass
class TrainerConfig:
    device: str = "auto"
    precision: str = "fp32"
    compile: bool = False
    num_threads: Optional[int] = None
    deterministic: bool = True
    max_steps: int = 1000
    batch_size: int = 32
    batch_tokens: Optional[int] = None
    accumulate: int = 1
    bucket_size: int = 50
    lr: float = 1e-3
    weight_decay: float = 0.01
    alpha_lr_scale: float = 1.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    schedule: str = "linear"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.0
    clip_grad_norm: Optional[float] = 1.0
    label_smoothing: float = 0.0
    eval_every: int = 200
    eval_max_batches: Optional[int] = None
    monitor: str = "auto"
    monitor_mode: str = "auto"
    patience: Optional[int] = None
    analysis: bool = True
    log_every: int = 20
    progress: str = "auto"
    resume: bool = True


@dataclass
class PathsConfig:
    output_dir: str = "outputs"
    cache_dir: str = "~/.cache/sparse_runner"


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: Any = None  # checked against TASK_SCHEMAS[task.family]
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = 0


PRECISIONS = ("fp32", "bf16", "fp16")
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
    family = (container.get("task") or {}).get("family")
    if family not in TASK_SCHEMAS:
        raise ConfigError(f"task.family: unknown task family {family!r}; valid: {', '.join(sorted(TASK_SCHEMAS))}")
    try:
        typed = OmegaConf.merge(OmegaConf.structured(RunConfig), {"task": OmegaConf.structured(TASK_SCHEMAS[family])})
        typed = OmegaConf.merge(typed, container)
    except OmegaConfBaseException as exc:
        raise ConfigError(describe_omegaconf_error(exc, family)) from None
    _check_values(typed)
    _resolve_monitor(typed)
    OmegaConf.set_readonly(typed, True)
    return typed


def _check_values(cfg: DictConfig) -> None:
    m, t, tr = cfg.model, cfg.task, cfg.trainer
    check_model_config(m)

    _positive("task.max_length", t.max_length)
    if t.family == "listops":
        _check_listops(t)
    if t.family == "translation":
        _check_translation(t)

    _positive("trainer.batch_tokens", tr.batch_tokens, allow_none=True)
    for key in ("max_steps", "batch_size", "accumulate", "bucket_size", "eval_every", "log_every"):
        _positive(f"trainer.{key}", tr[key])
    _positive("trainer.warmup_steps", tr.warmup_steps, allow_zero=True)
    _positive("trainer.num_threads", tr.num_threads, allow_none=True)
    _positive("trainer.eval_max_batches", tr.eval_max_batches, allow_none=True)
    _positive("trainer.patience", tr.patience, allow_none=True)
    _positive("trainer.clip_grad_norm", tr.clip_grad_norm, allow_none=True)
    _positive("trainer.lr", tr.lr)
    _positive("trainer.weight_decay", tr.weight_decay, allow_zero=True)
    _positive("trainer.alpha_lr_scale", tr.alpha_lr_scale, allow_zero=True)
    if not 0.0 <= tr.min_lr_ratio <= 1.0:
        _fail("trainer.min_lr_ratio", f"must be in [0, 1], got {tr.min_lr_ratio}")
    if not 0.0 <= tr.label_smoothing < 1.0:
        _fail("trainer.label_smoothing", f"must be in [0, 1), got {tr.label_smoothing}")
    if len(tr.betas) != 2 or not all(0.0 <= b < 1.0 for b in tr.betas):
        _fail("trainer.betas", f"must be two numbers in [0, 1), got {list(tr.betas)}")
    _choice("trainer.precision", tr.precision, PRECISIONS)
    _choice("trainer.schedule", tr.schedule, SCHEDULES)
    _choice("trainer.monitor", tr.monitor, ("auto",) + MONITORS[t.family])
    _choice("trainer.monitor_mode", tr.monitor_mode, MONITOR_MODES)
    _choice("trainer.progress", str(tr.progress).lower(), PROGRESS)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", tr.device):
        _fail("trainer.device", f"unknown device {tr.device!r}", "auto, cpu, cuda, cuda:N")


def _resolve_monitor(cfg: DictConfig) -> None:
    """`auto` -> the task family's main validation metric; mode `auto` -> min for losses, else max."""
    tr = cfg.trainer
    if tr.monitor == "auto":
        tr.monitor = MONITORS[cfg.task.family][0]
    if tr.monitor_mode == "auto":
        tr.monitor_mode = "min" if tr.monitor.endswith(("loss", "ppl")) else "max"


def _check_translation(t: DictConfig) -> None:
    _choice("task.source", t.source, TRANSLATION_SOURCES)
    _choice("task.file_format", t.file_format, FILE_FORMATS)
    if t.source == "files":
        if t.data_dir is None:
            _fail(
                "task.data_dir",
                f"task {t.name} reads local files (task.source=files) and needs a folder (conf/task/{t.name}.yaml says where to get them)",
                "a folder with {train,valid,test}.{src,tgt} files, {split}.tsv or {split}.jsonl",
            )
        if not Path(os.path.expanduser(t.data_dir)).is_dir():
            _fail("task.data_dir", f"{t.data_dir} is not a directory", "a folder with {train,valid,test}.{src,tgt} files, {split}.tsv or {split}.jsonl")
    if t.source == "hf" and not t.hf_path:
        _fail("task.hf_path", "task.source=hf needs a dataset id", "a Hugging Face dataset id such as IWSLT/iwslt2017")
    for key in ("vocab_size", "val_beam_size"):
        _positive(f"task.{key}", t[key])
    if t.vocab_size < 8:
        _fail("task.vocab_size", f"must be at least 8 (4 special ids + pieces), got {t.vocab_size}")
    if not 0.0 < t.character_coverage <= 1.0:
        _fail("task.character_coverage", f"must be in (0, 1], got {t.character_coverage}")
    if t.max_length < 4:
        _fail("task.max_length", f"must be at least 4 subword tokens, got {t.max_length}")
    _positive("task.max_train_pairs", t.max_train_pairs, allow_none=True)
    _positive("task.max_eval_pairs", t.max_eval_pairs, allow_none=True)
    d = t.decoding
    _positive("task.decoding.beam_size", d.beam_size)
    _positive("task.decoding.max_len_a", d.max_len_a, allow_zero=True)
    _positive("task.decoding.max_len_b", d.max_len_b, allow_zero=True)
    if d.max_len_a == 0 and d.max_len_b == 0:
        _fail("task.decoding.max_len_b", "max_len_a and max_len_b are both 0: no output could be produced")


def _check_listops(t: DictConfig) -> None:
    if t.data_dir is not None:
        path = Path(os.path.expanduser(t.data_dir))
        if not path.is_dir():
            _fail("task.data_dir", f"{t.data_dir} is not a directory", "a folder with basic_{train,val,test}.tsv, or null to generate")
        missing = [f"basic_{s}.tsv" for s in ("train", "val", "test") if not (path / f"basic_{s}.tsv").is_file()]
        if missing:
            _fail("task.data_dir", f"{t.data_dir} lacks {', '.join(missing)}", "a folder with basic_{train,val,test}.tsv, or null to generate")
        return
    g = t.generator
    for key in ("num_train", "num_val", "num_test", "max_length", "max_depth"):
        _positive(f"task.generator.{key}", g[key])
    _positive("task.generator.min_length", g.min_length, allow_zero=True)
    if g.max_args < 3:
        _fail("task.generator.max_args", f"must be >= 3 (children are drawn from 2..max_args-1), got {g.max_args}")
    if g.max_length - g.min_length < 2:
        _fail("task.generator.max_length", f"must exceed min_length + 1 (lengths are strict bounds), got {g.min_length}..{g.max_length}")


# ------------------------------------------------------------------------------- error messages
def describe_omegaconf_error(exc: OmegaConfBaseException, family: str | None = None) -> str:
    """One line from an OmegaConf error: the full key, the problem, and the valid keys if relevant."""
    full_key = getattr(exc, "full_key", None) or ""
    msg = str(exc).split("\n")[0].strip()
    missing = re.match(r"Key '([^']+)' (?:not in|is not in struct)", msg)
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
            node = TASK_SCHEMAS.get(family or "", ListOpsTaskConfig)
            continue
        hint = {f.name: f for f in fields(node)}.get(part) if hasattr(node, "__dataclass_fields__") else None
        if hint is None or not hasattr(hint.default_factory, "__dataclass_fields__"):
            return []
        node = hint.default_factory
    return [f.name for f in fields(node)] if hasattr(node, "__dataclass_fields__") else []


def group_options(group: str) -> list[str]:
    """The options of a config group, i.e. the YAML files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
