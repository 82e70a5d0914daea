"""Extractive question answering data: SQuAD v1.1 examples, BERT-style windows, span decoding, and an
offline cloze substitute.

SQuAD v1.1 (Rajpurkar et al. 2016): a question about a Wikipedia paragraph, answered by a span of the
paragraph. Examples come from

  json     the official files (``train-v1.1.json``, ``dev-v1.1.json``): ``read_squad_json``;
  hf       Hugging Face ``rajpurkar/squad`` rows: ``examples_from_rows`` (the task does the loading);
  cloze    the offline substitute, ``cloze_examples``: *real text, generated questions*. Passages are runs
           of consecutive sentences of a real corpus (the State of the Union addresses shipped with the
           package); a question is one of the passage's sentences with a span blanked out (``_____``)
           -- a number, a multi-word name or a long content word -- and the answer is that span. It
           exercises the same model, windows, span decoding and metric as SQuAD, offline, but its
           numbers are not comparable to SQuAD's: a model has to find the sentence and copy the blanked
           span, without the paraphrase and reasoning of crowd-written questions. ``cloze_baselines``
           gives the floors a model must beat on it. No package registry ships SQuAD or any other real
           extractive-QA set; this is the substitute DATA.md (part 4) recommends.

Features (``make_features``) follow BERT's ``run_squad.py`` (Devlin et al. 2019): ``[CLS] question [SEP]
context-window [SEP]``, the question cut to ``max_query_length`` tokens, the tokenised context cut into
windows ``doc_stride`` tokens apart, a training target of (0, 0) -- the CLS position -- for a window that
does not hold the whole answer. Predictions (``best_span``, ``predict_answers``) are mapped back to the
original context through the character offsets of each token (``SubwordTokenizer.encode_with_offsets``),
so a predicted answer is always an exact substring of the context. Scoring is
``sparse_runner.metrics.squad.squad_scores`` (the official v1.1 evaluation).

This module needs numpy only (no torch).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from sparse_runner.checks import ConfigError, one_line
from sparse_runner.metrics.squad import squad_scores

SQUAD_LAYOUT = '{"version": "1.1", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}'
BLANK = "_____"


@dataclass
class QAExample:
    """One question: ``answers[k]`` is ``context[answer_starts[k]:answer_starts[k] + len(answers[k])]``
    (character offsets). Training questions have one answer, SQuAD dev questions up to six (the
    crowd workers' answers; duplicates kept, as in the official file)."""

    id: str
    title: str
    context: str
    question: str
    answers: list[str]
    answer_starts: list[int]


@dataclass
class QAFeature:
    """One window of one example, ready for the model.

    ``tokens`` is ``[CLS] question [SEP] window [SEP]`` (int32); the window's tokens are
    ``tokens[context_start:context_start + len(token_starts)]`` and token ``context_start + i`` covers
    ``context[token_starts[i]:token_ends[i]]`` of the example's original context.
    ``start_position``/``end_position`` are indices into ``tokens`` of the first and last token of the
    first gold answer, or both 0 (the CLS token) when the window does not hold the whole answer.
    ``context_offset`` is the index of the window's first token in the whole tokenised context.
    """

    example_index: int
    tokens: np.ndarray
    context_start: int
    token_starts: np.ndarray
    token_ends: np.ndarray
    start_position: int = 0
    end_position: int = 0
    context_offset: int = 0

    @property
    def num_context_tokens(self) -> int:
        return len(self.token_starts)


# --------------------------------------------------------------------------------------------------
# Reading SQuAD v1.1


def read_squad_json(path: str | os.PathLike) -> list[QAExample]:
    """Every question of an official SQuAD v1.1 JSON file, in file order.

    Raises ``ConfigError`` (one line naming the file, and the question id where there is one) if the
    file cannot be read, is not JSON, does not have the v1.1 layout, repeats a question id, has a
    question without an answer, or an answer whose text is not at its ``answer_start`` in the context.
    SQuAD 2.0 files (``"version": "v2.0"`` or questions with ``is_impossible``) are refused: unanswerable
    questions need a no-answer decision this task does not make.
    """
    path = Path(os.path.expanduser(str(path)))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the SQuAD file ({one_line(err)})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path}: not JSON ({err.msg} at line {err.lineno} column {err.colno}); expected the SQuAD v1.1 layout {SQUAD_LAYOUT}"
        ) from None
    return _examples_from_json(data, str(path))


