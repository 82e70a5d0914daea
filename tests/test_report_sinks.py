"""sinks.py: untrusted text made safe per destination (terminal, CSV, Markdown, matplotlib)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sparse_runner.reporting import sinks  # noqa: E402


def test_terminal_drops_escape_sequences_and_bidi_overrides() -> None:
    text = "run\x1b[2J\x1b]0;owned\x07\x9b31m\u202eend"
    out = sinks.terminal(text)
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\u202e" not in out
    assert out == "run[2J]0;owned31mend"


def test_terminal_keeps_newlines_only_where_asked() -> None:
    assert sinks.terminal("a\nb\tc") == "abc"
    assert sinks.terminal("a\nb", keep_newlines=True) == "a\nb"


def test_csv_cell_quotes_formulas_but_not_numbers() -> None:
    assert sinks.csv_cell('=HYPERLINK("http://x","y")') == '\'=HYPERLINK("http://x","y")'
    for prefix in "+-@":
        assert sinks.csv_cell(f"{prefix}cmd|' /C calc'!A0").startswith("'")
    for number in ("-0.5", "+3", "-1e-05", "-inf", "12.5%", "-7"):
        assert sinks.csv_cell(number) == number
    assert sinks.csv_cell("plain") == "plain"


def test_markdown_escapes_raw_html() -> None:
    assert sinks.markdown('<img src=x onerror="alert(1)"> & co') == '&lt;img src=x onerror="alert(1)"> &amp; co'
    assert sinks.markdown("d_p >= n - 1") == "d_p >= n - 1"


def test_mathtext_draws_dollars_as_written() -> None:
    hostile = r"$\frac{1}{$ exp $x^$"
    fig, ax = plt.subplots()
    try:
        ax.set_title(hostile)   # as it was: matplotlib parses the dollars and fails while drawing
        try:
            fig.savefig(io.BytesIO(), format="png")
            raised = False
        except ValueError:
            raised = True
        assert raised
        ax.set_title(sinks.mathtext(hostile))
        fig.savefig(io.BytesIO(), format="png")
        assert ax.title.get_text() == sinks.mathtext(hostile)
    finally:
        plt.close(fig)
