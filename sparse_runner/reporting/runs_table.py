"""One runs table per task: every run with its status, the config values that vary between the runs, its
primary test metric, best validation value, attention statistics, size, speed and wall time."""

from __future__ import annotations

import fnmatch
from collections import Counter
from typing import Any

from sparse_runner.run_metrics import NON_RESULT_KEYS, validation_metric
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, sort_key
from sparse_runner.reporting.values import as_float, as_str, fmt_number, fmt_value, pct, score, slug

# Config keys that differ between runs without changing the result: the runner's own list, plus what the
# report shows elsewhere (`model.name`/`task.name` have their own columns, and a runs table holds one task)
# and where files go.
NOISE_KEYS = {*NON_RESULT_KEYS, "run_dir", "model.name", "task.name"}
NOISE_PATTERNS = ("paths.*", "hydra.*", "*_dir", "*.dir", "*_path", "*.path")

_MISSING = ""  # how an absent config key shows in a table
_UNKNOWN_TASK = "(unknown)"

# Headers of the test column for the metrics our tasks declare; any other metric is headed by its name.
TEST_HEADERS = {"test/accuracy": "test acc (%)", "test/bleu": "test BLEU", "test/sacrebleu": "test sacreBLEU",
                "test/chrf": "test chrF"}
_SCORES = {"test/bleu", "test/sacrebleu", "test/chrf"}

# A table none of whose runs has a primary metric (nothing readable, so no value to show) still needs a
# test column header: accuracy's, as before schema 2.
_DEFAULT_TEST_METRIC = "test/accuracy"


def is_noise(key: str) -> bool:
    return key in NOISE_KEYS or any(fnmatch.fnmatchcase(key, pattern) for pattern in NOISE_PATTERNS)


def varying_keys(records: list[RunRecord]) -> list[str]:
    """Dotted config keys that take at least two different values among `records`, noise excluded.

    A key absent from a run counts as unknown, not as a different value: older or partial files (a
    hand-written .hydra/config.yaml, a metrics.json from before a key existed) would otherwise turn every
    key they lack into a column.
    """
    values: dict[str, set[str]] = {}
    for rec in records:
        for key, value in rec.config.items():
            if not is_noise(key):
                values.setdefault(key, set()).add(fmt_value(value))
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def column_metric(runs: list[RunRecord]) -> str:
    """The metric of a runs table's test column: the primary metric most of its runs declare."""
    declared = Counter(rec.primary_metric for rec in runs if rec.primary_metric)
    return declared.most_common(1)[0][0] if declared else _DEFAULT_TEST_METRIC


def _metric_cell(metric: str, value: Any) -> str:
    if metric.endswith("accuracy"):
        return pct(as_float(value))
    return score(value) if metric in _SCORES else fmt_number(value, ".4g")


def _validation_cell(metric: str, value: Any) -> str:
    """A best validation value; named unless it is an accuracy, as it may not be the test column's metric."""
    if metric.endswith("accuracy"):
        return pct(as_float(value))
    number = fmt_number(value, ".4g")
    return f"{number} ({metric})" if metric and number else number


def _best_val(rec: RunRecord) -> str:
    """The value the run's checkpoint was selected on; without a selection, the validation counterpart of
    its primary metric."""
    selection = rec.data.get("selection")
    if isinstance(selection, dict) and as_float(selection.get("best_value")) is not None:
        return _validation_cell(str(selection.get("metric") or ""), selection["best_value"])
    if rec.primary_metric is None:
        return ""
    metric = validation_metric(rec.primary_metric)
    return _validation_cell(metric, rec.best_value(metric))


def _note(rec: RunRecord) -> str:
    """Why a run has no result: its error, how far it got, or that its files are unusable."""
    if rec.status == "unreadable":
        return "metrics.json is not valid JSON"
    if rec.status == "not started":
        return "no metrics.json"
    error = as_str(rec.data.get("error"))
    if error:
        error = " ".join(error.split())
        return error if len(error) <= 100 else error[:97] + "..."
    if rec.status in ("unfinished", "preempted", "unknown"):
        step, max_steps = rec.data.get("step"), rec.data.get("max_steps")
        if as_float(step) is not None:
            return f"step {step}/{max_steps}" if as_float(max_steps) is not None else f"step {step}"
    return ""


def runs_tables(records: list[RunRecord]) -> list[Table]:
    """One table per task: every run, the config values that vary between them, and its results."""
    by_task: dict[str, list[RunRecord]] = {}
    for rec in records:
        by_task.setdefault(rec.task or _UNKNOWN_TASK, []).append(rec)
    return [_runs_table(task, sorted(by_task[task], key=sort_key))
            for task in sorted(by_task, key=lambda t: (t == _UNKNOWN_TASK, t))]


def _runs_table(task: str, runs: list[RunRecord]) -> Table:
    varied = varying_keys(runs)
    show_experiment = len({rec.experiment or "" for rec in runs}) > 1
    notes = [_note(rec) for rec in runs]
    metric = column_metric(runs)
    headers = ["run", "status", "model"] + (["experiment"] if show_experiment else []) + varied
    first_numeric = len(headers)
    headers += [TEST_HEADERS.get(metric, metric), "best val", "attn density", "head JS", "params", "tokens/s",
                "wall time (s)"]
    numeric = set(range(first_numeric, len(headers)))
    if any(notes):
        headers.append("note")
    rows = []
    for rec, note in zip(runs, notes):
        row = [rec.display, rec.status, rec.model or ""]
        if show_experiment:
            row.append(rec.experiment or "")
        row += [fmt_value(rec.config[key]) if key in rec.config else _MISSING for key in varied]
        row += [
            _metric_cell(metric, rec.metric(metric)),
            _best_val(rec),
            fmt_number(rec.attention_mean("mean_density"), ".3f"),
            fmt_number(rec.attention_mean("js_mean"), ".3f"),
            fmt_number(rec.data.get("num_parameters"), ".0f"),
            fmt_number(rec.data.get("tokens_per_second"), ".0f"),
            fmt_number(rec.data.get("wall_time_s"), ".1f"),
        ]
        if any(notes):
            row.append(note)
        rows.append(row)
    label = "unknown task (no readable config)" if task == _UNKNOWN_TASK else f"task={task}"
    return Table(slug=f"runs_{slug(task)}", title=f"Runs: {label}", headers=headers, rows=rows, numeric=numeric)