def _examples_from_json(data: Any, where: str) -> list[QAExample]:
    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{where}: {problem}")

    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise bad(f"not the SQuAD v1.1 layout (no list under \"data\"); expected {SQUAD_LAYOUT}")
    version = str(data.get("version", ""))
    if version.lstrip("v").startswith("2"):
        raise bad(f"a SQuAD {version} file; only SQuAD v1.1 (every question answerable) is supported")
    examples: list[QAExample] = []
    seen: set[str] = set()
    for a, article in enumerate(data["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise bad(f"data[{a}] has no list of \"paragraphs\"; expected {SQUAD_LAYOUT}")
        title = article.get("title", "")
        for p, paragraph in enumerate(article["paragraphs"]):
            at = f"data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str) or not isinstance(paragraph.get("qas"), list):
                raise bad(f"{at} needs a \"context\" string and a \"qas\" list; expected {SQUAD_LAYOUT}")
            context = paragraph["context"]
            for q, qa in enumerate(paragraph["qas"]):
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str) or not isinstance(qa.get("question"), str):
                    raise bad(f"{at}.qas[{q}] needs an \"id\" and a \"question\" string; expected {SQUAD_LAYOUT}")
                qid = qa["id"]
                if "is_impossible" in qa or "plausible_answers" in qa:
                    raise bad(f"question {qid} has is_impossible: a SQuAD 2.0 file; only SQuAD v1.1 is supported")
                if qid in seen:
                    raise bad(f"question id {qid} appears twice")
                seen.add(qid)
                raw = qa.get("answers")
                if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
                    raise bad(f"question {qid}: \"answers\" must be a list of {{\"text\", \"answer_start\"}}")
                texts = [x.get("text") for x in raw]
                starts = [x.get("answer_start") for x in raw]
                examples.append(_checked_example(qid, str(title), context, qa["question"], texts, starts, where))
    return examples


def examples_from_rows(rows: Iterable[dict], *, where: str = "rajpurkar/squad") -> list[QAExample]:
    """Examples from Hugging Face ``rajpurkar/squad`` rows (``id, title, context, question, answers``
    with ``answers = {"text": [...], "answer_start": [...]}``), checked as ``read_squad_json`` checks
    a file (``where`` names the source in the one-line ``ConfigError``)."""
    examples: list[QAExample] = []
    seen: set[str] = set()
    for r, row in enumerate(rows):
        missing = [k for k in ("id", "context", "question", "answers") if k not in row]
        if missing:
            raise ConfigError(f"{where}: row {r} has no {', '.join(missing)} (columns: {', '.join(map(str, row))}); expected id, title, context, question, answers")
        qid = str(row["id"])
        answers = row["answers"]
        if not isinstance(answers, dict) or "text" not in answers or "answer_start" not in answers:
            raise ConfigError(f"{where}: question {qid}: answers must be {{\"text\": [...], \"answer_start\": [...]}}, got {_short(answers)}")
        if qid in seen:
            raise ConfigError(f"{where}: question id {qid} appears twice")
        seen.add(qid)
        examples.append(_checked_example(
            qid, str(row.get("title") or ""), row["context"], row["question"],
            list(answers["text"]), list(answers["answer_start"]), where,
        ))
    return examples


def _checked_example(qid: str, title: str, context: Any, question: Any, texts: list, starts: list, where: str) -> QAExample:
    if not isinstance(context, str) or not isinstance(question, str):
        raise ConfigError(f"{where}: question {qid}: context and question must be strings")
    if not texts:
        raise ConfigError(f"{where}: question {qid} has no answer (SQuAD v1.1 questions all have one)")
    if len(texts) != len(starts):
        raise ConfigError(f"{where}: question {qid}: {len(texts)} answer texts but {len(starts)} answer_start values")
    for text, start in zip(texts, starts):
        if not isinstance(text, str) or isinstance(start, bool) or not isinstance(start, (int, np.integer)):
            raise ConfigError(f"{where}: question {qid}: an answer needs a \"text\" string and an integer \"answer_start\", got {_short(text)} at {_short(start)}")
        found = context[start:start + len(text)] if 0 <= start <= len(context) else None
        if found != text:
            raise ConfigError(
                f"{where}: question {qid}: answer {_short(text)} is not at answer_start {start} of its context "
                f"(found {_short(found)}, context of {len(context)} characters)"
            )
    return QAExample(qid, title, context, question, list(texts), [int(s) for s in starts])


