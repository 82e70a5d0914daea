"""report.html: what a person opens after a sweep, the verdicts first.

1. The claims (the paper registered as "claims"): per claim its statement, the two arms, the difference
   with its interval and the verdict, in a table that fits the screen; the rest of each claim's row (paper,
   published numbers, setting, design, p and Holm p, n needed, published comparison, shared arms, commits, compute)
   folded under its statement, claims without runs folded below.
2. The paper tables that hold runs, their empty rows of ours folded into one line (filled.py), each paper's
   figures after its tables; then one line per paper table without runs, the table folded under it.
3. The runs, a section per task: the learning curves of each experiment (curves.py), the runs table (seeds
   as mean ± std (n)), every run on a row of its own with links to its folder and files, and the figures the
   runs drew (alpha trajectories, Pathfinder examples, then each run's analysis figures).

A table wider than the page scrolls inside its own box; notes fold under one line. A run's file is linked
or inlined only when it is a regular file inside the run folder (run_files.file_problem, html.read_png); any
other is named with the reason.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sparse_runner.reporting import html, run_files
from sparse_runner.reporting.claims import NOT_RUN
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


def _run_folder(rec: RunRecord, name: str) -> Path | None:
    """The run's subfolder `name` when it is a folder inside the run folder (not a link out of it)."""
    folder = rec.path / name
    try:
        inside = folder.is_dir() and folder.resolve().is_relative_to(rec.path.resolve())
    except (OSError, RuntimeError):
        return None
    return folder if inside else None


def _outputs(rec: RunRecord) -> list[Path]:
    """What the run's task wrote beside its results (the Pathfinder examples, an LM's sample): every entry
    of its outputs folder but subfolders."""
    folder = _run_folder(rec, OUTPUTS)
    return sorted(path for path in folder.iterdir() if not path.is_dir()) if folder else []


def _run_figures(rec: RunRecord) -> list[Path]:
    folder = _run_folder(rec, "figures")
    return sorted(folder.glob("*.png")) if folder else []


def _examples(rec: RunRecord) -> Path | None:
    return next((path for path in _outputs(rec) if path.name == EXAMPLES), None)


def _file_link(rec: RunRecord, path: Path, out_dir: Path) -> str:
    name = path.relative_to(rec.path).as_posix()
    problem = run_files.file_problem(path, rec.path)
    if problem:
        return f'<span class="skipped">{html.esc(name)} (not linked: {html.esc(problem)})</span>'
    return f'<a href="{html.href(path, out_dir)}">{html.esc(name)}</a>'


def _files_cell(rec: RunRecord, out_dir: Path) -> str:
    files = [rec.path / name for name in RUN_FILES if os.path.lexists(rec.path / name)]
    return " ".join(_file_link(rec, path, out_dir) for path in files + _run_figures(rec) + _outputs(rec))


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


def _figure_file(rec: RunRecord, path: Path, caption: str) -> str:
    """The run's figure at `path` inlined, or the line that names it and says why it is not."""
    try:
        return html.figure(html.read_png(path, rec.path), caption)
    except run_files.NotShown as exc:
        return html.skipped(f"{rec.display}/{path.relative_to(rec.path).as_posix()}", str(exc))


