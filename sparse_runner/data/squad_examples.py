"""SQuAD v1.1 examples (Rajpurkar et al. 2016): a question about a Wikipedia paragraph, answered by a
span of the paragraph. ``QAExample`` holds one question; its readers are

  json     the official files (``train-v1.1.json``, ``dev-v1.1.json``): ``read_squad_json``;
  hf       Hugging Face ``rajpurkar/squad`` rows: ``examples_from_rows`` (the task does the loading).

Every problem is a one-line ``ConfigError`` naming the file (and the question id). The offline
substitute, cloze questions over real text, is ``cloze.py``. The long-document sets (``triviaqa.py``,
``hotpotqa.py``) give answers as text, not offsets; ``find_spans`` locates them in the context.

This module needs numpy only (no torch).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from sparse_runner.checks import ConfigError, one_line

SQUAD_LAYOUT = '{"version": "1.1", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}'


@dataclass
class QAExample:
    """One question: ``answers[k]`` is ``context[answer_starts[k]:answer_starts[k] + len(answers[k])]``
    (character offsets). Training questions have one answer, SQuAD dev questions up to six (the
    crowd workers' answers; duplicates kept, as in the official file).

    ``gold_answers`` are what the metric compares with when they are not the located spans: TriviaQA's
    answer aliases, which may occur in the context several times or not at all (``answers`` then holds
    the occurrences found, in context order, possibly none). ``None``: the ``answers`` themselves.
    """

    id: str
    title: str
    context: str
    question: str
    answers: list[str]
    answer_starts: list[int]
    gold_answers: Optional[list[str]] = None

    @property
    def golds(self) -> list[str]:
        """The answers the metric scores a prediction against."""
        return list(self.answers) if self.gold_answers is None else list(self.gold_answers)


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


# --------------------------------------------------------------------------------------------------
# Locating answers given as text (distant supervision)


def find_spans(context: str, texts: Sequence[str], *, limit: Optional[int] = None, within: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of ``context`` where one of ``texts`` occurs, in context order.

    Matching ignores case and needs a word boundary on both sides (``"Paris"`` is not found in
    ``"Parisian"``), as distant supervision for TriviaQA does (Joshi et al. 2017; Clark and Gardner
    2018): the answer's aliases are searched in the evidence. Overlapping hits keep the one that starts
    first (the longest there). ``within``: only hits inside one of these character ranges count, when
    any does (HotpotQA's supporting sentences); otherwise every hit counts. ``limit``: at most that many.
    """
    texts = sorted({t.strip() for t in texts if t.strip()}, key=len, reverse=True)
    if not texts:
        return []
    # One pass over the context: alternatives longest first, so each hit is the longest at its start,
    # and finditer's hits never overlap.
    pattern = re.compile(rf"(?<!\w)(?:{'|'.join(map(re.escape, texts))})(?!\w)", re.IGNORECASE)
    spans = [m.span() for m in pattern.finditer(context)]
    if within:
        inside = [(a, b) for a, b in spans if any(lo <= a and b <= hi for lo, hi in within)]
        spans = inside or spans
    return spans[:limit] if limit is not None else spans


def _short(value: Any, limit: int = 60) -> str:
    """repr of a value for a one-line message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
