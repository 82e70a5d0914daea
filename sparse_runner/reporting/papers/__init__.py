"""The papers sparse-report regenerates tables of: a registry (sparse_runner.registry, the one registration
style of tasks, patterns, normalisers and regularisers), shown in the order of their `order` attribute.

A paper is any object (here: a module) with the `Paper` interface: its tables from the collected runs, and
the markdown sections (figures) it draws into the report folder. Its published numbers and the commands that
fill its cells live beside it. It registers itself where it is defined:

    register_paper("lra", order=10)(sys.modules[__name__])

Every module of this package is imported when the registry is first read, so adding a paper is adding a
module or a subpackage (one per paper) here; another installed package adds one through the entry-point group `sparse_runner.papers`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Protocol, TypeVar

from sparse_runner.registry import Registry
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord


class Paper(Protocol):
    CITATION: str
    order: float   # where the report shows it, lowest first (set by register_paper)

    def tables(self, records: list[RunRecord]) -> list[Table]:
        """Its tables, published numbers beside ours; a paper without runs may still show what to run."""

    def sections(self, records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
        """Markdown sections after the tables, and the files it wrote under `out_dir` to show them."""


PAPERS: Registry[Paper] = Registry("paper table", package="sparse_runner.reporting.papers",
                                   entry_points="sparse_runner.papers")
P = TypeVar("P")


def register_paper(name: str, *, order: float) -> Callable[[P], P]:
    """Decorator (or call on a module): make a paper available as `name`, shown at `order` among the papers."""
    return PAPERS.register(name, order=order)


def papers() -> list[Paper]:
    """Every registered paper in report order (`order`, then name: deterministic whatever imports first)."""
    return sorted(PAPERS.values(), key=lambda paper: (getattr(paper, "order", math.inf), getattr(paper, "name", "")))


def paper_tables(records: list[RunRecord]) -> list[Table]:
    return [table for paper in papers() for table in paper.tables(records)]
