"""sparse-report's command line: collect the runs, ask every registered paper for its tables and figures,
add one runs table per task, write markdown, CSV and LaTeX.

Reads every `metrics.json` below the given folders (and `.hydra/` of runs that never wrote one). Writes,
atomically, into `<first path>/report` or `--out`: `report.md` (also on stdout), one CSV and one LaTeX
file per table, and the papers' figures under `figures/` (PNG, whatever --formats says).

Exit codes of `main`: 0 report written; 1 no runs found (nothing written); 2 bad input (unknown format,
a path that does not exist, an output folder that cannot be written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparse_runner.checks import one_line
from sparse_runner.reporting.console import PROG, say
from sparse_runner.reporting.papers import paper_sections, paper_tables
from sparse_runner.reporting.render import FORMATS, render_markdown, write_report
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


def main(argv: list[str] | None = None) -> int:
    """`sparse-report [PATH ...] [--out DIR] [--formats md,csv,tex]`; see the module docstring for exit codes."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Collect run directories (metrics.json) and write the paper tables next to the "
                    "published numbers as markdown, CSV and LaTeX, and the paper's analysis figures (PNG).",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="folders to search for runs, recursively (default: outputs)")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default: <first PATH>/report)")
    parser.add_argument("--formats", default="md,csv,tex",
                        help="comma-separated subset of md,csv,tex (default: all three); the analysis "
                             "figures are written as PNG whatever this says")
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

    tables = paper_tables(records) + runs_tables(records)
    out_dir = Path(args.out) if args.out else Path(paths[0]) / "report"
    try:
        sections, written = paper_sections(records, out_dir)
        markdown = render_markdown(tables, _summary(records, paths), sections)
        written += write_report(tables, markdown, out_dir, formats)
    except OSError as exc:
        say(f"cannot write the report to {out_dir}: {one_line(exc)}")
        return 2
    if "md" in formats:
        sys.stdout.write(markdown)
    say(f"wrote {len(written)} file(s) to {out_dir}")
    return 0
