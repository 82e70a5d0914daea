"""Liu et al., "ERNIE-SPARSE: Learning Hierarchical Efficient Transformer Through Regularized
Self-Attention", arXiv 2022: registered, no tables yet.

Its place in the report: the LRA average (57.78 against BigBird's 55.01) and the HST/SAR ablations beside
our runs (PAPERS.md C; its per-task numbers are unconfirmed). Its LRA rows will share the task families of
`lra`. The published numbers and fill commands will live here.
"""

from __future__ import annotations

from pathlib import Path

from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord

CITATION = "Liu et al., arXiv 2203.12276, 2022"


def tables(records: list[RunRecord]) -> list[Table]:
    return []


def sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    return [], []
