"""sparse_runner.data.images: IDX, CIFAR-10 pickles and Hugging Face images -> ImageSplit.

Every input is generated here: IDX files (gzipped and raw), CIFAR-10 batches pickled as the official
release is, and a small `datasets.Dataset` of PIL images.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from sparse_runner.data.images import (
    images_from_hf,
    load_cifar10_batches,
    load_idx_dataset,
    lra_image_splits,
    read_idx_images,
    read_idx_labels,
    to_greyscale,
)
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.splits import ImageSplit


def idx_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    """An IDX file of uint8 `array`: magic 0x000008<ndim>, big-endian uint32 dims, then the data."""
    magic = 0x0800 | array.ndim if magic is None else magic
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, *, compress: bool, **kwargs) -> Path:
    data = idx_bytes(array, **kwargs)
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def write_idx_dataset(folder: Path, rng, *, n_train=7, n_test=3, side=28, compress=True) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, side, side), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, compress=compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, compress=compress)
        arrays[prefix] = (images, labels)
    return arrays


# --- IDX ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False], ids=["gz", "raw"])
def test_read_idx_round_trip(tmp_path, compress):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    labels = np.array([9, 0], dtype=np.uint8)
    read_images = read_idx_images(write_idx(tmp_path / "i", images, compress=compress))
    read_labels = read_idx_labels(write_idx(tmp_path / "l", labels, compress=compress))
    assert read_images.dtype == np.uint8 and np.array_equal(read_images, images)
    assert read_labels.dtype == np.int64 and read_labels.tolist() == [9, 0]


def test_read_idx_errors_are_one_line(tmp_path):
    labels_file = write_idx(tmp_path / "labels", np.zeros(4, np.uint8), compress=False)
    with pytest.raises(ValueError, match=r"not an IDX images file \(magic 0x00000801, expected 0x00000803\)"):
        read_idx_images(labels_file)

    short = tmp_path / "short"
    short.write_bytes(idx_bytes(np.zeros((3, 2, 2), np.uint8))[:-1])  # one pixel missing
    with pytest.raises(ValueError, match=r"11 data bytes for shape \(3, 2, 2\) \(expected 12\)"):
        read_idx_images(short)

    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(idx_bytes(np.zeros(4, np.uint8)))[:-6])
    with pytest.raises(ValueError, match="cannot read") as error:
        read_idx_labels(broken)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("compress", [True, False], ids=["gz", "raw"])
def test_load_idx_dataset_pads_to_32(tmp_path, compress):
    arrays = write_idx_dataset(tmp_path, np.random.default_rng(0), compress=compress)
    splits = load_idx_dataset(tmp_path)
    assert set(splits) == {"train", "test"}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = arrays[prefix]
        got = splits[split]
        assert isinstance(got, ImageSplit) and (got.height, got.width) == (32, 32)
        assert got.pixels.shape == (len(images), 1024) and got.pixels.dtype == np.uint8
        assert got.labels.dtype == np.int64 and got.labels.tolist() == labels.tolist()
        grid = got.images()
        assert np.array_equal(grid[:, 2:30, 2:30], images)  # centred: 2 pixels of frame each side
        assert grid[:, :2].max() == 0 and grid[:, 30:].max() == 0 and grid[:, :, :2].max() == 0 and grid[:, :, 30:].max() == 0

    assert load_idx_dataset(tmp_path, size=28)["train"].pixels.shape == (7, 784)


def test_load_idx_dataset_errors(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    write_idx_dataset(tmp_path, rng)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    expected = r"^no t10k-labels-idx1-ubyte\[\.gz\] in .* \(expected the MNIST / Fashion-MNIST IDX files\)$"
    with pytest.raises(ValueError, match=expected):
        load_idx_dataset(tmp_path)

    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(2, np.uint8), compress=False)  # 3 images, 2 labels
    with pytest.raises(ValueError, match=r": 3 test images but 2 labels$"):
        load_idx_dataset(tmp_path)

    with pytest.raises(ValueError, match="cannot pad 28x28 images to 16x16"):
        load_idx_dataset(tmp_path, size=16)


# --- CIFAR-10 -------------------------------------------------------------------------------------


def write_cifar(folder: Path, rng, n_per_batch: int = 4) -> dict[str, tuple[np.ndarray, list[int]]]:
    """The official layout: each batch a pickled dict with bytes keys, as Python 2 wrote them."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n_per_batch).tolist()
        with open(folder / name, "wb") as handle:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": []}, handle)
        written[name] = (data, labels)
    return written


