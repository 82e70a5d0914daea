"""Tests of translation_scores (sparse_runner.metrics.translation).

The tokenized BLEU is checked against a small multi-bleu.perl re-implementation written here on
hand-tokenized text, and the detokenized scores against sacreBLEU called directly.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from sacrebleu.metrics import BLEU, CHRF

from sparse_runner.metrics import translation_scores

KEYS = {"sacrebleu", "bleu", "chrf", "sacrebleu_signature", "chrf_signature", "bleu_tokenization"}


def multi_bleu(hyps: list[str], refs: list[str], max_n: int = 4) -> float:
    """What multi-bleu.perl prints: corpus BLEU over whitespace tokens, no smoothing, one reference."""
    matches, totals = [0] * max_n, [0] * max_n
    hyp_len = ref_len = 0
    for hyp, ref in zip(hyps, refs):
        h, r = hyp.split(), ref.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, max_n + 1):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / max_n
    bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_precision)


HYPS = [
    "I don't think it's going to rain today, but who knows?",
    "The committee approved the proposal on Tuesday.",
    "She said: \"We'll see.\"",
]
REFS = [
    "I don't think it will rain today, but who knows?",
    "On Tuesday the committee approved the proposal.",
    "She said: \"We will see.\"",
]
# The same sentences as the Moses tokenizer (English rules, no escaping) splits them, written by hand.
HYPS_MOSES = [
    "I don 't think it 's going to rain today , but who knows ?",
    "The committee approved the proposal on Tuesday .",
    "She said : \" We 'll see . \"",
]
REFS_MOSES = [
    "I don 't think it will rain today , but who knows ?",
    "On Tuesday the committee approved the proposal .",
    "She said : \" We will see . \"",
]


def test_identical_output_scores_100():
    refs = REFS + ["A short one.", "Ein deutscher Satz, mit Komma."]
    scores = translation_scores(list(refs), refs, target_lang="en")
    assert set(scores) == KEYS
    for key in ("bleu", "sacrebleu", "chrf"):
        assert scores[key] == pytest.approx(100.0), key


def test_known_example_against_independent_computations():
    scores = translation_scores(HYPS, REFS, target_lang="en")
    assert scores["bleu"] == pytest.approx(multi_bleu(HYPS_MOSES, REFS_MOSES), abs=1e-9)
    assert 0 < scores["bleu"] < 100
    assert scores["sacrebleu"] == pytest.approx(BLEU().corpus_score(HYPS, [REFS]).score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(CHRF().corpus_score(HYPS, [REFS]).score, abs=1e-9)
    assert "tok:13a" in scores["sacrebleu_signature"] and "nrefs:1" in scores["sacrebleu_signature"]
    assert "nc:6" in scores["chrf_signature"]
    assert "Moses" in scores["bleu_tokenization"] and "lang=en" in scores["bleu_tokenization"]
    assert "case-sensitive" in scores["bleu_tokenization"]


def test_tokenization_matters():
    # 13a keeps "don't" / "it's" whole; Moses splits them: the two BLEUs must differ here
    scores = translation_scores(HYPS, REFS, target_lang="en")
    assert scores["bleu"] != pytest.approx(scores["sacrebleu"], abs=0.01)
    assert BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(HYPS, [REFS]).score != pytest.approx(scores["bleu"])


def test_tokenized_bleu_is_case_sensitive_and_unsmoothed():
    refs = ["The cat sat on the mat near the door ."]
    lower = translation_scores(["the cat sat on the mat near the door ."], refs, target_lang="en")
    assert lower["bleu"] == pytest.approx(multi_bleu(["the cat sat on the mat near the door ."], refs))
    assert lower["bleu"] < 100
    # no 4-gram in common -> multi-bleu.perl gives 0 (no smoothing), sacreBLEU's default smoothing does not
    far = translation_scores(["cat the mat the sat"], ["the cat sat on the mat"], target_lang="en")
    assert far["bleu"] == 0.0 and far["sacrebleu"] > 0.0


def test_empty_input_scores_zero():
    scores = translation_scores([], [], target_lang="en")
    assert set(scores) == KEYS
    assert scores["bleu"] == scores["sacrebleu"] == scores["chrf"] == 0.0
    assert "tok:13a" in scores["sacrebleu_signature"] and scores["chrf_signature"]


def test_mismatched_lengths_are_a_one_line_error():
    with pytest.raises(ValueError) as info:
        translation_scores(["a", "b"], ["a"], target_lang="en")
    assert "2 hypotheses but 1 references" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(TypeError):
        translation_scores("a", "a", target_lang="en")
    with pytest.raises(ValueError, match="target_lang"):
        translation_scores(["a"], ["a"], target_lang="")


def test_japanese_target_uses_a_japanese_aware_tokenizer():
    sentence = "これはペンです。あれは本です。"
    scores = translation_scores([sentence], [sentence], target_lang="ja")
    assert scores["sacrebleu"] == pytest.approx(100.0) and scores["bleu"] == pytest.approx(100.0)
    # ja-mecab when MeCab is installed, else character-level: never 13a / Moses
    assert "tok:ja-mecab" in scores["sacrebleu_signature"] or "tok:char" in scores["sacrebleu_signature"]
    assert "Moses does not segment ja" in scores["bleu_tokenization"]