def run_figures(runs: list[RunRecord]) -> list[str]:
    """The figures the runs drew: alpha trajectories and the Pathfinder examples shown, each run's analysis
    figures folded; of one run per group of seeds (its best on validation), the best groups first."""
    groups = sorted(seed_groups(runs), key=lambda group: group.rank(), reverse=True)
    chosen = [group.best for group in groups][:MAX_FIGURE_RUNS]
    parts = []
    examples = next(((rec, path) for rec in sorted(runs, key=sort_key) if (path := _examples(rec))), None)
    if examples is not None:
        parts.append(_figure_file(examples[0], examples[1],
                                  f"Test examples with their labels (`{examples[0].display}`)"))
    for rec in chosen:
        trajectory = next((path for path in _run_figures(rec) if path.name == ALPHA_TRAJECTORIES), None)
        if trajectory is not None:
            parts.append(_figure_file(rec, trajectory,
                                      f"Learned α per head during training, {rec.label} (`{rec.display}`)"))
    analysed = [(rec, [path for path in _run_figures(rec) if path.name != ALPHA_TRAJECTORIES])
                for rec in chosen]
    analysed = [(rec, paths) for rec, paths in analysed if paths]
    if analysed:
        gallery = "".join(
            f"<h3>{html.esc(rec.label)} <code>{html.esc(rec.display)}</code></h3><div class=\"gallery\">"
            + "".join(_figure_file(rec, path, path.stem.replace("_", " ")) for path in paths) + "</div>"
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


# ----------------------------------------------------------------------------------------- claims
CLAIMS = "claims"                                                       # the claims table's slug
CLAIM_COLUMNS = ("claim", "treatment", "baseline", "result", "verdict")  # shown; the others fold per claim
CLAIM_SUMMARY = "paper"     # the folded column whose text opens a claim's details
# column widths (%) that fit 1280 px: the statement wraps, the numbers keep to a line or two
_CLAIM_WIDTHS = {"claim": 34, "treatment": 19, "baseline": 19, "result": 17, "verdict": 11}


def _claim_row(tab: Table, row: list[str]) -> str:
    columns = {header: index for index, header in enumerate(tab.headers)}
    folded = [i for i, header in enumerate(tab.headers)
              if header not in CLAIM_COLUMNS and header != CLAIM_SUMMARY and row[i].strip()]
    cells = []
    for name in (name for name in CLAIM_COLUMNS if name in columns):
        text = row[columns[name]]
        if name == "claim":
            opener = row[columns[CLAIM_SUMMARY]] if CLAIM_SUMMARY in columns else "details"
            details = "".join(f"<dt>{html.esc(tab.headers[i])}</dt><dd>{html.inline(row[i])}</dd>" for i in folded)
            cell = html.inline(text) + (f"<details><summary>{html.esc(opener)}</summary><dl>{details}</dl></details>"
                                        if details else "")
        elif name == "verdict":
            cell = f'<span class="verdict verdict-{slug(text).replace("_", "-")}">{html.esc(text)}</span>'
        else:
            cell = html.esc(text)
        cells.append(f'<td class="{name}">{cell}</td>')
    return "<tr>" + "".join(cells) + "</tr>"


def _claims_table(tab: Table, rows: list[list[str]]) -> str:
    shown = [name for name in CLAIM_COLUMNS if name in tab.headers]
    widths = "".join(f'<col style="width:{_CLAIM_WIDTHS[name]}%">' for name in shown)
    head = "".join(f'<th class="{name}">{html.esc(name)}</th>' for name in shown)
    return (f'<div class="scroll"><table class="claims"><colgroup>{widths}</colgroup><thead><tr>{head}</tr>'
            f'</thead><tbody>{"".join(_claim_row(tab, row) for row in rows)}</tbody></table></div>')


def claims_section(filled: Filled) -> list[str]:
    """The claims with runs, each on a row that fits the screen (module docstring); the claims without
    runs folded into one line below them; the notes (the rule of the verdicts) folded last."""
    tab = filled.table
    column = tab.headers.index("verdict") if "verdict" in tab.headers else None

    def verdict(row: list[str]) -> str:
        return row[column] if column is not None else ""

    tested = [row for row in tab.rows if verdict(row) != NOT_RUN]
    not_run = [row for row in tab.rows if verdict(row) == NOT_RUN]
    tally = ", ".join(f"{count} {name}" for name, count in Counter(map(verdict, tested)).items() if name)
    parts = [f'<h2 id="{html.anchor(tab.title)}">{html.esc(tab.title)}</h2>']
    if tested:
        parts.append(f'<p class="fold">{len(tested)} claim{"s" if len(tested) != 1 else ""} with runs'
                     + (f": {html.esc(tally)}" if tally else "") + ". Result: treatment minus baseline with its "
                     "95 % interval; each claim's paper opens its setting, design (test), p and Holm p, the runs "
                     "an inconclusive claim needs, the published comparison, shared arms, the commits its runs ran and compute.</p>")
        parts.append(_claims_table(tab, tested))
    if not_run:
        parts.append(f"<details><summary>{len(not_run)} claim{'s' if len(not_run) != 1 else ''} without runs"
                     f"</summary>{_claims_table(tab, not_run)}</details>")
    parts.append(html.notes(tab.notes))
    return parts


# ------------------------------------------------------------------------------------------- page
def _contents(entries: list[tuple[str, str]]) -> str:
    return "<nav><b>Contents</b><ul>" + "".join(
        f'<li><a href="#{html.anchor(title)}">{html.esc(title)}</a>{html.esc(note)}</li>' for title, note in entries
    ) + "</ul></nav>"


def render_page(summary: str, records: list[RunRecord], runs_tables: list[Table], parts: list[PaperPart],
                curves: list[CurveFigure], out_dir: Path, figures_dir: Path | None = None) -> str:
    """The whole page, in the module docstring's order. Links are relative to `out_dir`, where the page
    goes; the papers' figures are inlined from `figures_dir` (default `out_dir`: the folder the report is
    built in), the runs' figures from their folders."""
    figures_dir = figures_dir or out_dir
    verdicts = [piece for part in parts for filled in part.tables if filled.table.slug == CLAIMS
                for piece in claims_section(filled)]
    body, contents = [], []
    for part in parts:
        for filled in part.tables:
            if filled.has_runs and filled.table.slug != CLAIMS:
                body += paper_table(filled)
                contents.append((filled.table.title, ""))
        body += [html.markdown_section(section, figures_dir) for section in part.sections]
    empty = [filled for part in parts for filled in part.tables if not filled.has_runs and filled.table.slug != CLAIMS]
    if empty:
        title = "Paper tables without runs"
        body += [f'<h2 id="{html.anchor(title)}">{title}</h2>',
                 "<p class=\"fold\">Each line opens its table: the published numbers and the command of every "
                 "empty cell.</p>", *(empty_table(filled) for filled in empty)]
        contents.append((title, f" ({len(empty)})"))

    by_task: dict[str, list[RunRecord]] = {}
    for rec in records:
        by_task.setdefault(rec.task or "(unknown)", []).append(rec)
    tables_by_slug = {tab.slug: tab for tab in runs_tables}
    for task in sorted(by_task, key=lambda t: (t == "(unknown)", t)):
        body += task_section(task, by_task[task], tables_by_slug.get(f"runs_{slug(task)}"),
                             [c for c in curves if c.task == task], out_dir)
        contents.append((f"Runs: task={task}", f" ({len(by_task[task])})"))
    head = ["<h1>sparse-report</h1>", f'<p class="summary">{html.inline(summary)}</p>']
    return html.page("sparse-report", head + verdicts + [_contents(contents)] + body)
