"""Learning curves from each run's `log.jsonl`: one figure per task and experiment, the monitored validation
metric (left) and the training loss (right) against the step.

One line per group of completed runs that differ only in their seed (seeds.py): the mean over its seeds, with
a band from the lowest to the highest seed at each step. A run that did not complete (failed, diverged,
unfinished) is drawn on its own, dashed, and never enters a mean. A figure draws the best groups on
validation (seeds.SeedGroup.rank) and says how many it leaves out; the runs table lists every run.

Every text a figure draws from a run (its name, status, experiment, task, metric, config values) goes through
sinks.mathtext: a `$` in it is drawn as written, never parsed as mathtext.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from sparse_runner.run_metrics import validation_metric
from sparse_runner.reporting import run_files
from sparse_runner.reporting.console import warn
from sparse_runner.reporting.runs import RunRecord, sort_key
from sparse_runner.reporting.runs_table import varying_keys
from sparse_runner.reporting.seeds import SEED_KEY, SeedGroup, seed_groups
from sparse_runner.reporting.sinks import mathtext
from sparse_runner.reporting.values import as_float, fmt_value

TRAIN_LOSS = "train/loss"
MAX_GROUPS = 8        # lines of completed groups per figure: more is a legend nobody reads
MAX_UNFINISHED = 4    # dashed lines of runs that did not complete
LABEL_CHARS = 70
# 6,000 logged steps are 0.2 MB; a million are tens of MB. Beyond this a log is not a run's (run_files).
MAX_LOG_BYTES = 256 * run_files.MB
SMOOTH_ABOVE, SMOOTH_WINDOW = 100, 9   # a training loss logged at more steps is drawn as a running mean
# The largest magnitude drawn: matplotlib's axis arithmetic overflows on a span from -1e308 to 1e308.
DRAWABLE = 1e300

Curve = dict[int, float]   # step -> value


@dataclass(frozen=True)
class CurveFigure:
    task: str
    experiment: str
    png: bytes
    caption: str


def monitored_metric(rec: RunRecord) -> str:
    """The validation metric the run selected its checkpoint on, else its primary metric's counterpart."""
    selection = rec.data.get("selection")
    if isinstance(selection, dict) and isinstance(selection.get("metric"), str):
        return selection["metric"]
    return validation_metric(rec.primary_metric) if rec.primary_metric else "val/loss"


def read_log(path: Path, keys: tuple[str, ...]) -> dict[str, Curve]:
    """`keys` against the step from a log.jsonl of the run folder it is in (run_files.read_bytes); a step logged twice (a resumed run) keeps its last value,
    a line that is not JSON (a run killed mid-write) or nested too deep to parse is skipped, a value that is not
    finite or beyond ±DRAWABLE is a gap (NaN)."""
    curves: dict[str, Curve] = {key: {} for key in keys}
    try:
        text = run_files.read_bytes(path, path.parent, MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except run_files.NotShown as exc:
        warn(f"{path}: not read ({exc}); its run has no learning curve")
        return curves
    for line in text.splitlines():
        if not any(key in line for key in keys):   # most lines hold no key asked for: skip the parse
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int):
            continue
        for key in keys:
            value = row.get(key)
            if isinstance(value, (int, float)) and (number := as_float(value)) is not None:
                curves[key][step] = number if abs(number) <= DRAWABLE else math.nan   # NaN fails the test too
    return curves


def _band(curves: list[Curve]) -> tuple[list[int], list[float], list[float], list[float]]:
    """steps, mean, min, max over the runs that logged each step."""
    steps = sorted({step for curve in curves for step in curve})
    mean, low, high = [], [], []
    for step in steps:
        values = [curve[step] for curve in curves if step in curve and not math.isnan(curve[step])]
        mean.append(sum(values) / len(values) if values else math.nan)
        low.append(min(values) if values else math.nan)
        high.append(max(values) if values else math.nan)
    return steps, mean, low, high


