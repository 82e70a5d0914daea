"""Extractive question answering: exact match and token F1 of SQuAD v1.1 (Rajpurkar et al. 2016), and
the variants of TriviaQA and HotpotQA.

This re-implements the official evaluation script of SQuAD v1.1 (``evaluate-v1.1.py``) and gives the
same numbers:

* an answer is compared after ``normalize_answer``: lower case, every ``string.punctuation`` character
  deleted, the articles *a*, *an*, *the* deleted as whole words, runs of whitespace collapsed to one
  space and the ends stripped (in that order);
* ``exact_match``: the normalised strings are equal;
* ``f1``: harmonic mean of precision and recall of the normalised whitespace tokens, counted as a
  multiset (a token found twice in both counts twice);
* a question with several gold answers (SQuAD dev has up to six) gets its best score over them;
* ``squad_scores`` averages over every question of the gold set, in percent; a question without a
  prediction scores 0 on both metrics (the official script prints a message and counts it as wrong).

The other official scripts differ only where ``squad_scores(style=...)`` says:

* ``"triviaqa"`` (``triviaqa_evaluation.py``, Joshi et al. 2017): ``normalize_answer_triviaqa`` turns
  underscores and punctuation (ASCII plus ``‘ ’ ´ `` ` ``) into spaces instead of deleting them; a
  question's golds are its answer aliases, and it scores its best alias;
* ``"hotpotqa"`` (``hotpot_evaluate_v1.py``, Yang et al. 2018): SQuAD's normalisation, but F1 is 0
  when either side is ``yes`` / ``no`` / ``noanswer`` and the two differ (a yes/no answer is all or
  nothing).

Rajpurkar, Zhang, Lopyrev and Liang (2016), "SQuAD: 100,000+ Questions for Machine Comprehension of
Text", EMNLP.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable, Mapping, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_TRIVIAQA_PUNCTUATION = _PUNCTUATION | frozenset("‘’´`")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = ("yes", "no", "noanswer")
STYLES = ("squad", "triviaqa", "hotpotqa")


def normalize_answer(s: str) -> str:
    """``s`` lower-cased, without punctuation and articles, whitespace collapsed (as evaluate-v1.1.py).

    The steps run in the official order: lower case, delete ``string.punctuation`` characters,
    replace the whole words a/an/the by a space, then join the whitespace-separated tokens with single
    spaces. Deleting punctuation first means ``"the-end"`` becomes ``"theend"`` (no article left) and
    ``"a.b"`` becomes ``"ab"``. Only ASCII punctuation is removed (``"—"`` and ``"€"`` stay).
    """
    text = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_answer_triviaqa(s: str) -> str:
    """``s`` as ``triviaqa_evaluation.py`` normalises it: underscores to spaces, lower case, punctuation
    (``string.punctuation`` and ``‘ ’ ´ `` ` ``) to spaces, the whole words a/an/the to spaces, whitespace
    collapsed. ``"U.S.A."`` becomes ``"u s"``: its last letter is then the article *a* (SQuAD's: ``"usa"``)."""
    text = "".join(" " if ch in _TRIVIAQA_PUNCTUATION else ch for ch in s.replace("_", " ").lower())
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> bool:
    """Whether ``prediction`` and ``gold`` are equal after ``normalize_answer``.

    Two answers that normalise to the empty string (say ``""`` and ``"The."``) match.
    """
    return normalize_answer(prediction) == normalize_answer(gold)


def _token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    num_same = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, gold: str) -> float:
    """Token F1 in [0, 1] between ``prediction`` and ``gold`` (evaluate-v1.1.py's ``f1_score``).

    Tokens are the whitespace-separated words of the normalised strings; the overlap is the size of the
    multiset intersection. With ``num_same`` common tokens, precision = num_same / len(prediction
    tokens), recall = num_same / len(gold tokens), F1 = 2PR / (P + R).

    As in v1.1, F1 is 0 whenever no token is shared -- including when *both* strings normalise to empty:
    ``f1("", "")`` is 0.0 while ``exact_match("", "")`` is True. (SQuAD v2.0's script changed this to 1;
    v1.1 never needed it, as every gold answer there has a token.)
    """
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def exact_match_triviaqa(prediction: str, gold: str) -> bool:
    """TriviaQA's exact match: equal after ``normalize_answer_triviaqa``."""
    return normalize_answer_triviaqa(prediction) == normalize_answer_triviaqa(gold)


def f1_triviaqa(prediction: str, gold: str) -> float:
    """TriviaQA's token F1: SQuAD's ``f1`` over ``normalize_answer_triviaqa`` tokens."""
    return _token_f1(normalize_answer_triviaqa(prediction).split(), normalize_answer_triviaqa(gold).split())


def f1_hotpotqa(prediction: str, gold: str) -> float:
    """HotpotQA's answer F1: SQuAD's ``f1``, except 0 when either normalised side is yes / no /
    noanswer and they differ."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in _YES_NO or g in _YES_NO) and p != g:
        return 0.0
    return _token_f1(p.split(), g.split())


# style -> (exact match, F1) of one prediction against one gold answer
_METRICS: dict[str, tuple[Callable[[str, str], float], Callable[[str, str], float]]] = {
    "squad": (exact_match, f1),
    "triviaqa": (exact_match_triviaqa, f1_triviaqa),
    "hotpotqa": (exact_match, f1_hotpotqa),
}


def best_over_golds(metric: Callable[[str, str], float], prediction: str, golds: Sequence[str]) -> float:
    """The best ``metric(prediction, gold)`` over the gold answers (``metric_max_over_ground_truths``).

    ``exact_match`` results come back as 0.0 / 1.0. No gold answer at all is a ``ValueError``: a SQuAD
    v1.1 question always has one.
    """
    if isinstance(golds, str):
        raise TypeError("best_over_golds: golds must be a list of answers, not one string")
    if not golds:
        raise ValueError("best_over_golds: no gold answer to compare with")
    return max(float(metric(prediction, gold)) for gold in golds)


def squad_scores(predictions: Mapping[str, str], golds: Mapping[str, Sequence[str]], *, style: str = "squad") -> dict:
    """Exact match and F1 of ``predictions`` over every question of ``golds``, in percent (evaluate-v1.1.py).

    Args:
        predictions: question id -> predicted answer text.
        golds: question id -> its gold answer texts (one or more; TriviaQA: the answer's aliases).
        style: whose official script to follow, one of ``STYLES`` (see the module docstring).

    Returns:
        ``{"exact_match": float, "f1": float, "count": int, "missing": int}``: the two means in [0, 100]
        over the ``count`` questions of ``golds``; ``missing`` of them had no prediction and scored 0 on
        both (as in the official script). Predictions for ids not in ``golds`` are ignored. An empty
        ``golds`` gives 0.0 for both metrics (the official script would divide by zero).
    """
    per_question = question_scores(predictions, golds, style=style)
    em_total = f1_total = 0.0
    for em, f1 in per_question.values():
        em_total += em
        f1_total += f1
    count = len(golds)
    if count == 0:
        return {"exact_match": 0.0, "f1": 0.0, "count": 0, "missing": 0}
    missing = sum(qid not in predictions for qid in golds)
    return {"exact_match": 100.0 * em_total / count, "f1": 100.0 * f1_total / count, "count": count, "missing": missing}


def question_scores(predictions: Mapping[str, str], golds: Mapping[str, Sequence[str]], *,
                    style: str = "squad") -> dict[str, tuple[float, float]]:
    """Per question of ``golds``, in its order: (exact match, F1) in [0, 1], the best over its gold answers;
    (0, 0) for a question without a prediction. ``squad_scores`` is their mean, in percent."""
    if style not in _METRICS:
        raise ValueError(f"squad_scores: unknown style {style!r}; valid: {', '.join(STYLES)}")
    em_metric, f1_metric = _METRICS[style]
    out = {}
    for qid, answers in golds.items():
        if qid not in predictions:
            out[qid] = (0.0, 0.0)
            continue
        if isinstance(answers, str) or not answers:
            raise ValueError(f"squad_scores: question {qid!r} has no list of gold answers (got {answers!r})")
        out[qid] = (best_over_golds(em_metric, predictions[qid], answers), best_over_golds(f1_metric, predictions[qid], answers))
    return out
