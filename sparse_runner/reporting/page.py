"""report.html: what a person opens after a sweep, in the order the terminal tells it.

1. The runs, a section per task: the learning curves of each experiment (curves.py), the runs table (seeds
   as mean ± std (n)), every run on a row of its own with links to its folder and files, and the figures the
   runs drew (alpha trajectories, Pathfinder examples, then each run's analysis figures).
2. The paper tables that hold runs, their empty rows of ours folded into one line (filled.py), each paper's
   figures after its tables.
3. One line per paper table without runs, the table itself folded under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sparse_runner.reporting import html
from sparse_runner.reporting.curves import CurveFigure
from sparse_runner.reporting.filled import Filled
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, sort_key
from sparse_runner.reporting.runs_table import _note as run_note   # why a run has no result: one wording
from sparse_runner.reporting.seeds import seed_groups
from sparse_runner.reporting.values import as_float, fmt_number, pct, slug

RUN_FILES = ("metrics.json", "log.jsonl", "config.yaml", ".hydra/config.yaml", "sparse_run.log")
OUTPUTS = "outputs"                 # the task's own files in a run directory
EXAMPLES = "pathfinder_examples.png"
ALPHA_TRAJECTORIES = "alpha_trajectories.png"
OPEN_RUN_LIST = 30       # a task's list of runs is open up to this many runs, folded above
MAX_FIGURE_RUNS = 6      # runs whose analysis figures a task section inlines (one per group, best first)


@dataclass
class PaperPart:
    """One paper's tables (classified) and the markdown sections of its figures."""

    tables: list[Filled]
    sections: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- runs
def _metric(name: str | None, value: float | None) -> str:
    if value is None:
        return ""
    return pct(value) if name and name.endswith("accuracy") else fmt_number(value, ".4g")


def _outputs(rec: RunRecord) -> list[Path]:
    """What the run's task wrote beside its results (the Pathfinder examples, an LM's sample)."""
    folder = rec.path / OUTPUTS
    return sorted(path for path in folder.iterdir() if path.is_file()) if folder.is_dir() else []


def _run_figures(rec: RunRecord) -> list[Path]:
    folder = rec.path / "figures"
    return sorted(folder.glob("*.png")) if folder.is_dir() else []


def _examples(rec: RunRecord) -> Path | None:
    return next((path for path in _outputs(rec) if path.name == EXAMPLES), None)


def _files_cell(rec: RunRecord, out_dir: Path) -> str:
    files = [rec.path / name for name in RUN_FILES if (rec.path / name).is_file()] + _run_figures(rec) + _outputs(rec)
    return " ".join(f'<a href="{html.href(path, out_dir)}">{html.esc(path.relative_to(rec.path).as_posix())}</a>'
                    for path in files)


# run list columns: run .. step on one line, the numbers right-aligned, note and files wrapping
_RUN_LIST_CSS = {**dict.fromkeys(range(5), "short"), **dict.fromkeys(range(5, 10), "num short"), 11: "files"}


def run_list(runs: list[RunRecord], out_dir: Path) -> str:
    """Every run on a row of its own: what it computed, how far it got, its results, and its files."""
    headers = ["run", "status", "model", "experiment", "seed", "step", "test", "best val", "wall time (s)",
               "tokens/s", "note", "files"]
    rows = []
    for rec in sorted(runs, key=sort_key):
        step, max_steps = rec.data.get("step"), rec.data.get("max_steps")
        status = html.esc(rec.status)
        cells = [
            f'<a href="{html.href(rec.path, out_dir)}/">{html.esc(rec.display)}</a>',
            f'<span class="status-{slug(rec.status).replace("_", "-")}">{status}</span>',
            html.esc(rec.label), html.esc(rec.experiment or ""), html.esc(rec.config.get("seed", "")),
            html.esc(f"{step}/{max_steps}" if step is not None and max_steps is not None else (step or "")),
            html.esc(_metric(rec.primary_metric, rec.primary_value)),
            html.esc(_metric(rec.primary_metric, rec.validation_value)),
            html.esc(fmt_number(rec.data.get("wall_time_s"), ".1f")),
            html.esc(fmt_number(rec.data.get("tokens_per_second"), ".0f")),
            html.esc(run_note(rec)), _files_cell(rec, out_dir),
        ]
        rows.append("<tr>" + "".join(f'<td class="{_RUN_LIST_CSS.get(i, "")}">{cell}</td>'
                                     for i, cell in enumerate(cells)) + "</tr>")
    head = "".join(f"<th>{html.esc(h)}</th>" for h in headers)
    metric = next((rec.primary_metric for rec in runs if rec.primary_metric), "")
    summary = (f"Every run ({len(runs)}), with its folder and files"
               + (f"; test = {metric}, best val = its validation counterpart" if metric else ""))
    return (f'<details{" open" if len(runs) <= OPEN_RUN_LIST else ""}><summary>{html.esc(summary)}</summary>'
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            "</div></details>")


def _figure_file(path: Path, caption: str) -> str:
    try:
        return html.figure(path.read_bytes(), caption)
    except OSError:
        return ""


