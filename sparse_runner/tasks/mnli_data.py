"""The data of sentence-pair classification (MultiNLI): readers, an offline substitute, trivial baselines.

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

Offline substitute: ``sotu_pairs`` (there is no NLI data in the package, and none reachable offline).
The text is real -- sentences of the State of the Union addresses shipped with the package
(``sparse_runner.data.load_sotu_en``) -- but the pairs and their labels are GENERATED.  The three labels
are discourse relations, NOT entailment:

  0 "entailment"     the hypothesis is the next sentence of the premise's speech (continuation);
  1 "neutral"        the hypothesis is a sentence of the same speech at least ``neutral_min_distance``
                     (10) sentences away from the premise (same document, not adjacent);
  2 "contradiction"  the hypothesis is a sentence of another speech of the same split (different document).

The MNLI class names are kept only so that the MNLI code path (model, metrics, reports) runs unchanged
offline; an accuracy on this substitute says nothing about inference.  How the pairs are drawn
(balance, what a model cannot exploit, splits, matched / mismatched): ``sotu_pairs``.

Baselines, the floors a model has to beat: ``majority_baseline`` (the most frequent training label)
and ``overlap_baseline`` (two thresholds on the share of the hypothesis's words found in the premise,
fitted on train).

Pure Python + numpy: the data layer needs no torch.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from sparse_runner.checks import ConfigError
from sparse_runner.data.errors import DataFormatError

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
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(f"{path}: line {number}: not UTF-8 ({error.reason} at byte {error.start})") from None


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


# ----------------------------------------------------------------------------------------------------
# Offline substitute: sentence pairs of the State of the Union addresses
# ----------------------------------------------------------------------------------------------------

SUBSTITUTE_GENRE = "sotu"
SUBSTITUTE_DESCRIPTION = (
    "State of the Union sentence pairs (real text, generated pairs and labels): "
    "'entailment' = the next sentence of the speech, 'neutral' = a sentence of the same speech >= 10 sentences away, "
    "'contradiction' = a sentence of another speech; discourse relations, not entailment; no mismatched genre"
)
MIN_WORDS = 4  # shorter sentences ("(Applause.)", "Thank you.") are not used
MAX_WORDS = 60  # longer ones are cut to their first 60 words (99th percentile of SOTU sentences: ~95 words)


def usable_sentence(sentence: str, min_words: int = MIN_WORDS, max_words: int = MAX_WORDS) -> str | None:
    """`sentence` with its whitespace collapsed and cut at `max_words` words; None if under `min_words`."""
    words = sentence.split()
    return " ".join(words[:max_words]) if len(words) >= min_words else None


def sotu_documents(path: str | os.PathLike | None = None) -> dict[str, list[list[str]]]:
    """The State of the Union speeches as sentences: ``{"train" | "val" | "test": [[sentence, ...], ...]}``,
    speeches in chronological order (the order of ``sparse_runner.data.sotu_en_metadata()`` within a split)."""
    from sparse_runner.data.documents import sotu_documents as documents

    return documents(path)


def _seed_for(seed: int, split: str, *more: int) -> np.random.Generator:
    # A generator per (seed, split, document): one split's pairs do not depend on the other splits, nor
    # one document's premises on the other documents'.
    return np.random.default_rng([int(seed), zlib.crc32(split.encode("utf-8")), *more])


def sotu_pairs(
    documents_by_split: Mapping[str, Sequence[Sequence[str]]],
    *,
    seed: int = 0,
    pairs_per_document: int | None = None,
    neutral_min_distance: int = 10,
    min_words: int = MIN_WORDS,
    max_words: int = MAX_WORDS,
) -> dict[str, PairSplit]:
    """The offline substitute for MNLI: 3-way pairs of real sentences with generated labels, per split.

    `documents_by_split`: ``{split: [document, ...]}``, a document being its sentences in order
    (``sotu_documents()``).  Returns ``{split: PairSplit}`` with the same keys: pairs of a split come only
    from that split's documents.

    Sentences: whitespace collapsed, those under `min_words` words dropped, the rest cut at `max_words`
    words.  "Next" means next among the sentences kept, so only fragments of under `min_words` words
    ("(Applause.)") can lie between a premise and its continuation.

    Pairs: every kept sentence that has a next sentence (and a neutral candidate) is a premise -- or
    `pairs_per_document // 3` of them per document, drawn at random, when `pairs_per_document` is set --
    and each premise gives THREE pairs, one per label, as MNLI's premises do:

      0 "entailment"     its next sentence;
      1 "neutral"        a sentence of the same document at least `neutral_min_distance` positions away;
      2 "contradiction"  the continuation ("entailment" hypothesis) of a premise of another document of
                         the same split, drawn at random.

    So the classes are exactly balanced in every split, the premise alone says nothing about the label,
    and the three hypotheses come from (nearly) the same distribution of sentences: contradiction
    hypotheses are drawn from the entailment hypotheses rather than from all sentences, which would
    over-represent long speeches (the written messages of the 19th century) and make the era of the
    hypothesis a cue.  Neutral and contradiction hypotheses never repeat the premise's text or its next
    sentence's, and no speech holds both texts of a contradiction pair (a few sentences recur verbatim in
    several speeches).

    Splits: SOTU's own split by whole speeches is kept (train speeches -> train pairs, val -> val, test ->
    test).  A few sentences recur verbatim in other speeches (boilerplate, or a president repeating
    himself: 28 texts on the shipped corpus); a sentence whose text occurs in another split's documents is
    never used as a premise or hypothesis (its position still counts for "next"), so no sentence text is
    shared between the pairs of two splits.

    Matched / mismatched: every pair is ``matched``, and there is no mismatched split.  MNLI's mismatched
    set holds genres absent from training; SOTU has one genre, and its speech split spreads every era over
    train (train holds 10 to 47 speeches of every half-century from 1790 to 2021, written and spoken
    messages alike, and a speech of every president of val and test), so neither genre nor era nor
    president can set some validation speeches apart from training.  Calling some of them "mismatched" would report a domain shift that is not there.

    Deterministic: the pairs of a split depend only on `seed`, the split's name, its documents, the options
    and (through the texts left out) the sentences of the other splits; the order of the pairs is shuffled
    (seeded), so that any prefix holds all three labels in about equal numbers.
    """
    if pairs_per_document is not None and pairs_per_document < 3:
        raise ConfigError(f"pairs_per_document: must be >= 3 (each premise gives one pair per label) or None for all, got {pairs_per_document}")
    if neutral_min_distance < 2:
        raise ConfigError(f"neutral_min_distance: must be >= 2 (1 is the next sentence), got {neutral_min_distance}")
    if not 1 <= min_words <= max_words:
        raise ConfigError(f"min_words / max_words: need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    kept = {
        split: [[usable_sentence(s, min_words, max_words) for s in doc] for doc in docs]
        for split, docs in documents_by_split.items()
    }
    kept = {split: [[s for s in doc if s is not None] for doc in docs] for split, docs in kept.items()}
    splits_of: dict[str, set[str]] = {}
    for split, docs in kept.items():
        for doc in docs:
            for sentence in doc:
                splits_of.setdefault(sentence, set()).add(split)
    shared = {s for s, where in splits_of.items() if len(where) > 1}
    if shared:
        logger.info("sotu_pairs: %d sentence texts occur in more than one split; they are not used", len(shared))
    return {split: _split_pairs(split, docs, shared, seed, pairs_per_document, neutral_min_distance) for split, docs in kept.items()}


def _draw(rng: np.random.Generator, count: int, accept, tries: int = 64) -> int | None:
    """A uniform draw among range(count) that `accept` takes: rejection sampling, then (when the accepted
    ones are rare) a draw among all of them; None if there are none."""
    for _ in range(tries):
        k = int(rng.integers(count))
        if accept(k):
            return k
    accepted = [k for k in range(count) if accept(k)]
    return accepted[int(rng.integers(len(accepted)))] if accepted else None


def _split_pairs(split: str, docs: list[list[str]], shared: set[str], seed: int, pairs_per_document: int | None, gap: int) -> PairSplit:
    premise_doc, premise_pos, neutral_pos = [], [], []
    for d, doc in enumerate(docs):
        n = len(doc)
        usable = [s not in shared for s in doc]
        # premises: a usable sentence followed by another usable one, with some position >= gap away
        candidates = [i for i in range(n - 1) if usable[i] and usable[i + 1] and doc[i] != doc[i + 1] and (i >= gap or i + gap < n)]
        rng = _seed_for(seed, split, d)
        if pairs_per_document is not None and len(candidates) > pairs_per_document // 3:
            chosen = np.sort(rng.choice(len(candidates), size=pairs_per_document // 3, replace=False))
            candidates = [candidates[c] for c in chosen]
        for i in candidates:
            # neutral: positions 0 .. i-gap, then i+gap .. n-1, numbered 0 .. count-1
            before = max(0, i - gap + 1)
            count = before + max(0, n - i - gap)
            positions = lambda k, i=i, before=before: k if k < before else i + gap + (k - before)  # noqa: E731
            ok = lambda k, i=i, positions=positions: usable[positions(k)] and doc[positions(k)] not in (doc[i], doc[i + 1])  # noqa: E731
            k = _draw(rng, count, ok)
            if k is not None:
                premise_doc.append(d)
                premise_pos.append(i)
                neutral_pos.append(positions(k))
    if not premise_doc:
        raise ConfigError(f"sotu_pairs: split {split!r} gives no pairs ({len(docs)} documents; each needs more than {gap} usable sentences)")
    if len(set(premise_doc)) < 2:
        raise ConfigError(f"sotu_pairs: split {split!r} needs premises from at least two documents for the 'contradiction' pairs, got {len(set(premise_doc))}")
    # contradiction: the continuation of a random premise of another document
    rng = _seed_for(seed, split, len(docs) + 1)
    docs_of: dict[str, set[int]] = {}  # text -> the documents holding it (a few texts recur)
    for d, doc in enumerate(docs):
        for sentence in doc:
            docs_of.setdefault(sentence, set()).add(d)
    nexts = [docs[d][i + 1] for d, i in zip(premise_doc, premise_pos)]
    premises, hypotheses, labels = [], [], []
    for k, (d, i) in enumerate(zip(premise_doc, premise_pos)):
        premise = docs[d][i]
        # no document may hold both texts, or the pair would also be a "same document" one
        c = _draw(rng, len(nexts), lambda c: docs_of[nexts[c]].isdisjoint(docs_of[premise]))
        if c is None:
            raise ConfigError(f"sotu_pairs: split {split!r}: no sentence of another document for the 'contradiction' pair of document {d}")
        for label, hypothesis in enumerate((nexts[k], docs[d][neutral_pos[k]], nexts[c])):
            premises.append(premise)
            hypotheses.append(hypothesis)
            labels.append(label)
    order = _seed_for(seed, split, len(docs) + 2).permutation(len(labels))
    return PairSplit(
        premises=[premises[o] for o in order],
        hypotheses=[hypotheses[o] for o in order],
        labels=np.asarray(labels, np.int64)[order],
        matched=np.ones(len(labels), bool),
        genres=[SUBSTITUTE_GENRE] * len(labels),
    )


# ----------------------------------------------------------------------------------------------------
# Baselines
# ----------------------------------------------------------------------------------------------------


def majority_baseline(train: PairSplit, split: PairSplit) -> float:
    """Accuracy on `split` of always answering the most frequent label of `train` (the lowest id on a tie)."""
    if not len(split):
        raise ValueError("majority_baseline: the split to score is empty")
    majority = int(np.argmax(train.label_counts()))
    return float(np.mean(split.labels == majority))


_WORD = re.compile(r"\w+")


def overlap_scores(pairs: PairSplit) -> np.ndarray:
    """(n,) float: the share of the hypothesis's distinct words (lower-cased ``\\w+``) that occur in the premise."""
    cache: dict[str, frozenset] = {}  # a premise comes with three hypotheses, and sentences recur

    def words(text: str) -> frozenset:
        found = cache.get(text)
        if found is None:
            found = cache[text] = frozenset(_WORD.findall(text.lower()))
        return found

    out = np.empty(len(pairs))
    for k, (premise, hypothesis) in enumerate(zip(pairs.premises, pairs.hypotheses)):
        h = words(hypothesis)
        out[k] = len(h & words(premise)) / len(h) if h else 0.0
    return out


