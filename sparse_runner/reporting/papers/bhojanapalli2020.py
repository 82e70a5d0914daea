"""Bhojanapalli et al., "Low-Rank Bottleneck in Multi-head Attention Models", ICML 2020: registered, no
tables yet.

Its place in the report: Tables 1 and 2 (SQuAD F1/EM and MNLI accuracy against the number of heads and the
head size, PAPERS.md B.3, SECONDARY) beside our runs once the runner has those tasks. The published numbers
and fill commands will live here, as in `lra` and `correia2019`.
"""

from __future__ import annotations

from pathlib import Path

from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord

CITATION = "Bhojanapalli et al., ICML 2020"


def tables(records: list[RunRecord]) -> list[Table]:
    return []


def sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    return [], []
