"""Extractive question answering, examples to model inputs and back: BERT-style windows and span decoding.

Features (``make_features``) follow BERT's ``run_squad.py`` (Devlin et al. 2019): ``[CLS] question [SEP]
context-window [SEP]``, the question cut to ``max_query_length`` tokens, the tokenised context cut into
windows ``doc_stride`` tokens apart, a training target of (0, 0) -- the CLS position -- for a window that
does not hold the whole answer. A token in several windows is a candidate answer start only in the
window where it has the most context (BERT's ``_check_is_max_context``: ``QAFeature.max_context``), and
a piece with an empty character span (a standalone ``▁``, the first pieces of an NFKC expansion such as
``½``) is never the first or last token of an answer, gold or predicted. Predictions (``best_span``,
``predict_answers``) are mapped back to the original context through the character offsets of each
token (``SubwordTokenizer.encode_with_offsets``), so a predicted answer is always an exact substring of
the context. Scoring is ``sparse_runner.metrics.squad.squad_scores`` (the official v1.1 evaluation).

This module needs numpy only (no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from sparse_runner.checks import ConfigError
from sparse_runner.data.squad_examples import QAExample


@dataclass
class QAFeature:
    """One window of one example, ready for the model.

    ``tokens`` is ``[CLS] question [SEP] window [SEP]`` (int32); the window's tokens are
    ``tokens[context_start:context_start + len(token_starts)]`` and token ``context_start + i`` covers
    ``context[token_starts[i]:token_ends[i]]`` of the example's original context.
    ``start_position``/``end_position`` are indices into ``tokens`` of the first and last token of the
    first gold answer, or both 0 (the CLS token) when the window does not hold the whole answer.
    ``context_offset`` is the index of the window's first token in the whole tokenised context.
    ``max_context[i]`` says whether this is the window where context token ``i`` has the most context
    (BERT's ``_check_is_max_context``); only such tokens start a predicted span here. ``None`` (a
    feature made by hand) means every token.
    """

    example_index: int
    tokens: np.ndarray
    context_start: int
    token_starts: np.ndarray
    token_ends: np.ndarray
    start_position: int = 0
    end_position: int = 0
    context_offset: int = 0
    max_context: np.ndarray | None = None

    @property
    def num_context_tokens(self) -> int:
        return len(self.token_starts)


# --------------------------------------------------------------------------------------------------
# Windows


def make_features(
    examples: Sequence[QAExample],
    tokenizer: Any,
    *,
    max_length: int,
    doc_stride: int,
    max_query_length: int,
    cls_id: int,
    sep_id: int,
    train: bool,
) -> list[QAFeature]:
    """The model inputs of ``examples``: one ``QAFeature`` per window, examples in order, windows in order.

    Each question is tokenised and cut to its first ``max_query_length`` tokens; each distinct context
    is tokenised once (``tokenizer.encode_with_offsets``). With ``q`` question tokens a window holds up
    to ``max_length - q - 3`` context tokens; windows start ``doc_stride`` tokens apart and the last one
    reaches the end of the context (BERT's rule: a window stops early only at the end), so every context
    token is in at least one window and neighbouring windows overlap by ``window - doc_stride`` tokens.
    An empty context gives one window without context tokens.

    Positions: an answer's tokens are those whose character span overlaps ``[answer_start, answer_start +
    len(answer))``. A window's target is the first of the example's answers (in ``answers`` order) whose
    tokens it holds all of: ``start_position`` and ``end_position`` index its first and last in
    ``tokens``; a window that holds no whole answer has both 0 (the CLS token), as BERT trains. With one
    answer (SQuAD training) this is BERT's rule; with several occurrences of a distantly supervised
    answer (TriviaQA, in context order) every window that holds one learns its first. With ``train=True`` every example must have an answer (``ValueError`` otherwise);
    with ``train=False`` examples without one are allowed (positions 0) and the positions are only
    informative -- predictions go through ``predict_answers``. Pieces with an empty character span
    (``starts[i] == ends[i]``) are never the first or last answer token.

    ``max_context`` of each window marks the tokens whose best window it is, by BERT's rule: among the
    windows holding a token, the one with the largest ``min(left context, right context) + 0.01 *
    window length`` (the first such window on a tie), so each context token is marked in exactly one.

    Raises ``ConfigError`` if ``doc_stride`` is outside ``1 .. max_length - max_query_length - 3`` (a
    larger stride would skip context tokens).
    """
    for key, value in (("max_length", max_length), ("doc_stride", doc_stride), ("max_query_length", max_query_length)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"make_features: {key} must be a positive int, got {value!r}")
    min_window = max_length - max_query_length - 3
    if min_window < 1:
        raise ConfigError(
            f"make_features: max_length={max_length} leaves no room for context after a question of max_query_length={max_query_length} "
            f"and 3 special tokens; use max_length > max_query_length + 3"
        )
    if doc_stride > min_window:
        raise ConfigError(
            f"make_features: doc_stride={doc_stride} is more than the smallest context window ({min_window} = max_length - max_query_length - 3), "
            f"so some context tokens would be in no window; use doc_stride <= {min_window}"
        )

    questions = tokenizer.encode([ex.question for ex in examples])
    context_index: dict[str, int] = {}
    for ex in examples:
        context_index.setdefault(ex.context, len(context_index))
    encoded = tokenizer.encode_with_offsets(list(context_index))

    features: list[QAFeature] = []
    for k, ex in enumerate(examples):
        question = np.asarray(questions[k][:max_query_length], dtype=np.int32)
        ids, starts, ends = encoded[context_index[ex.context]]
        n = len(ids)
        window = max_length - len(question) - 3
        answer_tokens = _answer_tokens(ex, starts, ends)
        if train and not ex.answers:
            raise ValueError(f"make_features: training question {ex.id} has no answer")
        prefix = np.concatenate([[cls_id], question, [sep_id]]).astype(np.int32)
        context_start = len(prefix)
        spans = _windows(n, window, doc_stride)
        for (offset, length), max_context in zip(spans, _max_context(spans, n)):
            tokens = np.concatenate([prefix, ids[offset:offset + length], [sep_id]]).astype(np.int32)
            start_position = end_position = 0
            for first, last in answer_tokens:
                if offset <= first and last < offset + length:
                    start_position = context_start + first - offset
                    end_position = context_start + last - offset
                    break
            features.append(QAFeature(
                example_index=k, tokens=tokens, context_start=context_start,
                token_starts=starts[offset:offset + length], token_ends=ends[offset:offset + length],
                start_position=start_position, end_position=end_position, context_offset=offset,
                max_context=max_context,
            ))
    return features


def _windows(n: int, window: int, doc_stride: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each window over ``n`` context tokens: ``doc_stride`` apart, the last
    reaching the end (one empty window when ``n`` is 0)."""
    spans = []
    offset = 0
    while True:
        length = min(n - offset, window)
        spans.append((offset, length))
        if offset + length >= n:
            return spans
        offset += min(length, doc_stride)


