"""Pathfinder splits for the LRA task: ``prepare_pathfinder`` reads LRA's release or generates the
images, splits them into ``{"train", "val", "test"}`` and caches them as ``.npz`` (``split_cache``).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import time
from pathlib import Path

from sparse_runner.data.pathfinder_generator import CHUNK_SIZE, generate_pathfinder
from sparse_runner.data.pathfinder_params import DIFFICULTIES, PathfinderParams
from sparse_runner.data.pathfinder_release import metadata_files, read_released, resolve_release_dir, split_released
from sparse_runner.data.split_cache import split_cache
from sparse_runner.data.splits import ImageSplit

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")

# Bumped whenever the generator, the reader or the split changes what a seed or file produces, so
# that old cache directories (whose names hash this) are not reused. 2: negatives drawn with the
# positives' marker distances, and LRA's 2 px gaps between paddles.
_FORMAT_VERSION = 2


def _count(name: str, value) -> int:
    if isinstance(value, bool):
        raise TypeError(f"prepare_pathfinder: {name} must be an int, got {value!r}")
    try:
        value = operator.index(value)  # accepts numpy ints, rejects floats and strings
    except TypeError:
        raise TypeError(f"prepare_pathfinder: {name} must be an int, got {value!r}") from None
    if value < 0:
        raise ValueError(f"prepare_pathfinder: {name} must be >= 0, got {value}")
    return value


def prepare_pathfinder(
    *,
    data_dir: str | os.PathLike | None,
    cache_dir: str | os.PathLike,
    difficulty: str,
    num_train: int,
    num_val: int,
    num_test: int,
    seed: int,
    resolution: int = 32,
    workers: int = 1,
) -> dict[str, ImageSplit]:
    """{"train", "val", "test"} Pathfinder splits, from LRA's release or generated, cached.

    With `data_dir`: reads the release (``read_released``; data_dir = the ``curv_...`` folder or the
    folder above it) and splits it 80/10/10 with `seed` (``split_released``); the counts are ignored.
    The cache key covers the path, size and mtime of every metadata file.

    Without: generates num_train + num_val + num_test images with `seed` (one stream, cut in that
    order, so train does not change when only val/test counts do) at the difficulty's contour
    length; `workers` processes share the work without changing the result.

    Cached under ``cache_dir/pathfinder/<hash>/{train,val,test}.npz``; a second call with the same
    arguments loads the arrays and generates (or reads) nothing.
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"Pathfinder difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
    counts = {"train": _count("num_train", num_train), "val": _count("num_val", num_val), "test": _count("num_test", num_test)}
    seed, resolution = _count("seed", seed), _count("resolution", resolution)
    root = Path(cache_dir).expanduser() / "pathfinder"

    if data_dir is not None:
        directory = resolve_release_dir(data_dir, difficulty)
        files = [[str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns] for path in metadata_files(directory)]
        identity = {
            "version": _FORMAT_VERSION, "source": "release", "difficulty": difficulty, "directory": str(directory.resolve()),
            "resolution": resolution, "seed": seed, "metadata": files,
        }

        def build() -> dict[str, ImageSplit]:
            start = time.perf_counter()
            images = read_released(directory, difficulty, resolution=resolution)
            logger.info("Pathfinder: read %d released images from %s in %.1f s", len(images), directory, time.perf_counter() - start)
            return split_released(images, seed)

        return split_cache(root, ImageSplit, identity, build, what="Pathfinder")

    params = PathfinderParams.lra(DIFFICULTIES[difficulty], resolution)
    identity = {
        "version": _FORMAT_VERSION, "source": "generated", "difficulty": difficulty, "seed": seed,
        "counts": counts, "chunk_size": CHUNK_SIZE, "params": dataclasses.asdict(params),
    }

    def build() -> dict[str, ImageSplit]:
        total = sum(counts.values())
        start = time.perf_counter()
        everything = generate_pathfinder(total, contour_length=params.contour_length, seed=seed, resolution=resolution, workers=workers)
        elapsed = time.perf_counter() - start
        logger.info(
            "Pathfinder: generated %d %s images in %.1f s (%.0f images/s, %d worker(s))",
            total, difficulty, elapsed, total / elapsed if elapsed > 0 else float("inf"), workers,
        )
        splits, begin = {}, 0
        for name in SPLITS:
            splits[name] = everything.subset(slice(begin, begin + counts[name]))
            begin += counts[name]
        return splits

    return split_cache(root, ImageSplit, identity, build, what="Pathfinder")
