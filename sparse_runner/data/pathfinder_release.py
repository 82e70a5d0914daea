"""The images of LRA's Pathfinder release (``<root>/curv_contour_length_14/metadata/<k>.npy`` +
``imgs/<k>/sample_<i>.png``): ``read_released``, and ``split_released``, the 80/10/10 split.

Pillow reads the PNGs; numpy only otherwise: data preparation must not depend on torch. A release the
reader cannot use raises `DataFormatError`, one line naming the file (and the metadata line).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from sparse_runner.checks import one_line
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.pathfinder_params import DIFFICULTIES
from sparse_runner.data.splits import ImageSplit

logger = logging.getLogger(__name__)

#: Difficulty -> folder name in LRA's release (lra_benchmarks/data/pathfinder.py, _split_generators).
RELEASE_DIRS: dict[str, str] = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}

# Checked against (stored copies of) the two public readers of the release:
# * google-research/long-range-arena, lra_benchmarks/data/pathfinder.py (Pathfinder32._build_pcollection):
#   globs <dir>/<curv_...>/metadata/*.npy, reads each with tf.io.read_file(...).decode('utf-8'),
#   splits on '\n' (dropping the empty piece after the last newline), splits each line on ' ', and
#   takes the image path <dir>/<curv_...>/<field 0>/<field 1> and the label int(field 3).
# * state-spaces/s4, src/dataloaders/lra.py (PathFinderDataset): the same fields, metadata files in
#   the order of int(file stem), opened in text mode; it skips curv_baseline/imgs/0/sample_172.png,
#   "an empty file in the dataset", and reads images with PIL .convert("L").
# The generator (drewlinsley/pathfinder snakes2.py, accumulate_meta) writes the fields as
# [subpath, file name, image index, label, continuity, contour_length, distractor_length,
# paddle_length, paddle_thickness, paddle_margin, number of paddle contrasts]. Its save_metadata
# uses np.save, so the generator's own output is a real .npy file of strings, while both readers
# decode the released files as text (no released file was inspected here). Both forms are accepted.
#
# Splits: LRA's input pipeline (lra_benchmarks/image/input_pipeline.py, get_pathfinder_base_datasets)
# takes the TFDS split of one difficulty and slices it [:80%], [80%:90%], [90%:], after filtering out
# empty images. That order is the one TFDS gave the examples when it built the dataset (from hashed
# example keys), which cannot be reproduced without TFDS; S4 instead draws a seeded random split with
# int(0.1 n) images for val and for test. `split_released` does the latter with numpy.

_NUMPY_MAGIC = b"\x93NUMPY"


def resolve_release_dir(data_dir: str | os.PathLike, difficulty: str) -> Path:
    """The difficulty folder (the one holding metadata/): `data_dir` itself or
    `data_dir/RELEASE_DIRS[difficulty]`. DataFormatError naming the layout if neither has metadata files."""
    data_dir = Path(data_dir).expanduser()
    for candidate in (data_dir, data_dir / RELEASE_DIRS[difficulty]):
        if any((candidate / "metadata").glob("*.npy")):
            return candidate
    folder = RELEASE_DIRS[difficulty]
    raise DataFormatError(
        f"Pathfinder data_dir {data_dir}: no metadata/*.npy found; expected <root>/{folder}/metadata/<k>.npy "
        f"and <root>/{folder}/imgs/<k>/sample_<i>.png (LRA's release), with data_dir = <root> or <root>/{folder}"
    )


def metadata_files(directory: Path) -> list[Path]:
    """metadata/*.npy in the order of their numeric names (0, 1, 2, ..., 10), as S4 reads them."""
    files = list((directory / "metadata").glob("*.npy"))
    return sorted(files, key=lambda path: (0, int(path.stem), "") if path.stem.isdigit() else (1, 0, path.stem))


def _metadata_rows(path: Path) -> list[list[str]]:
    """The rows (lists of fields) of one metadata file, text or real .npy (never a pickle)."""
    try:
        raw = path.read_bytes()
        if raw.startswith(_NUMPY_MAGIC):
            with open(path, "rb") as handle:
                table = np.load(handle, allow_pickle=False)
            return [[str(field) for field in row] for row in np.atleast_2d(table)]
    # A directory named <k>.npy, an unreadable file; a damaged or object (pickled) .npy array.
    except (OSError, ValueError, EOFError) as error:
        raise DataFormatError(f"{path}: cannot read the metadata file ({one_line(error)})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DataFormatError(f"{path}: neither a text metadata file nor a .npy array") from None
    return [line.split() for line in text.splitlines() if line.strip()]


def read_released(data_dir: str | os.PathLike, difficulty: str = "hard", *, resolution: int = 32) -> ImageSplit:
    """All images of one difficulty of LRA's Pathfinder release, in metadata order (files by number,
    then lines), as an ImageSplit of resolution x resolution images with labels 0/1.

    `data_dir` is the difficulty folder (e.g. ``.../pathfinder32/curv_contour_length_14``) or the folder
    above it. Empty image files are skipped, as LRA's pipeline and S4 do (the release has one); a
    malformed line, a label other than 0/1, a missing image or one of another size raise DataFormatError
    naming the file.
    """
    from PIL import Image  # only needed for the release

    # What Pillow raises for a file that is no (whole) image: OSError (missing, unidentified, truncated),
    # SyntaxError and ValueError (a broken PNG), DecompressionBombError (absurd dimensions).
    unreadable = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)

    if difficulty not in DIFFICULTIES:
        raise ValueError(f"Pathfinder difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
    directory = resolve_release_dir(data_dir, difficulty)
    pixels: list[np.ndarray] = []
    labels: list[int] = []
    empty = 0
    for path in metadata_files(directory):
        for number, fields in enumerate(_metadata_rows(path), start=1):
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise DataFormatError(
                    f"{path}:{number}: expected '<subfolder> <file> <index> <label 0/1> ...', got {' '.join(fields)[:80]!r}"
                )
            image_path = directory / fields[0] / fields[1]
            try:
                if image_path.stat().st_size == 0:
                    empty += 1
                    continue
                with Image.open(image_path) as image:
                    grey = np.asarray(image.convert("L"))
            except unreadable as error:  # missing file, or not an image
                raise DataFormatError(f"{path}:{number}: cannot read image {image_path} ({one_line(error)})") from None
            if grey.shape != (resolution, resolution):
                raise DataFormatError(f"{image_path}: {grey.shape[1]}x{grey.shape[0]} image, expected {resolution}x{resolution}")
            pixels.append(grey.reshape(-1))
            labels.append(int(fields[3]))
    if not labels:
        raise DataFormatError(f"Pathfinder release {directory}: the metadata files list no (non-empty) images")
    if empty:
        logger.info("Pathfinder: skipped %d empty image file(s) in %s", empty, directory)
    return ImageSplit(np.stack(pixels), np.array(labels), resolution, resolution)


def split_released(images: ImageSplit, seed: int, *, val_fraction: float = 0.1, test_fraction: float = 0.1) -> dict[str, ImageSplit]:
    """{"train", "val", "test"} of the released images: a permutation drawn from `seed`, with
    int(val_fraction * n) images for val, int(test_fraction * n) for test and the rest for train
    (LRA's proportions 80/10/10; see the notes above on why not LRA's exact order)."""
    n = len(images)
    order = np.random.default_rng(seed).permutation(n)
    num_val, num_test = int(val_fraction * n), int(test_fraction * n)
    num_train = n - num_val - num_test
    cuts = {"train": order[:num_train], "val": order[num_train : num_train + num_val], "test": order[num_train + num_val :]}
    # Each split keeps release order inside it, so that a split's content, not its order, is random.
    return {name: images.subset(np.sort(index)) for name, index in cuts.items()}
