"""Per-example test records (sparse_runner/example_scores.py) and the hierarchical bootstrap over them
(reporting/bootstrap.py): each record gives back its run's metric, files from anyone are read safely, and the
interval is as wide as the seeds and the test set together make it."""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from sparse_runner import example_scores
from sparse_runner.example_scores import ExampleScores, bleu_from_statistics
from sparse_runner.metrics.squad import question_scores, squad_scores
from sparse_runner.metrics.translation import bleu_statistics, translation_scores
from sparse_runner.reporting.bootstrap import hierarchical_interval


def accuracy(right, index=None) -> ExampleScores:
    right = np.asarray(right, dtype=np.float64)
    return ExampleScores("test/accuracy", "mean", right[:, None], np.arange(len(right)) if index is None else np.asarray(index))


# ----------------------------------------------------------------------------------------- the records
def test_each_reducer_gives_back_its_metric():
    assert accuracy([1, 0, 1, 1]).value() == 0.75
    windows = ExampleScores("test/ppl", "exp_ratio", np.array([[2.0, 4.0], [6.0, 4.0]]), np.arange(2))
    assert windows.value() == pytest.approx(math.exp(8.0 / 8.0))
    # a resample that draws the first example twice and never the second
    assert windows.metric_of(np.array([[2, 0]]))[0] == pytest.approx(math.exp(4.0 / 8.0))


def test_sentence_statistics_give_back_the_papers_corpus_bleu():
    hyps = ["the cat sat on the mat .", "a dog barks loudly", "", "Hello, world!", "the the the the"]
    refs = ["the cat sat on a mat .", "the dog barks loud", "nothing here", "Hello there, world!", "the cat"]
    stats = bleu_statistics(hyps, refs, target_lang="en")
    assert stats.shape == (5, 10)
    assert bleu_from_statistics(stats.sum(0))[0] == pytest.approx(translation_scores(hyps, refs, target_lang="en")["bleu"])
    record = ExampleScores("test/bleu", "bleu", stats, np.arange(5))
    assert record.value() == pytest.approx(translation_scores(hyps, refs, target_lang="en")["bleu"])
    # the corpus of the first two sentences, as a resample of them weights it
    assert record.metric_of(np.array([[1, 1, 0, 0, 0]]))[0] == pytest.approx(
        translation_scores(hyps[:2], refs[:2], target_lang="en")["bleu"])


def test_per_question_scores_average_to_squad_scores():
    golds = {"a": ["Paris"], "b": ["the red fox", "red fox"], "c": ["1999"]}
    predictions = {"a": "paris", "b": "a red dog"}   # c has no prediction: 0 on both
    per = question_scores(predictions, golds)
    assert per["c"] == (0.0, 0.0) and per["a"] == (1.0, 1.0)
    scores = squad_scores(predictions, golds)
    assert 100 * np.mean([f1 for _, f1 in per.values()]) == pytest.approx(scores["f1"])
    assert scores["missing"] == 1 and scores["count"] == 3


def test_a_record_that_does_not_make_one_row_per_example_is_refused():
    with pytest.raises(ValueError, match="one row of 1 columns"):
        ExampleScores("test/accuracy", "mean", np.ones((3, 2)), np.arange(3))
    with pytest.raises(ValueError, match="reducer 'median' is not one of mean, ratio, exp_ratio, bleu"):
        ExampleScores("test/accuracy", "median", np.ones((3, 1)), np.arange(3))


def test_a_written_record_reads_back(tmp_path):
    record = accuracy([1, 0, 1], index=[2, 5, 7])
    described = example_scores.write(record, tmp_path)
    assert described == {"file": "test_examples.npz", "metric": "test/accuracy", "reducer": "mean", "examples": 3,
                         "columns": ["score"]}
    assert [p.name for p in tmp_path.iterdir()] == ["test_examples.npz"]   # no temporary left behind
    back = example_scores.read(open(tmp_path / "test_examples.npz", "rb"))
    assert back.metric == "test/accuracy" and back.index.tolist() == [2, 5, 7] and back.value() == pytest.approx(2 / 3)


