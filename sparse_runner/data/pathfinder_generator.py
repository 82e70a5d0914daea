"""The Pathfinder generator for the Long Range Arena (LRA): ``generate_pathfinder``, a numpy
re-implementation of the generator's recipe with LRA's 32x32 settings (``PathfinderParams``),
vectorised over a chunk of images. It is not a port of drewlinsley/pathfinder: "Generator" below says
what is and is not the same. The snakes themselves are drawn by ``pathfinder_snakes``.

Pathfinder (LRA section D.5 of the reference notes; Linsley et al. 2018, Kim et al. 2020) shows two
circle markers on a 32x32 grey image full of dashed curves ("snakes" of short line segments called
paddles). The label is 1 when the markers sit on the two ends of one snake, 0 when they sit on two
different snakes. Each pixel is one token (1024 tokens, 256 grey levels).

Generator
---------
Coordinates are (row, column) in pixels of the final image; pixel (i, j) covers [i, i+1) x [j, j+1).
For each image:

1. Draw the label (uniform 0/1) and which of the two target snakes carries the first marker.
2. Target snakes: start tip A uniform in the middle of the image (like the original generator, A
   keeps 2 * seed_distance from the border), start tip B at ``seed_distance`` from A in a random
   direction. Both grow together, paddle by paddle, ``contour_length`` paddles each. A paddle is a
   segment of ``paddle_length``; the next starts at most ``paddle_gap`` further on and turns by an
   angle d drawn with weight cos(min(|d| * continuity, pi/2))^2 (the original's continuity weight:
   with continuity 1 turns stay under 90 degrees and going straight is most likely), among
   ``turn_candidates`` evenly spaced turns with a random offset, over those that fit.
3. Markers: a disc of ``marker_radius`` at the start tip of the chosen snake, and one at the far tip
   of the same snake (label 1) or of the other snake (label 0).
4. Distractor snakes: ``num_distractor_snakes`` snakes of ``distractor_length`` paddles, each started at
   a random free place; one that does not fit after ``distractor_attempts`` tries is left out (the
   original also leaves out distractors that do not fit).
5. Render: each paddle is a line one sub-pixel wide on a canvas ``antialias_scale`` times finer (so
   0.5 pixel wide, LRA's paddle_thickness), the markers are filled discs, and the canvas is averaged
   down to grey levels k * 255 / antialias_scale^2 (0, 64, 128, 191, 255).

Occupancy makes connectivity well defined on the image itself. Every pixel lit by one snake (its
marker included) is kept more than ``separation`` pixels (Chebyshev) from every pixel lit by another:
two snakes always have at least two dark pixels between them, while consecutive paddles of one snake
have at most one (in practice the anti-aliasing fills most gaps). So a flood fill over lit pixels that
steps over one dark pixel joins exactly one snake, which the tests check. A new paddle also keeps one
dark pixel from its own snake's older paddles. Each image has a grid of bits (the border, the zones of
finished snakes, the zones of the snakes being grown); all candidate paddles of all images of a chunk
are checked against it at once. An image whose snake meets a dead end is redrawn from scratch, by
masking: later rounds work on the failed images only. To make dead ends rarer, a candidate paddle
after which no further paddle would fit (one paddle of lookahead) is avoided when another one fits.

Deliberate differences from the original generator (drewlinsley/pathfinder): markers and snakes have
the same intensity (the original scales paddle contrasts, then normalises), there are no
single-paddle distractors, the gap between paddles is one pixel (the original leaves paddle_margin on
both sides), the spacing rule above replaces the original's dilated masks, the turn is drawn from
candidate angles rather than from the pixels of a circle, and the lookahead is ours. The defaults are
LRA's 32x32 settings: padding 1, paddle_length 2, thickness 0.5, marker_radius 1.5, seed_distance 7,
continuity 1.0, antialias 2, distractor_length = contour_length // 3, num_distractor_snakes = 20 //
distractor_length.

Determinism: images are generated in chunks of ``CHUNK_SIZE``; chunk i draws from
``SeedSequence(seed, spawn_key=(i,))`` (the i-th child that ``SeedSequence(seed).spawn`` would give), and
always generates a full chunk. So the output depends only on (seed, parameters), not on ``workers``,
and ``generate_pathfinder(n)`` is a prefix of ``generate_pathfinder(m)`` for m > n.

Numpy only on purpose: data preparation must not depend on torch.
"""


from __future__ import annotations

import dataclasses
import operator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

from sparse_runner.data.pathfinder_params import PathfinderParams
from sparse_runner.data.pathfinder_snakes import add_distractor, place_targets, render
from sparse_runner.data.splits import ImageSplit

#: Images per generation chunk: large enough for numpy to amortise its per-call cost, small enough
#: that a short request (tests) does not pay for many unused images.
CHUNK_SIZE = 512


@dataclass(frozen=True, eq=False)
class PathfinderMeta:
    """Ground truth of generated images (for tests and figures), coordinates (row, col) in pixels.

    markers:     (n, 2, 2) float  centres of the first marker (start tip of the origin snake) and the
                                  second (far tip of the origin snake if label 1, else of the other)
    tips:        (n, 2, 2, 2) float  [target snake, start/far, row/col]
    origin:      (n,) int64       which target snake (0/1) carries the first marker
    snake_masks: (n, 2, H, W) bool  pixels lit by the paddles of each target snake (markers excluded)
    """

    markers: np.ndarray
    tips: np.ndarray
    origin: np.ndarray
    snake_masks: np.ndarray

    @property
    def path_mask(self) -> np.ndarray:
        """(n, H, W) bool pixels of the snake that starts at the first marker (the connecting path
        when the label is 1)."""
        return self.snake_masks[np.arange(len(self.origin)), self.origin]

    @staticmethod
    def empty(resolution: int) -> "PathfinderMeta":
        return PathfinderMeta(np.zeros((0, 2, 2)), np.zeros((0, 2, 2, 2)), np.zeros(0, np.int64), np.zeros((0, 2, resolution, resolution), bool))

    @staticmethod
    def concatenate(parts: list["PathfinderMeta"]) -> "PathfinderMeta":
        fields = [f.name for f in dataclasses.fields(PathfinderMeta)]
        return PathfinderMeta(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in fields})

    def subset(self, index) -> "PathfinderMeta":
        fields = [f.name for f in dataclasses.fields(PathfinderMeta)]
        return PathfinderMeta(**{name: getattr(self, name)[index] for name in fields})


