"""The data of sentence-pair classification (MultiNLI): ``PairSplit`` and its readers.

Every source becomes ``PairSplit`` objects (premises, hypotheses, labels 0/1/2, a matched flag and the
genre of each pair) in a ``dict`` keyed by MNLI's own split names (the Hugging Face ones): ``train``,
``validation_matched``, ``validation_mismatched``.  Labels follow ``LABELS`` = entailment, neutral,
contradiction (ids 0, 1, 2), the order of Hugging Face's ``nyu-mll/multi_nli`` and GLUE's ``mnli``.
``matched`` is True for a pair of MNLI's matched genres (every training pair and validation_matched)
and False for validation_mismatched, whose five genres never occur in training.

Sources:
  ``read_multinli_jsonl``  the official MultiNLI 1.0 release, ``multinli_1.0_{train,dev_matched,
                           dev_mismatched}.jsonl`` (``gold_label``, ``sentence1``, ``sentence2``, ``genre``
                           and fields not used here).  Rows whose gold_label is ``-`` (the five annotators
                           reached no majority) are skipped, as everyone does, and counted
                           (``PairSplit.skipped``, and a log line).
  ``read_glue_tsv``        GLUE's MNLI, ``{train,dev_matched,dev_mismatched}.tsv``: a header naming the
                           columns (``index, promptID, pairID, genre, ..., sentence1, sentence2, label1,
                           ..., gold_label``), read by name; no quoting (``csv.QUOTE_NONE``), so quote
                           characters are text.  GLUE's test files have no labels and are refused.
  ``read_mnli_dir``        a folder holding either set of three files (or its ``multinli_1.0/`` or
                           ``MNLI/`` subfolder, as the archives unpack).
  ``from_hub_rows``        rows of a Hugging Face dataset (``premise``, ``hypothesis``, ``label``, and
                           ``genre`` in ``nyu-mll/multi_nli`` but not in GLUE's ``mnli``); rows labelled -1
                           (no gold label; every row of the test splits) are skipped.

Every problem with a file is a ``ConfigError`` (``DataFormatError``) of ONE line naming the file, the
line number and what is wrong, with the valid choices where there are any.

The offline substitute (sentence pairs of the State of the Union addresses) is ``sotu_pairs.py``.

Pure Python + numpy: the data layer needs no torch.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from sparse_runner.checks import ConfigError
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.lines import utf8_lines

logger = logging.getLogger(__name__)

LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
LABEL_IDS: dict[str, int] = {name: i for i, name in enumerate(LABELS)}
NO_GOLD_LABEL = "-"  # MultiNLI's gold_label when the annotators reached no majority
HUB_UNLABELLED = -1  # the label of such rows (and of every test row) on the Hugging Face hub

#: MNLI's split names (Hugging Face's), in the order they are listed.
MNLI_SPLITS: tuple[str, ...] = ("train", "validation_matched", "validation_mismatched")
#: File names of the two layouts ``read_mnli_dir`` accepts, per split.
JSONL_FILES: dict[str, str] = {
    "train": "multinli_1.0_train.jsonl",
    "validation_matched": "multinli_1.0_dev_matched.jsonl",
    "validation_mismatched": "multinli_1.0_dev_mismatched.jsonl",
}
GLUE_FILES: dict[str, str] = {
    "train": "train.tsv",
    "validation_matched": "dev_matched.tsv",
    "validation_mismatched": "dev_mismatched.tsv",
}
#: Subfolders looked into when the files are not in the folder itself (how the archives unpack).
RELEASE_SUBFOLDERS: tuple[str, ...] = ("multinli_1.0", "MNLI")
ACCEPTED_FILES = (
    f"{', '.join(JSONL_FILES.values())} (the MultiNLI 1.0 release) or {', '.join(GLUE_FILES.values())} (GLUE's MNLI), "
    f"in the folder or its {' or '.join(s + '/' for s in RELEASE_SUBFOLDERS)} subfolder"
)

JSONL_FIELDS: tuple[str, ...] = ("gold_label", "sentence1", "sentence2")
GLUE_COLUMNS: tuple[str, ...] = ("sentence1", "sentence2", "gold_label")
_VALID_GOLD = ", ".join(LABELS + (NO_GOLD_LABEL + " (no consensus, skipped)",))


# ----------------------------------------------------------------------------------------------------
# PairSplit
# ----------------------------------------------------------------------------------------------------


@dataclass
class PairSplit:
    """The sentence pairs of one split; every field has one entry per pair, in the same order.

    ``labels``: int64 ids into ``LABELS``.  ``matched``: True for a pair of MNLI's matched genres (all of
    train and validation_matched), False for validation_mismatched.  ``genres``: MNLI's genre of the pair
    ("fiction", "government", ...), "" where the source has none (GLUE's mnli on the hub), "sotu" for the
    substitute.  ``skipped``: rows the reader left out because they had no gold label (not pairs here).
    """

    premises: list[str]
    hypotheses: list[str]
    labels: np.ndarray
    matched: np.ndarray
    genres: list[str]
    skipped: int = 0

    def __post_init__(self) -> None:
        self.premises, self.hypotheses, self.genres = list(self.premises), list(self.hypotheses), list(self.genres)
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        self.matched = np.asarray(self.matched, dtype=bool).reshape(-1)
        sizes = {len(self.premises), len(self.hypotheses), len(self.labels), len(self.matched), len(self.genres)}
        if len(sizes) != 1:
            raise ValueError(
                f"PairSplit fields differ in length: premises {len(self.premises)}, hypotheses {len(self.hypotheses)}, "
                f"labels {len(self.labels)}, matched {len(self.matched)}, genres {len(self.genres)}"
            )
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(LABELS)):
            raise ValueError(f"PairSplit labels must be in 0..{len(LABELS) - 1}, got {sorted(set(self.labels.tolist()))}")

    def __len__(self) -> int:
        return len(self.labels)

    @classmethod
    def concat(cls, splits: Iterable[PairSplit]) -> PairSplit:
        """One split holding the pairs of `splits` in order (``skipped`` adds up)."""
        splits = list(splits)
        return cls(
            premises=[p for s in splits for p in s.premises],
            hypotheses=[h for s in splits for h in s.hypotheses],
            labels=np.concatenate([s.labels for s in splits]) if splits else np.zeros(0, np.int64),
            matched=np.concatenate([s.matched for s in splits]) if splits else np.zeros(0, bool),
            genres=[g for s in splits for g in s.genres],
            skipped=sum(s.skipped for s in splits),
        )

    def select(self, index: Sequence[int] | np.ndarray) -> PairSplit:
        """The pairs at `index` (integer positions or a boolean mask), in that order."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        return PairSplit(
            premises=[self.premises[i] for i in index],
            hypotheses=[self.hypotheses[i] for i in index],
            labels=self.labels[index],
            matched=self.matched[index],
            genres=[self.genres[i] for i in index],
            skipped=self.skipped,
        )

    def label_counts(self) -> np.ndarray:
        """(3,) int64: the number of pairs of each label."""
        return np.bincount(self.labels, minlength=len(LABELS)).astype(np.int64)


