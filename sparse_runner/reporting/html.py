"""HTML pieces of report.html: escaping, the markdown the tables and papers write (code spans, headings,
images), a Table as a <table>, an image inlined as a data URI, and the page around them.

The page is one file with no script and no request: images are base64 PNG in the page, the style sheet is
in its head, and what folds is a <details> element, which works with scripts disabled.

A figure is read into the page only from a regular file inside its folder (a run's, or the report's) that
is a PNG by its signature and at most MAX_FIGURE_BYTES (`read_png`): a run folder may come from anyone,
and a link to a private file, a FIFO or /dev/zero must neither reach the page nor stop the report.
"""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path
from urllib.parse import quote

from sparse_runner.reporting.filled import FILL, is_fill, is_published_row
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.run_files import MB, NotShown, read_bytes

_CODE = re.compile(r"`([^`]+)`")
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; padding: 0 1.5rem 4rem;
       max-width: 1500px; color: #1d2330; background: #fff; overflow-wrap: break-word; }
h1 { font-size: 1.6rem; margin: 1.2rem 0 .3rem; }
h2 { font-size: 1.3rem; margin: 2.2rem 0 .5rem; padding-top: .6rem; border-top: 2px solid #d8dde6; }
h3 { font-size: 1.05rem; margin: 1.4rem 0 .4rem; }
nav ul { columns: 2; padding-left: 1.2rem; margin: .3rem 0; }
code { font: 12.5px ui-monospace, "DejaVu Sans Mono", monospace; background: #f1f3f7; padding: 0 .2em;
       border-radius: 3px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: .4rem 0; font-size: 13px; }
th, td { border-bottom: 1px solid #e3e6ec; padding: .25rem .55rem; text-align: left; vertical-align: top; }
th { background: #eef1f6; position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.short { white-space: nowrap; }
td.files { min-width: 22em; }
td.files a { white-space: nowrap; margin-right: .5em; }
tr.published td { color: #555c6b; background: #fafbfc; }
tr.rule td { border-top: 2px solid #aab2c0; }
td code.fill { color: #7a8190; background: none; font-size: 11px; white-space: normal; }
.status-completed { color: #17663a; }
.status-failed, .status-diverged, .status-unreadable { color: #b3261e; font-weight: 600; }
.status-unfinished, .status-preempted, .status-not-started, .status-unknown { color: #9a6700; }
details { margin: .3rem 0 .6rem; }
summary { cursor: pointer; color: #2b4c8c; }
details.notes > summary { font-size: 12.5px; }
ul.notes { font-size: 12.5px; color: #4a5160; margin: .2rem 0 .8rem; padding-left: 1.2rem; }
ul.notes li { max-width: 110ch; margin: .15rem 0; }
table.claims { width: 100%; table-layout: fixed; font-size: 13.5px; }
table.claims td { white-space: normal; }
table.claims td.result { font-variant-numeric: tabular-nums; }
table.claims td.claim details { margin: .15rem 0 0; }
table.claims td.claim summary { font-size: 12px; }
table.claims dl { display: grid; grid-template-columns: max-content 1fr; gap: .1rem .6rem; margin: .3rem 0;
                  font-size: 12.5px; color: #4a5160; }
table.claims dd { margin: 0; }
span.verdict { font-weight: 600; padding: .05rem .4rem; border-radius: 3px; white-space: nowrap; }
.verdict-held { color: #17663a; background: #e2f3e7; }
.verdict-not-held { color: #b3261e; background: #fbe5e3; }
.verdict-inconclusive { color: #7a5200; background: #fbf0d5; }
.verdict-not-run { color: #5d6473; background: #eef0f3; }
.skipped { color: #9a6700; }
figure { margin: .8rem 0 1.2rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e6ec; }
figcaption { font-size: 12.5px; color: #4a5160; }
.gallery { display: flex; flex-wrap: wrap; gap: .8rem; }
.gallery figure { margin: 0; max-width: 48%; }
p.summary { font-size: 15px; }
p.fold { margin: .2rem 0 .8rem; color: #4a5160; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def inline(text: str) -> str:
    """Escaped text with its `code` spans as <code>."""
    parts = _CODE.split(text)
    return "".join(f"<code>{esc(part)}</code>" if odd else esc(part) for odd, part in
                   ((i % 2 == 1, part) for i, part in enumerate(parts)))


def anchor(text: str) -> str:
    """An id from any text (headings link to it from the contents)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def href(target: Path, base: Path) -> str:
    """A link to `target` relative to the folder of the page, so that the report moves with its runs."""
    return quote(Path(os.path.relpath(target, base)).as_posix())


# The runner's figures are a few hundred kB. 20 MB takes any real figure, keeps a page of inlined figures
# (base64: 4/3 of their size) one a browser opens, and bounds what a huge file could make the report read.
MAX_FIGURE_BYTES = 20 * MB
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(path: Path, folder: Path, where: str = "run") -> bytes:
    """The bytes of the PNG at `path`: a regular file inside `folder` of at most MAX_FIGURE_BYTES
    (run_files.read_bytes) that starts with PNG's signature. Raises NotShown saying which it is not."""
    data = read_bytes(path, folder, MAX_FIGURE_BYTES, where)
    if not data.startswith(PNG_SIGNATURE):
        raise NotShown("not a PNG (its first bytes are not PNG's signature)")
    return data


def skipped(name: str, reason: str) -> str:
    """The line a page shows where a file is not shown: its name and why."""
    return f'<p class="skipped">Not shown: <code>{esc(name)}</code>, {esc(reason)}.</p>'


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def figure(png: bytes, caption: str) -> str:
    return (f'<figure><img src="{data_uri(png)}" alt="{esc(caption)}">'
            f"<figcaption>{inline(caption)}</figcaption></figure>")


def _cell(text: str, numeric: bool) -> str:
    # short cells (numbers, names, axes) keep to one line; long ones (notes, commands) wrap
    css = " ".join(name for name, on in (("num", numeric), ("short", len(text) <= 32)) if on)
    css = f' class="{css}"' if css else ""
    if is_fill(text):   # the command that fills an empty cell, quiet beside the numbers
        return f'<td{css}><code class="fill" title="fills this cell">{esc(text[len(FILL):])}</code></td>'
    return f"<td{css}>{esc(text)}</td>"


def table(tab: Table, rows: list[int] | None = None) -> str:
    """The rows of `tab` at `rows` (default: all), published rows shaded, its rules as heavier lines. A rule
    before a row that is not shown goes before the next row shown."""
    head = "".join(f'<th{" class=num" if i in tab.numeric else ""}>{esc(h)}</th>' for i, h in enumerate(tab.headers))
    body = []
    previous = -1
    for index in range(len(tab.rows)) if rows is None else rows:
        row = tab.rows[index]
        ruled = previous >= 0 and any(previous < rule <= index for rule in tab.rules_before)
        classes = [name for name, on in (("published", is_published_row(row)), ("rule", ruled)) if on]
        css = f' class="{" ".join(classes)}"' if classes else ""
        body.append(f"<tr{css}>" + "".join(_cell(cell, i in tab.numeric) for i, cell in enumerate(row)) + "</tr>")
        previous = index
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            "</table></div>")


def notes(items: list[str]) -> str:
    """A table's notes as a bullet list folded under one line, which says how many there are."""
    if not items:
        return ""
    return (f'<details class="notes"><summary>{len(items)} note{"s" if len(items) != 1 else ""}</summary>'
            '<ul class="notes">' + "".join(f"<li>{inline(note)}</li>" for note in items) + "</ul></details>")


def markdown_section(text: str, out_dir: Path) -> str:
    """A paper's markdown section (`## heading`, paragraphs, `![caption](figures/x.png)`) with its images
    inlined from `out_dir` (read_png); an image that is not shown is named with the reason."""
    parts = []
    for block in text.split("\n\n"):
        block = block.strip()
        if block.startswith("## "):
            parts.append(f"<h3>{inline(block[3:])}</h3>")
        elif match := _IMAGE.match(block):
            caption, path = match.groups()
            try:
                parts.append(figure(read_png(out_dir / path, out_dir, "report"), caption))
            except NotShown as exc:
                parts.append(f"<p>{inline(caption)}:</p>" + skipped(path, str(exc)))
        elif block:
            parts.append(f"<p>{inline(block)}</p>")
    return "\n".join(parts)


def page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
