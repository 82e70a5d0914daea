"""Tests of the SQuAD v1.1 metric (sparse_runner.metrics.squad) on hand-made cases whose scores are
worked out by hand here, following evaluate-v1.1.py."""

from __future__ import annotations

import pytest

from sparse_runner.metrics.squad import best_over_golds, exact_match, f1, normalize_answer, squad_scores


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Eiffel Tower", "eiffel tower"),  # case and a leading article
        ("  an   apple\tand\na pear ", "apple and pear"),  # whitespace collapsed, articles anywhere
        ("Denver Broncos!", "denver broncos"),  # punctuation
        ("U.S.A.", "usa"),
        ("$1,000.50", "100050"),
        ("the-end", "theend"),  # punctuation goes first: no article left to remove
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("A", ""),
        ("", ""),
        ("Zürich — 5 €", "zürich — 5 €"),  # only ASCII punctuation is removed
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_ignores_case_punctuation_articles_and_whitespace():
    assert exact_match("the Denver Broncos.", "Denver  Broncos")
    assert exact_match("AN Apple", "apple")
    assert not exact_match("Denver", "Denver Broncos")
    assert exact_match("", "")  # both normalise to empty
    assert exact_match("The.", "")


def test_f1_partial_overlap_by_hand():
    # prediction tokens: [denver, broncos, won]; gold: [broncos]  -> P = 1/3, R = 1, F1 = 2*(1/3)/(4/3) = 0.5
    assert f1("Denver Broncos won", "the Broncos") == pytest.approx(0.5)
    # prediction [in, 1990], gold [1990, season, of, nfl]: common 1 -> P = 1/2, R = 1/4, F1 = 1/3
    assert f1("in 1990", "1990 season of the NFL") == pytest.approx(1 / 3)
    # repeated tokens count as a multiset: pred [x, x, y], gold [x, y, y]: common {x: 1, y: 1} = 2
    # -> P = 2/3, R = 2/3, F1 = 2/3
    assert f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1("Denver Broncos", "denver broncos!") == 1.0
    assert f1("Carolina Panthers", "Denver Broncos") == 0.0


def test_f1_of_empty_answers_is_zero_as_in_v11():
    assert f1("", "Denver") == 0.0
    assert f1("Denver", "") == 0.0
    # both empty after normalisation: v1.1's f1_score returns 0 (num_same == 0) although EM is 1
    assert f1("", "") == 0.0
    assert f1("the", "a") == 0.0 and exact_match("the", "a")


def test_best_over_golds_takes_the_best_gold():
    golds = ["Denver Broncos", "the Broncos", "Broncos team of Denver"]
    assert best_over_golds(exact_match, "Broncos", golds) == 1.0
    # f1 against each: [2*(1/1)(1/2)/(3/2) = 2/3, 1.0, 2*(1)(1/4)/(5/4) = 0.4] -> 1.0
    assert best_over_golds(f1, "Broncos", golds) == 1.0
    # "Denver" vs golds: [2/3, 0, 0.4] -> 2/3
    assert best_over_golds(f1, "Denver", golds) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        best_over_golds(f1, "x", [])
    with pytest.raises(TypeError):
        best_over_golds(f1, "x", "Denver")


def test_squad_scores_average_in_percent_with_missing_predictions_as_zero():
    golds = {
        "q1": ["Denver Broncos", "Broncos"],  # exact (second gold)
        "q2": ["in 1990"],  # partial: pred [1990, season] vs [in, 1990] -> P 1/2, R 1/2 -> F1 1/2
        "q3": ["Santa Clara"],  # empty prediction -> 0
        "q4": ["Levi's Stadium"],  # no prediction -> 0, counted as missing
    }
    predictions = {"q1": "the Broncos", "q2": "1990 season", "q3": "", "extra": "ignored"}
    scores = squad_scores(predictions, golds)
    assert scores["count"] == 4
    assert scores["missing"] == 1
    assert scores["exact_match"] == pytest.approx(100 * 1 / 4)
    assert scores["f1"] == pytest.approx(100 * (1 + 0.5 + 0 + 0) / 4)


def test_squad_scores_edge_cases():
    assert squad_scores({}, {}) == {"exact_match": 0.0, "f1": 0.0, "count": 0, "missing": 0}
    perfect = squad_scores({"a": "x", "b": "y z"}, {"a": ["X."], "b": ["the y z"]})
    assert perfect["exact_match"] == 100.0 and perfect["f1"] == 100.0
    nothing = squad_scores({}, {"a": ["x"]})
    assert nothing == {"exact_match": 0.0, "f1": 0.0, "count": 1, "missing": 1}
    with pytest.raises(ValueError, match="q"):
        squad_scores({"q": "x"}, {"q": []})
