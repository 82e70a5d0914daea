"""Per-example test scores: what a run's headline metric is made of, kept so that intervals can resample
test examples as well as seeds.

A test metric is a function of sums over the test examples: accuracy is the mean of 0/1 scores, perplexity
exp(sum of losses / sum of tokens), corpus BLEU a function of summed n-gram counts. A task therefore keeps, per
test example, the statistics whose column sums give its metric (`ExampleScores.stats`, one row per example,
in the split's order) and names the `reducer` that turns column sums into the metric. Resampling examples is
then a weighted column sum, and the same reducer gives the metric of every resample: no model runs again.

The run writes them to `test_examples.npz` beside its metrics.json (numpy's compressed format, read with
`allow_pickle=False`: numbers only) and describes the file in metrics.json's `test_examples`. `reproduces`
checks on reading that the statistics give back the metric the run recorded, so a record that does not
belong to its run is never used.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from sparse_runner.io import atomic_open

FILE = "test_examples.npz"
ARRAYS = ("stats", "index", "metric", "reducer")   # what the file holds
# A reader refuses a record whose arrays would unpack to more than this (a zip can hold a small bomb).
MAX_UNPACKED_BYTES = 256 * 2**20


def _mean(sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    return sums[:, 0] / count


def _ratio(sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    return sums[:, 0] / np.maximum(sums[:, 1], 1e-300)


def _exp_ratio(sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    return np.exp(np.minimum(_ratio(sums, count), 50.0))  # the cap of the tasks' own ppl


def _bleu(sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    return bleu_from_statistics(sums)


def bleu_from_statistics(sums: np.ndarray) -> np.ndarray:
    """(R,) corpus BLEU from (R, 2 + 2 n) column sums of per-sentence statistics (metrics.translation's
    bleu_statistics: hypothesis and reference lengths, then matched and total n-grams for orders 1..n):
    sacreBLEU's own formula, no smoothing."""
    from sacrebleu.metrics import BLEU  # the reader of metrics.json has no torch, and needs no more than this

    sums = np.atleast_2d(np.asarray(sums, dtype=np.float64))
    order = (sums.shape[1] - 2) // 2
    counts = np.rint(sums).astype(np.int64)
    return np.array([BLEU.compute_bleu(row[2:2 + order].tolist(), row[2 + order:].tolist(), int(row[0]), int(row[1]),
                                       smooth_method="none", max_ngram_order=order).score for row in counts])


# corpus BLEU's per-sentence statistics (metrics.translation.bleu_statistics), for n-grams up to BLEU_ORDER
BLEU_ORDER = 4
BLEU_COLUMNS = ("sys_len", "ref_len", *(f"correct_{n}" for n in range(1, BLEU_ORDER + 1)),
                *(f"total_{n}" for n in range(1, BLEU_ORDER + 1)))

# reducer name -> f(column sums (R, k), examples per resample (R,)) -> (R,) metric values. Each names the
# columns it reads, in order.
REDUCERS: dict[str, tuple[tuple[str, ...], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "mean": (("score",), _mean),                       # accuracy, exact match, F1: the mean of a per-example score
    "ratio": (("value", "weight"), _ratio),            # a loss per token: sum of values / sum of weights
    "exp_ratio": (("value", "weight"), _exp_ratio),    # perplexity
    "bleu": (BLEU_COLUMNS, _bleu),
}


@dataclass(frozen=True)
class ExampleScores:
    """A split's per-example statistics.

    metric: the metric they give, as metrics.json names it (`test/accuracy`); reducer: a key of REDUCERS;
    stats: (n, k) float64, row i for the split's example `index[i]`, columns REDUCERS[reducer]'s; index: (n,)
    int64, the examples' positions in the split (sorted)."""

    metric: str
    reducer: str
    stats: np.ndarray
    index: np.ndarray

    def __post_init__(self) -> None:
        if self.reducer not in REDUCERS:
            raise ValueError(f"example scores: reducer {self.reducer!r} is not one of {', '.join(REDUCERS)}")
        columns = REDUCERS[self.reducer][0]
        if self.stats.ndim != 2 or self.stats.shape[1] != len(columns) or self.index.shape != (len(self.stats),):
            raise ValueError(f"example scores: stats {self.stats.shape} and index {self.index.shape} do not make "
                             f"one row of {len(columns)} columns ({', '.join(columns)}) per example")

    def __len__(self) -> int:
        return len(self.index)

    def metric_of(self, weights: np.ndarray) -> np.ndarray:
        """(R,) the metric of R resamples, `weights` (R, n): how often each example is drawn."""
        weights = np.asarray(weights, dtype=np.float64)
        return REDUCERS[self.reducer][1](weights @ self.stats, weights.sum(axis=1))

    def value(self) -> float:
        """The metric over every example once: what the run recorded."""
        return float(self.metric_of(np.ones((1, len(self))))[0])


def describe(scores: ExampleScores) -> dict:
    """metrics.json's `test_examples`: what the file holds."""
    return {"file": FILE, "metric": scores.metric, "reducer": scores.reducer, "examples": len(scores),
            "columns": list(REDUCERS[scores.reducer][0])}


def write(scores: ExampleScores, run_dir: Path) -> dict:
    """Write `test_examples.npz` atomically into `run_dir`; return its description for metrics.json."""
    with atomic_open(Path(run_dir) / FILE, "wb") as handle:
        np.savez_compressed(handle, stats=scores.stats.astype(np.float64), index=scores.index.astype(np.int64),
                            metric=np.array(scores.metric), reducer=np.array(scores.reducer))
    return describe(scores)


def read(handle) -> ExampleScores:
    """The scores in an open `test_examples.npz` (a binary file object). Raises ValueError saying why a file
    cannot be used: not a numpy archive, too large unpacked, arrays missing or not plain numbers, or not a
    valid record."""
    try:
        with zipfile.ZipFile(handle) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile:
        raise ValueError("not a numpy .npz archive") from None
    if unpacked > MAX_UNPACKED_BYTES:
        raise ValueError(f"its arrays unpack to {unpacked / 2**20:.0f} MB, over the limit of {MAX_UNPACKED_BYTES // 2**20} MB")
    handle.seek(0)
    try:
        with np.load(handle, allow_pickle=False) as data:
            arrays = {name: data[name] for name in ARRAYS if name in data.files}
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:   # ValueError: an object array
        raise ValueError(f"not a readable numpy archive ({exc})") from None
    missing = set(ARRAYS) - set(arrays)
    if missing:
        raise ValueError(f"not a per-example record: it lacks {', '.join(sorted(missing))}")
    try:
        return ExampleScores(str(arrays["metric"]), str(arrays["reducer"]), np.asarray(arrays["stats"], dtype=np.float64),
                             np.asarray(arrays["index"], dtype=np.int64))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a valid record ({exc})") from None


def reproduces(scores: ExampleScores, recorded: float | None, *, rel: float = 1e-5) -> bool:
    """Whether the statistics give back the value the run recorded for their metric (to `rel`)."""
    if recorded is None or not math.isfinite(recorded):
        return False
    return math.isclose(scores.value(), recorded, rel_tol=rel, abs_tol=1e-9)
