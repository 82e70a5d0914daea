"""Pathfinder without shortcuts: what a model could learn from the generated images without tracing a
path (sparse_runner.data.pathfinder_generator).

- Marker distance: negatives are drawn with the same distribution of the distance between the two
  markers as positives, so a classifier on that distance alone is at chance. Before, close markers
  (< 4 px) occurred only in positives and the best threshold on the distance scored 55-68 %.
- Dashes: paths have pixel gaps, at LRA's paddle spacing (a gap of 2 px between paddles of 2 px),
  instead of being 8-connected lines.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparse_runner.data import pathfinder_generator as gen
from sparse_runner.data import pathfinder_params as params
from sparse_runner.data import pathfinder_snakes as snakes

N = 4000  # images in the marker-distance test: fit on the first half, score on the second


def marker_distance(meta) -> np.ndarray:
    """(n,) distance in pixels between the centres of the two markers."""
    return np.linalg.norm(meta.markers[:, 0] - meta.markers[:, 1], axis=-1)


def best_threshold(distance: np.ndarray, labels: np.ndarray) -> tuple[float, bool]:
    """The single threshold t and direction that classify `labels` best from `distance` alone:
    predict 1 for distance <= t (below=True) or for distance > t (below=False)."""
    order = np.argsort(distance, kind="stable")
    d, y = distance[order], labels[order]
    positives_up_to = np.concatenate([[0], np.cumsum(y)])  # positives among the i smallest
    negatives_up_to = np.concatenate([[0], np.cumsum(1 - y)])
    below = (positives_up_to + negatives_up_to[-1] - negatives_up_to) / len(d)  # accuracy of "<= cut i"
    cuts = np.concatenate([[-np.inf], d])
    i, j = int(below.argmax()), int((1 - below).argmax())
    return (float(cuts[i]), True) if below[i] >= 1 - below[j] else (float(cuts[j]), False)


def held_out_accuracy(distance: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy on the second half of the best single threshold on marker distance fitted on the first."""
    half = len(labels) // 2
    t, below = best_threshold(distance[:half], labels[:half])
    predicted = distance[half:] <= t if below else distance[half:] > t
    return float(np.mean(predicted == (labels[half:] == 1)))


def chance_bound(n: int) -> float:
    """Three binomial standard deviations of an accuracy on n held-out images when it is 1/2."""
    return 3 * np.sqrt(0.25 / n)


@pytest.mark.parametrize("difficulty", list(params.DIFFICULTIES))
def test_marker_distance_alone_is_at_chance(difficulty):
    split, meta = gen.generate_pathfinder(N, contour_length=params.DIFFICULTIES[difficulty], seed=21, return_meta=True)
    distance, labels = marker_distance(meta), split.labels
    accuracy = held_out_accuracy(distance, labels)
    # Measured (seed 21): 0.48-0.51. Labels drawn before the snakes (the original generator's way): 0.55 (hard) to 0.68 (easy).
    assert abs(accuracy - 0.5) <= chance_bound(N - N // 2), f"{difficulty}: marker distance alone scores {accuracy:.3f}"
    # Close markers occur in both labels alike (before: only in positives).
    close = distance < 8
    assert abs(labels[close].mean() - 0.5) <= 4 * np.sqrt(0.25 / max(close.sum(), 1)), (close.sum(), labels[close].mean())
    full = N // gen.CHUNK_SIZE * gen.CHUNK_SIZE
    assert labels[:full].mean() == 0.5  # a chunk is pairs of one positive and one negative


def test_the_threshold_classifier_finds_a_shortcut_when_there_is_one():
    # The check itself: on labels that do depend on the distance, it is far above chance.
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, N)
    distance = rng.uniform(0, 20, N) - 4.0 * labels  # positives' markers a little closer
    assert held_out_accuracy(distance, labels) > 0.5 + 2 * chance_bound(N // 2)


def eight_connected(mask: np.ndarray) -> np.ndarray:
    """(n, H, W) bool -> (n,) is each image's set of pixels one 8-connected component."""
    n = len(mask)
    flat = mask.reshape(n, -1)
    seed = np.zeros_like(mask)
    seed.reshape(n, -1)[np.arange(n), flat.argmax(1)] = True  # the first lit pixel
    reached = seed & mask
    while True:
        padded = np.pad(reached, ((0, 0), (1, 1), (1, 1)))
        grown = np.zeros_like(reached)
        for dy in range(3):
            for dx in range(3):
                grown |= padded[:, dy : dy + mask.shape[1], dx : dx + mask.shape[2]]
        grown &= mask
        if (grown == reached).all():
            return (reached == mask).all(axis=(1, 2))
        reached = grown


def test_positive_paths_are_dashed():
    split, meta = gen.generate_pathfinder(gen.CHUNK_SIZE, contour_length=14, seed=22, return_meta=True)
    path = meta.path_mask[split.labels == 1]
    # Measured: no positive path is 8-connected.
    assert eight_connected(path).mean() <= 0.01
    # Without LRA's gaps (paddles one pixel apart) nearly all are.
    split, meta = gen.generate_pathfinder(gen.CHUNK_SIZE, contour_length=14, seed=22, paddle_gap=1.0, return_meta=True)
    assert eight_connected(meta.path_mask[split.labels == 1]).mean() >= 0.9


def test_paddles_are_spaced_as_configured():
    # LRA's 32x32 paddle_margin 1: the next paddle starts 1 px on along the old direction and 1 px
    # along the new one, so the straight gap is 2 cos(turn / 2), between 2 cos(45 deg) and 2 px.
    p = params.PathfinderParams()
    assert (p.paddle_length, p.paddle_gap) == (2.0, 2.0)
    rng = np.random.default_rng(0)
    ok, _, points, _ = snakes.place_targets(rng, rng.integers(0, 2, 256), p)
    points = points[ok]  # (m, 2, C, S, 2)
    assert len(points) > 30
    length = np.linalg.norm(points[..., -1, :] - points[..., 0, :], axis=-1)
    np.testing.assert_allclose(length, p.paddle_length, rtol=1e-9)
    gap = np.linalg.norm(points[:, :, 1:, 0, :] - points[:, :, :-1, -1, :], axis=-1)
    assert gap.max() <= p.paddle_gap + 1e-9 and gap.min() >= p.paddle_gap * np.cos(np.pi / 4) - 1e-9
    # In pixels, most gaps leave a dark pixel between the two paddles' pixels (none would be 8-adjacent).
    a, b = np.floor(points[:, :, :-1, -1, :]), np.floor(points[:, :, 1:, 0, :])
    assert 0.6 <= (np.abs(a - b).max(-1) >= 2).mean() <= 1.0
    assert (np.abs(a - b).max(-1) <= 2).all()  # ... and never more than one: a fill of reach 2 joins them
