"""Data that ships inside the package, readable offline with the standard library only.

``bible_es_en.tsv.xz``: 30,808 verse pairs of the Reina-Valera 1909 (Spanish) and the World English
Bible, both public domain, split by whole chapters into train / val / test.  How it was built, what
was filtered out and why: README.md next to it, and ``scripts/extract_bible_corpus.py``.
"""

from __future__ import annotations

import csv
import lzma
import os
from pathlib import Path

# Next to this module, so it resolves the same in a checkout, an editable install and a wheel
# (package data: see [tool.setuptools.package-data] in pyproject.toml).
BIBLE_ES_EN_PATH = Path(__file__).resolve().parent / "bible_es_en.tsv.xz"

BIBLE_SPLITS = ("train", "val", "test")
BIBLE_HEADER = ["split", "book", "chapter", "verse", "es", "en"]


def load_bible_es_en(path: str | os.PathLike | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """The Spanish→English Bible corpus: ``{"train": (es, en), "val": (es, en), "test": (es, en)}``.

    ``es`` and ``en`` are lists of verse texts aligned by index, in canonical (book, chapter,
    verse) order.  `path` defaults to the file shipped with the package (``BIBLE_ES_EN_PATH``).

    The file is plain TSV without quoting: the extractor guarantees no field holds a tab or a
    newline, so quote characters are ordinary text (``csv.QUOTE_NONE``) and round-trip as they are.
    """
    path = Path(BIBLE_ES_EN_PATH if path is None else path)
    out: dict[str, tuple[list[str], list[str]]] = {split: ([], []) for split in BIBLE_SPLITS}
    # newline="" as the csv module asks; the lines end in "\n" only.
    with lzma.open(path, "rt", encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE, strict=True)
        header = next(rows, None)
        if header != BIBLE_HEADER:
            raise ValueError(f"{path}: header is {header}, expected {BIBLE_HEADER}")
        for line, row in enumerate(rows, start=2):
            if len(row) != len(BIBLE_HEADER) or row[0] not in out:
                raise ValueError(f"{path}: line {line}: expected {len(BIBLE_HEADER)} fields and a split in {BIBLE_SPLITS}, got {row[:4]}")
            es, en = out[row[0]]
            es.append(row[4])
            en.append(row[5])
    return out