# ----------------------------------------------------------------------------------------------------
# Readers
# ----------------------------------------------------------------------------------------------------


def split_of_file(path: str | os.PathLike) -> tuple[str, bool]:
    """(MNLI split name, matched) a file holds, from its name: ``*dev_mismatched*`` -> validation_mismatched
    (not matched), ``*dev_matched*`` -> validation_matched, ``*train*`` -> train; any other name keeps its
    stem as the split name (matched)."""
    name = Path(path).name.lower()
    if "mismatched" in name:
        return "validation_mismatched", False
    if "matched" in name:
        return "validation_matched", True
    if "train" in name:
        return "train", True
    return Path(path).stem, True


def _short(value: Any, limit: int = 60) -> str:
    """`value` for a one-line message: its repr, squeezed to one line and cut at `limit` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a UTF-8 file, with its line ending; a BOM is ignored."""

    def error(number: int, err: UnicodeDecodeError) -> DataFormatError:
        return DataFormatError(f"{path}: line {number}: not UTF-8 ({err.reason} at byte {err.start})")

    return utf8_lines(path, error)


def _existing_file(path: str | os.PathLike) -> Path:
    path = Path(os.path.expanduser(str(path)))
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    return path


def _finish(path: Path, split: str, matched: bool, premises, hypotheses, labels, genres, skipped: int, rows: int) -> dict[str, PairSplit]:
    if not labels:
        raise DataFormatError(f"{path}: holds no labelled pair ({rows} rows, {skipped} without a gold label)")
    if skipped:
        logger.info("%s: skipped %d of %d rows without a gold label (%r: no annotator consensus)", path, skipped, rows, NO_GOLD_LABEL)
    return {split: PairSplit(premises, hypotheses, np.asarray(labels, np.int64), np.full(len(labels), matched), genres, skipped)}


