"""LRA Pathfinder: are the two circles connected by a path of dashes? (Tay et al. 2021; docs/papers.md)

A 32 x 32 greyscale image is a sequence of 1024 pixel tokens, label 1 = connected. Synthetic by design:
`data/pathfinder_generator.py` generates it (two target snakes, distractor snakes, two markers;
contour length 6 / 9 / 14 for task.difficulty easy / intermediate / hard, LRA's usual split being
hard), cached like ListOps; or reads LRA's released image folders (task.data_dir). A grid of examples
with their labels is drawn into the run directory (outputs/pathfinder_examples.png).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sparse_runner.checks import choice, existing_dir, positive
from sparse_runner.data.pathfinder_params import DIFFICULTIES
from sparse_runner.data.pathfinder_splits import prepare_pathfinder
from sparse_runner.data.splits import ImageSplit
from sparse_runner.io import atomic_open
from sparse_runner.tasks.base import TaskConfig
from sparse_runner.tasks.classification import ClassificationData
from sparse_runner.tasks.lra_image import ImageClassificationTask
from sparse_runner.tasks.registry import register_task

RELEASE_FOLDER = "LRA's pathfinder32 folder (or one difficulty folder in it) with metadata/*.npy and imgs/"


@dataclass
class PathfinderTaskConfig(TaskConfig):
    data_dir: Optional[str]  # LRA release; null = generate
    difficulty: str
    resolution: int
    num_train: int
    num_val: int
    num_test: int
    seed: int
    workers: int  # processes generating images (the output does not depend on it)


@register_task("pathfinder", config=PathfinderTaskConfig)
class PathfinderTask(ImageClassificationTask):
    @classmethod
    def check_config(cls, t) -> None:
        choice("task.difficulty", t.difficulty, tuple(DIFFICULTIES))
        if t.data_dir is not None:
            existing_dir("task.data_dir", t.data_dir, RELEASE_FOLDER)
        for key in ("resolution", "num_train", "num_val", "num_test", "workers"):
            positive(f"task.{key}", t[key])
        cls.check_image_length(t, t.resolution * t.resolution)

    def load_data(self) -> ClassificationData:
        t = self.cfg
        splits = prepare_pathfinder(
            data_dir=os.path.expanduser(t.data_dir) if t.data_dir else None, cache_dir=os.path.expanduser(self.cache_dir),
            difficulty=t.difficulty, num_train=t.num_train, num_val=t.num_val, num_test=t.num_test, seed=t.seed,
            resolution=t.resolution, workers=t.workers,
        )
        if t.data_dir:
            info = {"name": f"pathfinder{t.resolution} (release)", "source": "release", "substitute_for": None,
                    "description": f"LRA's released images in {t.data_dir}"}
        else:
            info = {"name": f"pathfinder{t.resolution}-{t.difficulty}", "source": "generated", "substitute_for": None,
                    "description": f"our generator, contour length {DIFFICULTIES[t.difficulty]} ({t.difficulty}), seed {t.seed}"}
        return self.image_data(splits, 2, info)

    def write_outputs(self, model, output_dir: Path) -> None:
        save_example_grid(self.splits["test"], Path(output_dir) / "pathfinder_examples.png")


def save_example_grid(split: ImageSplit, path: str | os.PathLike, *, count: int = 16, columns: int = 4) -> None:
    """A PNG grid of the first `count` images of `split`, each titled "connected" (label 1) or
    "not connected" (label 0), written atomically (a temporary file renamed over `path`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    count = min(count, len(split))
    if count < 1 or columns < 1:
        raise ValueError(f"save_example_grid: nothing to draw (count={count}, columns={columns}, {len(split)} images)")
    rows = -(-count // columns)
    # Figure + FigureCanvasAgg rather than pyplot: no global figure state, no GUI backend.
    figure = Figure(figsize=(1.7 * columns, 1.9 * rows))
    FigureCanvasAgg(figure)
    images = split.images()
    for i in range(count):
        axes = figure.add_subplot(rows, columns, i + 1)
        axes.imshow(images[i], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        axes.set_title("connected" if split.labels[i] == 1 else "not connected", fontsize=8)
        axes.set_axis_off()
    figure.tight_layout()
    with atomic_open(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=100)