@dataclass(frozen=True)
class OverlapRule:
    """Label by word overlap: `labels[0]` below `low`, `labels[1]` in [low, high), `labels[2]` from `high` on."""

    low: float
    high: float
    labels: tuple[int, int, int]
    train_accuracy: float = field(default=float("nan"), compare=False)

    def predict(self, pairs: PairSplit) -> np.ndarray:
        scores = overlap_scores(pairs)
        bins = (scores >= self.low).astype(np.int64) + (scores >= self.high)
        return np.asarray(self.labels, np.int64)[bins]


def fit_overlap_rule(train: PairSplit, quantiles: int = 200) -> OverlapRule:
    """The `OverlapRule` most accurate on `train`: two cut points among `quantiles` quantiles of its overlap
    scores, and any label for each of the three intervals (so a single cut and the majority are candidates)."""
    if not len(train):
        raise ValueError("fit_overlap_rule: the training split is empty")
    scores = overlap_scores(train)
    # cut points are scores of train (all of them when there are few distinct ones); +inf = "no cut"
    cuts = np.unique(np.concatenate([np.quantile(scores, np.linspace(0, 1, quantiles + 1), method="lower"), [np.inf]]))
    order = np.argsort(scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], train.labels[order]
    # below[c, k]: pairs of label c with a score < cuts[k]
    position = np.searchsorted(sorted_scores, cuts, side="left")
    onehot = np.zeros((len(LABELS), len(scores) + 1), np.int64)
    onehot[sorted_labels, np.arange(1, len(scores) + 1)] = 1
    below = np.cumsum(onehot, axis=1)[:, position]  # (3, cuts)
    total = below[:, -1:]
    best = (-1, 0, 0, (0, 0, 0))
    for assignment in itertools.product(range(len(LABELS)), repeat=3):
        lo, mid, hi = assignment
        # correct[a, b] = below[lo, a] + (below[mid, b] - below[mid, a]) + (total[hi] - below[hi, b]), a <= b
        correct = (below[lo] - below[mid])[:, None] + (below[mid] - below[hi])[None, :] + total[hi]
        correct = np.where(np.triu(np.ones_like(correct, dtype=bool)), correct, -1)
        a, b = np.unravel_index(int(np.argmax(correct)), correct.shape)
        if correct[a, b] > best[0]:
            best = (int(correct[a, b]), a, b, assignment)
    correct, a, b, assignment = best
    return OverlapRule(float(cuts[a]), float(cuts[b]), assignment, correct / len(scores))


def overlap_baseline(train: PairSplit, split: PairSplit) -> float:
    """Accuracy on `split` of the word-overlap rule fitted on `train` (``fit_overlap_rule``): the floor of a
    model that only counts shared words."""
    if not len(split):
        raise ValueError("overlap_baseline: the split to score is empty")
    return float(np.mean(fit_overlap_rule(train).predict(split) == split.labels))
