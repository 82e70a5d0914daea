"""Reading a UTF-8 text file line by line, with the line number a one-line error names."""

from __future__ import annotations

import os
from typing import Callable, Iterator

BOM = b"\xef\xbb\xbf"


def utf8_lines(
    path: str | os.PathLike, error: Callable[[int, UnicodeDecodeError], Exception], *, keep_ends: bool = True
) -> Iterator[tuple[int, str]]:
    """(line number, text) of every ``\\n``-terminated line of a UTF-8 file; a BOM is ignored.

    Lines are split on ``\\n`` only -- not on the other characters ``str.splitlines`` treats as line
    breaks (``\\r``, ``\\x85``, ``\\u2028``...), which would shift line numbers and the alignment of
    parallel files. With `keep_ends` the text keeps its line ending; without, a final ``\\n`` and then a
    ``\\r`` are removed before decoding. A line that is not UTF-8 raises ``error(line number, the
    UnicodeDecodeError)``.
    """
    with open(path, "rb") as handle:  # binary: split on b"\n" only, never on \r, \x85, \u2028 ...
        for number, raw in enumerate(handle, start=1):
            if not keep_ends:
                raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            if number == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise error(number, err) from None
