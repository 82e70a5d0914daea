"""Readers for the LRA Image task's data: CIFAR-10 and its offline stand-ins, as `ImageSplit`s.

LRA Image is CIFAR-10 in 8-bit greyscale, one token per pixel (32x32 = 1024 tokens, 256 grey
levels), split train[:90%] / train[90%:] / the official test set (`lra_image_splits`). Sources:

  load_cifar10_batches  the official "CIFAR-10 python version" release (pickled batches);
  images_from_hf        a Hugging Face `datasets.Dataset` of PIL images (e.g. ``uoft-cs/cifar10``);
  load_idx_dataset      MNIST-style IDX files (Fashion-MNIST is the offline stand-in, fetched by
                        `sparse_runner.data.fetch.fetch_fashion_mnist`), centred in size x size.

`to_greyscale` (TF's rgb_to_grayscale, as LRA's pipeline computes it) and `pad_images` (centred on a
larger canvas) are the pixel transforms the readers share. Every reader returns pixels (n, height * width)
uint8 in row-major order and labels (n,) int64. Numpy only (no torch): data preparation must not depend on
the model side.

A file without the expected layout raises `DataFormatError` (one line naming the file), which the command
line refuses like a bad option (exit status 2). CIFAR-10's pickles are read by `_CifarUnpickler`, which
builds only dicts, lists, strings, numbers and numpy arrays: a crafted batch cannot run code.
"""

from __future__ import annotations

import gzip
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from sparse_runner.checks import one_line
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.splits import ImageSplit

# --- Pixels ---------------------------------------------------------------------------------------


#: `tf.image.rgb_to_grayscale`'s weights (ITU-R 601 luma to 4 digits), float32 as TF's tensor holds them.
GREY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)