def read_multinli_jsonl(path: str | os.PathLike) -> dict[str, PairSplit]:
    """The pairs of one file of the MultiNLI 1.0 release (JSON lines), as ``{split: PairSplit}``.

    The split name and the matched flag come from the file name (``split_of_file``).  Rows whose
    ``gold_label`` is "-" are skipped and counted; empty lines are ignored.  ``genre`` is read when present.
    """
    path = _existing_file(path)
    split, matched = split_of_file(path)
    premises, hypotheses, labels, genres = [], [], [], []
    skipped = rows = 0
    for number, line in _utf8_lines(path):
        if not line.strip():
            continue
        rows += 1
        try:
            record = json.loads(line)
        except ValueError as error:
            raise DataFormatError(f"{path}: line {number}: not JSON ({error})") from None
        if not isinstance(record, dict):
            raise DataFormatError(f"{path}: line {number}: expected a JSON object, got {type(record).__name__}")
        missing = [f for f in JSONL_FIELDS if f not in record]
        if missing:
            hint = " (an unlabelled test file?)" if missing == ["gold_label"] else ""
            raise DataFormatError(f"{path}: line {number}: no field {', '.join(missing)}{hint}; fields needed: {', '.join(JSONL_FIELDS)}")
        gold = record["gold_label"]
        if gold == NO_GOLD_LABEL:
            skipped += 1
            continue
        if not isinstance(gold, str) or gold not in LABEL_IDS:
            raise DataFormatError(f"{path}: line {number}: gold_label {_short(gold)} is not a label; valid: {_VALID_GOLD}")
        for key in ("sentence1", "sentence2"):
            if not isinstance(record[key], str):
                raise DataFormatError(f"{path}: line {number}: {key} must be a string, got {_short(record[key])}")
        genre = record.get("genre")
        premises.append(record["sentence1"])
        hypotheses.append(record["sentence2"])
        labels.append(LABEL_IDS[gold])
        genres.append("" if genre is None else str(genre))
    return _finish(path, split, matched, premises, hypotheses, labels, genres, skipped, rows)


