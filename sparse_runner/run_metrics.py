"""`metrics.json`, the record of one run: written by `run.py` (`MetricsFile`), read by `sparse-report` (`read`,
`primary_metric`). The schema lives here only, so that writer and reader cannot drift apart.

Torch-free on purpose (the report must not import torch; `versions` imports torch when called). `SCHEMA`
lists every key a reader may rely on; `NON_RESULT_KEYS` are the config keys that do not change a run's
result (left out of the resume fingerprint, of run-directory names and of the report's "what varies"
columns).
"""

from __future__ import annotations

import json
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from sparse_runner.io import atomic_write_json

# 1: without `primary_metric`. 2: with `primary_metric`.
SCHEMA_VERSION = 2

# Every top-level key of metrics.json and what it holds. Written at start (status running): the run's
# identity and config; at the end: its results. Any key may be absent (schema 1, or a run that stopped
# before writing it), so a reader treats each one as optional.
SCHEMA: dict[str, str] = {
    "schema": "SCHEMA_VERSION of the writer",
    "status": "running | completed | failed | diverged | preempted",
    "error": "one line: why the run failed or stopped (null otherwise)",
    "run_dir": "absolute run directory when written",
    "task": "cfg.task.name",
    "task_family": "cfg.task.family: the registered task family; the report files runs into paper tables by it",
    "model": "cfg.model.name",
    "experiment": "the experiment= config the run came from (null when none)",
    "overrides": "Hydra command-line overrides, as given",
    "config": "the resolved config, nested",
    "seed": "cfg.seed",
    "versions": "python and library versions",
    "git_commit": "HEAD of the git checkout the process that wrote the file ran from (null outside one); every "
                  "process's: `provenance`",
    "provenance": "the code each process of the run ran, in order (a resumed run: its earlier processes' first, from its "
                  "checkpoint): [{commit (HEAD; null outside a git checkout, as for an installed package), dirty (whether "
                  "tracked files differed from it; null outside git), version (sparse_runner's), from_step (the step the "
                  "process began at)}]; an entry with every field null: processes whose checkpoint kept no such record",
    "started_at": "UTC, ISO 8601",
    "primary_metric": "the run's headline test metric (`test/accuracy`, `test/bleu`, ...), declared by its task; "
                      "schema 2 (schema-1 files: see primary_metric())",
    "num_parameters": "trainable parameters",
    "device": "torch device the run trained on",
    "world_size": "processes the run trained on (torchrun / SLURM tasks; 1 without a launcher)",
    "attention_backend": "attention kernels used, comma-separated",
    "attention_backend_reason": "{attention layer type: why its backend was chosen, e.g. 'triton: CUDA, threshold-form normaliser, "
                                "padding mask'}",
    "max_steps": "cfg.trainer.max_steps",
    "dataset_sizes": "{split: examples}",
    "step": "the last training step reached",
    "stopped_early": "true when early stopping ended training",
    "tokens_seen": "training tokens processed",
    "train_time_s": "seconds spent training",
    "data_wait_fraction": "share of training time spent making batches (the model waits for them)",
    "tokens_per_second": "training throughput",
    "wall_time_s": "seconds from start to end of the run (a resumed run: with its earlier processes up to the checkpoint it "
                   "resumed from; a pre-training stage's are its own, in `pretraining`)",
    "cpu_time_s": "CPU seconds (user + system, all threads) the run took, counted as wall_time_s is; on a shared machine, "
                  "where wall time says little, cpu_time_s / trainer.num_threads estimates the wall time on idle cores "
                  "(a lower bound: threads never scale perfectly)",
    "peak_memory_mb": "peak device (or process) memory",
    "metrics": "final metrics {`val/...`, `test/...`, `best/val/...`: number}; with trainer.test_topology_shift also "
               "`test_shifted/...` (one shift, or the mean over a list of shifts; a list adds each shift's "
               "`test_shifted@<k>/...` and the worst shift's `test_shifted_worst/...`)",
    "selection": "checkpoint selection {metric, mode, best_value, best_step}",
    "analysis": "attention statistics {attention: ..., alpha: ...} (null without analysis)",
    "figures": "PNG files the run drew",
    "task_info": "task facts (tokenizer, metric signatures, ...)",
    "test_examples": "the per-example record of the test metric beside metrics.json (sparse_runner/example_scores.py): {file "
                     "(test_examples.npz), metric (`test/accuracy` ...), reducer (how column sums give the metric), examples, "
                     "columns} (null: the task keeps none)",
    "pretraining": "where a fine-tuning run's encoder came from {run_dir, checkpoint, step, sha256 (of the loaded file), task, num_parameters, "
                   "metrics, wall_time_s, cpu_time_s, device, git_commit, provenance} (null: trained from scratch)",
    "finished_at": "UTC, ISO 8601",
}

