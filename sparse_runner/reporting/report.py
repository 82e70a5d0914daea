"""sparse-report's command line: collect the runs, ask every registered paper for its tables and figures,
add one runs table per task, write markdown, CSV, LaTeX and report.html.

Reads every `metrics.json` below the given folders (and `.hydra/` of runs that never wrote one), and each
run's `log.jsonl` for report.html's learning curves. Writes into `<first path>/report` or `--out`:
`report.md`, one CSV and one LaTeX file per table, `report.html` (one self-contained page: tables, curves
and figures inline), and the papers' figures under `figures/` (PNG, whatever --formats says). The folder is
written as a whole (report_folder.py): built beside it, then swapped in, replacing an earlier report; a
folder that holds files sparse-report did not write is refused.

What it prints (`--print`): in a terminal, an overview (console.overview: the runs, the tables that hold
runs, a line per table without runs); to a pipe or a file, report.md's markdown. The last line, on stderr,
names the folder written and report.html.

Exit codes of `main`: 0 report written; 1 no runs found (nothing written); 2 bad input (unknown format,
a path that does not exist, an output folder that cannot be written or holds files not of a report).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparse_runner.checks import one_line
from sparse_runner.io import atomic_write_text
from sparse_runner.reporting import sinks
from sparse_runner.reporting.console import PROG, overview, say
from sparse_runner.reporting.curves import task_curves
from sparse_runner.reporting.filled import classify_all
from sparse_runner.reporting.page import PaperPart, render_page
from sparse_runner.reporting.papers import papers
from sparse_runner.reporting.render import FORMATS, render_markdown, write_report
from sparse_runner.reporting.report_folder import Refused, building
from sparse_runner.reporting.runs import RunRecord, collect_runs, status_rank
from sparse_runner.reporting.runs_table import runs_tables


def _summary(records: list[RunRecord], roots: list[str]) -> str:
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.status] = counts.get(rec.status, 0) + 1
    by_status = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=status_rank))
    return f"{len(records)} run(s) under {', '.join(roots)}: {by_status}."


def _parse_formats(text: str) -> list[str]:
    formats = [item.strip().lower() for item in text.split(",") if item.strip()]
    for item in formats:
        if item not in FORMATS:
            raise ValueError(f"unknown format '{item}'; valid: {', '.join(FORMATS)}")
    if not formats:
        raise ValueError(f"no format given; valid: {', '.join(FORMATS)}")
    return formats


def _bad_path(paths: list[str], defaulted: bool) -> tuple[int, str] | None:
    """(exit code, message) for the first path that is not a folder of runs, or None."""
    for path in paths:
        if not Path(path).exists():
            if defaulted:  # the default folder is absent: nothing has been run here yet
                return 1, f"no runs found (no '{path}' folder here); create one with: sparse-run"
            return 2, f"no such directory: {path}"
        if not Path(path).is_dir():
            return 2, f"not a directory: {path}"
    return None


def _paper_parts(records: list[RunRecord], out_dir: Path) -> tuple[list[PaperPart], list[Path]]:
    """Each paper's tables, classified against the same tables made from no runs (filled.py), and its
    figures, drawn into `out_dir`; and the files drawn."""
    parts, written = [], []
    for paper in papers():
        sections, drawn = paper.sections(records, out_dir)
        parts.append(PaperPart(classify_all(paper.tables(records), paper.tables([])), sections))
        written += drawn
    return parts, written


def main(argv: list[str] | None = None) -> int:
    """`sparse-report [PATH ...] [--out DIR] [--formats md,csv,tex,html] [--print overview|md|none]`; see the
    module docstring for exit codes."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Collect run directories (metrics.json, log.jsonl) and write the paper tables next to the "
                    "published numbers as report.html (with learning curves and figures), markdown, CSV and "
                    "LaTeX, and the papers' analysis figures (PNG).",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="folders to search for runs, recursively (default: outputs)")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default: <first PATH>/report)")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help=f"comma-separated subset of {','.join(FORMATS)} (default: all); the analysis "
                             "figures are written as PNG whatever this says")
    parser.add_argument("--print", dest="show", choices=("overview", "md", "none"),
                        help="what goes to stdout: the overview (default in a terminal), report.md's markdown "
                             "(default to a pipe or file, when md is written), or nothing")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and its one-line error (or --help)
        return int(exc.code or 0)

    try:
        formats = _parse_formats(args.formats)
    except ValueError as exc:
        say(str(exc))
        return 2

    paths = args.paths or ["outputs"]
    bad = _bad_path(paths, defaulted=not args.paths)
    if bad:
        say(bad[1])
        return bad[0]

    records = collect_runs(paths)
    if not records:
        say(f"no runs found under {', '.join(paths)}; create one with: sparse-run")
        return 1

    out_dir = Path(args.out) if args.out else Path(paths[0]) / "report"
    summary = _summary(records, paths)
    try:
        with building(out_dir) as build:
            parts, written = _paper_parts(records, build)
            paper = [filled for part in parts for filled in part.tables]
            runs = runs_tables(records)
            tables = [filled.table for filled in paper] + runs
            markdown = render_markdown(tables, summary, [section for part in parts for section in part.sections])
            written += write_report(tables, markdown, build, formats)
            if "html" in formats:
                curves = task_curves(records)
                atomic_write_text(build / "report.html",
                                  render_page(summary, records, runs, parts, curves, out_dir, figures_dir=build))
                written.append(build / "report.html")
    except Refused as exc:
        say(str(exc))
        return 2
    except OSError as exc:
        say(f"cannot write the report to {out_dir}: {one_line(exc)}")
        return 2
    page = out_dir / "report.html"
    show = args.show or ("overview" if sys.stdout.isatty() else "md" if "md" in formats else "none")
    if show == "md":
        sys.stdout.write(sinks.terminal(markdown, keep_newlines=True))   # report.md as written: no control character
    elif show == "overview":
        sys.stdout.write(overview(summary, runs, paper))
    sys.stdout.flush()   # before the last line, on stderr, when both go to one pipe
    say(f"wrote {len(written)} file(s) to {out_dir}" + (f"; open {page}" if "html" in formats else ""))
    return 0
