"""Span decoding rules of extractive QA (sparse_runner.tasks.squad_windows) on hand-made pieces: pieces
with an empty character span are never a span's boundary, and BERT's max-context rule decides which
window a token's start score counts in. A stand-in tokenizer (fixed pieces and offsets) keeps these
exact and fast; tests/test_squad_data.py checks the same on a real sentencepiece model."""

from __future__ import annotations

import numpy as np
import pytest

from sparse_runner.data.squad_examples import QAExample
from sparse_runner.tasks.squad_windows import QAFeature, best_span, make_features, predict_answers

CLS, SEP = 1, 2


class PiecesTokenizer:
    """``encode_with_offsets`` gives the pieces it was built with; questions are one token each."""

    def __init__(self, contexts: dict[str, list[tuple[int, int]]]):
        self.contexts = contexts

    def encode(self, texts):
        return [np.array([7], dtype=np.int32) for _ in texts]

    def encode_with_offsets(self, texts):
        out = []
        for text in texts:
            spans = self.contexts[text]
            ids = np.arange(10, 10 + len(spans), dtype=np.int32)
            starts = np.array([s for s, _ in spans], dtype=np.int64)
            ends = np.array([e for _, e in spans], dtype=np.int64)
            out.append((ids, starts, ends))
        return out


# "aa (bb) ½ cc" as sentencepiece cuts it: ▁aa, ▁ (standalone, empty: just before "("), (, bb, ),
# ▁1 and ⁄ (NFKC's "½" -> "1⁄2": empty), 2 (the whole "½"), ▁cc
TEXT = "aa (bb) ½ cc"
PIECES = [(0, 2), (3, 3), (3, 4), (4, 6), (6, 7), (8, 8), (8, 8), (8, 9), (10, 12)]
EMPTY = [1, 5, 6]


def pieces_feature() -> QAFeature:
    n = len(PIECES)
    return QAFeature(
        example_index=0, tokens=np.arange(4 + n + 1, dtype=np.int32), context_start=4,
        token_starts=np.array([s for s, _ in PIECES]), token_ends=np.array([e for _, e in PIECES]),
    )


def logits(feature: QAFeature, start: dict[int, float], end: dict[int, float]):
    """Start and end logits of a feature, zero but at the given context tokens."""
    s, e = np.zeros(len(feature.tokens)), np.zeros(len(feature.tokens))
    for i, v in start.items():
        s[feature.context_start + i] = v
    for i, v in end.items():
        e[feature.context_start + i] = v
    return s, e


def test_empty_pieces_are_never_span_boundaries():
    f = pieces_feature()
    assert [TEXT[s:e] for s, e in PIECES] == ["aa", "", "(", "bb", ")", "", "", "½", "cc"]
    # the standalone ▁ has by far the best start and end: the span "(bb)" is chosen, not ""
    s, e = logits(f, {1: 10.0, 2: 1.0}, {1: 10.0, 4: 1.0})
    assert best_span(s, e, f, max_answer_length=30) == (2.0, 3, 7)
    # the empty pieces of "½" as start and end: "½" itself (start and end on the piece "2")
    s, e = logits(f, {5: 10.0, 6: 9.0, 7: 1.0}, {5: 10.0, 6: 9.0, 7: 2.0})
    assert best_span(s, e, f, max_answer_length=30) == (3.0, 8, 9)
    # an empty end after a real start: the end moves to a real piece ("bb", not "bb" cut before "½")
    s, e = logits(f, {3: 5.0}, {5: 10.0, 4: 1.0})
    assert best_span(s, e, f, max_answer_length=30) == (6.0, 4, 7)
    # with n_best=1 the best start and end are real pieces too (the empty ones are not candidates)
    s, e = logits(f, {1: 10.0, 2: 1.0}, {1: 10.0, 4: 1.0})
    assert best_span(s, e, f, max_answer_length=30, n_best=1) == (2.0, 3, 7)
    # every span of every logit pattern: the text is never empty
    rng = np.random.default_rng(0)
    for _ in range(200):
        s, e = rng.normal(size=len(f.tokens)), rng.normal(size=len(f.tokens))
        for i in EMPTY:
            s[f.context_start + i] += 5.0
            e[f.context_start + i] += 5.0
        _, a, b = best_span(s, e, f, max_answer_length=int(rng.integers(1, 4)), n_best=int(rng.integers(0, 4)))
        assert TEXT[a:b].strip() != ""


