"""A hierarchical bootstrap of a claim's difference: seeds and test examples resampled together.

A claim's t interval (claims.py) treats each run's test score as exact: it measures how much the score moves from
seed to seed on *this* test set. A small test set adds its own sampling error (Text's 223 examples: about 3 points
of binomial standard error on an accuracy), and the t interval ignores it. With every run's per-example record
(sparse_runner/example_scores.py) both can be resampled at once:

    for each of RESAMPLES draws:
        draw the test examples with replacement, once, shared by every run of both arms (the arms were tested
            on the same examples, so the comparison stays paired over examples);
        draw each arm's seeds with replacement;
        the arm's value = the mean over its drawn seeds of the run's metric on the drawn examples;
    the interval = the 2.5 % and 97.5 % quantiles of treatment minus baseline.

What it cannot do: with 3 seeds per arm, its seed level has at most 10 distinct multisets, and a percentile
bootstrap over them is too narrow for the seed part (the reason the verdicts use t). It is shown beside the t
interval, not instead of it: where it is wider, the test set, not the seeds, limits what the runs can tell.
numpy's Generator does the drawing; no library offers a two-level resampler of precomputed per-example
statistics, and scipy.stats.bootstrap resamples one level only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sparse_runner.example_scores import ExampleScores

RESAMPLES = 4000
SEED = 0             # the draws are a function of the records alone: the report is the same every time
CONFIDENCE = 0.95
_CELLS_PER_CHUNK = 4_000_000   # resamples x examples held at once (32 MB of float64 weights)


@dataclass(frozen=True)
class Interval:
    """treatment minus baseline on every example once (`difference`), and its bootstrap interval."""

    difference: float
    low: float
    high: float
    resamples: int
    examples: int


def same_examples(records: Sequence[ExampleScores]) -> str | None:
    """Why the records cannot be resampled together (another metric, other test examples), or None."""
    first = records[0]
    for other in records[1:]:
        if (other.metric, other.reducer) != (first.metric, first.reducer):
            return f"records of different metrics ({first.metric}, {other.metric})"
        if not np.array_equal(other.index, first.index):
            return "runs tested on different examples"
    return None


def hierarchical_interval(treatment: Sequence[ExampleScores], baseline: Sequence[ExampleScores], scale: float = 1.0, *,
                          resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = SEED) -> Interval:
    """The bootstrap interval of scale x (mean over treatment runs - mean over baseline runs) of their metric, seeds
    and test examples resampled together (module docstring). Every record must hold the same examples of the same
    metric (`same_examples`); each arm needs at least one run."""
    if not treatment or not baseline:
        raise ValueError("a bootstrap interval needs at least one run per arm")
    problem = same_examples([*treatment, *baseline])
    if problem:
        raise ValueError(problem)
    rng = np.random.default_rng(seed)
    n = len(treatment[0])
    chunk = max(1, _CELLS_PER_CHUNK // max(n, 1))
    differences = []
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=size)
        arms = []
        for runs in (treatment, baseline):
            values = np.stack([run.metric_of(weights) for run in runs], axis=1)        # (size, runs)
            drawn = rng.integers(0, len(runs), size=(size, len(runs)))
            arms.append(np.take_along_axis(values, drawn, axis=1).mean(axis=1))
        differences.append(scale * (arms[0] - arms[1]))
    every = np.concatenate(differences)
    tail = (1 - confidence) / 2
    low, high = np.quantile(every, [tail, 1 - tail])
    point = scale * (np.mean([run.value() for run in treatment]) - np.mean([run.value() for run in baseline]))
    return Interval(float(point), float(low), float(high), resamples, n)
