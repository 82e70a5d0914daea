"""How sparse-report talks to its user: one line per message on stderr, named after the program; and the
overview it prints in a terminal, what matters first.

The overview: the runs found (a runs table per task), the paper tables that hold runs (their empty rows of
ours folded into one line), then one line per paper table without runs; the line after it names
report.html. Notes,
figures and curves are in the report files.

Everything printed goes through sinks.terminal: a folder name or a run's error may hold escape sequences.
"""

from __future__ import annotations

import dataclasses
import sys

from sparse_runner.reporting import sinks
from sparse_runner.reporting.filled import Filled
from sparse_runner.reporting.render import Table, render_markdown_table

PROG = "sparse-report"
MAX_ROWS = 25   # rows of one table in a terminal; the files hold them all


def say(message: str) -> None:
    """`message` on one line of stderr, after the program's name, with no control character."""
    print(f"{PROG}: {sinks.terminal(message)}", file=sys.stderr)


def warn(message: str) -> None:
    say(f"warning: {message}")


def _table(table: Table, rows: list[list[str]], after: str = "") -> list[str]:
    lines = ["", f"## {table.title}", "",
             render_markdown_table(dataclasses.replace(table, rows=rows[:MAX_ROWS]), escape=sinks.terminal)]
    if len(rows) > MAX_ROWS:
        lines.append(f"... {len(rows) - MAX_ROWS} more rows in the report files")
    if after:
        lines.append(after)
    return lines


def overview(summary: str, runs_tables: list[Table], paper_tables: list[Filled]) -> str:
    """The terminal's text (module docstring), its lines kept and every control character in them removed;
    the line after it, on stderr, names report.html."""
    lines = [summary]
    for table in runs_tables:
        lines += _table(table, table.rows)
    for filled in paper_tables:
        if filled.has_runs:
            lines += _table(filled.table, filled.shown_rows,
                            f"+ {filled.fold_line()}" if filled.empty_rows else "")
    empty = [filled for filled in paper_tables if not filled.has_runs]
    if empty:
        lines += ["", "Paper tables without runs:"]
        lines += [f"- {filled.table.title}: {filled.fold_line()}" for filled in empty]
    return sinks.terminal("\n".join(lines) + "\n", keep_newlines=True)
