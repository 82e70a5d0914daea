"""Drawing Pathfinder's snakes: an occupancy grid of bits per image, paddles grown side by side on it,
the target snakes with their markers, distractor snakes, and the anti-aliased rendering.

Everything works on a chunk of images at once (numpy, one row per image). The rules (spacing between
snakes, one paddle of lookahead, what a marker may touch) are described in ``pathfinder_generator``.
"""

from __future__ import annotations

import numpy as np

from sparse_runner.data.pathfinder_params import PathfinderParams

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
    marked_ends: np.ndarray | None = None,
):
    """Grow a group of G snakes side by side, one paddle each per step, from tips (m, G, 2).

    Each paddle is drawn among `turn_candidates` directions with the continuity weight, over those
    whose pixels are free; candidates after which no paddle would fit (tried at _LOOKAHEAD_TURNS) are
    avoided when another one exists, which makes dead ends, and so whole-image retries, rarer.
    marked_ends: (m, G) bool, the snakes whose far tip may carry a marker (None: none); their last
    paddle is only put where a marker disc there keeps its distance from the other snakes too.

    Returns ok (m,) bool (every paddle found room), points (m, G, paddles, S, 2) float64 (S =
    p.samples_per_paddle) and ends (m, G, 2) (far tips). The zones of the new paddles and of the
    marker are claimed in `occ` (committed by the caller for the images it keeps).
    """
    m, group = tips.shape[:2]
    K = p.turn_candidates
    rows = np.arange(m)
    # A hair under half the gap, so that rounding never puts a full paddle_gap of 2 across three pixels.
    half_gap = 0.5 * p.paddle_gap * (1 - 1e-9)
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
    # Images that have failed are dropped from the work once they are a tenth of it: `live` maps the
    # rows being grown (and those of ok, ends, theta, ..., `occ`) to the caller's rows.
    whole_occ, whole_ok, whole_ends, live = occ, np.zeros(m, dtype=bool), ends.copy(), np.arange(m)
    for k in range(paddles):
        if k and 10 * np.count_nonzero(~ok) > len(ok):
            kept, dropped = np.flatnonzero(ok), np.flatnonzero(~ok)
            whole_ends[live[dropped]] = ends[dropped]
            live, m, rows = live[kept], len(kept), np.arange(len(kept))
            occ = _Occupancy(occ.bits[kept], p)
            ok, tips, ends, theta, heading = ok[kept], tips[kept], ends[kept], theta[kept], heading[kept]
            previous = [None if x is None else x[kept] for x in previous]
            marked_ends = None if marked_ends is None else marked_ends[kept]
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

            marked = None if marked_ends is None or k < paddles - 1 else marked_ends[:, g]
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
            points[live, g, k] = chosen
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
    whole_ok[live], whole_ends[live] = ok, ends
    if occ is not whole_occ:
        whole_occ.bits[live] = occ.bits
    return whole_ok, points, whole_ends


def place_targets(rng: np.random.Generator, origin: np.ndarray, p: PathfinderParams):
    """One attempt at the two target snakes and their markers for len(origin) images.

    origin: (m,) which snake carries the first marker (start tip). The second marker may go on the
    far tip of either snake (label 1 or 0, chosen later): both far tips keep room for it, so that
    the label can be chosen after the snakes are drawn, and an unmarked far tip looks the same in
    both labels. Returns ok (m,), the occupancy (m images), points (m, 2, C, S, 2) and tips
    (m, 2, 2, 2).
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
    grown, points, ends = _grow_snakes(rng, occ, starts, p.contour_length, p, marked_ends=np.ones((m, 2), dtype=bool))
    tips = np.stack([starts, ends], axis=2)  # (m, snake, start/far, 2)
    return ok & grown, occ, points, tips


def add_distractor(rng: np.random.Generator, bits: np.ndarray, p: PathfinderParams):
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


def render(points: np.ndarray, present: np.ndarray, markers: np.ndarray, p: PathfinderParams) -> np.ndarray:
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
