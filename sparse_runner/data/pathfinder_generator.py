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

1. Draw which of the two target snakes carries the first marker (the label comes in step 3).
2. Target snakes: start tip A uniform in the middle of the image (like the original generator, A
   keeps 2 * seed_distance from the border), start tip B at ``seed_distance`` from A in a random
   direction. Both grow together, paddle by paddle, ``contour_length`` paddles each. A paddle is a
   segment of ``paddle_length``; the next starts ``paddle_gap`` / 2 on along the old direction and
   ``paddle_gap`` / 2 along the new one (LRA: paddle_margin 1 on both sides of the pivot, so dashes
   of 2 px with gaps of 2 px, at most 2 px in a straight line), turned by an angle d drawn with
   weight cos(min(|d| * continuity, pi/2))^2 (the original's continuity weight: with continuity 1
   turns stay under 90 degrees and going straight is most likely), among ``turn_candidates`` evenly
   spaced turns with a random offset, over those that fit. Both far tips keep room for a marker disc.
3. Label and markers: a disc of ``marker_radius`` at the start tip of the chosen snake, and one at the
   far tip of the same snake (label 1) or of the other snake (label 0); the label is chosen so that
   both labels have the same distribution of marker distance (below).
4. Distractor snakes: ``num_distractor_snakes`` snakes of ``distractor_length`` paddles, each started at
   a random free place; one that does not fit after ``distractor_attempts`` tries is left out (the
   original also leaves out distractors that do not fit).
5. Render: each paddle is a line one sub-pixel wide on a canvas ``antialias_scale`` times finer (so
   0.5 pixel wide, LRA's paddle_thickness), the markers are filled discs, and the canvas is averaged
   down to grey levels k * 255 / antialias_scale^2 (0, 64, 128, 191, 255).

Occupancy makes connectivity well defined on the image itself. Every pixel lit by one snake (its
marker included) is kept more than ``separation`` pixels (Chebyshev) from every pixel lit by another:
two snakes always have at least two dark pixels between them, while consecutive paddles of one snake
have at most one (a gap of at most 2 px spans at most one pixel). So a flood fill over lit pixels that
steps over one dark pixel joins exactly one snake, which the tests check. A new paddle also keeps one
dark pixel from its own snake's older paddles. Each image has a grid of bits (the border, the zones of
finished snakes, the zones of the snakes being grown); all candidate paddles of all images of a chunk
are checked against it at once. Target snakes that meet a dead end are dropped (they leave the work
once a tenth of it has failed), and more candidates are drawn until there are enough. To make dead
ends rarer, a candidate paddle after which no further paddle would fit (one paddle of lookahead) is
avoided when another one fits.