def _labels(groups: list[SeedGroup]) -> list[str]:
    """The runs' axes (`softmax · dense · h4`), and where groups share them, the config values that tell
    those groups apart."""
    by_axes: dict[str, list[SeedGroup]] = {}
    for group in groups:
        by_axes.setdefault(group.first.label, []).append(group)
    labels = []
    for group in groups:
        label, alike = group.first.label, by_axes[group.first.label]
        varied = [key for key in varying_keys([g.first for g in alike]) if key != SEED_KEY] if len(alike) > 1 else []
        text = " ".join([label, *(f"{key}={fmt_value(group.first.config[key])}" for key in varied
                                  if key in group.first.config)])
        labels.append(text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…")
    return labels


def _smooth(values: list[float], window: int) -> list[float]:
    """A centred running mean over `window` logged steps (gaps stay gaps): a loss logged every few steps is
    too noisy to compare lines by."""
    half = window // 2
    out = []
    for index in range(len(values)):
        near = [v for v in values[max(0, index - half):index + half + 1] if not math.isnan(v)]
        out.append(math.nan if math.isnan(values[index]) or not near else sum(near) / len(near))
    return out


def _draw(lines: list[tuple[str, list[RunRecord], bool]], metric: str, title: str) -> tuple[bytes, bool]:
    """(PNG bytes, whether a logged value is a gap): (label, runs, completed) per line; completed lines are a
    mean and a min–max band. The labels, `metric` and `title` are drawn as written (sinks.mathtext)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg   # only a report with logs draws
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    val_ax, loss_ax = fig.subplots(1, 2)
    gaps = False
    for index, (label, runs, done) in enumerate(lines):
        logs = [read_log(rec.path / "log.jsonl", (metric, TRAIN_LOSS)) for rec in runs]
        gaps = gaps or any(math.isnan(value) for log in logs for curve in log.values() for value in curve.values())
        colour = f"C{index % 10}"
        for ax, key in ((val_ax, metric), (loss_ax, TRAIN_LOSS)):
            steps, mean, low, high = _band([log[key] for log in logs])
            if not steps:
                continue
            if key == TRAIN_LOSS and len(steps) > SMOOTH_ABOVE:
                mean, low, high = (_smooth(values, SMOOTH_WINDOW) for values in (mean, low, high))
            ax.plot(steps, mean, "-" if done else "--", color=colour, lw=1.4 if done else 1.0,
                    marker="o" if len(steps) < 30 and key == metric else None, ms=3,
                    label=mathtext(label) if key == metric else None)
            if len(runs) > 1:
                ax.fill_between(steps, low, high, color=colour, alpha=0.2, lw=0)
    val_ax.set(xlabel="step", ylabel=mathtext(metric), title=mathtext(f"{metric} (validation)"))
    smoothed = any(len(line.get_xdata()) > SMOOTH_ABOVE for line in loss_ax.lines)
    loss_ax.set(xlabel="step", ylabel=TRAIN_LOSS,
                title=f"training loss{f' (running mean of {SMOOTH_WINDOW} logged steps)' if smoothed else ''}")
    for ax in (val_ax, loss_ax):
        ax.grid(alpha=0.3)
    if val_ax.get_legend_handles_labels()[0]:
        fig.legend(loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    fig.suptitle(mathtext(title), fontsize="medium")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue(), gaps


def _caption(shown: list[SeedGroup], groups: list[SeedGroup], unfinished: list[RunRecord], drawn: int,
             gaps: bool) -> str:
    parts = [f"{len(shown)} group{'s' if len(shown) != 1 else ''} of completed runs (mean over seeds, band: "
             "lowest to highest seed)"]
    if len(groups) > len(shown):
        parts.append(f"the best {len(shown)} of {len(groups)} on validation drawn")
    if unfinished:
        parts.append(f"{drawn} run{'s' if drawn != 1 else ''} that did not complete dashed, never averaged"
                     + (f" ({len(unfinished) - drawn} more not drawn)" if len(unfinished) > drawn else ""))
    if gaps:
        parts.append(f"values logged as nan, inf or beyond ±{DRAWABLE:g} are gaps")
    return "; ".join(parts) + ". Every run is in the runs table."


def task_curves(records: list[RunRecord]) -> list[CurveFigure]:
    """One figure per (task, experiment) whose runs have a log.jsonl."""
    by_key: dict[tuple[str, str], list[RunRecord]] = {}
    for rec in records:
        if os.path.lexists(rec.path / "log.jsonl"):   # read_log names a link out or a FIFO
            by_key.setdefault((rec.task or "(unknown)", rec.experiment or "(none)"), []).append(rec)
    figures = []
    for (task, experiment), runs in sorted(by_key.items()):
        groups = seed_groups(runs)
        shown = sorted(sorted(groups, key=SeedGroup.rank, reverse=True)[:MAX_GROUPS], key=lambda g: g.first.display)
        unfinished = sorted((rec for rec in runs if rec.status != "completed"), key=sort_key)
        drawn = unfinished[:MAX_UNFINISHED]
        lines = [(label, group.runs, True) for label, group in zip(_labels(shown), shown)]
        lines += [(f"{rec.label} ({rec.status}: {rec.display})", [rec], False) for rec in drawn]
        metric = monitored_metric(shown[0].first if shown else runs[0])
        png, gaps = _draw(lines, metric, f"task={task}, experiment={experiment}")
        figures.append(CurveFigure(task, experiment, png, _caption(shown, groups, unfinished, len(drawn), gaps)))
    return figures
