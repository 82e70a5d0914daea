"""Tests of the Pathfinder generator, release reader, cache and figure (sparse_runner.data.pathfinder_*;
the figure: sparse_runner.tasks.pathfinder).

Connectivity is checked on the rendered pixels with a flood fill written here, not with the
generator's own occupancy grid, and the path's ends with a breadth-first search over the path mask.
Generation is chunked (512 images a chunk), so the image counts below are multiples of that.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from PIL import Image

from sparse_runner.data import pathfinder_generator as gen
from sparse_runner.data import pathfinder_params as params
from sparse_runner.data import pathfinder_release as pr
from sparse_runner.data import pathfinder_splits as pf
from sparse_runner.data.splits import ImageSplit
from sparse_runner.tasks.pathfinder import save_example_grid

CHUNK = gen.CHUNK_SIZE


@pytest.fixture(scope="module")
def hard():
    """1024 hard (contour length 14) images with their ground truth."""
    return gen.generate_pathfinder(2 * CHUNK, contour_length=14, seed=11, return_meta=True)


@pytest.fixture(scope="module")
def solid():
    """512 hard images whose paddles are at most one pixel apart (paddle_gap=1: no pixel gaps)."""
    return gen.generate_pathfinder(CHUNK, contour_length=14, seed=13, paddle_gap=1.0, return_meta=True)


@pytest.fixture(scope="module")
def by_difficulty(hard):
    out = {"hard": hard}
    for name in ("easy", "intermediate"):
        out[name] = gen.generate_pathfinder(CHUNK, contour_length=params.DIFFICULTIES[name], seed=12, return_meta=True)
    return out


# ---------------------------------------------------------------------------------------------------
# Helpers: morphology on (n, H, W) boolean images
# ---------------------------------------------------------------------------------------------------


def dilate(x: np.ndarray, reach: int) -> np.ndarray:
    """Chebyshev dilation by `reach` of (n, H, W) bool: a pixel is set if any pixel within reach is."""
    n, h, w = x.shape
    padded = np.pad(x, ((0, 0), (reach, reach), (reach, reach)))
    rows = np.zeros((n, h + 2 * reach, w), dtype=bool)
    for d in range(2 * reach + 1):
        rows |= padded[:, :, d : d + w]
    out = np.zeros((n, h, w), dtype=bool)
    for d in range(2 * reach + 1):
        out |= rows[:, d : d + h, :]
    return out


def flood(allowed: np.ndarray, seeds: np.ndarray, reach: int) -> np.ndarray:
    """(n, H, W) distance (in steps of Chebyshev length <= reach, through `allowed` pixels) from the
    seed pixels; -1 where not reached."""
    distance = np.where(seeds & allowed, 0, -1)
    reached = distance == 0
    step = 0
    while True:
        step += 1
        grown = dilate(reached, reach) & allowed
        new = grown & ~reached
        if not new.any():
            return distance
        distance[new] = step
        reached = grown


def one_pixel(n: int, shape: tuple[int, int], pixels: np.ndarray) -> np.ndarray:
    """(n, H, W) bool with pixel pixels[i] (row, col) set in image i."""
    out = np.zeros((n,) + shape, dtype=bool)
    out[np.arange(n), pixels[:, 0], pixels[:, 1]] = True
    return out


def markers_joined(split: ImageSplit, markers: np.ndarray, reach: int = 2) -> np.ndarray:
    """(n,) bool: is the second marker reached from the first by a flood fill over lit pixels (> 0)
    that may step over reach - 1 dark pixels."""
    images = split.images()
    first, second = np.floor(markers[:, 0]).astype(int), np.floor(markers[:, 1]).astype(int)
    distance = flood(images > 0, one_pixel(len(split), images.shape[1:], first), reach)
    return distance[np.arange(len(split)), second[:, 0], second[:, 1]] >= 0


# ---------------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------------


def test_shapes_and_grey_levels(hard):
    split, meta = hard
    assert isinstance(split, ImageSplit) and (split.height, split.width) == (32, 32)
    assert split.pixels.shape == (2 * CHUNK, 1024) and split.pixels.dtype == np.uint8
    assert set(np.unique(split.labels)) == {0, 1}
    # Anti-aliased: a 2x2 canvas per pixel gives five grey levels, and every image uses partial ones.
    assert set(np.unique(split.pixels)) == {0, 64, 128, 191, 255}
    partial = ((split.pixels > 0) & (split.pixels < 255)).any(axis=1)
    assert partial.all()
    assert meta.markers.shape == (2 * CHUNK, 2, 2) and meta.path_mask.shape == (2 * CHUNK, 32, 32)


def test_labels_are_balanced(hard):
    split, _ = hard
    n = len(split)
    # Binomial(n, 1/2): four standard deviations (a false alarm about once in 16,000 seeds).
    assert abs(split.labels.mean() - 0.5) <= 4 * np.sqrt(0.25 / n)


def test_markers_are_drawn_at_the_tips_of_the_right_snakes(hard):
    split, meta = hard
    n = len(split)
    rows = np.arange(n)
    other = 1 - meta.origin
    terminal = np.where(split.labels == 1, meta.origin, other)
    np.testing.assert_array_equal(meta.markers[:, 0], meta.tips[rows, meta.origin, 0])
    np.testing.assert_array_equal(meta.markers[:, 1], meta.tips[rows, terminal, 1])

    first, second = np.floor(meta.markers[:, 0]).astype(int), np.floor(meta.markers[:, 1]).astype(int)
    images = split.images()
    assert (images[rows, first[:, 0], first[:, 1]] == 255).all()  # a disc is fully lit at its centre
    assert (images[rows, second[:, 0], second[:, 1]] == 255).all()
    path = meta.path_mask
    assert path[rows, first[:, 0], first[:, 1]].all()  # the first marker starts the path
    positive = split.labels == 1
    on_path = path[rows, second[:, 0], second[:, 1]]
    assert on_path[positive].all()
    assert not on_path[~positive].any()  # label 0: on the other snake, which keeps away from the path
    other_mask = meta.snake_masks[rows, other]
    assert other_mask[rows, second[:, 0], second[:, 1]][~positive].all()

    # The path is one dashed curve: its gaps are one dark pixel, so steps of reach 2 cover it.
    pos = np.flatnonzero(positive)
    from_first = flood(path[pos], one_pixel(len(pos), (32, 32), first[pos]), reach=2)
    assert (from_first[path[pos]] >= 0).all(), "the path mask is one dashed curve"


def test_markers_are_the_two_ends_of_the_path(solid):
    # For label 1 the markers are the two ends of the path: along the path mask, the second marker
    # is the farthest pixel from the first, and the first the farthest from the second. Checked on
    # paths without gaps (paddle_gap=1, 8-connected): with LRA's gaps a fill that steps over them
    # also steps across the one dark pixel a snake may keep from its own older paddles, and so
    # takes shortcuts.
    split, meta = solid
    pos = np.flatnonzero(split.labels == 1)
    first, second = np.floor(meta.markers[pos, 0]).astype(int), np.floor(meta.markers[pos, 1]).astype(int)
    path = meta.path_mask[pos]
    from_first = flood(path, one_pixel(len(pos), (32, 32), first), reach=1)
    from_second = flood(path, one_pixel(len(pos), (32, 32), second), reach=1)
    assert (from_first[path] >= 0).all(), "the path mask is one 8-connected curve"
    k = np.arange(len(pos))
    assert (from_first[k, second[:, 0], second[:, 1]] == from_first.reshape(len(pos), -1).max(1)).all()
    assert (from_second[k, first[:, 0], first[:, 1]] == from_second.reshape(len(pos), -1).max(1)).all()


def test_connectivity_by_flood_fill_on_the_image(by_difficulty):
    # Consecutive paddles are at most one dark pixel apart and different snakes at least two, so a
    # fill over lit pixels that steps over one dark pixel (reach 2) decides the label. Measured
    # (seeds 11 and 12, 2048 images): 100% of positives joined, 100% of negatives apart; the
    # generator guarantees both, so the test asks for all.
    for name, (split, meta) in by_difficulty.items():
        joined = markers_joined(split, meta.markers, reach=2)
        positive = split.labels == 1
        assert joined[positive].all(), f"{name}: {np.sum(~joined[positive])} positives not joined"
        assert not joined[~positive].any(), f"{name}: {np.sum(joined[~positive])} negatives joined"


def test_each_difficulty_runs_and_longer_contours_give_longer_paths(by_difficulty):
    lengths = {name: by_difficulty[name][1].path_mask.sum(axis=(1, 2)).mean() for name in params.DIFFICULTIES}
    assert lengths["easy"] < lengths["intermediate"] < lengths["hard"]
    # Each paddle (2 px, then a 2 px gap) adds about 2-3 lit pixels to the path.
    for name, contour_length in params.DIFFICULTIES.items():
        assert 1.5 * contour_length < lengths[name] < 4 * contour_length, (name, lengths[name])


def test_lra_parameters():
    easy, hard = params.PathfinderParams.lra(6), params.PathfinderParams.lra(14)
    assert (easy.distractor_length, easy.num_distractor_snakes) == (2, 10)
    assert (hard.distractor_length, hard.num_distractor_snakes) == (4, 5)
    assert hard == params.PathfinderParams()  # the defaults are LRA's 32x32 hard settings
    with pytest.raises(ValueError, match="separation"):
        params.PathfinderParams(separation=1)


def test_same_seed_same_bytes_other_seed_other_images():
    a = gen.generate_pathfinder(300, contour_length=9, seed=3)
    b = gen.generate_pathfinder(300, contour_length=9, seed=3)
    c = gen.generate_pathfinder(300, contour_length=9, seed=4)
    assert a.pixels.tobytes() == b.pixels.tobytes() and a.labels.tobytes() == b.labels.tobytes()
    assert a.pixels.tobytes() != c.pixels.tobytes()
    # Fixed chunks: a shorter request is a prefix of a longer one.
    prefix = gen.generate_pathfinder(100, contour_length=9, seed=3)
    assert prefix.pixels.tobytes() == a.pixels[:100].tobytes()


def test_workers_do_not_change_the_output():
    one = gen.generate_pathfinder(CHUNK + 10, contour_length=6, seed=5, workers=1)
    two = gen.generate_pathfinder(CHUNK + 10, contour_length=6, seed=5, workers=2)
    assert one.pixels.tobytes() == two.pixels.tobytes() and one.labels.tobytes() == two.labels.tobytes()


# ---------------------------------------------------------------------------------------------------
# LRA's released files
# ---------------------------------------------------------------------------------------------------


def write_release(root, images: np.ndarray, labels: np.ndarray, *, per_file: int = 7, folder="curv_contour_length_14", npy=False):
    """Write LRA's layout: <root>/<folder>/imgs/<k>/sample_<i>.png and metadata/<k>.npy (text lines
    '<imgs/k> <sample_i.png> <i> <label> <generator fields...>', or a real .npy of strings)."""
    base = root / folder
    for k, start in enumerate(range(0, len(images), per_file)):
        (base / "imgs" / str(k)).mkdir(parents=True, exist_ok=True)
        rows = []
        for i in range(start, min(start + per_file, len(images))):
            Image.fromarray(images[i]).save(base / "imgs" / str(k) / f"sample_{i}.png")
            rows.append([f"imgs/{k}", f"sample_{i}.png", str(i), str(int(labels[i])), "1.0", "14", "4", "2", "0.5", "1", "1"])
        (base / "metadata").mkdir(parents=True, exist_ok=True)
        if npy:
            np.save(base / "metadata" / f"{k}.npy", np.array(rows))
        else:
            (base / "metadata" / f"{k}.npy").write_text("".join(" ".join(row) + "\n" for row in rows))
    return base


@pytest.fixture
def release(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (50, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 2, 50)
    root = tmp_path / "pathfinder32"
    write_release(root, images, labels)
    return root, images, labels


def test_reader_reads_the_release_layout_in_order(release):
    root, images, labels = release
    for data_dir in (root, root / "curv_contour_length_14"):  # the root or the difficulty folder
        split = pr.read_released(data_dir, "hard")
        np.testing.assert_array_equal(split.images(), images)
        np.testing.assert_array_equal(split.labels, labels)


def test_reader_orders_files_by_number_and_skips_empty_images(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (24, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 2, 24)
    base = write_release(tmp_path, images, labels, per_file=2)  # metadata 0..11: "10" sorts after "9"
    (base / "imgs" / "0" / "sample_1.png").write_bytes(b"")  # like curv_baseline/imgs/0/sample_172.png
    split = pr.read_released(tmp_path, "hard")
    keep = np.arange(24) != 1
    np.testing.assert_array_equal(split.images(), images[keep])
    np.testing.assert_array_equal(split.labels, labels[keep])


def test_reader_accepts_real_npy_metadata(tmp_path):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (9, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 2, 9)
    write_release(tmp_path, images, labels, folder="curv_baseline", npy=True)
    split = pr.read_released(tmp_path, "easy")
    np.testing.assert_array_equal(split.images(), images)
    np.testing.assert_array_equal(split.labels, labels)


def test_release_split_is_80_10_10_disjoint_and_seeded(release):
    root, images, _ = release
    split = pr.read_released(root, "hard")
    parts = pr.split_released(split, seed=0)
    assert {name: len(part) for name, part in parts.items()} == {"train": 40, "val": 5, "test": 5}
    rows = {name: {part.pixels[i].tobytes() for i in range(len(part))} for name, part in parts.items()}
    assert not (rows["train"] & rows["val"]) and not (rows["train"] & rows["test"]) and not (rows["val"] & rows["test"])
    assert rows["train"] | rows["val"] | rows["test"] == {image.tobytes() for image in images.reshape(50, -1)}
    again, other = pr.split_released(split, seed=0), pr.split_released(split, seed=1)
    assert again["test"].pixels.tobytes() == parts["test"].pixels.tobytes()
    assert other["test"].pixels.tobytes() != parts["test"].pixels.tobytes()


@pytest.mark.parametrize("make", ["missing", "empty", "no_metadata"])
def test_bad_data_dir_is_one_clear_line(tmp_path, make):
    data_dir = tmp_path / "pathfinder32"
    if make == "empty":
        data_dir.mkdir()
    elif make == "no_metadata":
        (data_dir / "curv_contour_length_14" / "imgs" / "0").mkdir(parents=True)
    for call in (
        lambda: pr.read_released(data_dir, "hard"),
        lambda: pf.prepare_pathfinder(data_dir=data_dir, cache_dir=tmp_path / "cache", difficulty="hard",
                                      num_train=1, num_val=1, num_test=1, seed=0),
    ):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message
        assert "curv_contour_length_14/metadata/<k>.npy" in message and "imgs/<k>/sample_<i>.png" in message


def test_bad_metadata_line_names_the_file(tmp_path):
    base = write_release(tmp_path, np.zeros((3, 32, 32), np.uint8), np.array([0, 1, 0]))
    (base / "metadata" / "0.npy").write_text("imgs/0 sample_0.png 0\n")
    with pytest.raises(ValueError, match=r"0\.npy:1: expected"):
        pr.read_released(tmp_path, "hard")


# ---------------------------------------------------------------------------------------------------
# Preparation and cache
# ---------------------------------------------------------------------------------------------------


def test_prepare_generates_once_then_loads_the_cache(tmp_path, monkeypatch, caplog):
    args = dict(data_dir=None, cache_dir=tmp_path, difficulty="easy", num_train=96, num_val=16, num_test=16, seed=7)
    with caplog.at_level(logging.INFO, logger=pf.__name__):
        first = pf.prepare_pathfinder(**args)
    assert "images/s" in caplog.text
    assert {name: len(split) for name, split in first.items()} == {"train": 96, "val": 16, "test": 16}
    # One stream cut train | val | test.
    stream = gen.generate_pathfinder(128, contour_length=6, seed=7)
    assert first["train"].pixels.tobytes() == stream.pixels[:96].tobytes()
    assert first["test"].pixels.tobytes() == stream.pixels[112:].tobytes()

    def no_generation(*args, **kwargs):
        raise AssertionError("generated again instead of loading the cache")

    monkeypatch.setattr(pf, "generate_pathfinder", no_generation)
    second = pf.prepare_pathfinder(**args)
    for name in pf.SPLITS:
        assert second[name].pixels.tobytes() == first[name].pixels.tobytes()
        np.testing.assert_array_equal(second[name].labels, first[name].labels)
    with pytest.raises(AssertionError, match="generated again"):  # another seed is another cache entry
        pf.prepare_pathfinder(**{**args, "seed": 8})


def test_prepare_reads_the_release_once(release, tmp_path, monkeypatch):
    root, _, _ = release
    args = dict(data_dir=root, cache_dir=tmp_path / "cache", difficulty="hard", num_train=0, num_val=0, num_test=0, seed=0)
    first = pf.prepare_pathfinder(**args)
    assert {name: len(split) for name, split in first.items()} == {"train": 40, "val": 5, "test": 5}

    def no_reading(*args, **kwargs):
        raise AssertionError("read the release again instead of loading the cache")

    monkeypatch.setattr(pf, "read_released", no_reading)
    second = pf.prepare_pathfinder(**args)
    assert second["val"].pixels.tobytes() == first["val"].pixels.tobytes()
    # A rewritten metadata file (new size and mtime) is a new cache entry.
    metadata = root / "curv_contour_length_14" / "metadata" / "0.npy"
    metadata.write_text(metadata.read_text() + "\n")
    os.utime(metadata, ns=(metadata.stat().st_atime_ns, metadata.stat().st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="read the release again"):
        pf.prepare_pathfinder(**args)


def test_prepare_rejects_unknown_difficulty(tmp_path):
    with pytest.raises(ValueError, match="easy, intermediate, hard"):
        pf.prepare_pathfinder(data_dir=None, cache_dir=tmp_path, difficulty="extreme", num_train=1, num_val=1, num_test=1, seed=0)


# ---------------------------------------------------------------------------------------------------
# Figure
# ---------------------------------------------------------------------------------------------------


def test_example_grid_is_a_png_written_atomically(hard, tmp_path):
    split, _ = hard
    path = tmp_path / "figures" / "examples.png"
    save_example_grid(split, path, count=8, columns=4)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        width, height = image.size
    assert width > height > 100  # 4 columns x 2 rows
    assert sorted(p.name for p in path.parent.iterdir()) == ["examples.png"]  # no temporary left behind