def to_greyscale(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB -> (...) uint8 grey, as `tf.image.rgb_to_grayscale` (which LRA's Image task applies
    to CIFAR-10) computes it, in float32 throughout: `convert_image_dtype` to float (x * float32(1 / 255)),
    the weighted sum 0.2989 R + 0.5870 G + 0.1140 B (accumulated R, G, then B), and `convert_image_dtype`
    back (x * 255.5, then a cast, which truncates). That is floor(255.5 / 255 * (0.2989 R + 0.5870 G +
    0.1140 B)) but for float32 rounding, not the sum rounded to nearest (which puts a quarter of random
    colours one level higher): pure green (0, 255, 0) is 149, not 150. In the sum's order only 79 of the 2^24
    colours depend on it (float32 rounding of the last bit); TF's kernel order is not checked here."""
    x = np.asarray(rgb).astype(np.float32) * np.float32(1.0 / 255)
    grey = x[..., 0] * GREY_WEIGHTS[0] + x[..., 1] * GREY_WEIGHTS[1]
    grey = grey + x[..., 2] * GREY_WEIGHTS[2]
    # >= 0 and at most 0.9999... * 255.5 < 256: the cast truncates and never wraps
    return (grey * np.float32(255.5)).astype(np.uint8)


def pad_images(images: np.ndarray, height: int, width: int, value: int = 0) -> np.ndarray:
    """(n, h, w) -> (n, height, width), centred, padded with `value` (28x28 MNIST -> LRA's 32x32)."""
    n, h, w = images.shape
    if h > height or w > width:
        raise ValueError(f"cannot pad {h}x{w} images to {height}x{width}")
    top, left = (height - h) // 2, (width - w) // 2
    out = np.full((n, height, width), value, dtype=images.dtype)
    out[:, top : top + h, left : left + w] = images
    return out


# --- IDX (MNIST, Fashion-MNIST) -------------------------------------------------------------------

IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions (n, rows, columns)
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension (n,)

#: Our split -> the prefix of its IDX files (MNIST and Fashion-MNIST name them alike).
IDX_SPLITS = {"train": "train", "test": "t10k"}


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            # By content, not by name: a file unpacked by hand sometimes keeps its ".gz".
            compressed = handle.read(2) == b"\x1f\x8b"
        opener = gzip.open if compressed else open
        with opener(path, "rb") as handle:
            return handle.read()
    # A damaged gzip stream: BadGzipFile (an OSError), EOFError when cut short, zlib.error inside the data.
    except (OSError, EOFError, zlib.error) as error:
        raise DataFormatError(f"{path}: cannot read ({one_line(error)})") from None


def _read_idx(path: str | os.PathLike, magic: int, what: str) -> np.ndarray:
    """The uint8 array of an IDX file: a big-endian uint32 magic (0x0000 0x08 = unsigned byte, then
    the number of dimensions), one big-endian uint32 per dimension, then the data, C order."""
    path = Path(path)
    raw = _read_maybe_gzip(path)
    if not raw:
        raise DataFormatError(f"{path}: the file is empty (expected an IDX {what} file)")
    ndim = magic & 0xFF
    header = 4 * (1 + ndim)
    found = int.from_bytes(raw[:4], "big")
    if len(raw) < 4 or found != magic:  # the magic first: a wrong kind of file says so, whatever its length
        raise DataFormatError(f"{path}: not an IDX {what} file (magic 0x{found:08x}, expected 0x{magic:08x})")
    if len(raw) < header:
        raise DataFormatError(f"{path}: too short for an IDX {what} file ({len(raw)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != expected:
        raise DataFormatError(f"{path}: {len(raw) - header} data bytes for shape {shape} (expected {expected})")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def read_idx_images(path: str | os.PathLike) -> np.ndarray:
    """(n, rows, columns) uint8 images of an IDX3 file (``*-images-idx3-ubyte``, gzipped or raw)."""
    return _read_idx(path, IDX_IMAGES_MAGIC, "images")


def read_idx_labels(path: str | os.PathLike) -> np.ndarray:
    """(n,) int64 labels of an IDX1 file (``*-labels-idx1-ubyte``, gzipped or raw)."""
    return _read_idx(path, IDX_LABELS_MAGIC, "labels").astype(np.int64)


def _find_idx_file(data_dir: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise DataFormatError(f"no {stem}[.gz] in {data_dir} (expected the MNIST / Fashion-MNIST IDX files)")


def load_idx_dataset(data_dir: str | os.PathLike, *, size: int = 32) -> dict[str, ImageSplit]:
    """{"train", "test"} of an MNIST-style data set: ``train-images-idx3-ubyte[.gz]``,
    ``train-labels-idx1-ubyte[.gz]``, ``t10k-...``, in `data_dir`.

    Each image is centred in a `size` x `size` black frame (28x28 -> LRA Image's 32x32: 2 pixels
    each side), so a split holds pixels (n, size * size) uint8 and labels (n,) int64.
    """
    data_dir = Path(data_dir).expanduser()
    splits = {}
    for split, prefix in IDX_SPLITS.items():
        images_path = _find_idx_file(data_dir, f"{prefix}-images-idx3-ubyte")
        labels_path = _find_idx_file(data_dir, f"{prefix}-labels-idx1-ubyte")
        images, labels = read_idx_images(images_path), read_idx_labels(labels_path)
        if len(images) != len(labels):
            raise DataFormatError(f"{data_dir}: {len(images)} {split} images but {len(labels)} labels")
        try:
            padded = pad_images(images, size, size)
        except ValueError as error:  # images larger than the frame
            raise DataFormatError(f"{images_path}: {error}") from None
        splits[split] = ImageSplit(padded, labels, size, size)
    return splits


# --- CIFAR-10 -------------------------------------------------------------------------------------

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
CIFAR10_SIDE = 32

#: Images converted to grey at a time: `to_greyscale` works in float32 (a few float32 copies per pixel).
_GREY_CHUNK = 4096


def _greyscale(rgb: np.ndarray) -> np.ndarray:
    """(n, H, W, 3) uint8 -> (n, H, W) uint8, `to_greyscale` in chunks to bound its float32 copies."""
    out = np.empty(rgb.shape[:-1], dtype=np.uint8)
    for start in range(0, len(rgb), _GREY_CHUNK):
        out[start : start + _GREY_CHUNK] = to_greyscale(rgb[start : start + _GREY_CHUNK])
    return out


def _latin1(text: object, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """`_codecs.encode` as a pickle of protocol 0-2 written by Python 3 uses it: a bytes object as latin-1 text."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError("it calls _codecs.encode other than for bytes (latin-1)")
    return text.encode("latin-1")


def _cifar_globals() -> dict[tuple[str, str], Any]:
    """The globals a CIFAR-10 batch may name, under each module name numpy 1 and 2 write: the numpy array
    (ndarray, dtype and the functions arrays and numpy scalars pickle with) and bytes as pickled by Python 3
    at protocols 0-2. The official files (Python 2, protocol 2) name numpy.core.multiarray._reconstruct,
    numpy.ndarray and numpy.dtype."""
    reconstruct = np.zeros(1).__reduce__()[0]  # numpy(._)core.multiarray._reconstruct
    scalar = np.uint8(0).__reduce__()[0]  # numpy(._)core.multiarray.scalar
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]  # numpy(._)core.numeric._frombuffer (protocol 5)
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _latin1}
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = scalar
        allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that resolves only `_cifar_globals()`: any other global (os.system, builtins.eval, a
    class of some package ...) ends the load with UnpicklingError before anything of the file is called."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, encoding="bytes")  # written by Python 2: keys are bytes
        self._allowed = _cifar_globals()

    def find_class(self, module: str, name: str) -> Any:
        allowed = self._allowed.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR-10 batch never does; nothing of the file was run")
        return allowed


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(n, 3072) uint8 rows and (n,) int64 labels of one pickled CIFAR-10 batch, read with
    `_CifarUnpickler`: nothing the file names is run."""
    try:
        with open(path, "rb") as handle:
            batch = _CifarUnpickler(handle).load()
    except Exception as error:  # pickle fails in many ways (UnpicklingError, EOFError, TypeError, ...)
        raise DataFormatError(f"{path}: not a CIFAR-10 batch ({type(error).__name__}: {one_line(error)})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataFormatError(f"{path}: not a CIFAR-10 batch (expected a dict with b'data' and b'labels')")
    data = np.asarray(batch[b"data"])
    try:
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        labels = None
    if labels is None or labels.ndim != 1 or (len(labels) and labels.min() < 0):
        raise DataFormatError(f"{path}: b'labels' is not a list of class numbers 0, 1, 2 ... (got {one_line(repr(batch[b'labels']))[:60]})")
    width = 3 * CIFAR10_SIDE * CIFAR10_SIDE
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != width or len(data) != len(labels):
        raise DataFormatError(f"{path}: b'data' is {data.dtype} {data.shape} for {len(labels)} labels (expected uint8 (n, {width}))")
    return data, labels


def load_cifar10_batches(data_dir: str | os.PathLike) -> dict[str, ImageSplit]:
    """{"train": 50,000, "test": 10,000} CIFAR-10 images in greyscale, from the official "CIFAR-10
    python version" release: ``cifar-10-batches-py/data_batch_1`` .. ``_5`` and ``test_batch``.

    `data_dir` is that folder or its parent. Each batch is a pickled dict: b"data" (10000, 3072)
    uint8, a row being the R, G and B planes of a 32x32 image, each row-major; b"labels" 10000 ints.
    Grey = `to_greyscale` (LRA's weights). Splits: pixels (n, 1024) uint8, labels (n,) int64.

    The batches are unpickled by `_CifarUnpickler`, which builds dicts, lists, strings, numbers and numpy
    arrays and nothing else: a file that names anything more (a function to call) is refused unrun.
    """
    data_dir = Path(data_dir).expanduser()
    if not (data_dir / CIFAR10_TEST_BATCH).is_file() and (data_dir / CIFAR10_FOLDER).is_dir():
        data_dir = data_dir / CIFAR10_FOLDER
    names = {"train": CIFAR10_TRAIN_BATCHES, "test": (CIFAR10_TEST_BATCH,)}
    missing = [n for batch_names in names.values() for n in batch_names if not (data_dir / n).is_file()]
    if missing:
        raise DataFormatError(f"{data_dir}: missing {', '.join(missing)} (expected the CIFAR-10 python version, {CIFAR10_FOLDER}/)")
    splits = {}
    for split, batch_names in names.items():
        batches = [_read_cifar_batch(data_dir / n) for n in batch_names]
        data = np.concatenate([d for d, _ in batches])
        labels = np.concatenate([l for _, l in batches])
        # (n, 3072) = (n, channel, row, column) -> (n, row, column, channel), as to_greyscale wants
        rgb = data.reshape(len(data), 3, CIFAR10_SIDE, CIFAR10_SIDE).transpose(0, 2, 3, 1)
        splits[split] = ImageSplit(_greyscale(rgb), labels, CIFAR10_SIDE, CIFAR10_SIDE)
    return splits


# --- Hugging Face datasets ------------------------------------------------------------------------

#: Images decoded per batch when reading a `datasets.Dataset`.
_HF_BATCH = 1000


def images_from_hf(dataset: Any, *, image_column: str = "img", label_column: str = "label") -> ImageSplit:
    """One split of a Hugging Face `datasets.Dataset` whose `image_column` holds PIL images and
    `label_column` integer labels, as an ImageSplit (pixels (n, H * W) uint8, labels (n,) int64).

    RGB images (H, W, 3) become grey with `to_greyscale`; grey ones ("L", (H, W)) are kept as they are.
    All images must have one size. CIFAR-10 (``uoft-cs/cifar10``) names its columns ``img`` and
    ``label``; MNIST-style sets ``image`` and ``label``. Other modes (RGBA, palette, 16-bit) raise:
    cast the column first, e.g. ``dataset.cast_column("img", datasets.Image(mode="RGB"))``.
    """
    for column in (image_column, label_column):
        if column not in dataset.column_names:
            raise DataFormatError(f"dataset has no column {column!r} (columns: {', '.join(dataset.column_names)})")
    pixels, labels, size = [], [], None
    # Numpy format decodes a batch of equal-sized images into one (b, H, W[, C]) array.
    for batch in dataset.with_format("numpy").iter(batch_size=_HF_BATCH):
        images = batch[image_column]
        if images.dtype == object:  # the batch could not be stacked: sizes differ within it
            shapes = sorted({tuple(np.shape(image)) for image in images})
            raise DataFormatError(f"column {image_column!r}: images of different sizes {shapes[:3]}")
        if images.ndim == 4 and images.shape[-1] == 1:
            images = images[..., 0]
        if images.ndim == 4 and images.shape[-1] == 3:
            images = _greyscale(images)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DataFormatError(
                f"column {image_column!r}: images of {images.dtype} shape {images.shape[1:]} are neither 8-bit grey nor RGB; "
                "cast the column with datasets.Image(mode='RGB') or mode='L'"
            )
        if size is None:
            size = images.shape[1:]
        elif images.shape[1:] != size:
            raise DataFormatError(f"column {image_column!r}: images of different sizes {size} and {images.shape[1:]}")
        pixels.append(images.reshape(len(images), -1))
        labels.append(np.asarray(batch[label_column], dtype=np.int64))
    if size is None:
        raise DataFormatError("dataset is empty")
    return ImageSplit(np.concatenate(pixels), np.concatenate(labels), *size)


# --- LRA's split ----------------------------------------------------------------------------------


def lra_image_splits(train: ImageSplit, test: ImageSplit, *, val_fraction: float = 0.1) -> dict[str, ImageSplit]:
    """{"train", "val", "test"} as LRA makes them: the first 1 - `val_fraction` of `train` in its
    given order, then the rest (TFDS slicing ``train[:90%]`` / ``train[90%:]``, no shuffling), and
    `test` as it is. The boundary is rounded to the nearest example, as TFDS rounds percent slices
    (CIFAR-10: 45,000 / 5,000 / 10,000). Train and val are views of `train`, not copies.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie strictly between 0 and 1, got {val_fraction}")
    boundary = int(round(len(train) * (1.0 - val_fraction)))
    return {
        "train": train.subset(slice(0, boundary)),
        "val": train.subset(slice(boundary, len(train))),
        "test": test,
    }
