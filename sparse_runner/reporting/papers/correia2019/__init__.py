"""Correia, Niculae and Martins, "Adaptively Sparse Transformers", EMNLP 2019: Table 1 (translation,
tokenized BLEU) published beside ours, the table of our runs behind it, and the Section 5 analysis figures.

published: the paper's numbers and the fill commands; picks: which run stands for each model; tables and
figures: what the report shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sparse_runner.reporting.papers import register_paper
from sparse_runner.reporting.papers.correia2019.claims import CLAIMS  # noqa: F401 (the claims table reads it)
from sparse_runner.reporting.papers.correia2019.figures import analysis_figures
from sparse_runner.reporting.papers.correia2019.picks import translation_picks
from sparse_runner.reporting.papers.correia2019.published import CORREIA2019_TABLE1
from sparse_runner.reporting.papers.correia2019.tables import runs_table, table1
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord

CITATION = CORREIA2019_TABLE1["citation"]


def tables(records: list[RunRecord]) -> list[Table]:
    """Table 1 (always: its empty cells say what to run) and, once there are runs, the table behind it."""
    picks = translation_picks(records)
    runs = runs_table(picks)
    return [table1(picks)] + ([runs] if runs else [])


def sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    """The analysis figures of every task+experiment Table 1's runs cover, drawn into `out_dir/figures`."""
    return analysis_figures(translation_picks(records), out_dir)


register_paper("correia2019", order=20)(sys.modules[__name__])
