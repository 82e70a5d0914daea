"""Byte-level documents with class labels, the data of LRA Text (and of the BBC News pairs of LRA Retrieval).

Every UTF-8 byte of a document is one token (``encode_bytes``: id = byte + 1, 0 pads), a split of
documents a `PackedSplit` (``byte_split``). ``read_class_folders`` reads corpora laid out as one folder
of ``.txt`` files per class (the official IMDB release, aclImdb_v1; BBC News), ``stratified_split``
cuts a corpus without splits into train / val / test per class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sparse_runner.checks import ConfigError, one_line
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.hub import SPLITS
from sparse_runner.data.splits import PackedSplit

PAD_ID = 0
VOCAB_SIZE = 257  # 256 byte values, shifted by one so that 0 can pad


def encode_bytes(text: str | bytes, max_length: int | None = None) -> np.ndarray:
    """A document as byte tokens: (n,) uint16 ids = UTF-8 byte + 1, the first `max_length` bytes."""
    data = (text.encode("utf-8") if isinstance(text, str) else text)[:max_length]
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16) + 1


def byte_split(texts: list[str], labels, max_length: int) -> PackedSplit:
    return PackedSplit.from_sequences([encode_bytes(t, max_length) for t in texts], labels)


def read_class_folders(root: Path, classes: list[str], where: str) -> tuple[list[str], list[int]]:
    """Texts and labels of `root/<class>/*.txt` (label = index of the class in `classes`), in
    sorted file order. Files are read as UTF-8 with undecodable bytes replaced. Something named ``*.txt``
    that is not a readable file (a directory, a dangling link) raises `DataFormatError` naming it."""
    texts, labels = [], []
    for label, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
            raise ConfigError(f"{where}: no class folder {folder} (task.classes={list(classes)}; folders there: {', '.join(present) or 'none'})")
        files = sorted(folder.glob("*.txt"))
        if not files:
            raise ConfigError(f"{where}: class folder {folder} holds no .txt files")
        for path in files:
            if not path.is_file():
                raise DataFormatError(f"{where}: {path} is a directory, not a text file" if path.is_dir() else f"{where}: {path} is not a file (a dangling link?)")
            try:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
            except OSError as error:
                raise DataFormatError(f"{where}: cannot read {path} ({one_line(error)})") from None
            labels.append(label)
    return texts, labels


def stratified_split(labels: np.ndarray, fractions: tuple[float, float], seed: int) -> dict[str, np.ndarray]:
    """Indices of train / val / test: per class a seeded shuffle cut at `fractions` (val, test)."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for label in np.unique(labels):
        index = rng.permutation(np.flatnonzero(labels == label))
        n_val, n_test = (int(round(f * len(index))) for f in fractions)
        parts["val"].append(index[:n_val])
        parts["test"].append(index[n_val : n_val + n_test])
        parts["train"].append(index[n_val + n_test :])
    return {s: np.sort(np.concatenate(p)) for s, p in parts.items()}
