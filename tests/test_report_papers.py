"""The paper registry of sparse-report (sparse_runner.registry, as tasks, patterns, normalisers and regularisers):
which papers it knows, in which order, their interface, and that a registered paper's tables and sections are
what the report shows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sparse_runner.reporting import collect_runs, main
from sparse_runner.registry import Registry
from sparse_runner.reporting.papers import PAPERS, paper_tables, papers, register_paper
from sparse_runner.reporting.render import Table
from test_report import write_run


BHOJANAPALLI_TABLES = ["bhojanapalli2020_table1", "bhojanapalli2020_table2a", "bhojanapalli2020_table2b"]


def test_registry_lists_the_four_papers_in_report_order() -> None:
    assert isinstance(PAPERS, Registry) and PAPERS.entry_points == "sparse_runner.papers"
    assert sorted(PAPERS.names()) == ["bhojanapalli2020", "claims", "correia2019", "ernie_sparse", "lra"]
    # The order the report shows them in is their `order`, not which module Python imported first; the
    # claims table (every paper's CLAIMS) comes first.
    assert [paper.name for paper in papers()] == ["claims", "lra", "correia2019", "bhojanapalli2020", "ernie_sparse"]
    for paper in papers():
        assert paper.CITATION and callable(paper.tables) and callable(paper.sections)
    assert "bhojanapalli2020_bert" not in PAPERS     # a part of a paper's module, not a paper


def test_papers_without_runs_of_theirs_show_only_their_fillable_tables(tmp_path: Path) -> None:
    records = collect_runs([write_run(tmp_path / "run")])
    assert PAPERS["ernie_sparse"].tables(records) == []
    assert PAPERS["lra"].tables(records)[0].slug == "lra_table1"
    assert [t.slug for t in PAPERS["bhojanapalli2020"].tables(records)] == BHOJANAPALLI_TABLES
    for name in ("bhojanapalli2020", "ernie_sparse"):
        assert PAPERS[name].sections(records, tmp_path / "report") == ([], [])


def test_each_paper_shows_its_own_tables_without_runs() -> None:
    # With no run at all, a paper still shows the tables whose empty cells say what to run.
    assert [table.slug for table in paper_tables([])] == ["claims", "lra_table1", "correia2019_table1", *BHOJANAPALLI_TABLES]


def toy_paper(calls: list) -> SimpleNamespace:
    def tables(records):
        calls.append(len(records))
        return [Table(slug="toy_table1", title="Toy Table 1: what we ran", headers=["run", "ours"],
                      rows=[[rec.display, f"{rec.primary_value:.2f}"] for rec in records], numeric={1})]

    def sections(records, out_dir: Path):
        return ["## Toy figures\n\nnone drawn"], []

    return SimpleNamespace(CITATION="Toy et al. 2024", tables=tables, sections=sections)


def test_registering_a_paper_adds_its_tables_and_sections(tmp_path: Path, monkeypatch, capsys) -> None:
    calls: list = []
    monkeypatch.setattr(PAPERS, "_items", dict(PAPERS.load()))   # the toy leaves with the test
    register_paper("toy", order=35)(toy_paper(calls))            # after Bhojanapalli 2020, before ERNIE-Sparse
    root = tmp_path / "outputs"
    write_run(root / "a", test_acc=0.25)
    assert main([str(root)]) == 0
    markdown = capsys.readouterr().out
    assert calls == [1, 0]   # the runs, then none: the baseline that tells a table with runs (filled.py)
    titles = [line[3:] for line in markdown.splitlines() if line.startswith("## ")]
    # After the papers of a lower order, before ERNIE-Sparse (no tables here) and the runs tables; its sections
    # after every table.
    assert titles.index("Toy Table 1: what we ran") == titles.index("Runs: task=listops") - 1
    assert titles.index("Toy Table 1: what we ran") > titles.index("Bhojanapalli et al. 2020, Table 2B: 8 heads, "
                                                                   "d 512, 24 layers, growing head size; SQuAD F1/EM "
                                                                   "and MNLI accuracy (%)")
    assert titles[-1] == "Toy figures"
    assert "| a | 0.25 |" in markdown
    assert (root / "report" / "toy_table1.csv").read_text() == "run,ours\na,0.25\n"
    assert "% Toy Table 1: what we ran" in (root / "report" / "toy_table1.tex").read_text()
