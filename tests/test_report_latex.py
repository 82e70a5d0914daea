"""sparse-report's LaTeX output: every character pdflatex cannot take raw is escaped, the daggers of the LRA
and Bhojanapalli et al. tables (substitute data †, a printed Avg that is not its row's mean ‡) included."""

from __future__ import annotations

from sparse_runner.reporting.papers.lra.published import PRINTED_AVG, SUBSTITUTE
from sparse_runner.reporting.render import Table, latex_escape, render_latex


def test_daggers_are_latex_commands() -> None:
    assert latex_escape("†") == r"\textdagger{}" and latex_escape("‡") == r"\textdaggerdbl{}"
    assert latex_escape("61.95 † and 50.00 ‡") == r"61.95 \textdagger{} and 50.00 \textdaggerdbl{}"


def test_a_table_with_both_daggers_has_no_raw_dagger() -> None:
    table = Table(
        slug="daggers", title="LRA Table 1 † ‡",
        headers=["model", "Image", "Avg"],
        rows=[["Transformer", f"40.00 {SUBSTITUTE}", f"54.39 {PRINTED_AVG}"], ["ours", "38.20", ""]],
        numeric={1, 2}, notes=[f"{SUBSTITUTE} substitute data; {PRINTED_AVG} printed Avg"],
    )
    tex = render_latex(table)
    assert "†" not in tex and "‡" not in tex
    assert r"Transformer & 40.00 \textdagger{} & 54.39 \textdaggerdbl{} \\" in tex
    assert r"% \textdagger{} substitute data; \textdaggerdbl{} printed Avg" in tex
    assert tex.isascii()
