"""Which paper tables hold runs, and which of their rows of ours are still empty: what the terminal and
report.html show first, and what they fold into one line.

Tables are lists of strings, drawn by each paper in its own way, so this reads them as a reader would:

- a **fill cell** is `run: <command>`, the empty cell of ours that says how to fill it;
- a **result column** is one that holds a fill cell in some row (the columns runs fill);
- an **empty row of ours** has a fill cell, nothing in its result columns but fill cells or blanks, and
  nothing under a `published` header (folding it must not hide a published number);
- a **published row** has a cell that starts with `published` (a `source` column).

A paper's tables made from no runs at all are the baseline: a table that equals its baseline holds no run
(Bhojanapalli et al.'s tables have no fill cells, only published and computed columns). A table holds
runs when it differs from its baseline, or has none, and some row is neither in the baseline, nor
published, nor an empty row of ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparse_runner.reporting.render import Table

FILL = "run: "
_NOTE_COMMAND = re.compile(r"`(sparse-run [^`]+)`")


def is_fill(cell: str) -> bool:
    return cell.startswith(FILL)


def fill_command(cell: str) -> str:
    return cell[len(FILL):].strip()


@dataclass
class Filled:
    """One table as the overview shows it."""

    table: Table
    has_runs: bool
    empty_rows: list[int] = field(default_factory=list)   # indices of the empty rows of ours, folded

    @property
    def shown_rows(self) -> list[list[str]]:
        """The rows a table with runs shows in full: every row but the empty ones of ours."""
        folded = set(self.empty_rows)
        return [row for index, row in enumerate(self.table.rows) if index not in folded]

    def _fill_cells(self) -> list[str]:
        rows = self.empty_rows if self.has_runs else range(len(self.table.rows))
        return [fill_command(cell) for index in rows for cell in self.table.rows[index] if is_fill(cell)]

    def fold_line(self) -> str:
        """One line for what is folded: how many rows (or that the table has no run yet) and a command that
        fills one of its cells; a table without fill cells gives the first command of its notes."""
        cells = self._fill_cells()
        if cells:
            start = f"; `{cells[0]}` fills one of {len(cells)} empty cells" if len(cells) > 1 else f"; fill: `{cells[0]}`"
        else:
            commands = [match for note in self.table.notes for match in _NOTE_COMMAND.findall(note)]
            start = f"; fill: `{commands[0]}`" if commands else ""
        if not self.has_runs:
            return f"no runs yet{start}"
        count = len(self.empty_rows)
        return f"{count} row{'s' if count != 1 else ''} of ours without runs{start}"


def _result_columns(table: Table) -> set[int]:
    return {index for row in table.rows for index, cell in enumerate(row) if is_fill(cell)}


def _published_columns(table: Table) -> set[int]:
    return {index for index, header in enumerate(table.headers) if "published" in header.lower()}


def is_published_row(row: list[str]) -> bool:
    return any(cell.startswith("published") for cell in row)


def empty_rows(table: Table) -> list[int]:
    """The indices of the empty rows of ours (module docstring)."""
    results, published = _result_columns(table), _published_columns(table)
    return [index for index, row in enumerate(table.rows)
            if any(is_fill(cell) for cell in row)
            and not any(row[i].strip() for i in published if i < len(row))
            and all(not row[i].strip() or is_fill(row[i]) for i in results if i < len(row))]


def classify(table: Table, baseline: Table | None) -> Filled:
    """`table` against the same table made from no runs (None where the paper makes none without runs)."""
    empty = empty_rows(table)
    if baseline is not None and baseline.rows == table.rows and baseline.headers == table.headers:
        return Filled(table, has_runs=False, empty_rows=empty)
    known = {tuple(row) for row in baseline.rows} if baseline is not None else set()
    folded = set(empty)
    has_runs = any(tuple(row) not in known and not is_published_row(row) and index not in folded
                   for index, row in enumerate(table.rows))
    return Filled(table, has_runs=has_runs, empty_rows=empty)


def classify_all(tables: list[Table], baselines: list[Table]) -> list[Filled]:
    """Each of a paper's tables against its baseline of the same slug."""
    by_slug = {table.slug: table for table in baselines}
    return [classify(table, by_slug.get(table.slug)) for table in tables]
