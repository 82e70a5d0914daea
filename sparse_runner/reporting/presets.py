"""Which paper preset a run is: the config a cell's fill command composes, compared key by key with the run's.

A paper cell says how to fill it (`sparse-run experiment=lra_listops_cpu model=bigbird`); those overrides are
its `Preset`. Hydra composes each preset once per process (`compose`, cached: about 0.1 s each, so a table
composes only the presets its runs may be) and a run is that preset when every result-changing key agrees
(`identity.result_keys`, the seed aside: seeds.py averages over it). `model.name` is a label and never counts:
`model=softmax normaliser=alpha_entmax` is the `model=entmax` preset. A run that is no preset is shown beside
the nearest one, as the `key=value` overrides that turn the preset into the run (`Match.pairs`).

Rules where the two configs are not alike (`differences`):
- a key only the preset has (the run's schema lacks it) agrees when the preset holds its
  default (`identity.default_values`), as the trainer's resume check does (training/trainer.py
  `fingerprint_difference`);
- a key only the run has agrees, unless the preset holds a node there or a leaf above it (a run's
  `pretrain.trainer.*` against a preset's `pretrain.trainer: null` follows the pre-training rule below);
- `trainer.monitor: auto` and `trainer.monitor_mode: auto` are what the runner resolves them to (config.py
  `_resolve_monitor`): the task's headline validation metric, maximised unless it is a loss or perplexity;
- `pretrain.trainer.*` counts only when both sides have a pre-training stage (`pretrain.task`): without one
  it trains nothing;
- `*.data_dir` never counts: it says where a task's files are, not what they are (task_info.data does);
- EXECUTION_KEYS (`trainer.precision` ...) never count: they change how a run was executed, not its setup.

Torch-free: the defaults are those of `conf/config.yaml` composed with no override (`identity.default_values`),
the only place they are written.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from sparse_runner import identity
from sparse_runner.checks import one_line
from sparse_runner.reporting.console import warn
from sparse_runner.reporting.values import fmt_value
from sparse_runner.run_metrics import lower_is_better, validation_metric

CONF_DIR = identity.CONF_DIR
SEED_KEY = "seed"
# How many `key=value` differences a label shows before `(+k more)`.
SHOWN_DIFFERENCES = 4
# Where a task's files are (`task.data_dir=/data/lra_release/...`, which the presets of file-based tasks leave
# to the user): a folder on one machine, not what the data are. Never compared: a run's metrics.json says which
# data it used (task_info.data), and seeds.py keeps runs on other data apart (a cell prefers official data).
LOCATION_SUFFIXES = (".data_dir",)
# How a run computed, not what: the same model and training up to floating-point rounding (bf16 autocast, a
# compiled graph, recomputed activations, another attention kernel). The GPU presets recommend bf16, and a
# paper cell is the paper's setup however it was executed; run directories still tell these apart.
EXECUTION_KEYS = ("trainer.precision", "trainer.compile", "trainer.activation_checkpointing", "model.attention_impl",
                  "model.memory_efficient_from")


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()   # a key the run's config does not have


@functools.lru_cache(maxsize=None)
def _model_names() -> tuple[str, ...]:
    return tuple(sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml")))


def model_names() -> list[str]:
    """The model presets the runner has (conf/model/*.yaml), by name."""
    return list(_model_names())


@functools.lru_cache(maxsize=None)
def compose(overrides: tuple[str, ...]) -> dict[str, Any] | None:
    """conf/config.yaml composed with `overrides` and resolved (no `hydra` node), as a nested dict; None (and one
    warning) when Hydra refuses them. Cached: every preset is composed once per process."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    identity.register_resolvers()
    try:  # initialize_config_dir saves and restores any Hydra already set up in this process
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sparse_report"):
            config = OmegaConf.to_container(hydra_compose(config_name="config", overrides=list(overrides)), resolve=True)
    except Exception as exc:  # a preset the conf/ folder lacks: it fills nothing
        warn(f"cannot compose the preset `{' '.join(overrides)}`: {one_line(exc)}")
        return None
    return config if isinstance(config, dict) else None


@dataclass(frozen=True)
class Keys:
    """The result-changing keys of a config but the seed, EXECUTION_KEYS and file locations, flattened, with
    every node above a leaf (`a`, `a.b` for `a.b.c`), so that a leaf on one side and a node on the other
    (`pretrain.task: null` against a pre-training task) is found without a scan."""

    values: dict[str, Any]
    nodes: frozenset[str] = field(default=frozenset())

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> Keys:
        values = {k: v for k, v in identity.result_keys(config or {}).items()
                  if k != SEED_KEY and k not in EXECUTION_KEYS and not k.endswith(LOCATION_SUFFIXES)}
        nodes = {key[:i] for key in values for i, char in enumerate(key) if char == "."}
        return cls(values, frozenset(nodes))

    def leaf_above(self, key: str) -> bool:
        """Whether a leaf of these keys sits above `key` (`pretrain.task` above `pretrain.task.name`)."""
        return any(char == "." and key[:i] in self.values for i, char in enumerate(key))


@dataclass(frozen=True)
class Preset:
    """A fill command's overrides (`experiment=lra_listops_cpu`, `model=bigbird`) and the config they compose."""

    overrides: tuple[str, ...]

    @property
    def command(self) -> str:
        return " ".join(["sparse-run", *self.overrides])

    @property
    def keys(self) -> Keys | None:
        return _preset_keys(self.overrides)

    def __str__(self) -> str:
        return " ".join(self.overrides)


@functools.lru_cache(maxsize=None)
def _preset_keys(overrides: tuple[str, ...]) -> Keys | None:
    config = compose(overrides)
    return None if config is None else Keys.of(config)


# A pre-training stage's trainer: a node, or null without a stage (`pretrain=none`).
_STAGE_TRAINER = "pretrain.trainer"
# With a pre-training stage, model.init_from is where run.py put the stage's weights (with_init_from), a path
# that holds the seed: the stage's own config says what the weights are, so the path is no difference.
STAGE_INIT_FROM = "model.init_from"


def pretrains(keys: Keys) -> bool:
    """Whether a config has a pre-training stage (a `pretrain.task` node, not null)."""
    return "pretrain.task" in keys.nodes


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: 1 and 1.0 are, true and 1 are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _resolved_auto(key: str, want: Any, have: Any, primary_metric: str | None) -> Any:
    """What the runner makes of `auto` in `trainer.monitor` / `trainer.monitor_mode` for a run scored on
    `primary_metric` (the run's own `auto` is left as it is)."""
    if want != "auto" or have == "auto" or not primary_metric:
        return want
    monitor = validation_metric(primary_metric)
    if key == "trainer.monitor":
        return monitor
    if key == "trainer.monitor_mode":
        return "min" if lower_is_better(monitor) else "max"
    return want


def differences(run: Keys, preset: Keys, *, primary_metric: str | None = None,
                ignore: Iterable[str] = ()) -> dict[str, Any]:
    """{key: the run's value} for every result-changing key where the run is not the preset (ABSENT: the run
    lacks it); {} when it is the preset. The seed and `ignore` never count; see the module docstring for
    keys only one side has."""
    ignored = set(ignore)
    # A pre-training stage's trainer changes nothing unless both sides pre-train (then it is compared).
    inert = () if pretrains(run) and pretrains(preset) else (f"{_STAGE_TRAINER}.",)
    if inert:
        ignored.add(_STAGE_TRAINER)
    if pretrains(run) and pretrains(preset):
        ignored.add(STAGE_INIT_FROM)
    out: dict[str, Any] = {}
    for key, want in preset.values.items():
        if key in ignored or key.startswith(inert):
            continue
        if key in run.values:
            have = run.values[key]
            if not _same(have, _resolved_auto(key, want, have, primary_metric)):
                out[key] = have
        elif key in run.nodes or run.leaf_above(key):
            continue   # a node here, or a leaf above: the run's side reports it below
        else:
            defaults = identity.default_values()
            if not (key in defaults and _same(defaults[key], want)):
                out[key] = ABSENT
    for key, have in run.values.items():
        if key in preset.values or key in ignored or key.startswith(inert):
            continue
        if key in preset.nodes or preset.leaf_above(key):
            out[key] = have
    return dict(sorted(out.items(), key=_shown_first))


def _shown_first(item: tuple[str, Any]) -> tuple:
    """A config's name first (`task.name=listops_lra` says more than its ten keys), then key order."""
    return (not item[0].endswith(".name"), item[0])


def override_text(key: str, value: Any) -> str:
    """`trainer.lr=0.01`, as a command line would give it."""
    return f"{key}=(absent)" if value is ABSENT else f"{key}={fmt_value(value)}"


@dataclass(frozen=True)
class Match:
    """A run against the preset it is (no differences) or the nearest one."""

    preset: Preset
    differences: tuple[tuple[str, Any], ...] = ()

    @property
    def exact(self) -> bool:
        return not self.differences

    @property
    def pairs(self) -> tuple[str, ...]:
        """Every difference as `key=value`: names first (`task.name`), then in key order."""
        return tuple(override_text(key, value) for key, value in self.differences)


def shown(pairs: Sequence[str], limit: int = SHOWN_DIFFERENCES) -> str:
    """`trainer.lr=0.01, trainer.max_steps=100 (+3 more)`: the first `limit` differences."""
    text = ", ".join(pairs[:limit])
    return text + (f" (+{len(pairs) - limit} more)" if len(pairs) > limit else "")


def match(keys: Keys, candidates: Iterable[Preset], *, primary_metric: str | None = None,
          ignore: Iterable[str] = ()) -> Match | None:
    """The first candidate `keys` is, else the nearest (fewest differing keys; the first on a tie); None
    when no candidate composes. Candidates are composed in order, as far as needed."""
    ignore = tuple(ignore)
    nearest: Match | None = None
    for preset in candidates:
        preset_keys = preset.keys
        if preset_keys is None:
            continue
        found = differences(keys, preset_keys, primary_metric=primary_metric, ignore=ignore)
        if not found:
            return Match(preset)
        if nearest is None or len(found) < len(nearest.differences):
            nearest = Match(preset, tuple(found.items()))
    return nearest


def cache_clear() -> None:
    """Forget every composed preset (a long-lived process whose conf/ changed; tests counting compositions)."""
    for cached in (compose, _preset_keys, identity.default_config, model_recipe, _model_names):
        cached.cache_clear()


# ------------------------------------------------------------------------------------ model recipes
def recipe(values: Mapping[str, Any]) -> tuple:
    """What a model preset chooses, from flattened result keys: normaliser, pattern, whether heads have a fixed
    size, whether SAR is on. Two runs of one recipe may still differ in sizes, task and training."""
    return (values.get("model.normaliser", "softmax"), values.get("model.pattern", "dense"),
            values.get("model.head_size") is None, values.get("model.regulariser") == "sar")


RECIPE_PARTS = len(recipe({}))


@functools.lru_cache(maxsize=None)
def model_recipe(name: str) -> tuple | None:
    """The recipe of `model=<name>` (composed alone); None when it does not compose."""
    keys = _preset_keys((f"model={name}",))
    return None if keys is None else recipe(keys.values)


def recipe_agreement(keys: Keys, model: str) -> int:
    """How many parts of its recipe a run shares with a model preset (RECIPE_PARTS: all of them)."""
    theirs = model_recipe(model)
    return 0 if theirs is None else sum(a == b for a, b in zip(recipe(keys.values), theirs))


def closest_models(keys: Keys, among: Sequence[str]) -> list[str]:
    """The models of `among` (in that order) whose recipe is most like the run's: the presets worth composing
    for it. Only these are compared key by key, which keeps a report of many runs at a few compositions. A model
    that composes what an earlier one does (`standard_heads` is `softmax` under another name) is left out: the
    earlier one is the preset the run is."""
    scores = {model: recipe_agreement(keys, model) for model in among}
    best = max(scores.values(), default=0)
    kept: dict[str, Keys | None] = {}
    for model in among:
        alone = _preset_keys((f"model={model}",))
        if scores[model] == best and (alone is None or alone not in kept.values()):
            kept[model] = alone
    return list(kept)


def agrees(keys: Keys, base: Preset | None, on: Sequence[str]) -> bool:
    """Whether a run has the values of `base` (an experiment alone) for the keys `on` that no model preset
    changes (task, sizes): a cheap test of which experiment's presets are worth composing for it."""
    base_keys = base.keys if base is not None else None
    return base_keys is not None and all(_same(keys.values.get(key), base_keys.values.get(key)) for key in on)
