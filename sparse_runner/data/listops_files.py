"""ListOps' vocabulary, tokeniser and release files (the Long Range Arena's ``Source<TAB>Target`` TSVs).

* ``tokenize``: LRA's input pipeline rule that turns a source text into ids (parentheses deleted,
  ``]`` -> ``X``, ``[`` of operators stripped).
* ``read_tsv`` / ``write_tsv``: the official release format (``Source<TAB>Target`` header).
* ``TokenizedSplit``: all sequences of a split as one flat ``uint8`` array plus offsets, saved as ``.npz``.

Errors
------
Anything wrong with the input (a malformed or empty TSV file, an unknown token) raises
``sparse_runner.checks.DataError``: one line naming the file (and line), the problem and what is
expected, which the command line prints as a refusal (exit status 2) rather than a crash.

Pure Python + numpy on purpose: data preparation must not depend on torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from sparse_runner.checks import DataError
from sparse_runner.data.listops_generator import OPERATORS
from sparse_runner.data.splits import PackedSplit
from sparse_runner.io import atomic_open

# ----------------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------------

PAD_ID = 0
END_TOKEN = "X"  # what the closing "]" becomes after tokenisation
#: id 0 = padding, ids 1..10 = digits "0".."9", ids 11..14 = operators, id 15 = "X" (the closing "]").
VOCAB: tuple[str, ...] = ("<pad>",) + tuple(str(d) for d in range(10)) + OPERATORS + (END_TOKEN,)
TOKEN_TO_ID: dict[str, int] = {token: i for i, token in enumerate(VOCAB)}
NUM_CLASSES = 10

# Source-text token -> id, after "(" and ")" are deleted. One lookup implements LRA's rules
# ("]" -> "X", "[MAX" -> "MAX"). Bare "MAX" / "X" are accepted too: LRA's pipeline would map them to
# the same vocabulary entries.
_SOURCE_TOKEN_TO_ID: dict[str, int] = dict(TOKEN_TO_ID)
del _SOURCE_TOKEN_TO_ID["<pad>"]
_SOURCE_TOKEN_TO_ID.update({"[" + op: TOKEN_TO_ID[op] for op in OPERATORS})
_SOURCE_TOKEN_TO_ID["]"] = TOKEN_TO_ID[END_TOKEN]
_DELETE_PARENS = str.maketrans("", "", "()")
_VALID_SOURCE_TOKENS = " ".join([str(d) for d in range(10)] + ["[" + op for op in OPERATORS] + ["]", "(", ")"])


# ----------------------------------------------------------------------------------------------------
# Tokenisation
# ----------------------------------------------------------------------------------------------------


def _source_token_ids(source: str) -> list[int]:
    tokens = source.translate(_DELETE_PARENS).split()
    try:
        return [_SOURCE_TOKEN_TO_ID[token] for token in tokens]
    except KeyError as err:
        raise ValueError(
            f"unknown ListOps token {err.args[0]!r}; valid tokens are: {_VALID_SOURCE_TOKENS}"
        ) from None


def tokenize(source: str) -> list[int]:
    """Ids (see ``VOCAB``) of one source text, following LRA's input pipeline.

    ``(`` and ``)`` are deleted (even when glued to other tokens), ``]`` becomes ``X``, the leading
    ``[`` of an operator is stripped, and the rest is split on whitespace.
    An unknown token raises ``ValueError`` (one line naming it and the valid tokens).
    """
    return _source_token_ids(source)


# ----------------------------------------------------------------------------------------------------
# TSV files (official release format)
# ----------------------------------------------------------------------------------------------------

TSV_HEADER = "Source\tTarget"
_LABEL_TEXT = {str(d): d for d in range(NUM_CLASSES)}


def write_tsv(path: str | os.PathLike, rows: Iterable[tuple[str, int]]) -> None:
    """Write ``rows`` as ``Source<TAB>Target`` lines under that header, atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(TSV_HEADER + "\n")
        for source, label in rows:
            if "\t" in source or "\n" in source:
                raise ValueError(f"{path}: a ListOps source must not contain tabs or newlines")
            handle.write(f"{source}\t{int(label)}\n")


_EXPECTED_ROW = "expected 'Source<TAB>Target' rows: a ListOps expression, a tab, a label 0-9"


def _iter_tsv(path: str | os.PathLike) -> Iterator[tuple[int, str, int]]:
    """Yield ``(line_number, source, label)`` of a release-format TSV file, validating as it goes.

    Every problem raises ``DataError`` naming the file and, where there is one, the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: ListOps TSV file not found; expected a file with the header 'Source<TAB>Target'")
    # Binary lines decoded one by one, so that a bad byte is reported with its line number. The official
    # files were written by csv.writer and end their lines with "\r\n"; "\n" alone is accepted too.
    line_number = 0
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{line_number}: not UTF-8 text ({err.reason} at byte {err.start}); {_EXPECTED_ROW}") from None
            line = line.rstrip("\n").removesuffix("\r")
            if line_number == 1:
                header = line.removeprefix("\ufeff")  # a byte-order mark some editors write
                if header != TSV_HEADER:
                    raise DataError(f"{path}:1: expected the header 'Source<TAB>Target', got {header[:60]!r}")
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                what = "an empty line" if line.strip() == "" else f"{len(fields)} tab-separated fields"
                raise DataError(f"{path}:{line_number}: {what}; {_EXPECTED_ROW}")
            source, label_text = fields
            if source.strip() == "":
                raise DataError(f"{path}:{line_number}: empty Source; {_EXPECTED_ROW}")
            label = _LABEL_TEXT.get(label_text)
            if label is None:
                label = _parse_label(label_text, f"{path}:{line_number}")
            yield line_number, source, label
    if line_number == 0:
        raise DataError(f"{path}:1: the file is empty; expected the header 'Source<TAB>Target' and one row per example")
    if line_number == 1:
        # A split without examples would train on nothing or score 0 of 0 as accuracy 0.0.
        raise DataError(f"{path}: no examples (only the header); {_EXPECTED_ROW}, one per line")


def _parse_label(text: str, where: str) -> int:
    """A label written other than as one digit ("05", " 5"), or the DataError saying why it is none."""
    try:
        value = int(text)
    except ValueError:
        raise DataError(f"{where}: label {text[:20]!r} is not an integer; expected an integer 0-9 in Target") from None
    if not 0 <= value < NUM_CLASSES:
        raise DataError(f"{where}: label {value} is out of range; expected an integer 0-9 in Target")
    return value


def read_tsv(path: str | os.PathLike) -> list[tuple[str, int]]:
    """Read a release-format TSV file into ``(source, label)`` pairs.

    A missing or empty file, a missing or wrong header, no example row, a line without exactly 2
    tab-separated fields, an empty source, or a label that is not an integer 0-9 raises ``DataError``
    (a ``ValueError``) naming the file and line.
    """
    return [(source, label) for _, source, label in _iter_tsv(path)]


# ----------------------------------------------------------------------------------------------------
# Tokenised splits
# ----------------------------------------------------------------------------------------------------


class TokenizedSplit(PackedSplit):
    """All sequences of one ListOps split, concatenated (a `PackedSplit` whose ids and labels are checked
    against ListOps' vocabulary and classes).

    tokens:  (total_tokens,) uint8  ids from ``VOCAB`` (no padding inside)
    offsets: (n + 1,) int64        sequence i is ``tokens[offsets[i]:offsets[i + 1]]``
    labels:  (n,) int64            values 0-9
    """

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.uint8)
        super().__post_init__()

    def _problem(self) -> str | None:
        problem = super()._problem()
        if problem:
            return problem
        if len(self.labels) and self.labels.max() >= NUM_CLASSES:
            return f"labels must be in 0..{NUM_CLASSES - 1}"
        if len(self.tokens) and self.tokens.max() >= len(VOCAB):
            return f"token ids must be < {len(VOCAB)}"
        return None

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, int]]) -> "TokenizedSplit":
        """Tokenise ``(source, label)`` pairs (``DataError`` naming the row for an unknown token)."""
        return cls._from_numbered(((i, source, label) for i, (source, label) in enumerate(rows)), where="row ")

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TokenizedSplit":
        """Read and tokenise a release-format TSV file (``DataError`` naming the file and line, as ``read_tsv``)."""
        return cls._from_numbered(_iter_tsv(path), where=f"{path}:")

    @classmethod
    def _from_numbered(cls, rows: Iterable[tuple[int, str, int]], *, where: str) -> "TokenizedSplit":
        # A bytearray holds one byte per token: the full LRA train split (~10^8 tokens) would take
        # several GB as a Python list of ints.
        tokens = bytearray()
        offsets = [0]
        labels: list[int] = []
        for number, source, label in rows:
            try:
                tokens.extend(_source_token_ids(source))
            except ValueError as err:
                raise DataError(f"{where}{number}: {err}") from None
            offsets.append(len(tokens))
            labels.append(label)
        return cls(np.frombuffer(bytes(tokens), dtype=np.uint8).copy(), np.array(offsets), np.array(labels))