def run_figures(runs: list[RunRecord]) -> list[str]:
    """The figures the runs drew: alpha trajectories and the Pathfinder examples shown, each run's analysis
    figures folded; of one run per group of seeds (its best on validation), the best groups first."""
    groups = sorted(seed_groups(runs), key=lambda group: group.rank(), reverse=True)
    chosen = [group.best for group in groups][:MAX_FIGURE_RUNS]
    parts = []
    examples = next(((rec, path) for rec in sorted(runs, key=sort_key) if (path := _examples(rec))), None)
    if examples is not None:
        parts.append(_figure_file(examples[1], f"Test examples with their labels (`{examples[0].display}`)"))
    for rec in chosen:
        trajectory = rec.path / "figures" / ALPHA_TRAJECTORIES
        if trajectory.is_file():
            parts.append(_figure_file(trajectory, f"Learned α per head during training, {rec.label} (`{rec.display}`)"))
    analysed = [(rec, [path for path in _run_figures(rec) if path.name != ALPHA_TRAJECTORIES])
                for rec in chosen]
    analysed = [(rec, paths) for rec, paths in analysed if paths]
    if analysed:
        gallery = "".join(
            f"<h3>{html.esc(rec.label)} <code>{html.esc(rec.display)}</code></h3><div class=\"gallery\">"
            + "".join(_figure_file(path, path.stem.replace("_", " ")) for path in paths) + "</div>"
            for rec, paths in analysed)
        more = f", the best {len(chosen)} of {len(groups)} groups" if len(groups) > len(chosen) else ""
        parts.append(f"<details><summary>Analysis figures of {len(analysed)} run(s){more} (one per group "
                     f"of seeds: its best on validation)</summary>{gallery}</details>")
    return parts


def task_section(task: str, runs: list[RunRecord], runs_table: Table | None, curves: list[CurveFigure],
                 out_dir: Path) -> list[str]:
    title = f"Runs: task={task}"
    parts = [f'<h2 id="{html.anchor(title)}">{html.esc(title)}</h2>']
    for curve in curves:
        parts.append(html.figure(curve.png, f"Learning curves, experiment={curve.experiment}: {curve.caption}"))
    if runs_table is not None:
        parts += [html.table(runs_table), html.notes(runs_table.notes)]
    parts.append(run_list(runs, out_dir))
    parts += run_figures(runs)
    return parts


# ----------------------------------------------------------------------------------------- papers
def paper_table(filled: Filled) -> list[str]:
    """A table that holds runs: its rows but the empty ones of ours, which fold into one line."""
    tab = filled.table
    parts = [f'<h2 id="{html.anchor(tab.title)}">{html.esc(tab.title)}</h2>',
             html.table(tab, [i for i in range(len(tab.rows)) if i not in set(filled.empty_rows)])]
    if filled.empty_rows:
        parts.append(f"<details><summary>{html.inline(filled.fold_line())}</summary>"
                     f"{html.table(tab, filled.empty_rows)}</details>")
    parts.append(html.notes(tab.notes))
    return parts


def empty_table(filled: Filled) -> str:
    """One line for a table without runs; the table (published numbers, fill commands) folded under it."""
    tab = filled.table
    return (f'<details id="{html.anchor(tab.title)}"><summary><b>{html.esc(tab.title)}</b>: '
            f"{html.inline(filled.fold_line())}</summary>{html.table(tab)}{html.notes(tab.notes)}</details>")


# ------------------------------------------------------------------------------------------- page
def _contents(entries: list[tuple[str, str]]) -> str:
    return "<nav><b>Contents</b><ul>" + "".join(
        f'<li><a href="#{html.anchor(title)}">{html.esc(title)}</a>{html.esc(note)}</li>' for title, note in entries
    ) + "</ul></nav>"


def render_page(summary: str, records: list[RunRecord], runs_tables: list[Table], parts: list[PaperPart],
                curves: list[CurveFigure], out_dir: Path) -> str:
    """The whole page; images from `out_dir` (the papers' figures) and the runs' folders are inlined."""
    by_task: dict[str, list[RunRecord]] = {}
    for rec in records:
        by_task.setdefault(rec.task or "(unknown)", []).append(rec)
    tables_by_slug = {tab.slug: tab for tab in runs_tables}
    body, contents = [], []
    for task in sorted(by_task, key=lambda t: (t == "(unknown)", t)):
        body += task_section(task, by_task[task], tables_by_slug.get(f"runs_{slug(task)}"),
                             [c for c in curves if c.task == task], out_dir)
        contents.append((f"Runs: task={task}", f" ({len(by_task[task])})"))

    for part in parts:
        with_runs = [filled for filled in part.tables if filled.has_runs]
        for filled in with_runs:
            body += paper_table(filled)
            contents.append((filled.table.title, ""))
        body += [html.markdown_section(section, out_dir) for section in part.sections]
    empty = [filled for part in parts for filled in part.tables if not filled.has_runs]
    if empty:
        title = "Paper tables without runs"
        body += [f'<h2 id="{html.anchor(title)}">{title}</h2>',
                 "<p class=\"fold\">Each line opens its table: the published numbers and the command of every "
                 "empty cell.</p>", *(empty_table(filled) for filled in empty)]
        contents.append((title, f" ({len(empty)})"))
    head = ["<h1>sparse-report</h1>", f'<p class="summary">{html.inline(summary)}</p>', _contents(contents)]
    return html.page("sparse-report", head + body)
