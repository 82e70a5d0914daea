"""Run collection: walk folders, read each run directory's metrics.json into a RunRecord.

It never infers anything from directory names: Hydra names run directories after the overrides, but users
may rename or move them. A run that never wrote metrics.json is read from `.hydra/` instead, as written: a run
folder may come from anyone, so no interpolation in it is resolved (`${oc.env:...}` would read the reader's
environment into the report).
"""

from __future__ import annotations

import fnmatch
import functools
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml  # PyYAML, which omegaconf reads YAML with

from sparse_runner import example_scores, identity, run_metrics
from sparse_runner.checks import one_line
from sparse_runner.example_scores import ExampleScores
from sparse_runner.reporting import run_files
from sparse_runner.reporting.console import warn
from sparse_runner.reporting.presets import Keys
from sparse_runner.reporting.values import as_float, as_str, finite, mean

# Folders that never contain runs of their own; hidden folders (.hydra, .git, ...) are skipped as well.
SKIP_DIRS = {"checkpoints", "tb"}

# What the report reads of one run at most (run_files.read_bytes): a metrics.json of the runner is tens of
# kB and a config a few; the limits are far above that and keep a crafted file from exhausting memory.
MAX_METRICS_BYTES = 64 * run_files.MB
MAX_CONFIG_BYTES = 8 * run_files.MB
MAX_EXAMPLES_BYTES = 64 * run_files.MB   # test_examples.npz: tens of kB for 10,000 examples

# Display status -> sort rank: finished work first, then work that stopped, then what never ran. `diverged`:
# the loss became non-finite, a failure of the training itself rather than of the machinery.
STATUS_ORDER = ["completed", "preempted", "unfinished", "failed", "diverged", "not started", "unreadable", "unknown"]
_STATUS_RANK = {status: rank for rank, status in enumerate(STATUS_ORDER)}

# Config keys that differ between runs without changing the result: the runner's own list, plus what the
# report shows elsewhere (`model.name`/`task.name` have their own columns, and a runs table holds one task)
# and where files go. Neither a column of the runs tables nor a difference between seeds of one group.
NOISE_KEYS = {*run_metrics.NON_RESULT_KEYS, "run_dir", "model.name", "task.name"}
NOISE_PATTERNS = ("paths.*", "hydra.*", "*_dir", "*.dir", "*_path", "*.path")


def status_rank(status: str) -> int:
    return _STATUS_RANK.get(status, len(STATUS_ORDER))


@functools.lru_cache(maxsize=4096)   # a report asks about the same few hundred keys for every run
def is_noise(key: str) -> bool:
    return key in NOISE_KEYS or any(fnmatch.fnmatchcase(key, pattern) for pattern in NOISE_PATTERNS)