def _short(value: Any, limit: int = 60) -> str:
    """repr of a value for a one-line message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


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

    Positions: the first gold answer's tokens are those whose character span overlaps
    ``[answer_start, answer_start + len(answer))``. In a window that holds all of them, ``start_position``
    and ``end_position`` index the first and last in ``tokens``; otherwise both are 0 (the CLS token),
    as BERT trains. With ``train=True`` every example must have an answer (``ValueError`` otherwise);
    with ``train=False`` examples without one are allowed (positions 0) and the positions are only
    informative -- predictions go through ``predict_answers``.

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
        offset = 0
        while True:
            length = min(n - offset, window)
            tokens = np.concatenate([prefix, ids[offset:offset + length], [sep_id]]).astype(np.int32)
            start_position = end_position = 0
            if answer_tokens is not None:
                first, last = answer_tokens
                if offset <= first and last < offset + length:
                    start_position = context_start + first - offset
                    end_position = context_start + last - offset
            features.append(QAFeature(
                example_index=k, tokens=tokens, context_start=context_start,
                token_starts=starts[offset:offset + length], token_ends=ends[offset:offset + length],
                start_position=start_position, end_position=end_position, context_offset=offset,
            ))
            if offset + length >= n:
                break
            offset += min(length, doc_stride)
    return features


def _answer_tokens(ex: QAExample, starts: np.ndarray, ends: np.ndarray) -> tuple[int, int] | None:
    """Indices of the first and last context token overlapping the first gold answer (None if none do)."""
    if not ex.answers:
        return None
    begin = ex.answer_starts[0]
    end = begin + len(ex.answers[0])
    inside = np.flatnonzero((starts < end) & (ends > begin))
    if inside.size == 0:
        return None
    return int(inside[0]), int(inside[-1])


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
    (never the question, CLS or SEP); a span runs from token ``i`` to token ``j >= i`` with at most
    ``max_answer_length`` tokens, and scores ``start_logits[i] + end_logits[j]``. As in BERT's
    ``run_squad.py`` the search is over the ``n_best`` highest start and the ``n_best`` highest end
    logits; when no valid span is among them (or ``n_best`` is 0) every valid span is searched. Ties go
    to the earliest start, then the earliest end. The characters are ``context[char_start:char_end]``
    of the example's original context. A window without context tokens gives ``(-inf, 0, 0)``.
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
    found = None
    if n_best and n_best < n:
        top_starts = np.sort(np.argsort(-starts, kind="stable")[:n_best])
        top_ends = np.sort(np.argsort(-ends, kind="stable")[:n_best])
        found = _best_pair(starts, ends, top_starts, top_ends, max_answer_length)
    if found is None:
        everything = np.arange(n)
        found = _best_pair(starts, ends, everything, everything, max_answer_length)
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


# --------------------------------------------------------------------------------------------------
# Offline substitute: cloze questions over real text

# A number: digits, maybe $, thousands commas, decimals, a percent sign ("1990", "$1,200", "3.5%").
_NUMBER = re.compile(r"(?<![\w$.,])\$?\d+(?:,\d{3})*(?:\.\d+)?%?(?![\w%]|[.,]\d)")
# A name: two or more capitalised words, maybe joined by "of" / "of the" / "for" ("Soviet Union",
# "Department of Defense", "Bank of the United States").
_CAPITALISED = r"[A-Z][a-z]+(?:['’-][A-Za-z]+)?"
_NAME = re.compile(rf"(?<![\w'’-]){_CAPITALISED}(?: (?:(?:of|for)(?: the)? )?{_CAPITALISED})+(?![\w'’-])")
# A long word: 7 letters or more, not one of the frequent function words of that length.
_LONG_WORD = re.compile(r"(?<![\w'’-])[A-Za-z]{7,}(?![\w'’-])")
_FUNCTION_WORDS = frozenset(
    "although against another anything because before between however nothing something therefore "
    "through throughout together whether whatever whenever wherever without within yourselves "
    "ourselves themselves everyone everything everybody someone somebody already perhaps toward towards "
    "another several whereas".split()
)
KINDS = ("number", "name", "word")


def answer_kind(text: str) -> str:
    """``"number"``, ``"name"`` or ``"word"``: which kind of cloze answer ``text`` is."""
    if _NUMBER.fullmatch(text):
        return "number"
    if _NAME.fullmatch(text):
        return "name"
    return "word"


def _candidates(sentence: str) -> dict[str, list[tuple[int, int]]]:
    """Character spans of the possible cloze answers of one sentence, by kind, in order.

    A name may not start the sentence (a sentence-initial capital says nothing): a name found at
    position 0 loses its first word and counts only if two capitalised words remain.
    """
    names: list[tuple[int, int]] = []
    for m in _NAME.finditer(sentence):
        if m.start() == 0:
            rest = _NAME.search(sentence, m.group().index(" ") + 1, m.end())
            if rest is None:
                continue
            m = rest
        names.append(m.span())
    words = [m.span() for m in _LONG_WORD.finditer(sentence) if m.group().lower() not in _FUNCTION_WORDS]
    return {"number": [m.span() for m in _NUMBER.finditer(sentence)], "name": names, "word": words}


def cloze_examples(
    documents: Sequence[Sequence[str]],
    *,
    seed: int,
    passage_sentences: int = 5,
    questions_per_passage: int = 2,
    id_prefix: str,
) -> list[QAExample]:
    """Cloze questions over real text: the offline stand-in for SQuAD (see the module docstring).

    ``documents`` are lists of sentences (e.g. ``split_sentences`` of each State of the Union address).
    Each document is cut into passages of ``passage_sentences`` consecutive sentences (a shorter last
    passage is kept if it has two sentences or more), stripped and joined by single spaces. In each
    passage up to ``questions_per_passage`` different sentences are picked at random; in a picked
    sentence the answer is a random number or multi-word name (not sentence-initial) if it has any,
    else a random long word (7+ letters, not a function word); a sentence with none is passed over. The
    question is the sentence with the answer replaced by ``"_____"``; ``answer_starts`` is the answer's
    exact offset in the passage. Deterministic given ``seed`` (and the documents).

    Ids are ``f"{id_prefix}-{document}-{passage}-{question}"``, the title ``f"{id_prefix}-{document}"``.
    """
    if passage_sentences < 1 or questions_per_passage < 1:
        raise ValueError(f"cloze_examples: passage_sentences and questions_per_passage must be >= 1, got {passage_sentences}, {questions_per_passage}")
    if isinstance(documents, str) or any(isinstance(doc, str) for doc in documents):
        raise TypeError("cloze_examples: documents must be lists of sentences")
    rng = np.random.default_rng(seed)
    examples: list[QAExample] = []
    for d, document in enumerate(documents):
        sentences = [s.strip() for s in document if s.strip()]
        for p, first in enumerate(range(0, len(sentences), passage_sentences)):
            chunk = sentences[first:first + passage_sentences]
            if len(chunk) < min(2, passage_sentences):
                continue
            context = " ".join(chunk)
            offsets = np.cumsum([0] + [len(s) + 1 for s in chunk[:-1]])
            made = 0
            for i in rng.permutation(len(chunk)):
                found = _candidates(chunk[i])
                pool = found["number"] + found["name"] or found["word"]
                if not pool:
                    continue
                begin, end = pool[int(rng.integers(len(pool)))]
                sentence = chunk[i]
                answer_start = int(offsets[i]) + begin
                examples.append(QAExample(
                    id=f"{id_prefix}-{d}-{p}-{made}", title=f"{id_prefix}-{d}", context=context,
                    question=sentence[:begin] + BLANK + sentence[end:],
                    answers=[sentence[begin:end]], answer_starts=[answer_start],
                ))
                made += 1
                if made == questions_per_passage:
                    break
    return examples


def cloze_baselines(examples: Sequence[QAExample]) -> dict[str, float]:
    """Trivial predictors on cloze examples, scored with ``squad_scores`` (percent): the floors a model
    must beat.

    * ``first_sentence``: the passage's first sentence, whatever the question;
    * ``same_kind_first``: the first span in the passage of the gold answer's kind (``answer_kind``):
      the first number, the first multi-word name that does not start a sentence, or the first long
      word -- a reader that knows what kind of answer is wanted but not where.

    Returns ``{"first_sentence_exact_match", "first_sentence_f1", "same_kind_first_exact_match",
    "same_kind_first_f1"}``. Needs no network and no Hugging Face.
    """
    from sparse_runner.data.documents import split_sentences

    golds = {ex.id: list(ex.answers) for ex in examples}
    first_sentence: dict[str, str] = {}
    same_kind: dict[str, str] = {}
    for ex in examples:
        sentences = [s.strip() for s in split_sentences(ex.context)]
        first_sentence[ex.id] = sentences[0] if sentences else ""
        kind = answer_kind(ex.answers[0]) if ex.answers else "word"
        same_kind[ex.id] = ""
        for sentence in sentences:
            spans = _candidates(sentence)[kind]
            if spans:
                begin, end = spans[0]
                same_kind[ex.id] = sentence[begin:end]
                break
    out: dict[str, float] = {}
    for name, predictions in (("first_sentence", first_sentence), ("same_kind_first", same_kind)):
        scores = squad_scores(predictions, golds)
        out[f"{name}_exact_match"] = scores["exact_match"]
        out[f"{name}_f1"] = scores["f1"]
    return out


__all__ = [
    "BLANK", "KINDS", "QAExample", "QAFeature", "SQUAD_LAYOUT", "answer_kind", "best_span", "cloze_baselines",
    "cloze_examples", "examples_from_rows", "make_features", "predict_answers", "read_squad_json",
]