def grey(r, g, b) -> int:
    """LRA's grey level of one pixel in exact arithmetic: tf.image.rgb_to_grayscale scales to [0, 1] (/ 255),
    weighs (0.2989, 0.5870, 0.1140), scales back by 255.5 and truncates. TF does it in float32, which differs
    from this for 237 of the 2^24 colours (those within about 1e-5 of a level): test_greyscale_* pins them."""
    exact = (Fraction(r) * Fraction("0.2989") + Fraction(g) * Fraction("0.5870") + Fraction(b) * Fraction("0.1140"))
    return int(exact / 255 * Fraction("255.5"))


def test_load_cifar10_batches(tmp_path):
    written = write_cifar(tmp_path / "cifar-10-batches-py", np.random.default_rng(2))
    # the parent folder and the folder itself both work
    for where in (tmp_path, tmp_path / "cifar-10-batches-py"):
        splits = load_cifar10_batches(where)
        assert len(splits["train"]) == 20 and len(splits["test"]) == 4
        assert splits["train"].pixels.shape == (20, 1024) and (splits["train"].height, splits["train"].width) == (32, 32)

    train_labels = sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert splits["train"].labels.tolist() == train_labels  # batches in order 1..5
    assert splits["test"].labels.tolist() == written["test_batch"][1]

    # pixel (row 5, column 7) of the first image of batch 2: planes R, G, B of 1024 row-major values
    data = written["data_batch_2"][0][0]
    k = 5 * 32 + 7
    expected = grey(int(data[k]), int(data[1024 + k]), int(data[2048 + k]))
    assert splits["train"].images()[4, 5, 7] == expected
    test_data = written["test_batch"][0][3]
    assert splits["test"].pixels[3, 1023] == grey(int(test_data[1023]), int(test_data[2047]), int(test_data[3071]))


def test_cifar_greyscale_hand_values(tmp_path):
    """A few colours with grey levels worked out by hand."""
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, np.random.default_rng(3), n_per_batch=1)
    data = np.zeros((1, 3072), np.uint8)
    colours = {0: (255, 0, 0), 1: (0, 255, 0), 2: (0, 0, 255), 3: (255, 255, 255), 4: (10, 20, 30)}
    for k, (r, g, b) in colours.items():
        data[0, k], data[0, 1024 + k], data[0, 2048 + k] = r, g, b
    with open(folder / "test_batch", "wb") as handle:
        pickle.dump({b"labels": [7], b"data": data}, handle)
    row = load_cifar10_batches(folder)["test"].pixels[0]
    # grey = trunc(255.5 / 255 * (0.2989 R + 0.5870 G + 0.1140 B)), 255.5 / 255 = 1.0019608:
    # 0.2989 * 255.5 = 76.37; 0.5870 * 255.5 = 149.98 (149, where rounding gave 150); 0.1140 * 255.5 = 29.13;
    # 0.9999 * 255.5 = 255.47; (2.989 + 11.74 + 3.42) * 1.0019608 = 18.18
    assert row[:5].tolist() == [76, 149, 29, 255, 18]


# (R, G, B) -> grey level as tf.image.rgb_to_grayscale gives it, worked out by hand:
# trunc(255.5 / 255 * (0.2989 R + 0.5870 G + 0.1140 B)), 255.5 / 255 = 1.0019608.
TF_GREY = {
    (0, 0, 0): 0,
    (255, 0, 0): 76,        # 76.2195 * 1.0019608 = 76.369
    (0, 255, 0): 149,       # 149.685 * 1.0019608 = 149.979: rounding to nearest gives 150
    (0, 0, 255): 29,        # 29.07 * 1.0019608 = 29.127
    (255, 255, 255): 255,   # 254.9745 * 1.0019608 = 255.474
    (10, 20, 30): 18,       # 18.149 * 1.0019608 = 18.185
    (50, 0, 0): 14,         # 14.945 * 1.0019608 = 14.974: rounding gives 15
    (0, 0, 14): 1,          # 1.596 * 1.0019608 = 1.599: rounding gives 2
    (0, 0, 5): 0,           # 0.57 * 1.0019608 = 0.571: rounding gives 1
    (128, 128, 128): 128,   # 127.9872 * 1.0019608 = 128.238
}


def test_greyscale_as_tensorflow_computes_it() -> None:
    rgb = np.array(list(TF_GREY), dtype=np.uint8)
    assert to_greyscale(rgb).tolist() == list(TF_GREY.values())
    assert to_greyscale(rgb.reshape(2, 5, 3)).shape == (2, 5) and to_greyscale(rgb).dtype == np.uint8


def test_greyscale_is_float32_arithmetic_as_in_tensorflow() -> None:
    # Exactly 92.99999608 and 155.99998373 after the scaling: float32 arithmetic lands on 93.0 and 156.0
    # whatever the order of the sum, as TF's does; exact (or float64) arithmetic truncates to 92 and 155.
    rgb = np.array([(0, 122, 186), (3, 254, 50)], dtype=np.uint8)
    assert [grey(*map(int, c)) for c in rgb] == [92, 155]
    assert to_greyscale(rgb).tolist() == [93, 156]


