"""What a run computed, read off its resolved config: its attention axes, its directory name and a hash of
every result-changing key.

A run is named by what it computed, never by how its command line spelled it: `task=iwslt` (an alias)
and `task=iwslt17_de_en` resolve to the same config and so to the same directory, and
`model=softmax normaliser=alpha_entmax` is an alpha-entmax run wherever it is filed. Torch-free: the
report reads the same functions from metrics.json's `config`.

    >>> run_name(cfg)         # doctest: +SKIP
    'listops_softmax_dense_h4_seed0_3f9c2a1b'
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from pathlib import Path

from omegaconf import OmegaConf

from sparse_runner.run_metrics import LABEL_KEYS, NON_RESULT_KEYS, flatten

HASH_LENGTH = 8


def result_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened resolved config (no `hydra` node) less the keys that change no result and the labels."""
    flat = flatten({k: v for k, v in config.items() if k != "hydra"})
    return {k: v for k, v in flat.items() if k not in NON_RESULT_KEYS and k not in LABEL_KEYS}


def config_hash(config: Mapping[str, Any]) -> str:
    """A short, stable hash of every result-changing key: equal for two configs that compute the same run."""
    text = json.dumps(result_keys(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


@dataclass(frozen=True)
class Axes:
    """The attention axes of a run and the regulariser and pre-training of its training, as short labels."""

    normaliser: str   # softmax | sparsemax | entmax15 | alpha_entmax (learned per head) | alpha_entmax(1.3) (fixed)
    pattern: str      # dense | causal | local | bigbird | hst
    geometry: str     # h4 (standard heads: d_model / heads each) | h8_qkv64 (standard, qkv_dim / heads) | h8_dp32 (fixed d_p = 32)
    regulariser: str  # none | sar | rdrop
    pretrained: bool  # fine-tuned from a masked-LM pre-training (a stage or model.init_from)

    def label(self) -> str:
        """`alpha_entmax · hst · h8_dp32 · sar · pre-trained`, the parts that are not the plain default."""
        parts = [self.normaliser, self.pattern, self.geometry]
        parts += [self.regulariser] if self.regulariser != "none" else []
        parts += ["pre-trained"] if self.pretrained else []
        return " · ".join(parts)


def _get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def axes(config: Mapping[str, Any]) -> Axes:
    """The axes of a resolved config (a nested dict, as metrics.json's `config`)."""
    normaliser = str(_get(config, "model.normaliser", "softmax"))
    alpha = _get(config, "model.normaliser_options.alpha")
    if normaliser == "alpha_entmax" and alpha is not None:
        normaliser = f"alpha_entmax({float(alpha):g})"
    heads = _get(config, "model.num_heads")
    head_size = _get(config, "model.head_size")
    qkv_dim = _get(config, "model.qkv_dim")
    geometry = f"h{heads}" + (f"_dp{head_size}" if head_size is not None else f"_qkv{qkv_dim}" if qkv_dim is not None else "")
    regulariser = str(_get(config, "model.regulariser", "none") or "none")
    pretrained = _get(config, "pretrain.task") is not None or _get(config, "model.init_from") is not None
    return Axes(normaliser, str(_get(config, "model.pattern", "dense")), geometry, regulariser, bool(pretrained))


def run_name(config: Mapping[str, Any]) -> str:
    """`<task>_<normaliser>_<pattern>_<geometry>[_<regulariser>][_pretrained]_seed<k>_<hash>`: readable, and
    unique to what the run computes (the hash covers every result-changing key)."""
    a = axes(config)
    parts = [str(_get(config, "task.name", "task")), a.normaliser, a.pattern, a.geometry]
    parts += [a.regulariser] if a.regulariser != "none" else []
    parts += ["pretrained"] if a.pretrained else []
    parts += [f"seed{_get(config, 'seed', 0)}", config_hash(config)]
    return "_".join(parts).replace("/", "-").replace("(", "").replace(")", "")


# ---------------------------------------------------------------------- composing: where the configs are, what they read
# The Hydra configs, shipped inside the package (a link to the repository's conf/ in a checkout).
CONF_DIR = Path(__file__).resolve().parent / "conf"

def non_result_overrides() -> list[str]:
    """Overrides left out of run-directory names: keys that change no result, and the launcher."""
    return [*NON_RESULT_KEYS, "hydra.launcher", "hydra/launcher"]


def run_dir_name(override_dirname: str, *, _root_: Any) -> str:
    """`hydra.run.dir`'s name: `run_name` of the job's resolved config, so that the same run, however spelled,
    lands in the same directory and resumes there.

    `override_dirname` holds only keys that change no result but that a sweep varies (the CLI lets them
    through, cli.excluded_sweeps): they are appended, so that each such job has its own directory."""
    config = {key: OmegaConf.to_container(_root_[key], resolve=True) if OmegaConf.is_config(_root_[key]) else _root_[key]
              for key in _root_ if key != "hydra"}  # resolving `hydra` would resolve this very name
    shared = [item.replace("/", "_") for item in override_dirname.split(",") if item.split("=", 1)[0] in NON_RESULT_KEYS]
    return "_".join([run_name(config), *shared])


# The nodes whose every key has a default a run may be compared against (`task` is the task family's own).
DEFAULT_NODES = ("model", "trainer", "paths")


@functools.lru_cache(maxsize=None)
def default_config() -> dict[str, Any]:
    """conf/config.yaml composed with no override and resolved, without its `hydra` node: the one place a
    default is written (the dataclasses of config.py carry types, not values). Cached: composed once per process."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    register_resolvers()
    running = get_gh_backup()  # the Hydra of a running job or of the CLI's checks, set up again afterwards
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sparse_run_defaults"):
            config = compose(config_name="config")
    finally:
        restore_gh_from_backup(running)
    return {key: value for key, value in OmegaConf.to_container(config, resolve=True).items() if key != "hydra"}


def default_values() -> dict[str, Any]:
    """The default of every model / trainer / paths key, flattened (`trainer.max_steps`: 4000), from
    `default_config`; a pre-training stage's trainer key defaults like the run's own (`pretrain.trainer.lr` as
    `trainer.lr`: conf/pretrain/*.yaml start from conf/trainer/default.yaml). What the resume check takes a key
    that a checkpoint lacks to hold, and what the report takes a key that a run's config lacks to hold."""
    flat = flatten({node: default_config()[node] for node in DEFAULT_NODES})
    return {**flat, **{f"pretrain.{key}": value for key, value in flat.items() if key.startswith("trainer.")}}


def register_resolvers() -> None:
    """Register what conf/hydra/default.yaml reads (`non_result_keys`, `run_dir_name`); wherever configs are
    composed: the CLI, config.py, the report's presets, tests."""
    for name, resolver in (("non_result_keys", non_result_overrides), ("run_dir_name", run_dir_name)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