def read_glue_tsv(path: str | os.PathLike) -> dict[str, PairSplit]:
    """The pairs of one file of GLUE's MNLI (tab-separated, with a header), as ``{split: PairSplit}``.

    Columns are found by their header name (train.tsv has one label column fewer than the dev files); the
    text is read without quoting, so quote characters are ordinary text.  A row whose ``gold_label`` is "-"
    is skipped and counted.  A file without a gold_label column (GLUE's test files) is refused: it is
    unlabelled.
    """
    path = _existing_file(path)
    split, matched = split_of_file(path)
    lines = _utf8_lines(path)
    reader = csv.reader((text for _, text in lines), delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        header = next(reader)
    except StopIteration:
        raise DataFormatError(f"{path}: line 1: the file is empty; expected a header with columns {', '.join(GLUE_COLUMNS)}") from None
    header = [h.strip() for h in header]
    missing = [c for c in GLUE_COLUMNS if c not in header]
    if missing == ["gold_label"]:
        raise DataFormatError(f"{path}: line 1: no gold_label column: the file is unlabelled (GLUE's test files are); use train / dev_matched / dev_mismatched")
    if missing:
        raise DataFormatError(f"{path}: line 1: the header has no column {', '.join(missing)}; got {_short(header, 200)}")
    premise_at, hypothesis_at, gold_at = (header.index(c) for c in GLUE_COLUMNS)
    genre_at = header.index("genre") if "genre" in header else None
    premises, hypotheses, labels, genres = [], [], [], []
    skipped = rows = 0
    for number, row in enumerate(reader, start=2):
        if not row or row == [""]:
            continue
        rows += 1
        if len(row) != len(header):
            raise DataFormatError(f"{path}: line {number}: {len(row)} fields, the header has {len(header)} (a tab or newline inside a text?)")
        gold = row[gold_at].strip()
        if gold == NO_GOLD_LABEL:
            skipped += 1
            continue
        if gold not in LABEL_IDS:
            raise DataFormatError(f"{path}: line {number}: gold_label {_short(gold)} is not a label; valid: {_VALID_GOLD}")
        premises.append(row[premise_at])
        hypotheses.append(row[hypothesis_at])
        labels.append(LABEL_IDS[gold])
        genres.append(row[genre_at] if genre_at is not None else "")
    return _finish(path, split, matched, premises, hypotheses, labels, genres, skipped, rows)


def find_mnli_files(data_dir: str | os.PathLike) -> dict[str, Path]:
    """{split: file} of the MNLI files in `data_dir` (or its multinli_1.0/ or MNLI/ subfolder): the JSONL
    release if all three of its files are there, else GLUE's TSVs; a one-line ConfigError otherwise."""
    root = Path(os.path.expanduser(str(data_dir)))
    if not root.is_dir():
        raise ConfigError(f"{root}: not a directory; expected a folder with {ACCEPTED_FILES}")
    partial = []
    for folder in (root,) + tuple(root / s for s in RELEASE_SUBFOLDERS):
        for names in (JSONL_FILES, GLUE_FILES):
            present = {split: folder / name for split, name in names.items() if (folder / name).is_file()}
            if len(present) == len(names):
                return present
            if present:
                missing = [name for split, name in names.items() if split not in present]
                partial.append(f"{folder} lacks {', '.join(missing)}")
    if partial:
        raise ConfigError(f"{root}: incomplete MNLI data: {'; '.join(partial)}; expected {ACCEPTED_FILES}")
    raise ConfigError(f"{root}: no MNLI files; expected {ACCEPTED_FILES}")


def read_mnli_dir(data_dir: str | os.PathLike) -> dict[str, PairSplit]:
    """``{train, validation_matched, validation_mismatched: PairSplit}`` from a folder holding either the
    MultiNLI 1.0 JSONL release (preferred when both are there) or GLUE's MNLI TSVs (``find_mnli_files``)."""
    files = find_mnli_files(data_dir)
    reader = read_multinli_jsonl if next(iter(files.values())).suffix == ".jsonl" else read_glue_tsv
    out = {}
    for split, path in files.items():
        (out[split],) = reader(path).values()
    return out


def _columns(rows: Any, names: Sequence[str]) -> tuple[dict[str, list], int]:
    """Columns `names` (those present) of a datasets.Dataset, a mapping of columns, or an iterable of row
    mappings; and the number of rows."""
    if hasattr(rows, "column_names") and hasattr(rows, "__getitem__"):  # datasets.Dataset: read by column (fast)
        present = [n for n in names if n in rows.column_names]
        return {n: list(rows[n]) for n in present}, len(rows)
    if isinstance(rows, Mapping):  # columns, e.g. Dataset[:] or a dict of lists
        present = [n for n in names if n in rows]
        columns = {n: list(rows[n]) for n in present}
        return columns, len(next(iter(columns.values()))) if columns else 0
    columns: dict[str, list] = {n: [] for n in names}
    count = 0
    for count, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise DataFormatError(f"row {count}: expected a mapping of column to value, got {type(row).__name__}")
        for n in names:
            columns[n].append(row.get(n, _ABSENT))
    return {n: v for n, v in columns.items() if not all(x is _ABSENT for x in v)}, count


_ABSENT = object()


def from_hub_rows(rows: Any, *, matched: bool, where: str = "hub rows") -> PairSplit:
    """The pairs of Hugging Face rows (``premise``, ``hypothesis``, ``label`` int, ``genre`` if present).

    `rows`: a ``datasets.Dataset`` (read by column), a mapping of columns, or an iterable of row mappings.
    Rows labelled -1 are skipped and counted; `matched` is the flag of every pair (True for train and
    validation_matched).  `where` names the source in error messages (e.g. "nyu-mll/multi_nli train").
    """
    columns, count = _columns(rows, ("premise", "hypothesis", "label", "genre"))
    missing = [n for n in ("premise", "hypothesis", "label") if n not in columns]
    if missing:
        raise DataFormatError(f"{where}: no column {', '.join(missing)}; columns needed: premise, hypothesis, label (genre optional); got {', '.join(columns) or 'none'}")
    genres = columns.get("genre")
    premises, hypotheses, labels, kept_genres = [], [], [], []
    skipped = 0
    valid = f"{', '.join(f'{i} ({n})' for i, n in enumerate(LABELS))}, {HUB_UNLABELLED} (unlabelled, skipped)"
    for i, (premise, hypothesis, label) in enumerate(zip(columns["premise"], columns["hypothesis"], columns["label"])):
        absent = [n for n, v in (("premise", premise), ("hypothesis", hypothesis), ("label", label)) if v is _ABSENT]
        if absent:
            raise DataFormatError(f"{where}: row {i + 1}: no {', '.join(absent)}; columns needed: premise, hypothesis, label (genre optional)")
        if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)) or not HUB_UNLABELLED <= label < len(LABELS):
            raise DataFormatError(f"{where}: row {i + 1}: label {_short(label)} is not a label id; valid: {valid}")
        if label == HUB_UNLABELLED:
            skipped += 1
            continue
        for key, text in (("premise", premise), ("hypothesis", hypothesis)):
            if not isinstance(text, str):
                raise DataFormatError(f"{where}: row {i + 1}: {key} must be a string, got {_short(text)}")
        premises.append(premise)
        hypotheses.append(hypothesis)
        labels.append(int(label))
        genre = genres[i] if genres is not None else ""
        kept_genres.append("" if genre is _ABSENT or genre is None else str(genre))
    if count and not labels:
        raise DataFormatError(f"{where}: all {count} rows are unlabelled (label {HUB_UNLABELLED}; a test split?); use train / validation_matched / validation_mismatched")
    if skipped:
        logger.info("%s: skipped %d of %d rows labelled %d (no gold label)", where, skipped, count, HUB_UNLABELLED)
    return PairSplit(premises, hypotheses, np.asarray(labels, np.int64), np.full(len(labels), bool(matched)), kept_genres, skipped)