Marker distance
---------------
With the label drawn first, the distance between the two markers gave the label away: a snake can
curl back to near its own start, but the far tip of the other snake keeps its separation from the
first marker, so markers less than ~5 px apart occurred only in positives, and the best single
threshold on the distance scored 55-68 % (easy worst: a short snake cannot reach as far as the other
snake's far tip, seed_distance away). The original generator has the same bias. Here the label
is chosen after the target snakes are drawn, in pairs: a candidate (two target snakes) has a marker
distance as a positive and one as a negative; binned by ``DISTANCE_BIN``, it completes a pair with a
waiting candidate of the other label in the same bin, or waits in both of its bins. A chunk is
CHUNK_SIZE / 2 such pairs, shuffled, so both labels have the same histogram of marker distances (a
classifier on the distance alone is at chance, which the tests check); distances that only one
label can have (markers closer than the separation allows two snakes) do not occur.

Deliberate differences from the original generator (drewlinsley/pathfinder): markers and snakes have
the same intensity (the original scales paddle contrasts, then normalises), there are no
single-paddle distractors, marker distances are matched between labels (above) and both far tips
keep room for a marker, the spacing rule above replaces the original's dilated masks, the turn is
drawn from candidate angles rather than from the pixels of a circle, and the lookahead is ours. The defaults are
LRA's 32x32 settings: padding 1, paddle_length 2, thickness 0.5, marker_radius 1.5, seed_distance 7,
continuity 1.0, antialias 2, distractor_length = contour_length // 3, num_distractor_snakes = 20 //
distractor_length.

Determinism: images are generated in chunks of ``CHUNK_SIZE``; chunk i draws from
``SeedSequence(seed, spawn_key=(i,))`` (the i-th child that ``SeedSequence(seed).spawn`` would give), and
always generates a full chunk (exactly half of its labels positive). So the output depends only on
(seed, parameters), not on ``workers``, and ``generate_pathfinder(n)`` is a prefix of
``generate_pathfinder(m)`` for m > n.

Numpy only on purpose: data preparation must not depend on torch.
"""


from __future__ import annotations

import dataclasses
import operator
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

from sparse_runner.data.pathfinder_params import PathfinderParams
from sparse_runner.data.pathfinder_snakes import add_distractor, place_targets, render
from sparse_runner.data.splits import ImageSplit

#: Images per generation chunk: large enough for numpy to amortise its per-call cost, small enough
#: that a short request (tests) does not pay for many unused images.
CHUNK_SIZE = 512  # even: a chunk holds pairs of one positive and one negative
#: Width in pixels of the marker-distance bins in which positives and negatives are paired.
DISTANCE_BIN = 0.25
_MARGIN = 1.0  # candidates per missing image, over the success rate so far
_MIN_ROUND = 64  # fewest candidates tried in a round
_MAX_ROUNDS = 200


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


def _matched_targets(rng: np.random.Generator, p: PathfinderParams):
    """CHUNK_SIZE target-snake pairs with their labels, half of them positive, whose marker distances
    have the same distribution in both labels (see "Marker distance" in the module docstring).

    Returns labels (n,), origin (n,), the committed occupancy bits (n, cells), the target points
    (n, 2, C, S, 2) and tips (n, 2, 2, 2).
    """
    n = CHUNK_SIZE
    half = n // 2
    rounds: list[tuple[np.ndarray, ...]] = []  # kept candidates of each round
    # (distance bin, label) -> candidates not yet used that would fall in that bin with that label;
    # each waiting candidate is in two queues, one per label.
    waiting: dict[tuple[int, int], deque] = {}
    used: list[bool] = []
    pairs: list[tuple[int, int]] = []  # (positive, negative)
    tried = 0
    for _ in range(_MAX_ROUNDS):
        # Nearly every candidate drawn ends up in a pair once enough are waiting: try as many as the
        # images still missing need at the success rate so far (a round of n at first).
        success = len(used) / tried if used else 1.0
        m = min(max(_MIN_ROUND, int(np.ceil(_MARGIN * (n - 2 * len(pairs)) / max(success, 0.01)))), 8 * n)
        origin = rng.integers(0, 2, m)
        first = rng.integers(0, 2, m)  # the label a candidate tries first when it can complete a pair
        ok, occ, points, tips = place_targets(rng, origin, p)
        tried += m
        good = np.flatnonzero(ok)  # a failed candidate is simply dropped
        rows = np.arange(m)
        start = tips[rows, origin, 0]
        # Marker distance as a positive (far tip of the same snake) and as a negative (of the other).
        bins = np.floor(np.stack([
            np.linalg.norm(start - tips[rows, 1 - origin, 1], axis=-1),
            np.linalg.norm(start - tips[rows, origin, 1], axis=-1),
        ], axis=1) / DISTANCE_BIN).astype(np.int64)[good]  # (kept, label)
        rounds.append((origin[good], occ.committed()[good], points[good], tips[good]))
        for i, order in enumerate(first[good].tolist()):
            c = len(used)
            used.append(False)
            for label in (order, 1 - order):
                queue = waiting.get((int(bins[i, label]), 1 - label))
                while queue and used[queue[0]]:
                    queue.popleft()
                if queue:
                    partner = queue.popleft()
                    used[partner] = used[c] = True
                    pairs.append((c, partner) if label == 1 else (partner, c))
                    break
            else:
                for label in (0, 1):
                    waiting.setdefault((int(bins[i, label]), label), deque()).append(c)
            if len(pairs) == half:
                break
        if len(pairs) == half:
            break
    else:
        raise RuntimeError(f"Pathfinder: could not pair {half} target snakes by marker distance in {_MAX_ROUNDS} rounds ({p})")

    chosen = np.array(pairs, dtype=np.int64).reshape(-1)
    labels = np.tile(np.array([1, 0]), half)
    order = rng.permutation(n)
    chosen, labels = chosen[order], labels[order]
    origin, bits, targets, tips = (np.concatenate(field)[chosen] for field in zip(*rounds))
    return labels, origin, bits, targets, tips


def _generate_chunk(seed: int, chunk: int, p: PathfinderParams, with_meta: bool):
    """CHUNK_SIZE images from SeedSequence(seed, spawn_key=(chunk,)): (n, H, W) uint8, (n,) labels and
    the PathfinderMeta (None unless `with_meta`: the masks are twice the size of the images)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(chunk,)))
    n, S = CHUNK_SIZE, p.samples_per_paddle
    labels, origin, bits, targets, tips = _matched_targets(rng, p)
    terminal = np.where(labels == 1, origin, 1 - origin)

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