def _max_context(spans: Sequence[tuple[int, int]], n: int) -> list[np.ndarray]:
    """Per window, which of its tokens have their most context there (BERT's ``_check_is_max_context``:
    score ``min(left, right) + 0.01 * length``, the earlier window on a tie)."""
    best_score = np.full(n, -np.inf)
    best_window = np.full(n, -1, dtype=np.int64)
    for w, (offset, length) in enumerate(spans):
        position = np.arange(offset, offset + length)
        score = np.minimum(position - offset, offset + length - 1 - position) + 0.01 * length
        better = score > best_score[position]
        best_score[position[better]] = score[better]
        best_window[position[better]] = w
    return [best_window[offset:offset + length] == w for w, (offset, length) in enumerate(spans)]


def _answer_tokens(ex: QAExample, starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Per answer (in ``ex.answers`` order), the indices of the first and last context token with
    characters (a non-empty span) overlapping it; answers that no such token overlaps are left out."""
    out = []
    for text, begin in zip(ex.answers, ex.answer_starts):
        end = begin + len(text)
        inside = np.flatnonzero((starts < end) & (ends > begin) & (ends > starts))
        if inside.size:
            out.append((int(inside[0]), int(inside[-1])))
    return out


# --------------------------------------------------------------------------------------------------
# Decoding


def best_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    feature: QAFeature,
    *,
    max_answer_length: int,
    n_best: int = 20,
) -> tuple[float, int, int]:
    """The best answer span of one window: ``(score, char_start, char_end)``.

    ``start_logits``/``end_logits`` are the model's scores for every position of ``feature.tokens``
    (longer arrays, e.g. padded to the batch, are fine). Only the window's context tokens are candidates
    (never the question, CLS or SEP), and of those only pieces with a non-empty character span (a
    standalone ``▁`` or the first pieces of an NFKC expansion decode to nothing); a start must also be a
    token whose most-context window this is (``feature.max_context``, BERT's rule; the end need not be,
    as in BERT). A span runs from token ``i`` to token ``j >= i`` with at most ``max_answer_length``
    tokens, and scores ``start_logits[i] + end_logits[j]``. As in BERT's ``run_squad.py`` the search is
    over the ``n_best`` highest start and the ``n_best`` highest end logits of the candidates; when no
    valid span is among them (or ``n_best`` is 0) every valid span is searched. Ties go to the earliest
    start, then the earliest end. The characters are ``context[char_start:char_end]`` of the example's
    original context. A window without a candidate start gives ``(-inf, 0, 0)``.
    """
    n = feature.num_context_tokens
    if n == 0:
        return -math.inf, 0, 0
    if max_answer_length < 1:
        raise ValueError(f"best_span: max_answer_length must be >= 1, got {max_answer_length}")
    c = feature.context_start
    starts = np.asarray(start_logits, dtype=np.float64).reshape(-1)[c:c + n]
    ends = np.asarray(end_logits, dtype=np.float64).reshape(-1)[c:c + n]
    if len(starts) < n or len(ends) < n:
        raise ValueError(f"best_span: {c + len(starts)} start and {c + len(ends)} end logits for a feature of {len(feature.tokens)} tokens")
    has_text = np.asarray(feature.token_ends) > np.asarray(feature.token_starts)
    may_start = has_text if feature.max_context is None else has_text & np.asarray(feature.max_context, dtype=bool)
    start_candidates, end_candidates = np.flatnonzero(may_start), np.flatnonzero(has_text)
    if start_candidates.size == 0:  # no context token starts a span in this window
        return -math.inf, 0, 0
    found = None
    if n_best and (n_best < start_candidates.size or n_best < end_candidates.size):
        top_starts = np.sort(start_candidates[np.argsort(-starts[start_candidates], kind="stable")[:n_best]])
        top_ends = np.sort(end_candidates[np.argsort(-ends[end_candidates], kind="stable")[:n_best]])
        found = _best_pair(starts, ends, top_starts, top_ends, max_answer_length)
    if found is None:
        found = _best_pair(starts, ends, start_candidates, end_candidates, max_answer_length)
    score, i, j = found
    char_start = int(feature.token_starts[i])
    return score, char_start, max(char_start, int(feature.token_ends[j]))


def _best_pair(starts: np.ndarray, ends: np.ndarray, si: np.ndarray, ei: np.ndarray, max_answer_length: int):
    """(score, i, j) of the best valid pair with i in ``si``, j in ``ei`` (both ascending), or None."""
    length = ei[None, :] - si[:, None]
    valid = (length >= 0) & (length < max_answer_length)
    if not valid.any():
        return None
    scores = np.where(valid, starts[si][:, None] + ends[ei][None, :], -np.inf)
    flat = int(np.argmax(scores))
    a, b = divmod(flat, len(ei))
    if not valid[a, b]:  # every valid score is NaN or -inf: take the first valid pair
        a, b = (int(x[0]) for x in np.nonzero(valid))
    return float(scores[a, b]), int(si[a]), int(ei[b])


def predict_answers(
    examples: Sequence[QAExample],
    features: Sequence[QAFeature],
    logits_per_feature: Sequence[tuple[np.ndarray, np.ndarray]],
    max_answer_length: int,
    *,
    n_best: int = 20,
) -> dict[str, str]:
    """Question id -> predicted answer: the best ``best_span`` over all windows of each example.

    ``logits_per_feature[f]`` is ``(start_logits, end_logits)`` of ``features[f]``. The answer is the
    substring ``context[char_start:char_end]`` of the example's original context, less any whitespace
    at its ends. Examples without a feature get no prediction (``squad_scores`` counts them missing).
    On equal scores the earlier window wins.
    """
    if len(features) != len(logits_per_feature):
        raise ValueError(f"predict_answers: {len(features)} features but {len(logits_per_feature)} logit pairs")
    best: dict[int, tuple[float, int, int]] = {}
    for feature, (start_logits, end_logits) in zip(features, logits_per_feature):
        span = best_span(start_logits, end_logits, feature, max_answer_length=max_answer_length, n_best=n_best)
        k = feature.example_index
        if k not in best or span[0] > best[k][0]:
            best[k] = span
    out: dict[str, str] = {}
    for k, (_, char_start, char_end) in best.items():
        context = examples[k].context
        while char_start < char_end and context[char_start].isspace():
            char_start += 1
        while char_end > char_start and context[char_end - 1].isspace():
            char_end -= 1
        out[examples[k].id] = context[char_start:char_end]
    return out
