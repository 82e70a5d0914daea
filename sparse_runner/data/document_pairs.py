"""Document pairs for LRA Retrieval (do two documents match?), as byte-level `PackedSplit`s.

  read_aan_pairs  LRA's release: ``new_aan_pairs.{train,eval,test}.tsv``, tab-separated without a
                  header: label, id1, id2, text1, text2 (ACL Anthology Network citation pairs; read with
                  `datasets`' csv builder, as the LRA ports do);
  article_pairs   the offline substitute: pairs of half-articles of a corpus with topics (BBC News),
                  matched by article (``halves``) or by topic (``topic``).
"""

from __future__ import annotations

import os

import numpy as np

from sparse_runner.checks import ConfigError, one_line
from sparse_runner.data.byte_text import encode_bytes
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.hub import SPLITS
from sparse_runner.data.lines import utf8_lines
from sparse_runner.data.splits import PackedSplit

AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
AAN_COLUMNS = ["label", "id1", "id2", "text1", "text2"]
AAN_ROW = "expected label<TAB>id1<TAB>id2<TAB>text1<TAB>text2 per line, UTF-8 (LRA's AAN release)"


def read_aan_pairs(files: dict[str, str | os.PathLike], max_length: int, where: str) -> dict[str, PackedSplit]:
    """``{split}_first`` and ``{split}_second`` (the two documents of each pair, up to `max_length` byte
    tokens, with the pair's label) of LRA's AAN files, `files` mapping our splits to their paths. A label
    other than 0 or 1 is a one-line ``ConfigError`` naming the file (`where` first); a file that is not
    UTF-8 or a label that is not a number, a ``DataFormatError`` naming it."""
    import csv

    import datasets

    try:
        loaded = datasets.load_dataset(
            "csv", data_files={s: str(p) for s, p in files.items()}, delimiter="\t", column_names=AAN_COLUMNS,
            quoting=csv.QUOTE_NONE, keep_in_memory=True,
        )
    except datasets.exceptions.DatasetGenerationError as error:  # the csv builder could not parse a file
        raise _unparsable(files, where, error) from None
    out = {}
    for split in SPLITS:
        ds = loaded[split]
        # The release writes labels as floats ("1.0") in some copies and ints in others.
        labels = np.asarray([_label(x, files[split], row, where) for row, x in enumerate(ds["label"], start=1)], dtype=np.int64)
        if len(labels) and not set(np.unique(labels)) <= {0, 1}:
            raise ConfigError(f"{where}: {files[split]}: labels must be 0 or 1, got {sorted(set(labels.tolist()))[:5]}")
        for side, column in (("first", "text1"), ("second", "text2")):
            out[f"{split}_{side}"] = PackedSplit.from_sequences([encode_bytes(x or "", max_length) for x in ds[column]], labels)
    return out


def _label(text: object, path: str | os.PathLike, row: int, where: str) -> int:
    try:
        return int(float(text))
    except (TypeError, ValueError, OverflowError):
        raise DataFormatError(f"{where}: {path}: row {row}: label {str(text)[:20]!r} is not a number; {AAN_ROW}") from None


def _unparsable(files: dict[str, str | os.PathLike], where: str, error: Exception) -> DataFormatError:
    """The one line for a file the csv builder failed on: the first line that is not UTF-8 or whose label is
    not a number, else the builder's reason."""
    def not_utf8(number: int, err: UnicodeDecodeError) -> DataFormatError:
        return DataFormatError(f"{where}: {path}:{number}: not valid UTF-8 ({err.reason} at byte {err.start}); {AAN_ROW}")

    for path in files.values():
        try:
            for number, line in utf8_lines(path, not_utf8, keep_ends=False):
                label = line.split("\t", 1)[0]
                try:
                    float(label)
                except ValueError:
                    if line.strip():
                        return DataFormatError(f"{where}: {path}:{number}: label {label[:20]!r} is not a number; {AAN_ROW}")
        except DataFormatError as found:
            return found
        except OSError:
            pass
    cause = error.__cause__ or error.__context__ or error
    return DataFormatError(f"{where}: cannot read {', '.join(map(str, files.values()))} ({type(cause).__name__}: {one_line(cause)}); {AAN_ROW}")


PAIRINGS = ("halves", "topic")


def article_pairs(texts: list[str], topics: np.ndarray, *, pairing: str, count: int, max_length: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """`count` pairs (first document, second document, label) over the articles `texts`, half positive.

    Every article is cut into its first and second half (in bytes); a document is a half's first
    `max_length` byte tokens; the first document of a pair is always a first half, the second a second half.
      halves  positive (label 1): both halves of one article; negative: halves of two articles, of the
              same topic for half of the negatives (so the topic alone does not decide).
      topic   positive: halves of two different articles of the same topic; negative: of two topics.
    Articles are drawn with replacement.
    """
    if len(texts) < 2:
        raise ConfigError(f"bbc_pairs: needs at least two articles, got {len(texts)}")
    halves = []
    for text in texts:
        data = text.encode("utf-8")
        middle = len(data) // 2
        halves.append((encode_bytes(data[:middle], max_length), encode_bytes(data[middle:], max_length)))
    rng = np.random.default_rng(seed)
    everything = np.arange(len(texts))
    labels = rng.permutation(np.arange(count) % 2)
    first, second = [], []
    for label in labels:
        a = int(rng.integers(len(texts)))
        same_topic = np.flatnonzero(topics == topics[a])
        if pairing == "halves":
            pool = [a] if label else (same_topic if rng.random() < 0.5 and len(same_topic) > 1 else everything)
        else:
            pool = same_topic if label else np.flatnonzero(topics != topics[a])
        pool = np.asarray(pool)
        if not label or pairing == "topic":
            pool = pool[pool != a]
        if len(pool) == 0:
            raise ConfigError(f"bbc_pairs: article {a} has no partner for pairing={pairing} (too few articles per topic)")
        b = int(rng.choice(pool))
        first.append(halves[a][0])
        second.append(halves[b][1])
    return first, second, labels