@dataclass
class RunRecord:
    """One run directory as the report sees it. Every field tolerates an absent key in metrics.json."""

    path: Path                         # absolute run directory
    display: str                       # how the run is named in tables (relative to the walked root)
    status: str                        # one of STATUS_ORDER, or whatever else metrics.json says
    problem: str | None = None         # why metrics.json is unreadable (`cannot be read: permission denied`)
    task: str | None = None
    task_family: str | None = None
    model: str | None = None           # cfg.model.name: a label (the axes say what the run computed)
    experiment: str | None = None      # the experiment= it was spelled with (presets.py says which it is)
    primary_metric: str | None = None  # headline test metric (run_metrics.primary_metric)
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)   # flattened to dotted keys
    data: dict[str, Any] = field(default_factory=dict)     # metrics.json as read ({} when there is none)
    nested_config: dict[str, Any] = field(default_factory=dict)   # the resolved config as written

    @functools.cached_property
    def keys(self) -> Keys:
        """Its result-changing config keys but the seed, to compare with a paper preset (presets.py)."""
        return Keys.of(self.nested_config)

    @property
    def axes(self) -> identity.Axes:
        """What its attention computed (normaliser, pattern, heads, regulariser, pre-trained), from its config."""
        return identity.axes(self.nested_config)

    @property
    def label(self) -> str:
        """`alpha_entmax · dense · h4`: the run by what it computed, whatever its model= label says."""
        return self.axes.label()

    @property
    def metrics(self) -> dict[str, Any]:
        value = self.data.get("metrics")
        return value if isinstance(value, dict) else {}

    def metric(self, name: str) -> float | None:
        """A final metric of the run (`test/bleu`, `test/chrf`, ...), or None when it has none."""
        return as_float(self.metrics.get(name))

    @property
    def primary_value(self) -> float | None:
        return self.metric(self.primary_metric) if self.primary_metric else None

    def best_value(self, name: str) -> float | None:
        """The best value of a validation metric: the checkpoint-selection value when the run selected on
        `name`, else the trainer's `best/<name>`, else the final value."""
        selection = self.data.get("selection")
        if isinstance(selection, dict) and selection.get("metric") == name:
            best = as_float(selection.get("best_value"))
            if best is not None:
                return best
        best = self.metric(f"best/{name}")
        return best if best is not None else self.metric(name)

    @property
    def minimises(self) -> bool:
        """Whether lower is better for the primary metric (perplexity, loss): the run's checkpoint selection
        minimised its validation counterpart."""
        selection = self.data.get("selection")
        return (isinstance(selection, dict) and selection.get("mode") == "min" and self.primary_metric is not None
                and selection.get("metric") == run_metrics.validation_metric(self.primary_metric))

    @property
    def validation_value(self) -> float | None:
        """The best validation value of the primary metric (val/accuracy for test/accuracy, ...)."""
        return self.best_value(run_metrics.validation_metric(self.primary_metric)) if self.primary_metric else None

    def analysis(self, key: str) -> dict | None:
        """metrics.json analysis[key] ("attention" or "alpha") when it holds data, else None."""
        analysis = self.data.get("analysis")
        block = analysis.get(key) if isinstance(analysis, dict) else None
        return block if isinstance(block, dict) and block else None

    def attention_mean(self, field_name: str) -> float | None:
        """An analysis value (`mean_density`, `js_mean`) averaged over the attention types of the run."""
        per_type = (self.analysis("attention") or {}).values()
        values = finite(as_float(v.get(field_name)) for v in per_type if isinstance(v, dict))
        return mean(values) if values else None


    @functools.cached_property
    def test_examples(self) -> ExampleScores | str:
        """The run's per-example record of its test metric (sparse_runner/example_scores.py), or why it has no
        usable one, in a few words: none recorded, the file refused (run_files), or statistics that do not give
        back the metric the run recorded (a record that does not belong to its run)."""
        described = self.data.get("test_examples")
        if not isinstance(described, dict):
            return "no per-example record"
        try:
            raw = run_files.read_bytes(self.path / example_scores.FILE, self.path, MAX_EXAMPLES_BYTES)
            scores = example_scores.read(io.BytesIO(raw))
        except (run_files.NotShown, ValueError) as exc:
            return f"{example_scores.FILE} {one_line(exc)}"
        if not example_scores.reproduces(scores, self.metric(scores.metric)):
            return f"{example_scores.FILE} does not give back the run's {scores.metric}"
        return scores


def sort_key(rec: RunRecord) -> tuple[int, str]:
    return (status_rank(rec.status), rec.display)


def completed(records: Iterable[RunRecord], family: str, metric: str) -> list[RunRecord]:
    """The runs that may stand next to a published number in `metric`: completed runs of task `family`
    whose primary metric is `metric` (a run scored on anything else is not comparable)."""
    return [rec for rec in records
            if rec.task_family == family and rec.status == "completed" and rec.primary_metric == metric]


def ranking(minimises: bool, validation: float | None, test: float | None) -> tuple[float, float]:
    """How runs (and groups of runs) compete for a cell, higher is better: the validation score, then the test
    score to break ties; negated when lower is better, -inf when missing or not finite.

    Chosen on the validation score, not the test score, so that the reported test number is not itself
    chosen on the test set.
    """
    sign = -1.0 if minimises else 1.0

    def scored(value: float | None) -> float:
        return sign * value if value is not None and math.isfinite(value) else -math.inf

    return scored(validation), scored(test)


