"""Parameters of the Pathfinder generator: LRA's difficulties and ``PathfinderParams`` (lengths in
pixels of the final image; the defaults are LRA's 32x32 settings, hard)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Difficulty -> contour length (paddles per target snake): drewlinsley/pathfinder snakes2_wrapper.py
#: writes curv_baseline with contour_length 6, then curv_contour_length_9 and _14.
DIFFICULTIES: dict[str, int] = {"easy": 6, "intermediate": 9, "hard": 14}


@dataclass(frozen=True)
class PathfinderParams:
    """Generator parameters; lengths in pixels of the final image. Defaults: LRA 32x32, hard."""

    resolution: int = 32
    contour_length: int = 14  # paddles per target snake
    distractor_length: int = 4  # paddles per distractor snake
    num_distractor_snakes: int = 5
    paddle_length: float = 2.0
    # Between consecutive paddles of a snake: half along the old direction, half along the new one
    # (at most this far in a straight line). LRA's 32x32 paddle_margin 1 on both sides of the pivot.
    paddle_gap: float = 2.0
    padding: int = 1  # blank border
    marker_radius: float = 1.5
    seed_distance: float = 7.0  # between the start tips of the two target snakes
    continuity: float = 1.0
    antialias_scale: int = 2
    separation: int = 2  # dark pixels kept between different snakes (see the module docstring)
    # Turn angles tried per paddle, over 180 degrees: 20 degrees apart, about the original's one pixel
    # of arc at the pivot's radius paddle_length + margin = 3 px (360 / (2 pi 3) = 19 degrees).
    turn_candidates: int = 9
    distractor_attempts: int = 4

    def __post_init__(self) -> None:
        checks = {
            "resolution": self.resolution >= 16,
            "contour_length": self.contour_length >= 1,
            "distractor_length": self.distractor_length >= 1,
            "num_distractor_snakes": self.num_distractor_snakes >= 0,
            "paddle_length": self.paddle_length > 0,
            # A flood fill that steps over one dark pixel must join consecutive paddles: two points at
            # most 2 px apart fall in pixels at most 2 apart (Chebyshev).
            "paddle_gap": 0 <= self.paddle_gap <= 2,
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
