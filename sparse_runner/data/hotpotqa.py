"""HotpotQA (Yang et al. 2018), distractor setting: multi-hop questions over ten Wikipedia paragraphs
(two gold, eight distractors), as ``QAExample``s for the extractive reader.

The context is ``"yes no "`` followed by the ten paragraphs in the dataset's order, each as
``title + ": " + its sentences joined as given`` (HotpotQA's sentences carry their own leading
spaces), paragraphs separated by a blank line. Comparison questions may be answered "yes" or "no",
which are not spans of the paragraphs; the two words in front of every context make them spans, so the
same span head, decoder and pre-trained encoder answer every question (the alternative, an answer-type
head, would add a second output and loss to the model). Ten paragraphs usually fit one window of 4,096
tokens, so at that size the two words are in the window that reads the whole context; with shorter
windows only the first window can answer yes or no.

Other answers are located by ``find_spans`` (case-insensitive, whole words): the first occurrence
inside a supporting-fact sentence, else the first anywhere. A question whose answer is nowhere in its
paragraphs keeps its gold for the metric but has no span (the task drops it from training). The gold is
the answer text, scored by ``hotpot_evaluate_v1.py``'s rules (``squad_scores(style="hotpotqa")``).

Readers:

  files  the official JSON (``hotpot_train_v1.1.json``, ``hotpot_dev_distractor_v1.json``):
         ``read_hotpotqa``;
  hf     Hugging Face ``hotpotqa/hotpot_qa``, config ``distractor``: ``examples_from_rows``.

Problems are one-line ``DataFormatError``s naming the file or row. This module needs numpy only (no torch).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.lines import release_json
from sparse_runner.data.squad_examples import QAExample, find_spans

FILES = "a folder with the official hotpot_train_v1.1.json and hotpot_dev_distractor_v1.json"
SPLIT_FILES = {"train": "hotpot_train_v1.1.json", "test": "hotpot_dev_distractor_v1.json"}  # test = the dev set (test answers are hidden)
JSON_LAYOUT = '[{"_id", "question", "answer", "supporting_facts": [[title, sentence index]], "context": [[title, [sentences]]]}]'
YES_NO_PREFIX = "yes no "


def read_hotpotqa(root: str | os.PathLike, split: str) -> list[QAExample]:
    """The questions of the official ``split`` file (``"train"``, or ``"test"``: the distractor dev file)
    in the folder ``root``.

    Raises ``DataFormatError`` naming the file for a missing or unreadable file, a layout that is not the
    release's, or a question id given twice.
    """
    root = Path(os.path.expanduser(str(root)))
    path = root / SPLIT_FILES[split]
    data = release_json(root, SPLIT_FILES[split], dataset="HotpotQA", files=FILES, layout=JSON_LAYOUT)
    if not isinstance(data, list):
        raise DataFormatError(f"{path}: not the HotpotQA layout (the file must hold a list of questions); expected {JSON_LAYOUT}")
    examples, seen = [], set()
    for i, item in enumerate(data):
        where = f"{path}: question {i}"
        if not isinstance(item, dict) or not all(k in item for k in ("_id", "question", "answer", "context")):
            raise DataFormatError(f"{where} needs _id, question, answer and context; expected {JSON_LAYOUT}")
        try:
            paragraphs = [(str(title), [str(s) for s in sentences]) for title, sentences in item["context"]]
            supporting = [(str(title), int(k)) for title, k in item.get("supporting_facts") or []]
        except (TypeError, ValueError):
            raise DataFormatError(f"{where}: context must be [[title, [sentences]]] and supporting_facts [[title, index]]; expected {JSON_LAYOUT}") from None
        qid = str(item["_id"])
        if qid in seen:
            raise DataFormatError(f"{path}: question id {qid} appears twice")
        seen.add(qid)
        examples.append(make_example(qid, item["question"], item["answer"], paragraphs, supporting, where=where))
    return examples


def examples_from_rows(rows: Iterable[dict], *, where: str = "hotpotqa/hotpot_qa") -> list[QAExample]:
    """Examples from Hugging Face ``hotpotqa/hotpot_qa`` distractor rows (``id, question, answer,
    supporting_facts{title, sent_id}, context{title, sentences}``), checked as ``read_hotpotqa`` checks
    a file (``where`` names the source in the one-line ``DataFormatError``)."""
    examples, seen = [], set()
    for r, row in enumerate(rows):
        missing = [k for k in ("id", "question", "answer", "context") if k not in row]
        if missing:
            raise DataFormatError(f"{where}: row {r} has no {', '.join(missing)} (columns: {', '.join(map(str, row))}); "
                              "expected the distractor config of hotpotqa/hotpot_qa")
        context, facts = row["context"], row.get("supporting_facts") or {"title": [], "sent_id": []}
        if not isinstance(context, dict) or "title" not in context or "sentences" not in context:
            raise DataFormatError(f"{where}: row {r}: context must be {{\"title\": [...], \"sentences\": [[...]]}}")
        qid = str(row["id"])
        if qid in seen:
            raise DataFormatError(f"{where}: question id {qid} appears twice")
        seen.add(qid)
        paragraphs = [(str(t), [str(s) for s in sentences]) for t, sentences in zip(context["title"], context["sentences"])]
        supporting = [(str(t), int(k)) for t, k in zip(facts.get("title") or [], facts.get("sent_id") or [])]
        examples.append(make_example(qid, row["question"], row["answer"], paragraphs, supporting, where=f"{where}: row {r}"))
    return examples


def make_example(qid: str, question: Any, answer: Any, paragraphs: Sequence[tuple[str, Sequence[str]]],
                 supporting: Sequence[tuple[str, int]], *, where: str) -> QAExample:
    """One question: the context (``"yes no "`` + paragraphs), the answer's span and its gold."""
    if not isinstance(question, str) or not isinstance(answer, str):
        raise DataFormatError(f"{where}: question and answer must be strings")
    parts, sentence_spans = [YES_NO_PREFIX], {}
    offset = len(YES_NO_PREFIX)
    for p, (title, sentences) in enumerate(paragraphs):
        if p:
            parts.append("\n\n")
            offset += 2
        head = f"{title}: "
        parts.append(head)
        offset += len(head)
        for k, sentence in enumerate(sentences):
            sentence_spans.setdefault((title, k), (offset, offset + len(sentence)))
            parts.append(sentence)
            offset += len(sentence)
    context = "".join(parts)
    gold = answer.strip()
    if gold.lower() in ("yes", "no"):
        start = 0 if gold.lower() == "yes" else len("yes ")
        spans = [(start, start + len(gold))]
    else:
        within = [sentence_spans[fact] for fact in supporting if fact in sentence_spans]
        spans = find_spans(context[len(YES_NO_PREFIX):], [gold], limit=1,
                           within=[(a - len(YES_NO_PREFIX), b - len(YES_NO_PREFIX)) for a, b in within])
        spans = [(a + len(YES_NO_PREFIX), b + len(YES_NO_PREFIX)) for a, b in spans]
    return QAExample(
        id=qid, title=qid, context=context, question=question,
        answers=[context[a:b] for a, b in spans], answer_starts=[a for a, _ in spans], gold_answers=[answer],
    )
