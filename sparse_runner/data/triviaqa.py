"""TriviaQA (Joshi et al. 2017), reading comprehension over long Wikipedia evidence: ``QAExample`` readers.

One question per example, its context the question's evidence documents (Wikipedia articles) joined in
the order the dataset lists them, each as ``title + "\\n" + text``, an empty line between documents,
cut after ``max_context_words`` whitespace-separated words when that is set. This is the Wikipedia
setting, which the official evaluation scores per question (not per question-document pair).

TriviaQA gives answers as text (an entity and its aliases), not offsets, so the training spans are found
by distant supervision, as Longformer and BigBird do after Clark and Gardner (2018): every occurrence of
an alias in the context (``find_spans``: case-insensitive, whole words), in context order, up to
``max_answer_spans``. A window learns the first occurrence it holds (``squad_windows.make_features``).
The metric's golds (``QAExample.gold_answers``) are the answer's normalised aliases plus its human
answers (verified sets), as ``triviaqa_evaluation.py`` reads them; they are scored even when no alias
occurs in the (cut) evidence.

Readers:

  files  the official release: ``qa/wikipedia-{train,dev}.json`` and ``evidence/wikipedia/<Filename>``
         (``read_triviaqa``);
  hf     Hugging Face ``mandarjoshi/trivia_qa``, config ``rc.wikipedia`` (or ``rc``): ``examples_from_rows``.

The held-out title of an example (``QAExample.title``) is its first evidence document's title, so the
validation split never shares an article with training. Problems are one-line ``DataFormatError``s naming
the file or row. This module needs numpy only (no torch).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from sparse_runner.checks import one_line
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.lines import release_json
from sparse_runner.data.squad_examples import QAExample, find_spans

FILES = "the TriviaQA release folder (triviaqa-rc): qa/wikipedia-{train,dev}.json and evidence/wikipedia/*.txt"
SPLIT_FILES = {"train": "wikipedia-train.json", "test": "wikipedia-dev.json"}  # test = the dev set (test answers are hidden)
JSON_LAYOUT = '{"Data": [{"QuestionId", "Question", "Answer": {"Aliases", "NormalizedAliases", "Value"}, "EntityPages": [{"Filename", "Title"}]}]}'


def read_triviaqa(root: str | os.PathLike, split: str, *, max_context_words: Optional[int] = None, max_answer_spans: Optional[int] = None) -> list[QAExample]:
    """The questions of ``qa/wikipedia-<train|dev>.json`` under the release folder ``root``, with their
    evidence read from ``evidence/wikipedia/``. ``split`` is ``"train"`` or ``"test"`` (the dev file).

    Raises ``DataFormatError`` naming the file for a missing or unreadable file, a layout that is not the
    release's, or a question id given twice.
    """
    root = Path(os.path.expanduser(str(root)))
    path = root / "qa" / SPLIT_FILES[split]
    data = release_json(root, f"qa/{SPLIT_FILES[split]}", dataset="TriviaQA", files=FILES, layout=JSON_LAYOUT)
    if not isinstance(data, dict) or not isinstance(data.get("Data"), list):
        raise DataFormatError(f"{path}: not the TriviaQA layout (no list under \"Data\"); expected {JSON_LAYOUT}")
    evidence = root / "evidence" / "wikipedia"
    examples, seen = [], set()
    for i, datum in enumerate(data["Data"]):
        where = f"{path}: Data[{i}]"
        if not isinstance(datum, dict) or not all(k in datum for k in ("QuestionId", "Question", "Answer", "EntityPages")):
            raise DataFormatError(f"{where} needs QuestionId, Question, Answer and EntityPages; expected {JSON_LAYOUT}")
        answer = datum["Answer"]
        if not isinstance(answer, dict) or not isinstance(answer.get("NormalizedAliases"), list):
            raise DataFormatError(f"{where}: Answer needs a NormalizedAliases list; expected {JSON_LAYOUT}")
        pages = []
        for page in datum["EntityPages"]:
            if not isinstance(page, dict) or "Filename" not in page:
                raise DataFormatError(f"{where}: an entity page without a Filename; expected {JSON_LAYOUT}")
            pages.append((str(page.get("Title", "")), _read_evidence(evidence / page["Filename"], where)))
        qid = str(datum["QuestionId"])
        if qid in seen:
            raise DataFormatError(f"{path}: question id {qid} appears twice")
        seen.add(qid)
        examples.append(make_example(
            qid, datum["Question"], pages, answer.get("Aliases") or [], _golds(answer),
            max_context_words=max_context_words, max_answer_spans=max_answer_spans,
        ))
    return examples


def examples_from_rows(rows: Iterable[dict], *, where: str = "mandarjoshi/trivia_qa", max_context_words: Optional[int] = None,
                       max_answer_spans: Optional[int] = None) -> list[QAExample]:
    """Examples from Hugging Face ``mandarjoshi/trivia_qa`` rows (``question_id, question, answer{aliases,
    normalized_aliases, ...}, entity_pages{title, wiki_context, ...}``), checked as ``read_triviaqa``
    checks the release (``where`` names the source in the one-line ``DataFormatError``)."""
    examples, seen = [], set()
    for r, row in enumerate(rows):
        missing = [k for k in ("question_id", "question", "answer", "entity_pages") if k not in row]
        if missing:
            raise DataFormatError(f"{where}: row {r} has no {', '.join(missing)} (columns: {', '.join(map(str, row))}); "
                              "expected the rc.wikipedia or rc config of mandarjoshi/trivia_qa")
        answer, pages = row["answer"], row["entity_pages"]
        if not isinstance(answer, dict) or "normalized_aliases" not in answer:
            raise DataFormatError(f"{where}: row {r}: answer has no normalized_aliases")
        if not isinstance(pages, dict) or "wiki_context" not in pages:
            raise DataFormatError(f"{where}: row {r}: entity_pages has no wiki_context")
        qid = str(row["question_id"])
        if qid in seen:
            raise DataFormatError(f"{where}: question id {qid} appears twice")
        seen.add(qid)
        titles = list(pages.get("title") or [""] * len(pages["wiki_context"]))
        golds = list(answer["normalized_aliases"]) + list(answer.get("normalized_human_answers") or [])
        examples.append(make_example(
            qid, row["question"], list(zip(titles, pages["wiki_context"])), list(answer.get("aliases") or []), golds,
            max_context_words=max_context_words, max_answer_spans=max_answer_spans,
        ))
    return examples


def make_example(qid: str, question: Any, pages: Sequence[tuple[str, str]], aliases: Sequence[str], golds: Sequence[str], *,
                 max_context_words: Optional[int] = None, max_answer_spans: Optional[int] = None) -> QAExample:
    """One question over its evidence ``pages`` (``(title, text)``): the context and the alias spans
    found in it (see the module docstring). ``golds`` are the metric's answers."""
    if not isinstance(question, str):
        raise DataFormatError(f"TriviaQA question {qid}: the question must be a string, got {type(question).__name__}")
    context = "\n\n".join(f"{title}\n{text}" if title else str(text) for title, text in pages)
    if max_context_words is not None:
        context = cut_words(context, max_context_words)
    spans = find_spans(context, [*aliases, *golds], limit=max_answer_spans)
    return QAExample(
        id=qid, title=pages[0][0] if pages else qid, context=context, question=question,
        answers=[context[a:b] for a, b in spans], answer_starts=[a for a, _ in spans],
        gold_answers=[str(g) for g in golds if str(g).strip()] or list(aliases),
    )


def cut_words(text: str, max_words: int) -> str:
    """``text`` up to the end of its ``max_words``-th whitespace-separated word (all of it if shorter)."""
    words = 0
    inside = False
    for i, ch in enumerate(text):
        if ch.isspace():
            if inside:
                inside = False
                if words == max_words:
                    return text[:i]
        elif not inside:
            inside = True
            words += 1
    return text


def _golds(answer: dict) -> list[str]:
    """The official script's golds: NormalizedAliases plus the HumanAnswers of verified sets."""
    return [str(a) for a in answer["NormalizedAliases"]] + [str(a) for a in answer.get("HumanAnswers") or []]


def _read_evidence(path: Path, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataFormatError(f"{where}: evidence file {path} does not exist; valid: {FILES}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataFormatError(f"{where}: cannot read evidence file {path} ({one_line(err)})") from None
