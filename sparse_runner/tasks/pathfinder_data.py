"""Pathfinder data for the Long Range Arena (LRA): a vectorised generator, a reader of the released
files, a cache and an example figure.

Pathfinder (LRA section D.5 of the reference notes; Linsley et al. 2018, Kim et al. 2020) shows two
circle markers on a 32x32 grey image full of dashed curves ("snakes" of short line segments called
paddles). The label is 1 when the markers sit on the two ends of one snake, 0 when they sit on two
different snakes. Each pixel is one token (1024 tokens, 256 grey levels).

What this module provides
-------------------------
* ``generate_pathfinder``: a numpy re-implementation of the generator's recipe with LRA's 32x32
  settings (``PathfinderParams``), vectorised over a chunk of images. It is not a port of
  drewlinsley/pathfinder; see "Generator" below for what is and is not the same.
* ``read_released`` / ``split_released``: the images of LRA's release
  (``<root>/curv_contour_length_14/metadata/<k>.npy`` + ``imgs/<k>/sample_<i>.png``) and the 80/10/10
  split.
* ``prepare_pathfinder``: released or generated ``{"train", "val", "test"}`` splits, cached as ``.npz``
  by ``split_cache.split_cache``.
* ``save_example_grid``: a PNG of a few examples titled with their labels.

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

Numpy only on purpose (Pillow to read PNGs, matplotlib for the figure): data preparation must not
depend on torch.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from sparse_runner.data.split_cache import split_cache
from sparse_runner.data.splits import ImageSplit
from sparse_runner.io import atomic_open

logger = logging.getLogger(__name__)

#: Difficulty -> contour length (paddles per target snake): drewlinsley/pathfinder snakes2_wrapper.py
#: writes curv_baseline with contour_length 6, then curv_contour_length_9 and _14.
DIFFICULTIES: dict[str, int] = {"easy": 6, "intermediate": 9, "hard": 14}
#: Difficulty -> folder name in LRA's release (lra_benchmarks/data/pathfinder.py, _split_generators).
RELEASE_DIRS: dict[str, str] = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}
SPLITS: tuple[str, ...] = ("train", "val", "test")
#: Images per generation chunk: large enough for numpy to amortise its per-call cost, small enough
#: that a short request (tests) does not pay for many unused images.
CHUNK_SIZE = 512

# Bumped whenever the generator, the reader or the split changes what a seed or file produces, so
# that old cache directories (whose names hash this) are not reused.
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class PathfinderParams:
    """Generator parameters; lengths in pixels of the final image. Defaults: LRA 32x32, hard."""

    resolution: int = 32
    contour_length: int = 14  # paddles per target snake
    distractor_length: int = 4  # paddles per distractor snake
    num_distractor_snakes: int = 5
    paddle_length: float = 2.0
    paddle_gap: float = 1.0  # at most this between consecutive paddles of a snake
    padding: int = 1  # blank border
    marker_radius: float = 1.5
    seed_distance: float = 7.0  # between the start tips of the two target snakes
    continuity: float = 1.0
    antialias_scale: int = 2
    separation: int = 2  # dark pixels kept between different snakes (see the module docstring)
    turn_candidates: int = 12  # turn angles tried per paddle
    distractor_attempts: int = 4

    def __post_init__(self) -> None:
        checks = {
            "resolution": self.resolution >= 16,
            "contour_length": self.contour_length >= 1,
            "distractor_length": self.distractor_length >= 1,
            "num_distractor_snakes": self.num_distractor_snakes >= 0,
            "paddle_length": self.paddle_length > 0,
            # A flood fill that steps over one dark pixel must join consecutive paddles.
            "paddle_gap": 0 <= self.paddle_gap <= 1,
            "padding": self.padding >= 0,
            "marker_radius": self.marker_radius > 0,
            "seed_distance": self.seed_distance > 0,
            "continuity": self.continuity > 0,
            "antialias_scale": self.antialias_scale >= 1,
            # ... and must not join two snakes: at least two dark pixels between them.
            "separation": self.separation >= 2,
            "turn_candidates": self.turn_candidates >= 2,
            "distractor_attempts": self.distractor_attempts >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"PathfinderParams: invalid {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}")

    @classmethod
    def lra(cls, contour_length: int = 14, resolution: int = 32, **overrides) -> "PathfinderParams":
        """LRA's 32x32 settings for `contour_length`: distractor_length = contour_length // 3 and
        num_distractor_snakes = 20 // distractor_length (lra_benchmarks/data/pathfinder.py)."""
        distractor_length = max(1, contour_length // 3)
        base = dict(
            resolution=resolution,
            contour_length=contour_length,
            distractor_length=distractor_length,
            num_distractor_snakes=20 // distractor_length,
        )
        return cls(**{**base, **overrides})

    @property
    def samples_per_paddle(self) -> int:
        """Points drawn along a paddle: one canvas pixel apart, so the drawn line is 8-connected."""
        return int(np.ceil(self.paddle_length * self.antialias_scale)) + 1


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


# ----------------------------------------------------------------------------------------------------
# Occupancy grid
# ----------------------------------------------------------------------------------------------------

_COMMON = np.uint8(1)  # the border, and every snake already kept (with its separation zone)
#: Turns tried one paddle ahead: a candidate after which none of them fits is (nearly) a dead end.
_LOOKAHEAD_TURNS = np.radians([-45.0, 0.0, 45.0])


def _zone_bit(g) -> np.ndarray:
    """Bit of the separation zone of snake g of the group being grown (g may be an array)."""
    return (np.uint8(2) << np.asarray(g, dtype=np.uint8)).astype(np.uint8)


def _self_bit(g: int, group: int) -> np.uint8:
    """Bit of the zone snake g of a group of `group` snakes keeps clear of its own older paddles."""
    return np.uint8((2 << group) << g)


def _unit(theta: np.ndarray) -> np.ndarray:
    """(...) angles -> (..., 2) unit vectors (row, col)."""
    return np.stack([np.sin(theta), np.cos(theta)], axis=-1)


def _or_last(x: np.ndarray) -> np.ndarray:
    """OR over the (short) last axis: (..., n) -> (...). A loop over n is several times faster than
    `x.any(-1)` when n is 3-15, as here."""
    out = x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        out |= x[..., i]
    return out


def _square(radius: int) -> np.ndarray:
    """(F, 2) offsets of the (2 radius + 1)^2 square."""
    d = np.arange(-radius, radius + 1)
    return np.stack(np.meshgrid(d, d, indexing="ij"), axis=-1).reshape(-1, 2)


class _Occupancy:
    """One uint8 of bits per pixel and image, over the image plus a blocked margin.

    bits: (m, side * side) uint8, side = resolution + 2 * margin. A bit set at a pixel means "a snake
    of that class may not light this pixel": _COMMON for every snake, _zone_bit(g) for the other
    snakes of the group, _self_bit(g) for snake g itself. Indices are into `bits.ravel()` (one fancy
    index on a 1-D array is the fastest numpy gather/scatter).
    """

    def __init__(self, bits: np.ndarray, p: PathfinderParams) -> None:
        # The margin holds everything read or written around a paddle that starts inside the image:
        # a lookahead paddle (two paddles on), or a claim around a marker at the end of one paddle.
        step = int(np.ceil(p.paddle_length + p.paddle_gap))
        self.margin = max(2 * step, step + int(p.marker_radius) + 1 + p.separation) + 1
        self.side = p.resolution + 2 * self.margin
        self.bits = np.ascontiguousarray(bits)
        self.flat = self.bits.reshape(-1)  # a view: writes go to self.bits
        self.row_start = np.arange(len(bits)) * self.side * self.side

    @classmethod
    def empty(cls, m: int, p: PathfinderParams) -> "_Occupancy":
        occ = cls(np.zeros((0, 0), dtype=np.uint8), p)
        grid = np.full((occ.side, occ.side), _COMMON, dtype=np.uint8)
        inner = slice(occ.margin + p.padding, occ.margin + p.resolution - p.padding)
        grid[inner, inner] = 0
        return cls(np.tile(grid.ravel(), (m, 1)), p)

    def index(self, points: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """(m, ..., 2) points (float, in pixels of the image) or integer pixels -> (m, ...) indices
        into `bits.ravel()` of the pixels they fall in. points[i] belong to image i, or to image
        rows[i] when `rows` is given.

        No bounds check: callers keep every point within the margin of the image (a paddle starts
        inside the image, or in its middle for an image that has failed).
        """
        yx = (points + self.margin).astype(np.intp)  # truncation is floor: the values are positive
        local = yx[..., 0] * self.side + yx[..., 1]
        start = self.row_start if rows is None else self.row_start[rows]
        return local + start.reshape((-1,) + (1,) * (local.ndim - 1))

    def blocked(self, index: np.ndarray, forbidden) -> np.ndarray:
        """(m, ..., P) indices -> (m, ...) bool: is any bit of `forbidden` ((m,) or scalar) set at any
        of the P pixels (the points of one paddle, or of one marker disc)."""
        forbidden = np.asarray(forbidden, dtype=np.uint8).reshape((-1,) + (1,) * (index.ndim - 2))
        return (_or_last(self.flat[index]) & forbidden) != 0

    def claim(self, pixels: np.ndarray, bit, radius: int, rows: np.ndarray | None = None) -> None:
        """Set `bit` ((m,) or scalar) within Chebyshev `radius` of the pixels of the (m, P, 2) points
        (of images `rows`, default all)."""
        offsets = _square(radius) @ np.array([self.side, 1])  # (F,) index offsets
        around = (self.index(pixels, rows)[:, :, None] + offsets).reshape(len(pixels), pixels.shape[1] * len(offsets))
        # A repeated index in one fancy-index `|=` writes the same value each time (one bit per
        # image), so duplicates are harmless.
        self.flat[around] |= np.asarray(bit, dtype=np.uint8).reshape(-1, 1)

    def committed(self) -> np.ndarray:
        """The bits with the group's snakes made permanent: every zone bit becomes _COMMON."""
        zones = (self.bits & ~_COMMON) != 0
        return np.where(zones, _COMMON, self.bits & _COMMON).astype(np.uint8)


# ----------------------------------------------------------------------------------------------------
# Geometry
# ----------------------------------------------------------------------------------------------------


def _inside_disc(subpixels: np.ndarray, scaled: np.ndarray, p: PathfinderParams) -> np.ndarray:
    """(m, F, 2) canvas sub-pixels, (m, 2) disc centres in canvas units -> (m, F) bool: is the
    sub-pixel's centre within the marker radius. The one test both the drawing and the occupancy use,
    so that they agree to the last bit."""
    radius = p.antialias_scale * p.marker_radius
    return ((subpixels + 0.5 - scaled[:, None, :]) ** 2).sum(-1) <= radius * radius


def _disc_subpixels(centres: np.ndarray, p: PathfinderParams) -> np.ndarray:
    """Canvas sub-pixels of marker discs: centres (m, 2) -> (m, F, 2) int.

    F is fixed (a square around the centre); entries outside the disc repeat the centre's sub-pixel,
    which is always inside, so that callers can draw all F without a mask.
    """
    scaled = centres * p.antialias_scale
    middle = np.floor(scaled).astype(np.int64)[:, None, :]
    # A sub-pixel at offset d from the centre's one is at least |d| - 1 from the centre.
    sub = middle + _square(int(p.antialias_scale * p.marker_radius) + 1)
    return np.where(_inside_disc(sub, scaled, p)[..., None], sub, middle)


def _marker_pixels(centres: np.ndarray, p: PathfinderParams) -> np.ndarray:
    """Image pixels a marker disc lights (any of their sub-pixels inside): centres (m, 2) -> (m, F, 2)
    int; entries not lit repeat the centre's pixel (always lit), so all F can be used without a mask."""
    s = p.antialias_scale
    scaled = centres * s
    middle_sub = np.floor(scaled).astype(np.int64)[:, None, :]
    middle = middle_sub // s
    pixels = middle + _square(int(p.marker_radius) + 1)  # (m, F, 2)
    # The sub-pixel of a pixel nearest the centre: per axis, the centre's sub-pixel clamped into the
    # pixel (sub-pixel centres form a grid, so the nearest one is found axis by axis).
    nearest = np.clip(middle_sub, pixels * s, pixels * s + s - 1)
    return np.where(_inside_disc(nearest, scaled, p)[..., None], pixels, middle)


def _grow_snakes(
    rng: np.random.Generator,
    occ: _Occupancy,
    tips: np.ndarray,
    paddles: int,
    p: PathfinderParams,
    marked_end: np.ndarray | None = None,
):
    """Grow a group of G snakes side by side, one paddle each per step, from tips (m, G, 2).

    Each paddle is drawn among `turn_candidates` directions with the continuity weight, over those
    whose pixels are free; candidates after which no paddle would fit (tried at _LOOKAHEAD_TURNS) are
    avoided when another one exists, which makes dead ends, and so whole-image retries, rarer.
    marked_end: (m,) index of the snake whose far tip carries a marker (None: no marker); its last
    paddle is only put where the marker disc keeps its distance from the other snakes too.

    Returns ok (m,) bool (every paddle found room), points (m, G, paddles, S, 2) float64 (S =
    p.samples_per_paddle) and ends (m, G, 2) (far tips). The zones of the new paddles and of the
    marker are claimed in `occ` (committed by the caller for the images it keeps).
    """
    m, group = tips.shape[:2]
    K = p.turn_candidates
    rows = np.arange(m)
    half_gap = 0.5 * p.paddle_gap
    along = np.linspace(0.0, p.paddle_length, p.samples_per_paddle)[:, None]  # (S, 1)
    # One paddle ahead, its middle and end are enough for a guess (its start is next to the
    # candidate's end), and cheaper. Measured from the candidate's end, past half the gap
    # (the other half is along the candidate's direction).
    along_ahead = half_gap + np.array([0.5, 1.0])[:, None] * p.paddle_length
    cos_ahead, sin_ahead = np.cos(_LOOKAHEAD_TURNS)[:, None], np.sin(_LOOKAHEAD_TURNS)[:, None]  # (J, 1)

    ok = np.ones(m, dtype=bool)
    points = np.zeros((m, group, paddles, p.samples_per_paddle, 2))
    ends = np.array(tips, dtype=np.float64)  # a copy: the far tips so far
    theta = np.zeros((m, group))
    heading = np.zeros((m, group, 2))  # unit vector of theta
    previous = [None] * group  # each snake's last paddle points: "own old" one step later
    for k in range(paddles):
        for g in range(group):
            others = np.uint8(sum(int(_zone_bit(h)) for h in range(group) if h != g))
            forbidden = _COMMON | others | _self_bit(g, group)
            if k == 0:  # first paddle: any direction, evenly spaced from a random offset
                angles = rng.uniform(0, 2 * np.pi, (m, 1)) + np.arange(K) * (2 * np.pi / K)
                weight = np.ones((m, K))
                direction = _unit(angles)  # (m, K, 2)
                starts = tips[:, g, None, :]
            else:  # turns in [-90, 90) degrees, weighted cos(min(|turn| * continuity, 90 deg))^2
                turns = (np.arange(K) + rng.random((m, 1))) * (np.pi / K) - np.pi / 2
                angles = theta[:, g, None] + turns
                weight = np.cos(np.minimum(np.abs(turns) * p.continuity, np.pi / 2)) ** 2
                direction = _unit(angles)
                # The gap bends halfway between the old and new directions: at most paddle_gap long.
                starts = ends[:, g, None, :] + half_gap * (heading[:, g, None, :] + direction)
            candidates = starts[:, :, None, :] + along * direction[:, :, None, :]  # (m, K, S, 2)
            free = ~occ.blocked(occ.index(candidates), forbidden)  # (m, K)

            if k < paddles - 1:  # one paddle of lookahead
                # Directions turned by _LOOKAHEAD_TURNS, by rotating the candidate directions.
                dy, dx = direction[:, :, None, 0:1], direction[:, :, None, 1:2]  # (m, K, 1, 1)
                ahead_direction = np.concatenate([dy * cos_ahead + dx * sin_ahead, dx * cos_ahead - dy * sin_ahead], -1)
                bend = candidates[:, :, -1, :] + half_gap * direction  # (m, K, 2) where the gap turns
                ahead = bend[:, :, None, None, :] + along_ahead * ahead_direction[..., None, :]  # (m, K, J, 2, 2)
                room_ahead = _or_last(~occ.blocked(occ.index(ahead), forbidden))  # (m, K)
                promising = free & room_ahead
                free = np.where(promising.any(-1, keepdims=True), promising, free)

            marked = None if marked_end is None or k < paddles - 1 else marked_end == g
            if marked is not None:  # the disc may touch this snake's own paddles, not the others'
                # Only the candidates that are still free and carry the marker need the disc.
                image, which = np.nonzero(free & marked[:, None])
                disc = _marker_pixels(candidates[image, which, -1], p)  # (c, F, 2)
                clash = occ.blocked(occ.index(disc, rows=image), _COMMON | others)
                free[image[clash], which[clash]] = False

            cdf = np.cumsum(np.where(free, weight, 0.0), axis=-1)
            total = cdf[:, -1]
            ok &= total > 0
            pick = np.minimum((cdf <= (rng.random(m) * total)[:, None]).sum(-1), K - 1)  # inverse CDF
            chosen = candidates[rows, pick]  # (m, S, 2)
            points[:, g, k] = chosen
            theta[:, g] = angles[rows, pick]
            heading[:, g] = direction[rows, pick]
            ends[:, g] = chosen[:, -1]
            occ.claim(chosen, _zone_bit(g), p.separation)
            if marked is not None:
                image = np.flatnonzero(marked)
                occ.claim(_marker_pixels(ends[image, g], p), _zone_bit(g), p.separation, rows=image)
            if previous[g] is not None:
                occ.claim(previous[g], _self_bit(g, group), 1)
            previous[g] = chosen
            # An image that has failed goes on (masked) from the middle of the image, so that its
            # points never leave the occupancy grid.
            ends[~ok, g] = 0.5 * p.resolution
    return ok, points, ends


def _place_targets(rng: np.random.Generator, origin: np.ndarray, terminal: np.ndarray, p: PathfinderParams):
    """One attempt at the two target snakes and their markers for len(origin) images.

    origin, terminal: (m,) which snake carries the first marker (start tip) and the second (far tip).
    Returns ok (m,), the occupancy (m images), points (m, 2, C, S, 2) and tips (m, 2, 2, 2).
    """
    m = len(origin)
    occ = _Occupancy.empty(m, p)
    rows = np.arange(m)
    # Like the original generator, the first tip keeps 2 * seed_distance from the border (its
    # initialize_two_seeds blocks that band), so that both snakes start with room around them; at
    # small resolutions the band shrinks to what the marker disc needs.
    low = p.padding + p.marker_radius + 0.5
    high = p.resolution - low
    band = min(2 * p.seed_distance, (p.resolution - 1) / 2)
    tip_a = rng.uniform(max(low, band), min(high, p.resolution - band), (m, 2))
    tries = 8  # directions tried for tip B; most images need one
    around = tip_a[:, None, :] + p.seed_distance * _unit(rng.uniform(0, 2 * np.pi, (m, tries)))
    inside = ((around >= low) & (around < high)).all(-1)
    ok = inside.any(-1)
    tip_b = np.where(ok[:, None], around[rows, inside.argmax(-1)], tip_a)  # failed: anywhere inside
    starts = np.stack([tip_a, tip_b], axis=1)  # (m, 2, 2)

    # The first marker is reserved before growing, so that the other snake keeps its distance.
    occ.claim(_marker_pixels(starts[rows, origin], p), _zone_bit(origin), p.separation)
    grown, points, ends = _grow_snakes(rng, occ, starts, p.contour_length, p, marked_end=terminal)
    tips = np.stack([starts, ends], axis=2)  # (m, snake, start/far, 2)
    return ok & grown, occ, points, tips


def _add_distractor(rng: np.random.Generator, bits: np.ndarray, p: PathfinderParams):
    """One attempt at one distractor snake in each of the images whose occupancy is `bits` (m, cells).

    Returns ok (m,), the committed bits (m, cells) and points (m, distractor_length, S, 2).
    """
    m = len(bits)
    occ = _Occupancy(bits.copy(), p)
    tries = 8  # random start points; the first free one is used
    starts = rng.uniform(p.padding, p.resolution - p.padding, (m, tries, 2))
    free = ~occ.blocked(occ.index(starts[:, :, None, :]), _COMMON)
    ok = free.any(-1)
    tip = starts[np.arange(m), free.argmax(-1)][:, None, :]  # (m, 1, 2)
    grown, points, _ = _grow_snakes(rng, occ, tip, p.distractor_length, p)
    return ok & grown, occ.committed(), points[:, 0]


def _render(points: np.ndarray, present: np.ndarray, markers: np.ndarray, p: PathfinderParams) -> np.ndarray:
    """Anti-aliased images from paddle points (n, P, 2) (`present` (n, P) False for points of snakes
    left out) and marker centres (n, 2, 2) -> (n, resolution, resolution) uint8."""
    n, s, res = len(points), p.antialias_scale, p.resolution
    side = res * s
    canvas = np.zeros((n, side * side + 1), dtype=np.uint8)  # last column: sink for masked writes
    rows = np.arange(n)[:, None]
    sub = np.floor(points * s).astype(np.int64)
    canvas[rows, np.where(present, sub[..., 0] * side + sub[..., 1], side * side)] = 1
    discs = _disc_subpixels(markers.reshape(-1, 2), p).reshape(n, -1, 2)
    canvas[rows, discs[..., 0] * side + discs[..., 1]] = 1
    coverage = canvas[:, :-1].reshape(n, res, s, res, s).sum(axis=(2, 4), dtype=np.int32)
    return np.rint(coverage * (255.0 / (s * s))).astype(np.uint8)


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
        ok, occ, points, found = _place_targets(rng, origin[pending], terminal[pending], p)
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
            ok, committed, points = _add_distractor(rng, bits[pending], p)
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
    images = _render(every_point, every_present, markers, p)
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


# ----------------------------------------------------------------------------------------------------
# LRA's released files
# ----------------------------------------------------------------------------------------------------
#
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


def _resolve_release_dir(data_dir: str | os.PathLike, difficulty: str) -> Path:
    """The difficulty folder (the one holding metadata/): `data_dir` itself or
    `data_dir/RELEASE_DIRS[difficulty]`. ValueError naming the layout if neither has metadata files."""
    data_dir = Path(data_dir).expanduser()
    for candidate in (data_dir, data_dir / RELEASE_DIRS[difficulty]):
        if any((candidate / "metadata").glob("*.npy")):
            return candidate
    folder = RELEASE_DIRS[difficulty]
    raise ValueError(
        f"Pathfinder data_dir {data_dir}: no metadata/*.npy found; expected <root>/{folder}/metadata/<k>.npy "
        f"and <root>/{folder}/imgs/<k>/sample_<i>.png (LRA's release), with data_dir = <root> or <root>/{folder}"
    )


def _metadata_files(directory: Path) -> list[Path]:
    """metadata/*.npy in the order of their numeric names (0, 1, 2, ..., 10), as S4 reads them."""
    files = list((directory / "metadata").glob("*.npy"))
    return sorted(files, key=lambda path: (0, int(path.stem), "") if path.stem.isdigit() else (1, 0, path.stem))


def _metadata_rows(path: Path) -> list[list[str]]:
    """The rows (lists of fields) of one metadata file, text or real .npy."""
    raw = path.read_bytes()
    if raw.startswith(_NUMPY_MAGIC):
        with open(path, "rb") as handle:
            table = np.load(handle, allow_pickle=False)
        return [[str(field) for field in row] for row in np.atleast_2d(table)]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: neither a text metadata file nor a .npy array") from None
    return [line.split() for line in text.splitlines() if line.strip()]


def read_released(data_dir: str | os.PathLike, difficulty: str = "hard", *, resolution: int = 32) -> ImageSplit:
    """All images of one difficulty of LRA's Pathfinder release, in metadata order (files by number,
    then lines), as an ImageSplit of resolution x resolution images with labels 0/1.

    `data_dir` is the difficulty folder (e.g. ``.../pathfinder32/curv_contour_length_14``) or the folder
    above it. Empty image files are skipped, as LRA's pipeline and S4 do (the release has one); a
    malformed line, a label other than 0/1, a missing image or one of another size raise ValueError
    naming the file.
    """
    from PIL import Image  # only needed for the release

    if difficulty not in DIFFICULTIES:
        raise ValueError(f"Pathfinder difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
    directory = _resolve_release_dir(data_dir, difficulty)
    pixels: list[np.ndarray] = []
    labels: list[int] = []
    empty = 0
    for path in _metadata_files(directory):
        for number, fields in enumerate(_metadata_rows(path), start=1):
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise ValueError(
                    f"{path}:{number}: expected '<subfolder> <file> <index> <label 0/1> ...', got {' '.join(fields)[:80]!r}"
                )
            image_path = directory / fields[0] / fields[1]
            try:
                if image_path.stat().st_size == 0:
                    empty += 1
                    continue
                with Image.open(image_path) as image:
                    grey = np.asarray(image.convert("L"))
            except OSError as error:  # missing file, or not an image
                raise ValueError(f"{path}:{number}: cannot read image {image_path} ({error})") from None
            if grey.shape != (resolution, resolution):
                raise ValueError(f"{image_path}: {grey.shape[1]}x{grey.shape[0]} image, expected {resolution}x{resolution}")
            pixels.append(grey.reshape(-1))
            labels.append(int(fields[3]))
    if not labels:
        raise ValueError(f"Pathfinder release {directory}: the metadata files list no (non-empty) images")
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


# ----------------------------------------------------------------------------------------------------
# Preparation with a cache
# ----------------------------------------------------------------------------------------------------


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
        directory = _resolve_release_dir(data_dir, difficulty)
        files = [[str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns] for path in _metadata_files(directory)]
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


# ----------------------------------------------------------------------------------------------------
# Figure
# ----------------------------------------------------------------------------------------------------


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