# Config keys that do not change a run's result. conf/hydra/default.yaml reads this list through the
# `non_result_keys` resolver (identity.register_resolvers) to keep them out of run-directory names.
_TRAINER_NON_RESULT = ("resume", "device", "progress", "progress_every_s", "log_every", "num_threads", "cpu_block_cache_mb")
NON_RESULT_KEYS = (
    *(f"trainer.{key}" for key in _TRAINER_NON_RESULT),
    # the same keys of a pre-training stage (conf/pretrain/) change none of its results either
    *(f"pretrain.trainer.{key}" for key in _TRAINER_NON_RESULT),
    "paths.output_dir",
    "paths.cache_dir",
)
# Config keys that name a recipe but change nothing it computes (`model=entmax` and `model=softmax
# normaliser=alpha_entmax` are one model): left out of run-directory names and of resume comparisons.
LABEL_KEYS = ("model.name",)

# The primary metric of a file that does not name one: schema-1 files, and runs that failed before their
# task was built (so before it could declare its metric). These are the metrics the tasks declare in
# schema 2; a task family not listed falls back on the metric the run selected its checkpoint on.
SCHEMA1_PRIMARY_METRICS = {"listops": "test/accuracy", "translation": "test/bleu"}

VAL, TEST = "val/", "test/"


def lower_is_better(metric: str) -> bool:
    """Whether lower is better for `metric` (`val/loss`, `test/ppl`): losses and perplexities; higher for the rest."""
    return metric.endswith(("loss", "ppl"))


# The deepest nesting a reader accepts: a metrics.json the runner writes is 8 levels deep at most, and a file
# nested thousands of levels deep exhausts the recursion of the JSON parser and of everything that walks it.
MAX_DEPTH = 100
# Digits of the longest integer read as an int (Python refuses to convert longer ones); a longer one reads as
# a float (±inf), as JSON's 1e400 does.
_MAX_INT_DIGITS = 4000


class UnreadableFile(ValueError):
    """A metrics.json that cannot be used; its message says why (`cannot be read: permission denied`,
    `not valid JSON (...)`, `nested deeper than 100 levels`)."""


