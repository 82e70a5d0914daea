"""One runs table per task: every run with its status, what it computed (identity.axes: normaliser, pattern,
heads, regulariser, pre-trained), the config values that vary between the runs, its primary test metric, best
validation value, attention statistics, size, speed and wall time. Completed runs that differ only in their
seed share a row (seeds.py: mean ± std (n)); every other run has a row of its own."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from sparse_runner.run_metrics import validation_metric
from sparse_runner.reporting import seeds
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, is_noise, sort_key
from sparse_runner.reporting.seeds import SeedGroup, distinct, summary
from sparse_runner.reporting.values import (NOT_FINITE_NOTE, as_float, as_str, fmt_number, fmt_value, number_format,
                                            pct, score, slug)

_UNKNOWN_TASK = "(unknown)"
# How a cell shows a value that is not finite (values.fmt_number): it needs NOT_FINITE_NOTE under the table.
_NOT_FINITE = re.compile(r"(?<![\w.])[+-]?(nan|inf)\b")

# Headers of the test column for the metrics our tasks declare; any other metric is headed by its name.
TEST_HEADERS = {"test/accuracy": "test acc (%)", "test/bleu": "test BLEU", "test/sacrebleu": "test sacreBLEU",
                "test/chrf": "test chrF"}
_SCORES = {"test/bleu", "test/sacrebleu", "test/chrf"}

# A table none of whose runs has a primary metric (nothing readable, so no value to show) still needs a
# test column header: accuracy's (that of ListOps, the default task).
_DEFAULT_TEST_METRIC = "test/accuracy"


def varying_keys(records: list[RunRecord]) -> list[str]:
    """Dotted config keys that take at least two different values among `records`, noise excluded.

    A key absent from a run counts as unknown, not as a different value: partial files (a hand-written
    .hydra/config.yaml, a metrics.json whose config lacks a key) would otherwise turn every
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


def _best_val(rec: RunRecord) -> tuple[str, float | None]:
    """(metric, value): the value the run's checkpoint was selected on; without a selection, the validation
    counterpart of its primary metric."""
    selection = rec.data.get("selection")
    if isinstance(selection, dict) and as_float(selection.get("best_value")) is not None:
        return str(selection.get("metric") or ""), as_float(selection["best_value"])
    if rec.primary_metric is None:
        return "", None
    metric = validation_metric(rec.primary_metric)
    return metric, rec.best_value(metric)


def _best_val_cell(group: SeedGroup) -> str:
    """Named unless it is an accuracy, as it may not be the test column's metric."""
    metric = _best_val(group.first)[0]
    values = group.values(lambda rec: _best_val(rec)[1])
    if metric.endswith("accuracy"):
        return summary(values, pct)
    number = summary(values, number_format(".4g"))
    return f"{number} ({metric})" if metric and number else number


def _note(rec: RunRecord) -> str:
    """Why a run has no result: its error, how far it got, or that its files are unusable."""
    if rec.status == "unreadable":
        return f"metrics.json: {rec.problem or 'unreadable'}"
    if rec.status == "not started":
        return "no metrics.json"
    error = as_str(rec.data.get("error"))
    if error:
        error = " ".join(error.split())
        return error if len(error) <= 100 else error[:97] + "..."
    if rec.status in ("unfinished", "preempted", "diverged", "unknown"):
        step, max_steps = (fmt_number(rec.data.get(key), ".0f") for key in ("step", "max_steps"))
        if step:
            return f"step {step}/{max_steps}" if max_steps else f"step {step}"
    return ""


def runs_tables(records: list[RunRecord]) -> list[Table]:
    """One table per task: every run, the config values that vary between them, and its results."""
    by_task: dict[str, list[RunRecord]] = {}
    for rec in records:
        by_task.setdefault(rec.task or _UNKNOWN_TASK, []).append(rec)
    return [_runs_table(task, by_task[task]) for task in sorted(by_task, key=lambda t: (t == _UNKNOWN_TASK, t))]


def _rows(runs: list[RunRecord]) -> list[SeedGroup]:
    """A row per group of completed runs that differ only in their seed, and per run that did not complete
    (it has no result to average), in (status, run name) order."""
    rows = seeds.seed_groups(runs) + [SeedGroup([rec]) for rec in runs if rec.status != "completed"]
    return sorted(rows, key=lambda group: sort_key(group.first))


def _runs_table(task: str, runs: list[RunRecord]) -> Table:
    groups = _rows(runs)
    varied = varying_keys(runs)
    show_experiment = len({rec.experiment or "" for rec in runs}) > 1
    notes = [distinct((_note(rec) for rec in group.runs), sep="; ") for group in groups]
    metric = column_metric(runs)
    headers = ["run", "status", "model"] + (["experiment"] if show_experiment else []) + varied
    first_numeric = len(headers)
    headers += [TEST_HEADERS.get(metric, metric), "best val", "attn density", "head JS", "params", "tokens/s",
                "wall time (s)"]
    numeric = set(range(first_numeric, len(headers)))
    if any(notes):
        headers.append("note")
    rows = []
    for group, note in zip(groups, notes):
        rec = group.first
        # what the runs computed (their axes), not the model= label they were spelled with
        row = [group.display, rec.status, distinct(r.label for r in group.runs)]
        if show_experiment:
            row.append(distinct(r.experiment or "" for r in group.runs))
        row += [group.config_text(key) for key in varied]
        row += [
            group.text(metric, lambda value: _metric_cell(metric, value)),
            _best_val_cell(group),
            group.text(lambda r: r.attention_mean("mean_density"), number_format(".3f")),
            group.text(lambda r: r.attention_mean("js_mean"), number_format(".3f")),
            # the config fixes the size: the same for every seed
            distinct(fmt_number(r.data.get("num_parameters"), ".0f") for r in group.runs),
            group.text(lambda r: r.data.get("tokens_per_second"), number_format(".0f")),
            group.text(lambda r: r.data.get("wall_time_s"), number_format(".1f")),
        ]
        if any(notes):
            row.append(note)
        rows.append(row)
    label = "unknown task (no readable config)" if task == _UNKNOWN_TASK else f"task={task}"
    grouped = any(len(group.runs) > 1 or group.repeats for group in groups)
    not_finite = any(_NOT_FINITE.search(row[column]) for row in rows for column in numeric)
    notes = ([seeds.NOTE] if grouped else []) + ([NOT_FINITE_NOTE] if not_finite else [])
    return Table(slug=f"runs_{slug(task)}", title=f"Runs: {label}", headers=headers, rows=rows, numeric=numeric,
                 notes=notes)
