"""LRA Image: CIFAR-10 as 8-bit greyscale pixels, one token per pixel (Tay et al. 2021; docs/papers.md).

A 32 x 32 image is a sequence of 1024 tokens (vocabulary 256, read row by row, no convolutional stem);
LRA's split is train[:90 %] / train[90 %:] / the official test set.

Sources (`task.source`):
  hf             CIFAR-10 through Hugging Face `datasets` (`uoft-cs/cifar10`: columns img, label), or any
                 image dataset with an image and a label column (local image folders included:
                 `task.hf_path=imagefolder task.hf_data_dir=DIR`).
  files          the official release files in `task.data_dir`: CIFAR-10's python version
                 (`task.file_format=cifar10`: data_batch_1..5, test_batch) or IDX files
                 (`task.file_format=idx`: MNIST / Fashion-MNIST's train-/t10k-*-ubyte[.gz]), the latter
                 padded from 28 x 28 to 32 x 32.
  fashion_mnist  the offline substitute: Fashion-MNIST (Xiao et al. 2017; 70k 28 x 28 greyscale images of
                 10 clothing classes), fetched from Debian's `dataset-fashion-mnist` package on first use
                 and padded to 32 x 32. Real images, but not CIFAR-10: metrics.json and the report say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sparse_runner.checks import choice, fail
from sparse_runner.data import images
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.hub import load_hub_splits
from sparse_runner.data.split_cache import split_cache
from sparse_runner.data.splits import ImageSplit
from sparse_runner.tasks.classification import ClassificationData, SequenceClassificationTask
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import DataSourceConfig, check_source

SOURCES = ("hf", "files", "fashion_mnist")
FILE_FORMATS = ("cifar10", "idx")
RELEASE_FILES = "a folder with CIFAR-10's python batches (task.file_format=cifar10) or MNIST-style IDX files (task.file_format=idx)"
IMAGE_SIZE = 32
# Part of every split cache key: 2 = grey levels as tf.image.rgb_to_grayscale truncates them (format 1
# rounded them to nearest), so a cache of another format is not served.
_FORMAT_VERSION = 2


def padded(split: ImageSplit, size: int) -> ImageSplit:
    """`split` centred on a size x size canvas (28 x 28 MNIST-style images -> LRA's 32 x 32)."""
    if (split.height, split.width) == (size, size):
        return split
    if split.height > size or split.width > size:
        raise DataFormatError(f"task lra_image: the data's images are {split.width}x{split.height}, larger than LRA Image's {size}x{size}")
    return ImageSplit(images.pad_images(split.images(), size, size), split.labels, size, size)


class ImageClassificationTask(SequenceClassificationTask):
    """Pixels as tokens: every id 0-255 is a grey level, so nothing pads (all images have one size)."""

    @classmethod
    def check_image_length(cls, t, pixels: int) -> None:
        if t.max_length != pixels:
            fail("task.max_length", f"must equal the pixels per image ({pixels}), got {t.max_length}")

    def image_data(self, splits: dict[str, ImageSplit], num_classes: int, info: dict) -> ClassificationData:
        return ClassificationData(splits, vocab_size=ImageSplit.VOCAB_SIZE, num_classes=num_classes, pad_id=None, info=info)


@dataclass
class LraImageTaskConfig(DataSourceConfig):
    source: str
    file_format: str
    hf_path: Optional[str]
    hf_splits: dict[str, str]
    hf_image_field: str
    hf_label_field: str
    val_fraction: float  # validation = the last 10 % of the training split, as in LRA


@register_task("lra_image", config=LraImageTaskConfig)
class LraImageTask(ImageClassificationTask):
    @classmethod
    def check_config(cls, t) -> None:
        check_source(t, files=RELEASE_FILES, hub_example="uoft-cs/cifar10", sources=SOURCES)
        choice("task.file_format", t.file_format, FILE_FORMATS)
        if not 0 < t.val_fraction < 1:
            fail("task.val_fraction", f"must be in (0, 1), got {t.val_fraction}")
        unknown = sorted(set(t.hf_splits) - {"train", "test"})
        if unknown:
            fail("task.hf_splits", f"has key(s) {', '.join(unknown)}; validation is cut from train (task.val_fraction)", "train, test")
        cls.check_image_length(t, IMAGE_SIZE * IMAGE_SIZE)

    def load_data(self) -> ClassificationData:
        t = self.cfg
        root = Path(os.path.expanduser(self.cache_dir)) / "lra_image"
        if t.source == "hf":
            identity = {"version": _FORMAT_VERSION, "hf": [t.hf_path, t.hf_name, t.hf_revision, t.hf_data_dir, str(t.hf_data_files), dict(t.hf_splits)],
                        "fields": [t.hf_image_field, t.hf_label_field]}
            base = split_cache(root / "hf", ImageSplit, identity, self._from_hub, what="LRA Image")
            real = t.hf_path == "uoft-cs/cifar10"
            info = {"name": "cifar10" if real else str(t.hf_path), "source": "hub" if real else "release", "substitute_for": None,
                    "description": f"{t.hf_path} through datasets, greyscale 32x32"}
        elif t.source == "files":
            data_dir = Path(os.path.expanduser(t.data_dir))
            stats = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in data_dir.rglob("*") if p.is_file())
            identity = {"version": _FORMAT_VERSION, "format": t.file_format, "files": stats}
            load = images.load_cifar10_batches if t.file_format == "cifar10" else images.load_idx_dataset
            base = split_cache(root / "files", ImageSplit, identity, lambda: load(data_dir), what="LRA Image")
            info = {"name": "cifar10" if t.file_format == "cifar10" else data_dir.name, "source": "release", "substitute_for": None,
                    "description": f"{t.file_format} files in {t.data_dir}"}
        else:
            from sparse_runner.data.fetch import fetch_fashion_mnist

            identity = {"version": _FORMAT_VERSION, "source": "fashion_mnist"}
            base = split_cache(root / "fashion_mnist", ImageSplit, identity, lambda: images.load_idx_dataset(fetch_fashion_mnist(self.cache_dir)), what="LRA Image")
            info = {"name": "fashion_mnist", "source": "substitute", "substitute_for": "CIFAR-10",
                    "description": "Fashion-MNIST (Xiao et al. 2017) from Debian's dataset-fashion-mnist, padded to 32x32; real images standing in for CIFAR-10"}
        base = {s: padded(split, IMAGE_SIZE) for s, split in base.items()}
        splits = images.lra_image_splits(base["train"], base["test"], val_fraction=t.val_fraction)
        num_classes = int(max(int(s.labels.max()) for s in splits.values())) + 1
        return self.image_data(splits, num_classes, info)

    def _from_hub(self) -> dict[str, ImageSplit]:
        t = self.cfg
        loaded = load_hub_splits(
            t.hf_path, t.hf_name, splits=dict(t.hf_splits), revision=t.hf_revision, data_dir=t.hf_data_dir, data_files=t.hf_data_files,
            where=f"task {t.name}", local_files=f"task.source=files task.data_dir=<{RELEASE_FILES}>, or task.source=fashion_mnist (offline substitute)",
        )
        return {s: images.images_from_hf(ds, image_column=t.hf_image_field, label_column=t.hf_label_field) for s, ds in loaded.items()}
