"""The claims table: every registered paper's `CLAIMS` (reporting/claims.py) in one table, shown first."""

from __future__ import annotations

import sys
from pathlib import Path

from sparse_runner.reporting.claims import claims_table
from sparse_runner.reporting.papers import papers, register_paper
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord

CITATION = "the papers' claims (each row cites its paper)"


def tables(records: list[RunRecord]) -> list[Table]:
    claims = [claim for paper in papers() for claim in getattr(paper, "CLAIMS", ())]
    return [claims_table(claims, records)] if claims else []


def sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    return [], []


register_paper("claims", order=0)(sys.modules[__name__])