def _npz(**arrays) -> io.BytesIO:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("make, reason", [
    (lambda: io.BytesIO(b"not a zip at all"), "not a numpy .npz archive"),
    (lambda: _npz(stats=np.ones((2, 1))), "it lacks index, metric, reducer"),
    # an object array needs pickle to load: the reader never unpickles a file from anyone
    (lambda: _npz(stats=np.array([{"a": 1}], dtype=object), index=np.arange(1), metric=np.array("m"),
                  reducer=np.array("mean")), "not a readable numpy archive"),
])
def test_a_file_that_is_not_a_record_is_refused_with_its_reason(make, reason):
    with pytest.raises(ValueError, match=reason):
        example_scores.read(make())


def test_a_record_that_unpacks_beyond_the_limit_is_refused_before_it_is_unpacked(monkeypatch):
    buffer = io.BytesIO()
    np.savez_compressed(buffer, stats=np.zeros((200_000, 1)), index=np.zeros(200_000, dtype=np.int64), metric=np.array("m"),
                        reducer=np.array("mean"))
    assert len(buffer.getvalue()) < 20_000   # zeros compress: the file is small, its arrays are not
    monkeypatch.setattr(example_scores, "MAX_UNPACKED_BYTES", 2**20)
    buffer.seek(0)
    with pytest.raises(ValueError, match="unpack to 3 MB, over the limit of 1 MB"):
        example_scores.read(buffer)


# ----------------------------------------------------------------------------------------- the bootstrap
def test_the_interval_of_one_run_per_arm_is_the_paired_test_set_interval():
    """Seeds without spread (one run per arm): the interval is the test set's alone, paired over examples, and its
    half-width is the normal one, 1.96 sd(a_i - b_i) / sqrt(n), within the bootstrap's own noise."""
    rng = np.random.default_rng(1)
    n = 2000
    a = (rng.random(n) < 0.62).astype(float)
    b = np.where(rng.random(n) < 0.8, a, (rng.random(n) < 0.6).astype(float))   # b agrees with a on most examples
    found = hierarchical_interval([accuracy(a)], [accuracy(b)], 100.0)
    assert found.difference == pytest.approx(100 * (a.mean() - b.mean()))
    half = 1.96 * 100 * np.std(a - b, ddof=1) / math.sqrt(n)
    assert (found.high - found.low) / 2 == pytest.approx(half, rel=0.08)
    # unpaired it would be far wider: the pairing is what the shared draw of examples keeps
    unpaired = 1.96 * 100 * math.sqrt(a.var(ddof=1) / n + b.var(ddof=1) / n)
    assert (found.high - found.low) / 2 < 0.8 * unpaired


def test_seeds_that_disagree_widen_the_interval_beyond_the_test_sets():
    rng = np.random.default_rng(2)
    n = 500
    base = (rng.random(n) < 0.5).astype(float)
    same = [accuracy(base)] * 3
    # seeds that differ: each gets the first k examples right, about k / 2 more than the base run
    better = lambda k: accuracy(np.where(np.arange(n) < k, 1.0, base))   # noqa: E731
    spread = [better(0), better(100), better(200)]
    narrow = hierarchical_interval(same, same, 100.0)
    wide = hierarchical_interval(spread, same, 100.0)
    assert narrow.low == narrow.high == 0.0     # the same runs in both arms: every resample gives 0
    assert wide.high - wide.low > 5.0


def test_the_interval_is_the_same_every_time_and_refuses_records_of_other_examples():
    a, b = accuracy([1, 0, 1, 1, 0, 1]), accuracy([0, 0, 1, 1, 0, 0])
    assert hierarchical_interval([a], [b]) == hierarchical_interval([a], [b])
    with pytest.raises(ValueError, match="runs tested on different examples"):
        hierarchical_interval([a], [accuracy([1, 0, 1, 1, 0, 1], index=[0, 1, 2, 3, 4, 9])])
    with pytest.raises(ValueError, match="records of different metrics"):
        hierarchical_interval([a], [ExampleScores("test/f1", "mean", np.ones((6, 1)), np.arange(6))])
