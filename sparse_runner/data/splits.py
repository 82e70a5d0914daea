"""In-memory containers for classification splits, with a fast `.npz` cache form.

Two shapes cover every LRA task:
  PackedSplit  variable-length sequences (ListOps tokens, bytes of a document) concatenated into one
               flat array plus offsets, so 10^8 tokens cost 10^8 bytes, not a list of Python ints;
  ImageSplit   fixed-size greyscale images (LRA Image, Pathfinder), one row of height * width pixels
               per example: each pixel is one token (0-255), read row by row.

Both satisfy `classification.ClassificationSplit` (`len`, `sequence(i)`, `labels`, `lengths()`).
Numpy only: data preparation must not depend on torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from sparse_runner.io import atomic_open


def _load_npz(path: str | os.PathLike, names: tuple[str, ...], what: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        missing = set(names) - set(data.files)
        if missing:
            raise ValueError(f"{path}: not a {what} file (missing {', '.join(sorted(missing))})")
        return {name: data[name] for name in data.files}


def _save_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Uncompressed (fast to load), written atomically."""
    with atomic_open(path, "wb") as handle:
        np.savez(handle, **arrays)


@dataclass(eq=False)  # numpy arrays have no single truth value
class PackedSplit:
    """Variable-length sequences of one split, concatenated.

    tokens:  (total,) uint8 or uint16   ids, no padding inside
    offsets: (n + 1,) int64             sequence i is tokens[offsets[i]:offsets[i + 1]]
    labels:  (n,) int64
    """

    tokens: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens)
        if self.tokens.dtype not in (np.uint8, np.uint16):
            self.tokens = self.tokens.astype(np.uint16 if self.tokens.size and self.tokens.max() > 255 else np.uint8)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        problem = self._problem()
        if problem:
            raise ValueError(f"inconsistent {type(self).__name__}: {problem}")

    def _problem(self) -> str | None:
        if self.tokens.ndim != 1 or self.offsets.ndim != 1 or self.labels.ndim != 1:
            return "tokens, offsets and labels must be 1-D"
        if len(self.offsets) != len(self.labels) + 1:
            return f"{len(self.offsets)} offsets for {len(self.labels)} labels (need n + 1)"
        if self.offsets[0] != 0 or self.offsets[-1] != len(self.tokens):
            return f"offsets must run from 0 to {len(self.tokens)}, got {self.offsets[0]}..{self.offsets[-1]}"
        if np.any(np.diff(self.offsets) < 0):
            return "offsets must be non-decreasing"
        if len(self.labels) and self.labels.min() < 0:
            return "labels must be >= 0"
        return None

    @classmethod
    def from_sequences(cls, sequences: list[np.ndarray] | list[bytes], labels) -> "PackedSplit":
        """From a list of 1-D id arrays (or `bytes`, read as uint8 ids)."""
        arrays = [np.frombuffer(s, dtype=np.uint8) if isinstance(s, (bytes, bytearray)) else np.asarray(s) for s in sequences]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint8)
        return cls(tokens, offsets, np.asarray(labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        """(n,) int64 number of tokens of each sequence."""
        return np.diff(self.offsets)

    def sequence(self, i: int) -> np.ndarray:
        """(length_i,) ids of sequence `i` (a view, not a copy)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sequence index {i} out of range for {n} sequences")
        i %= n
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def save(self, path: str | os.PathLike) -> None:
        _save_npz(path, {"tokens": self.tokens, "offsets": self.offsets, "labels": self.labels})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PackedSplit":
        data = _load_npz(path, ("tokens", "offsets", "labels"), cls.__name__)
        try:
            return cls(data["tokens"], data["offsets"], data["labels"])
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


@dataclass(eq=False)
class ImageSplit:
    """Greyscale images of one split, one token per pixel.

    pixels: (n, height * width) uint8   row-major (row 0 left to right, then row 1, ...)
    labels: (n,) int64
    """

    pixels: np.ndarray
    labels: np.ndarray
    height: int
    width: int

    VOCAB_SIZE: ClassVar[int] = 256  # one id per 8-bit grey level (LRA Image / Pathfinder)

    def __post_init__(self) -> None:
        self.pixels = np.ascontiguousarray(self.pixels, dtype=np.uint8)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.height, self.width = int(self.height), int(self.width)
        if self.pixels.ndim == 3:  # (n, H, W) images
            self.pixels = self.pixels.reshape(len(self.pixels), -1)
        if self.pixels.ndim != 2 or self.pixels.shape[1] != self.height * self.width:
            raise ValueError(f"inconsistent ImageSplit: pixels of shape {self.pixels.shape} for {self.height}x{self.width} images")
        if len(self.pixels) != len(self.labels):
            raise ValueError(f"inconsistent ImageSplit: {len(self.pixels)} images for {len(self.labels)} labels")
        if len(self.labels) and self.labels.min() < 0:
            raise ValueError("inconsistent ImageSplit: labels must be >= 0")

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        return np.full(len(self), self.pixels.shape[1], dtype=np.int64)

    def sequence(self, i: int) -> np.ndarray:
        return self.pixels[i]

    def images(self) -> np.ndarray:
        """(n, height, width) uint8 view."""
        return self.pixels.reshape(len(self), self.height, self.width)

    def subset(self, index) -> "ImageSplit":
        return ImageSplit(self.pixels[index], self.labels[index], self.height, self.width)

    def save(self, path: str | os.PathLike) -> None:
        _save_npz(path, {"pixels": self.pixels, "labels": self.labels, "shape": np.array([self.height, self.width])})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ImageSplit":
        data = _load_npz(path, ("pixels", "labels", "shape"), cls.__name__)
        try:
            return cls(data["pixels"], data["labels"], *data["shape"].tolist())
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