def test_window_of_only_empty_pieces_has_no_span():
    f = QAFeature(example_index=0, tokens=np.arange(7, dtype=np.int32), context_start=4,
                  token_starts=np.array([3, 3]), token_ends=np.array([3, 3]))
    assert best_span(np.ones(7), np.ones(7), f, max_answer_length=5) == (-np.inf, 0, 0)


def test_predictions_never_decode_to_empty_pieces():
    tok = PiecesTokenizer({TEXT: PIECES})
    ex = QAExample("q", "t", TEXT, "What?", ["(bb)"], [3])
    (f,) = make_features([ex], tok, max_length=32, doc_stride=4, max_query_length=4, cls_id=CLS, sep_id=SEP, train=False)
    s, e = logits(f, {1: 10.0, 2: 1.0, 5: 9.0}, {1: 10.0, 4: 1.0, 6: 9.0})
    assert predict_answers([ex], [f], [(s, e)], max_answer_length=30) == {"q": "(bb)"}


def test_gold_positions_are_never_empty_pieces():
    tok = PiecesTokenizer({TEXT: PIECES})
    # " ½" starts with a space: the empty ▁1 and ⁄ overlap it, but the gold tokens are "2" .. "2"
    ex = QAExample("q", "t", TEXT, "What?", [" ½"], [7])
    (f,) = make_features([ex], tok, max_length=32, doc_stride=4, max_query_length=4, cls_id=CLS, sep_id=SEP, train=True)
    assert (f.start_position - f.context_start, f.end_position - f.context_start) == (7, 7)
    # an answer made of pieces with characters is unchanged
    ex = QAExample("q", "t", TEXT, "What?", ["(bb) ½"], [3])
    (f,) = make_features([ex], tok, max_length=32, doc_stride=4, max_query_length=4, cls_id=CLS, sep_id=SEP, train=True)
    assert (f.start_position - f.context_start, f.end_position - f.context_start) == (2, 7)


# --------------------------------------------------------------------------------------------------
# Max context


