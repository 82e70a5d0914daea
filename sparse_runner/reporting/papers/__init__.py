"""The papers sparse-report regenerates tables of, by name, in the order the report shows them.

A paper is any object (here: a module) with the `Paper` interface: its tables from the collected runs,
and the markdown sections (figures) it draws into the report folder. Its published numbers and the
commands that fill its cells live beside it. Adding a paper is adding a module and one PAPERS entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sparse_runner.reporting.papers import bhojanapalli2020, correia2019, ernie_sparse, lra
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord


class Paper(Protocol):
    CITATION: str

    def tables(self, records: list[RunRecord]) -> list[Table]:
        """Its tables, published numbers beside ours; a paper without runs may still show what to run."""

    def sections(self, records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
        """Markdown sections after the tables, and the files it wrote under `out_dir` to show them."""


PAPERS: dict[str, Paper] = {
    "lra": lra,
    "correia2019": correia2019,
    "bhojanapalli2020": bhojanapalli2020,
    "ernie_sparse": ernie_sparse,
}


def paper_tables(records: list[RunRecord]) -> list[Table]:
    return [table for paper in PAPERS.values() for table in paper.tables(records)]


def paper_sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    sections: list[str] = []
    written: list[Path] = []
    for paper in PAPERS.values():
        more_sections, more_written = paper.sections(records, out_dir)
        sections += more_sections
        written += more_written
    return sections, written