def pick_best(candidates: list[RunRecord]) -> RunRecord:
    """The best of several runs by `ranking`, the run name keeping it deterministic: which of a seed's
    repeated runs counts, which run of a group stands for it in a figure."""
    return max(candidates, key=lambda rec: (*ranking(rec.minimises, rec.validation_value, rec.primary_value),
                                            rec.display))


def _yaml_problem(text: str) -> str | None:
    """Why a YAML text is not read, or None: an alias (one can expand a small file into billions of values) or
    nesting deeper than run_metrics.MAX_DEPTH. Read from the parser's events, which need no recursion."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            return "YAML aliases are not read"
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > run_metrics.MAX_DEPTH:
                return f"nested deeper than {run_metrics.MAX_DEPTH} levels"
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _read_yaml(path: Path, run_dir: Path) -> Any:
    """A YAML file's data as written: no interpolation is resolved (`${oc.env:...}` stays text). Raises
    ValueError saying why a file cannot be read."""
    from omegaconf import OmegaConf  # imported here: only runs without a usable metrics.json need it
    from omegaconf.errors import OmegaConfBaseException

    try:
        text = run_files.read_bytes(path, run_dir, MAX_CONFIG_BYTES).decode("utf-8")
        problem = _yaml_problem(text)
        if problem:
            raise ValueError(problem)
        return OmegaConf.to_container(OmegaConf.load(io.StringIO(text)), resolve=False)
    except (run_files.NotShown, UnicodeDecodeError, yaml.YAMLError, OmegaConfBaseException) as exc:
        raise ValueError(one_line(exc)) from exc


def _load_hydra(run_dir: Path) -> tuple[dict | None, list[str] | None]:
    """Hydra's saved config and overrides of a run directory, as written (no interpolation resolved), or None
    where missing or unreadable (one warning each)."""
    config = overrides = None
    config_file, overrides_file = run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml"
    if os.path.lexists(config_file):
        try:
            config = _read_yaml(config_file, run_dir)
        except ValueError as exc:
            warn(f"{config_file}: cannot read ({one_line(exc)})")
    if os.path.lexists(overrides_file):
        try:
            loaded = _read_yaml(overrides_file, run_dir)
            overrides = [str(item) for item in loaded] if isinstance(loaded, list) else None
        except ValueError as exc:
            warn(f"{overrides_file}: cannot read ({one_line(exc)})")
    return (config if isinstance(config, dict) else None), overrides


def _experiment_from_overrides(overrides: list[str]) -> str | None:
    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if sep and key == "experiment" and value not in ("", "null"):
            return value
    return None


def current_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved config (metrics.json's `config`, nested) with the settings the runner holds under other keys
    moved there, so that a run is read by what it computed whichever keys its runner wrote; a config that
    holds them already is returned unchanged. Returns a new dict; `config` is not modified.

    - `model.alpha`, `model.alpha_init` -> `model.normaliser_options` (alpha_entmax's options; the other
      normalisers take none);
    - `model.sar` (on when its weight > 0), `trainer.regulariser`, `trainer.regulariser_weight`,
      `trainer.rdrop_task_loss` -> `model.regulariser` + `model.regulariser_options` (an R-Drop config without
      `rdrop_task_loss` counted the first pass's task loss alone);
    - a pre-training stage's trainer loses the same trainer keys (the stage trains the same model).
    """
    model, trainer = config.get("model"), config.get("trainer")
    if not isinstance(model, dict) or "regulariser" in model or "normaliser_options" in model:
        return config
    model = dict(model)
    alpha, alpha_init = model.pop("alpha", None), model.pop("alpha_init", "random")
    model["normaliser_options"] = {"alpha": alpha, "alpha_init": alpha_init} if model.get("normaliser") == "alpha_entmax" else {}
    sar = model.pop("sar", None)
    trainer = dict(trainer) if isinstance(trainer, dict) else {}
    regulariser = trainer.pop("regulariser", "none")
    weight = trainer.pop("regulariser_weight", 1.0)
    task_loss = trainer.pop("rdrop_task_loss", None)
    if isinstance(sar, dict) and (as_float(sar.get("weight")) or 0.0) > 0:
        model["regulariser"], model["regulariser_options"] = "sar", dict(sar)
    elif regulariser == "rdrop":
        model["regulariser"] = "rdrop"
        model["regulariser_options"] = {"weight": weight, "task_loss": task_loss or "first"}
    else:
        model["regulariser"], model["regulariser_options"] = "none", {}
    current = {**config, "model": model}
    if isinstance(config.get("trainer"), dict):
        current["trainer"] = trainer
    stage = config.get("pretrain")
    if isinstance(stage, dict) and isinstance(stage.get("trainer"), dict):
        stage_trainer = {k: v for k, v in stage["trainer"].items() if k not in ("regulariser", "regulariser_weight", "rdrop_task_loss")}
        current["pretrain"] = {**stage, "trainer": stage_trainer}
    return current


