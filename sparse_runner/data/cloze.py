"""The offline substitute for SQuAD: cloze questions over real text (*real text, generated questions*).

Passages are runs of consecutive sentences of a real corpus (the State of the Union addresses shipped
with the package); a question is one of the passage's sentences with a span blanked out (``_____``) --
a number, a multi-word name or a long content word -- and the answer is that span (``cloze_examples``).
It exercises the same model, windows, span decoding and metric as SQuAD, offline, but its numbers are
not comparable to SQuAD's: a model has to find the sentence and copy the blanked span, without the
paraphrase and reasoning of crowd-written questions. The SQuAD task reports the floors a model must
beat on it (first sentence; first span of the answer's kind). No package registry ships SQuAD or any
other real extractive-QA set offline, so this substitute stands in for it (docs/tasks.md).

``long_cloze_examples`` is the long-document version, the substitute for TriviaQA and HotpotQA: the
passage is a whole speech (its first sentences up to a word budget, thousands of tokens), so the blanked
sentence is usually far from the question in the input and the reader must find it there.

This module needs numpy only (no torch).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

import numpy as np

from sparse_runner.data.squad_examples import QAExample

BLANK = "_____"

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


def answer_candidates(sentence: str) -> dict[str, list[tuple[int, int]]]:
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
                found = answer_candidates(chunk[i])
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


def long_cloze_examples(
    documents: Sequence[Sequence[str]],
    *,
    seed: int,
    max_words: int,
    questions_per_document: int,
    id_prefix: str,
    segments: int | None = 1,
) -> list[QAExample]:
    """Cloze questions whose passage is a whole document: ``cloze_examples`` with one passage per segment.

    Each document is cut into consecutive segments of whole sentences whose whitespace-separated words
    add up to at most ``max_words`` (at least one sentence each), so a context of ``max_words`` words
    fits a reader's window. The first ``segments`` segments of each document are kept (``None``: all of
    them; the default 1 is the document's beginning), and ``questions_per_document`` sentences of each
    kept segment become questions, blanked as in ``cloze_examples``. Ids are
    ``f"{id_prefix}-{document}-{segment}-{question}"``, titles ``f"{id_prefix}-{document}"``.
    Deterministic given ``seed``; the questions of the first segments do not depend on ``segments``.
    """
    if max_words < 1 or questions_per_document < 1:
        raise ValueError(f"long_cloze_examples: max_words and questions_per_document must be >= 1, got {max_words}, {questions_per_document}")
    if segments is not None and segments < 1:
        raise ValueError(f"long_cloze_examples: segments must be >= 1 or None (all), got {segments}")
    if isinstance(documents, str) or any(isinstance(doc, str) for doc in documents):
        raise TypeError("long_cloze_examples: documents must be lists of sentences")
    cut: list[list[str]] = []
    origin: list[tuple[int, int]] = []  # (document, segment) of each entry of `cut`
    for d, document in enumerate(documents):
        for s, segment in enumerate(_word_segments(document, max_words)):
            if segments is not None and s == segments:
                break
            cut.append(segment)
            origin.append((d, s))
    longest = max((len(doc) for doc in cut), default=1)
    examples = cloze_examples(cut, seed=seed, passage_sentences=max(longest, 1), questions_per_passage=questions_per_document, id_prefix=id_prefix)
    renamed = []
    for example in examples:
        # cloze_examples numbered the segments as documents: f"{id_prefix}-{index into cut}-0-{question}".
        index, question = example.id[len(id_prefix) + 1:].split("-")[0::2]
        d, s = origin[int(index)]
        renamed.append(replace(example, id=f"{id_prefix}-{d}-{s}-{question}", title=f"{id_prefix}-{d}"))
    return renamed


def _word_segments(document: Sequence[str], max_words: int) -> list[list[str]]:
    """The document's non-empty sentences in consecutive runs of at most ``max_words`` words (a longer
    sentence is a run of its own)."""
    runs: list[list[str]] = []
    words = 0
    for sentence in (s.strip() for s in document):
        if not sentence:
            continue
        n = len(sentence.split())
        if not runs or words + n > max_words:
            runs.append([])
            words = 0
        runs[-1].append(sentence)
        words += n
    return runs