def test_greyscale_truncates_where_rounding_would_go_one_level_up() -> None:
    rgb = np.random.default_rng(11).integers(0, 256, size=(200_000, 3), dtype=np.uint8)
    ours = to_greyscale(rgb).astype(int)
    rounded = np.rint(rgb.astype(np.float64) @ np.array([0.2989, 0.5870, 0.1140])).astype(int)
    assert set(np.unique(rounded - ours)) == {0, 1}            # never higher, at most one level lower
    assert 0.24 < float(np.mean(rounded != ours)) < 0.26         # a quarter of random colours
    assert int(ours.min()) >= 0 and int(ours.max()) <= 255


def test_load_cifar10_batches_errors(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, np.random.default_rng(4), n_per_batch=1)
    (folder / "data_batch_3").unlink()
    with pytest.raises(ValueError, match=r"missing data_batch_3 \(expected the CIFAR-10 python version"):
        load_cifar10_batches(tmp_path)
    with pytest.raises(ValueError, match="missing data_batch_1, data_batch_2"):
        load_cifar10_batches(tmp_path / "elsewhere")

    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"data_batch_3: not a CIFAR-10 batch \(UnpicklingError"):
        load_cifar10_batches(folder)

    with open(folder / "data_batch_3", "wb") as handle:
        pickle.dump({b"labels": [1, 2], b"data": np.zeros((2, 1024), np.uint8)}, handle)
    with pytest.raises(ValueError, match=r"b'data' is uint8 \(2, 1024\) for 2 labels \(expected uint8 \(n, 3072\)\)"):
        load_cifar10_batches(folder)