def read_run(run_dir: Path, display: str) -> RunRecord:
    """One RunRecord from metrics.json, falling back to .hydra/ for whatever metrics.json lacks."""
    metrics_file = run_dir / "metrics.json"
    data: dict[str, Any] = {}
    problem = None
    if os.path.lexists(metrics_file):   # a link or a FIFO is named unreadable, not skipped
        try:
            data = run_metrics.parse(run_files.read_bytes(metrics_file, run_dir, MAX_METRICS_BYTES))
            raw_status = as_str(data.get("status"))
            status = {"running": "unfinished", None: "unknown"}.get(raw_status, raw_status)
        except (run_files.NotShown, ValueError) as exc:  # both say why in their message
            problem = one_line(exc)
            warn(f"{metrics_file}: {problem}; listed as unreadable")
            status = "unreadable"
    else:
        status = "not started"

    hydra_config, hydra_overrides = _load_hydra(run_dir)
    config = data.get("config") if isinstance(data.get("config"), dict) else hydra_config
    config = current_keys(config) if isinstance(config, dict) else config
    overrides = data.get("overrides") if isinstance(data.get("overrides"), list) else hydra_overrides
    overrides = [str(item) for item in overrides or []]
    flat = run_metrics.flatten(config or {}, keep_empty=True)

    task = as_str(data.get("task")) or as_str(flat.get("task.name"))
    # task.family: the registered task family; the report files runs into paper tables by it (a config
    # without it goes to the table named like the task).
    family = as_str(data.get("task_family")) or as_str(flat.get("task.family")) or task
    model = as_str(data.get("model")) or as_str(flat.get("model.name"))
    experiment = as_str(data.get("experiment")) if "experiment" in data else _experiment_from_overrides(overrides)
    return RunRecord(
        path=run_dir, display=display, status=status, problem=problem, task=task, task_family=family, model=model,
        experiment=experiment, primary_metric=run_metrics.primary_metric(data, family), overrides=overrides,
        config=flat, data=data, nested_config=config or {},
    )


def collect_runs(paths: Iterable[str | os.PathLike]) -> list[RunRecord]:
    """Walk `paths` recursively and read every run directory found below them.

    A run directory is one holding `metrics.json`, or `.hydra/config.yaml` without it (a run that never
    got going: status `not started`). Hidden folders, `checkpoints` and `tb` are not searched. Runs are
    named relative to the path they were found under (prefixed by that path when several are given).
    """
    roots = [Path(p) for p in paths]
    records: list[RunRecord] = []
    seen: set[Path] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda exc: warn(one_line(exc))):
            # Prune in place so os.walk never descends into these.
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
            run_dir = Path(dirpath)
            if "metrics.json" not in filenames and not os.path.lexists(run_dir / ".hydra" / "config.yaml"):
                continue
            key = run_dir.resolve()
            if key in seen:  # overlapping paths (outputs and outputs/runs): report each run once
                continue
            seen.add(key)
            rel = run_dir.relative_to(root).as_posix()
            if len(roots) == 1 and rel != ".":
                display = rel
            else:
                display = root.as_posix() if rel == "." else f"{root.as_posix().rstrip('/')}/{rel}"
            records.append(read_run(run_dir, display))
    return records