def _generate_chunk(seed: int, chunk: int, p: PathfinderParams, with_meta: bool):
    """CHUNK_SIZE images from SeedSequence(seed, spawn_key=(chunk,)): (n, H, W) uint8, (n,) labels and
    the PathfinderMeta (None unless `with_meta`: the masks are twice the size of the images)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(chunk,)))
    n, S = CHUNK_SIZE, p.samples_per_paddle
    labels = rng.integers(0, 2, n)
    origin = rng.integers(0, 2, n)
    terminal = np.where(labels == 1, origin, 1 - origin)

    targets = np.zeros((n, 2, p.contour_length, S, 2))
    tips = np.zeros((n, 2, 2, 2))
    bits = None
    pending = np.arange(n)
    for _ in range(1000):  # a failed image is redrawn from scratch; typically a few rounds
        ok, occ, points, found = place_targets(rng, origin[pending], terminal[pending], p)
        if bits is None:
            bits = np.zeros((n, occ.bits.shape[1]), dtype=np.uint8)
        done = pending[ok]
        bits[done], targets[done], tips[done] = occ.committed()[ok], points[ok], found[ok]
        pending = pending[~ok]
        if not pending.size:
            break
    else:
        raise RuntimeError(f"Pathfinder: could not place the target snakes in {pending.size} images ({p})")

    distractors = np.zeros((n, p.num_distractor_snakes, p.distractor_length, S, 2))
    present = np.zeros((n, p.num_distractor_snakes), dtype=bool)
    for d in range(p.num_distractor_snakes):
        pending = np.arange(n)
        for _ in range(p.distractor_attempts):
            ok, committed, points = add_distractor(rng, bits[pending], p)
            done = pending[ok]
            bits[done], distractors[done, d], present[done, d] = committed[ok], points[ok], True
            pending = pending[~ok]
            if not pending.size:
                break

    rows = np.arange(n)
    markers = np.stack([tips[rows, origin, 0], tips[rows, terminal, 1]], axis=1)  # (n, 2, 2)
    every_point = np.concatenate([targets.reshape(n, -1, 2), distractors.reshape(n, -1, 2)], axis=1)
    every_present = np.concatenate(
        [np.ones((n, targets[0].size // 2), dtype=bool), np.repeat(present, p.distractor_length * S, axis=1)], axis=1
    )
    images = render(every_point, every_present, markers, p)
    if not with_meta:
        return images, labels.astype(np.int64), None

    res = p.resolution
    snake_masks = np.zeros((n, 2, res * res), dtype=bool)
    lit = np.floor(targets.reshape(n, 2, -1, 2)).astype(np.int64)
    snake_masks[rows[:, None, None], np.arange(2)[:, None], lit[..., 0] * res + lit[..., 1]] = True
    meta = PathfinderMeta(markers, tips, origin.astype(np.int64), snake_masks.reshape(n, 2, res, res))
    return images, labels.astype(np.int64), meta


def _generate_chunk_args(args: tuple):
    return _generate_chunk(*args)


def generate_pathfinder(
    n: int,
    *,
    contour_length: int,
    seed: int,
    resolution: int = 32,
    workers: int = 1,
    return_meta: bool = False,
    **overrides,
) -> ImageSplit | tuple[ImageSplit, PathfinderMeta]:
    """`n` Pathfinder images (resolution x resolution, labels 0/1) from `seed`.

    Parameters are ``PathfinderParams.lra(contour_length, resolution)`` with `overrides` (any other
    field, e.g. ``continuity=1.5``) replaced. `workers` > 1 generates chunks in that many processes;
    the output is the same for any number of workers. With `return_meta`, also returns the
    ``PathfinderMeta`` (marker centres, snake tips and masks) of the images.
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"generate_pathfinder: n must be >= 0, got {n}")
    p = PathfinderParams.lra(contour_length, resolution, **overrides)
    chunks = [(operator.index(seed), i, p, return_meta) for i in range(-(-n // CHUNK_SIZE))]
    if workers > 1 and len(chunks) > 1:
        # "spawn", not "fork": a forked child would inherit the threads of whatever the parent has
        # loaded (torch, in a run). Each worker pays one import of the package, about a second.
        with ProcessPoolExecutor(max_workers=min(workers, len(chunks)), mp_context=get_context("spawn")) as pool:
            parts = list(pool.map(_generate_chunk_args, chunks))  # map keeps the chunk order
    else:
        parts = [_generate_chunk(*args) for args in chunks]
    if not parts:
        parts = [(np.zeros((0, resolution, resolution), np.uint8), np.zeros(0, np.int64), PathfinderMeta.empty(resolution))]
    images = np.concatenate([part[0] for part in parts])[:n]
    labels = np.concatenate([part[1] for part in parts])[:n]
    split = ImageSplit(images.reshape(len(images), resolution * resolution), labels, resolution, resolution)
    if not return_meta:
        return split
    return split, PathfinderMeta.concatenate([part[2] for part in parts]).subset(slice(0, n))
