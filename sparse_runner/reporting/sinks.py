"""Text from run folders made safe for where it goes: a terminal, a CSV cell, Markdown, a matplotlib label.

A run folder may come from anyone (a colleague's sweep, an archive from a paper), so its folder names,
`experiment`, `error` and config values are untrusted. Each sink has its own danger:

- terminal: escape sequences (ESC, CSI, OSC) clear the screen, set the title or hide text;
- CSV: a cell starting with `=`, `+`, `-` or `@` is a formula to a spreadsheet (`=HYPERLINK(...)`);
- Markdown: raw HTML in report.md is rendered by most viewers;
- matplotlib: `$...$` is parsed as mathtext, and a malformed expression raises while drawing.

HTML and LaTeX have their escapers beside their renderers (html.esc, render.latex_escape).
"""

from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls (ESC, CSI 0x9b, OSC 0x9d, DEL, ...) and the bidirectional overrides that reorder what
# a reader sees; newline and tab are kept where a sink allows lines.
_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f"
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?%?|[+-]?(inf|nan)", re.IGNORECASE)


def _is_control(char: str, keep: str) -> bool:
    return char not in keep and (unicodedata.category(char) == "Cc" or char in _BIDI)


def terminal(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every control character but newline (when `keep_newlines`) removed, so that no escape
    sequence reaches the terminal; what is left of a sequence (`[2J`) shows as plain text."""
    keep = "\n" if keep_newlines else ""
    return "".join(char for char in str(text) if not _is_control(char, keep))


def csv_cell(text: object) -> str:
    """A CSV cell a spreadsheet shows as text: control characters removed, and a leading `=`, `+`, `-`, `@`
    quoted with `'` (OWASP's advice) unless the whole cell is a number, which stays a number."""
    cell = terminal(text)
    if cell.startswith(_FORMULA_START) and not _NUMBER.fullmatch(cell.strip()):
        return "'" + cell
    return cell


def markdown(text: object) -> str:
    """Text for a Markdown file: control characters removed and `&` and `<` escaped, so that no raw HTML (a
    tag or an entity) is rendered by a Markdown viewer. `>` alone opens no tag, and kept as written it
    leaves `d_p >= n - 1` readable in the plain file."""
    return terminal(text).replace("&", "&amp;").replace("<", "&lt;")


def mathtext(text: object) -> str:
    """A matplotlib title, label or legend entry shown as written: `$` escaped, so nothing is parsed as
    mathtext, and control characters removed."""
    return terminal(text).replace("$", r"\$")