def nesting_depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value` (a number: 0, `[1]`: 1), measured without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:   # deeper than that is all a caller needs to know
                stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _parse_int(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= _MAX_INT_DIGITS else float(text)


def read(path: str | Path) -> dict[str, Any]:
    """A metrics.json as a dict. Raises UnreadableFile (a ValueError) saying why the file cannot be used: it
    cannot be read, or `parse` refuses its bytes."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UnreadableFile(f"cannot be read: {reason[:1].lower()}{reason[1:]}") from exc
    return parse(raw)


def parse(raw: bytes) -> dict[str, Any]:
    """The bytes of a metrics.json as a dict. Raises UnreadableFile saying why they cannot be used: not
    UTF-8, not valid JSON, not an object, or nested deeper than MAX_DEPTH."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_int=_parse_int)
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"not UTF-8 text (byte {exc.start})") from exc
    except RecursionError:
        raise UnreadableFile(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise UnreadableFile(f"not valid JSON ({exc.msg}: line {exc.lineno}, column {exc.colno})") from exc
    if not isinstance(data, dict):
        raise UnreadableFile("not a JSON object")
    if nesting_depth(data) > MAX_DEPTH:
        raise UnreadableFile(f"nested deeper than {MAX_DEPTH} levels")
    return data


def primary_metric(data: Mapping[str, Any], task_family: str | None = None) -> str | None:
    """The run's headline test metric: `primary_metric` when the file names it, else (the one fallback)
    SCHEMA1_PRIMARY_METRICS of its task family, else the test counterpart of its selection metric (`val/x`
    -> `test/x`); None when none of these is known. `task_family` stands in for the file's own (a run
    without metrics.json has its family in .hydra/config.yaml)."""
    named = data.get("primary_metric")
    if isinstance(named, str) and named:
        return named
    family = data.get("task_family") if task_family is None else task_family
    if family in SCHEMA1_PRIMARY_METRICS:
        return SCHEMA1_PRIMARY_METRICS[family]
    selection = data.get("selection")
    selected = selection.get("metric") if isinstance(selection, dict) else None
    if isinstance(selected, str) and selected.startswith(VAL):
        return TEST + selected[len(VAL):]
    return None


def validation_metric(test_metric: str) -> str:
    """The validation counterpart of a test metric (`test/bleu` -> `val/bleu`): what a run is chosen on."""
    return VAL + test_metric[len(TEST):] if test_metric.startswith(TEST) else test_metric


def flatten(config: Any, prefix: str = "", *, keep_empty: bool = False) -> dict[str, Any]:
    """`{"model": {"num_heads": 2}}` -> `{"model.num_heads": 2}`; lists stay whole (one value).

    An empty mapping has no leaf, so it disappears unless `keep_empty` keeps it as a value (`{"a": {}}` ->
    `{"a": {}}`). The resume fingerprint drops them (checkpoints saved so far were fingerprinted that way);
    the report keeps them, so that `pattern_options: {}` next to `pattern_options: null` shows as a change.
    """
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and (value or not keep_empty):
            flat.update(flatten(value, dotted, keep_empty=keep_empty))
        else:
            flat[dotted] = value
    return flat


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(*args: str) -> str | None:
    """The output of `git ARGS` run in this package's folder, stripped; None when git is missing, fails or hangs.
    Without optional locks: a `git status` that refreshed the index would hold its lock against the user's own git."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """HEAD of the git checkout this package's files are tracked in; None outside one. A package installed into
    a folder that some other checkout holds (a virtualenv inside a project) is untracked there, so it is None too."""
    if _git("ls-files", "--error-unmatch", "--", Path(__file__).name) is None:
        return None
    return _git("rev-parse", "--verify", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether tracked files of this package's git checkout differ from its HEAD (untracked files aside); None
    when git cannot tell."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


# The fields of a `provenance` entry whose code is unknown: processes of a run whose checkpoint kept no record.
UNKNOWN_CODE = {"commit": None, "dirty": None, "version": None}


def code_version() -> dict[str, Any]:
    """The code this process runs, as a `provenance` entry without its step: {"commit": git_commit(), "dirty":
    git_dirty() (None outside git), "version": sparse_runner's version}."""
    from sparse_runner import __version__

    commit = git_commit()
    return {"commit": commit, "dirty": git_dirty() if commit else None, "version": __version__}


def versions() -> dict[str, str]:
    import hydra
    import numpy
    import omegaconf
    import torch

    import sparse_runner

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "hydra": hydra.__version__,
        "omegaconf": omegaconf.__version__,
        "sparse_runner": sparse_runner.__version__,
        "cuda": torch.version.cuda or "",
    }


class MetricsFile:
    """metrics.json of a run: written atomically at start (status running) and at every end."""

    def __init__(self, run_dir: Path, cfg: Any, meta: dict[str, Any]) -> None:
        from omegaconf import OmegaConf

        self.path = Path(run_dir) / "metrics.json"
        self.data: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "status": "running",
            "error": None,
            "run_dir": str(Path(run_dir).resolve()),
            "task": cfg.task.name,
            "task_family": cfg.task.family,
            "model": cfg.model.name,
            "experiment": meta.get("experiment"),
            "overrides": list(meta.get("overrides", [])),
            "config": OmegaConf.to_container(cfg, resolve=True),
            "seed": cfg.seed,
            "versions": versions(),
            "git_commit": git_commit(),
            "started_at": now(),
        }

    def write(self, **fields: Any) -> None:
        self.data.update(fields)
        atomic_write_json(self.path, self.data)