def bert_is_max_context(doc_spans: list[tuple[int, int]], cur_span_index: int, position: int) -> bool:
    """Google BERT's ``_check_is_max_context`` (run_squad.py), spans as (start, length)."""
    best_score, best_span_index = None, None
    for span_index, (start, length) in enumerate(doc_spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        num_left_context = position - start
        num_right_context = end - position
        score = min(num_left_context, num_right_context) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_span_index = score, span_index
    return cur_span_index == best_span_index


def words(n: int) -> tuple[str, list[tuple[int, int]]]:
    """n two-digit words ("00 01 02 ..."), one piece each."""
    return " ".join(f"{i:02d}" for i in range(n)), [(3 * i, 3 * i + 2) for i in range(n)]


@pytest.mark.parametrize("n,max_length,stride", [(12, 10, 3), (13, 10, 3), (20, 12, 5), (7, 10, 2), (30, 16, 1), (5, 16, 4)])
def test_max_context_marks_match_bert(n, max_length, stride):
    text, pieces = words(n)
    ex = QAExample("q", "t", text, "Q?", ["00"], [0])
    features = make_features([ex], PiecesTokenizer({text: pieces}), max_length=max_length, doc_stride=stride, max_query_length=1,
                             cls_id=CLS, sep_id=SEP, train=False)
    spans = [(f.context_offset, f.num_context_tokens) for f in features]
    counts = np.zeros(n, dtype=int)
    for w, f in enumerate(features):
        assert f.max_context.dtype == bool and len(f.max_context) == f.num_context_tokens
        expected = [bert_is_max_context(spans, w, f.context_offset + i) for i in range(f.num_context_tokens)]
        assert f.max_context.tolist() == expected
        counts[f.context_offset:f.context_offset + f.num_context_tokens] += f.max_context
    assert np.all(counts == 1)  # every token counts in exactly one window


def test_max_context_decides_between_windows():
    # 12 words, windows of 6 tokens 3 apart: [0..5], [3..8], [6..11]. Word 5 is the last token of window 0
    # (no right context) and has 2 tokens each side in window 1: it counts only in window 1.
    text, pieces = words(12)
    ex = QAExample("q", "t", text, "Q?", ["00"], [0])
    features = make_features([ex], PiecesTokenizer({text: pieces}), max_length=10, doc_stride=3, max_query_length=1,
                             cls_id=CLS, sep_id=SEP, train=False)
    assert [(f.context_offset, f.num_context_tokens) for f in features] == [(0, 6), (3, 6), (6, 6)]
    w0, w1, w2 = features
    # window 0 is sure of a span at word 5 (score 12); window 1 rates word 5 low and word 6 higher (score 6)
    pairs = [logits(w0, {5: 10.0}, {5: 2.0}), logits(w1, {2: 1.0, 3: 3.0}, {2: 1.0, 3: 3.0}), logits(w2, {}, {})]
    assert best_span(*pairs[0], w0, max_answer_length=30)[0] == 2.0  # word 5 is no start in window 0: 0 + 2 at best
    assert best_span(*pairs[1], w1, max_answer_length=30) == (6.0, 18, 20)  # word 6
    assert predict_answers([ex], features, pairs, max_answer_length=30) == {"q": "06"}  # not "05" from window 0
    # a span may end outside the start's max-context part of the window (BERT checks the start only)
    s, e = logits(w0, {3: 4.0}, {5: 4.0})
    assert best_span(s, e, w0, max_answer_length=30) == (8.0, 9, 17)


def test_max_context_ties_go_to_the_earlier_window():
    # word 4: 4 left / 1 right in window 0, 1 left / 4 right in window 1, same length: window 0 (BERT's first)
    text, pieces = words(12)
    ex = QAExample("q", "t", text, "Q?", ["00"], [0])
    w0, w1, _ = make_features([ex], PiecesTokenizer({text: pieces}), max_length=10, doc_stride=3, max_query_length=1,
                              cls_id=CLS, sep_id=SEP, train=False)
    assert w0.max_context.tolist() == [True, True, True, True, True, False]
    assert w1.max_context.tolist() == [False, False, True, True, True, False]


def test_single_window_without_empty_pieces_is_unchanged():
    # one window, every piece with characters: every start and end is a candidate
    text, pieces = words(6)
    ex = QAExample("q", "t", text, "Q?", ["00"], [0])
    (f,) = make_features([ex], PiecesTokenizer({text: pieces}), max_length=32, doc_stride=4, max_query_length=1,
                         cls_id=CLS, sep_id=SEP, train=False)
    rng = np.random.default_rng(1)
    for _ in range(100):
        s, e = rng.normal(size=len(f.tokens)), rng.normal(size=len(f.tokens))
        c, n = f.context_start, f.num_context_tokens
        m = int(rng.integers(1, 4))
        score, i, j = max((s[c + i] + e[c + j], -i, -j) for i in range(n) for j in range(i, min(n, i + m)))
        i, j = -i, -j  # the best score, ties to the earliest start, then the earliest end
        assert best_span(s, e, f, max_answer_length=m, n_best=0) == (score, pieces[i][0], pieces[j][1])
        assert best_span(s, e, f, max_answer_length=m, n_best=2)[0] <= score
