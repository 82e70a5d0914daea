"""Reading UTF-8 text files: line by line, with the line number a one-line error names; a release's JSON file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from sparse_runner.checks import one_line
from sparse_runner.data.errors import DataFormatError

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


def release_json(root: Path, relative: str, *, dataset: str, files: str, layout: str) -> Any:
    """The JSON held by `root / relative`, a file of a dataset's release. A missing file raises
    DataFormatError naming `task.data_dir` and the release's `files`; an unreadable one (not UTF-8, not
    JSON) names the file and the `layout` it should have."""
    path = root / relative
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataFormatError(f"task.data_dir: {root} has no {relative}; valid: {files}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataFormatError(f"{path}: cannot read the {dataset} file ({one_line(err)}); expected {layout}") from None