class Python2Pickler(pickle._Pickler):
    """Pickles as Python 2's cPickle wrote the official batches (protocol 2): every string, keys included,
    a byte string (SHORT_BINSTRING / BINSTRING), numpy's functions under numpy.core."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj, *args):
        data = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str

    def save_global(self, obj, name=None):
        module = {"numpy._core.multiarray": "numpy.core.multiarray"}.get(obj.__module__, obj.__module__)
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__name__}\n".encode())
        self.memoize(obj)


def python2_batch(batch: dict) -> bytes:
    out = io.BytesIO()
    Python2Pickler(out, protocol=2).dump(batch)
    return out.getvalue()


def test_cifar_batches_of_every_pickle_protocol_load_as_pickle_loads_them(tmp_path):
    """The restricted unpickler reads what pickle.load reads, bit for bit: the official files (Python 2,
    protocol 2, numpy.core names) and batches written by Python 3 at every protocol (numpy._core names,
    _codecs.encode for bytes at 0-2, _frombuffer at 5), labels as ints or numpy ints."""
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, np.random.default_rng(5), n_per_batch=3)
    rng = np.random.default_rng(6)
    batch = {b"batch_label": b"training batch 1 of 5", b"labels": [3, 0, 9], b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8),
             b"filenames": [b"a.png", b"b.png", b"c.png"]}
    official = python2_batch(batch)
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in official and b"_codecs" not in official
    variants = {"python2": official, **{f"protocol{p}": pickle.dumps(batch, protocol=p) for p in range(6)},
                "numpy_labels": pickle.dumps({**batch, b"labels": [np.int64(v) for v in batch[b"labels"]]})}
    expected = None
    for name, raw in variants.items():
        (folder / "data_batch_1").write_bytes(raw)
        reference = pickle.loads(raw, encoding="bytes")
        assert np.array_equal(reference[b"data"], batch[b"data"]) and list(reference[b"labels"]) == [3, 0, 9], name
        train = load_cifar10_batches(folder)["train"]
        if expected is None:
            expected = train
        assert train.pixels.tobytes() == expected.pixels.tobytes() and train.labels.tolist() == expected.labels.tolist(), name
        assert train.labels.tolist()[:3] == [3, 0, 9]


class RunsCode:
    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return (self.call, self.args)


@pytest.mark.parametrize("payload, names", [
    (RunsCode(os.system, "touch PWNED"), f"{os.system.__module__}.system"),
    (RunsCode(eval, "open('PWNED', 'w')"), "builtins.eval"),
    (RunsCode(np.save, "PWNED", np.zeros(1)), "numpy.save"),
    (RunsCode(__import__("codecs").encode, "x", "rot13"), "_codecs.encode other than for bytes"),
])
def test_a_crafted_cifar_batch_is_refused_without_running_anything(tmp_path, monkeypatch, payload, names):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, np.random.default_rng(7), n_per_batch=1)
    (folder / "data_batch_2").write_bytes(pickle.dumps({b"labels": [1], b"data": payload}))
    with pytest.raises(DataFormatError, match=rf"data_batch_2: not a CIFAR-10 batch \(UnpicklingError: .*{names}") as info:
        load_cifar10_batches(folder)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "PWNED").exists()


# --- Hugging Face ---------------------------------------------------------------------------------


def pil_images(arrays):
    from PIL import Image

    return [Image.fromarray(a) for a in arrays]


def test_images_from_hf_rgb(monkeypatch):
    datasets = pytest.importorskip("datasets")
    import sparse_runner.data.images as image_data

    monkeypatch.setattr(image_data, "_HF_BATCH", 2)  # several batches, the last one short
    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, size=(5, 3, 4, 3), dtype=np.uint8)
    rgb[0, 0, 0] = (255, 0, 0)
    rgb[0, 0, 1] = (10, 20, 30)
    dataset = datasets.Dataset.from_dict({"img": pil_images(rgb), "label": [3, 1, 4, 1, 5]})
    split = images_from_hf(dataset)
    assert (split.height, split.width) == (3, 4) and split.pixels.shape == (5, 12) and split.pixels.dtype == np.uint8
    assert split.labels.dtype == np.int64 and split.labels.tolist() == [3, 1, 4, 1, 5]
    assert split.images()[0, 0, :2].tolist() == [76, 18]
    expected = [[grey(*map(int, rgb[n, i, j])) for i in range(3) for j in range(4)] for n in range(5)]
    assert split.pixels.tolist() == expected


def test_images_from_hf_grey_kept():
    datasets = pytest.importorskip("datasets")
    grey_images = np.random.default_rng(6).integers(0, 256, size=(3, 5, 2), dtype=np.uint8)
    dataset = datasets.Dataset.from_dict({"image": pil_images(grey_images), "label": [0, 1, 2]})
    split = images_from_hf(dataset, image_column="image")
    assert np.array_equal(split.images(), grey_images)


def test_images_from_hf_errors():
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    with pytest.raises(ValueError, match=r"dataset has no column 'img' \(columns: image, label\)"):
        images_from_hf(datasets.Dataset.from_dict({"image": pil_images([np.zeros((2, 2), np.uint8)]), "label": [0]}))

    mixed = pil_images([np.zeros((2, 2), np.uint8), np.zeros((2, 3), np.uint8)])
    with pytest.raises(ValueError, match="images of different sizes"):
        images_from_hf(datasets.Dataset.from_dict({"img": mixed, "label": [0, 1]}))

    rgba = [Image.fromarray(np.zeros((2, 2, 4), np.uint8), mode="RGBA")]
    with pytest.raises(ValueError, match=r"neither 8-bit grey nor RGB; cast the column"):
        images_from_hf(datasets.Dataset.from_dict({"img": rgba, "label": [0]}))


def test_images_from_hf_sizes_across_batches(monkeypatch):
    datasets = pytest.importorskip("datasets")
    import sparse_runner.data.images as image_data

    monkeypatch.setattr(image_data, "_HF_BATCH", 1)
    mixed = pil_images([np.zeros((2, 2), np.uint8), np.zeros((3, 2), np.uint8)])
    with pytest.raises(ValueError, match=r"images of different sizes \(2, 2\) and \(3, 2\)"):
        images_from_hf(datasets.Dataset.from_dict({"img": mixed, "label": [0, 1]}))


# --- LRA's split ----------------------------------------------------------------------------------


def numbered(n: int) -> ImageSplit:
    """n 1x1 images whose pixel and label are their index (mod 256), to see the order."""
    return ImageSplit(np.arange(n, dtype=np.int64).reshape(n, 1) % 256, np.arange(n), 1, 1)


@pytest.mark.parametrize(
    "n, val_fraction, n_train", [(50000, 0.1, 45000), (60000, 0.1, 54000), (10, 0.1, 9), (7, 0.1, 6), (7, 0.5, 4)]
)
def test_lra_image_splits_sizes_and_order(n, val_fraction, n_train):
    train, test = numbered(n), numbered(3)
    splits = lra_image_splits(train, test, val_fraction=val_fraction)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [n_train, n - n_train, 3]
    # in the given order, no shuffling: train[:90%] then train[90%:]
    assert splits["train"].labels.tolist() == list(range(n_train))
    assert splits["val"].labels.tolist() == list(range(n_train, n))
    assert splits["test"] is test
    assert np.shares_memory(splits["train"].pixels, train.pixels)  # a view, not a copy


def test_lra_image_splits_rejects_bad_fraction():
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="val_fraction must lie strictly between 0 and 1"):
            lra_image_splits(numbered(4), numbered(1), val_fraction=bad)
