"""Extractive QA: SQuAD v1.1 (Rajpurkar et al. 2016), as Bhojanapalli et al. (2020) fine-tune BERT on it,
and the long-document sets TriviaQA and HotpotQA (`task.dataset`), as ERNIE-Sparse's QA tasks.

A start and an end logit per token (`models/bert.py` SpanExtractor) over `[CLS] question [SEP]
context-window [SEP]`; contexts longer than a window are split into windows `task.doc_stride` tokens
apart; the answer is the best-scoring span over all windows of a question (end >= start, at most
`task.max_answer_length` tokens; a token starts a span only in the window where it has the most
context, BERT's rule; a piece with no characters of its own, such as a standalone `▁`, is never a
span's first or last token), cut from the original context through the tokens' character offsets.
Metrics: the official v1.1 exact match and F1 (`metrics/squad.py`), in percent, as the paper reports
them. The readers are `data/squad_examples.py`, the cloze substitute `data/cloze.py`, the
windows and span decoding `squad_windows.py`.

Splits: `test` is the development set (the test sets' answers are hidden); `val` is `task.val_size`
training articles (whole titles, so no context is shared with train; for HotpotQA a title is a question)
held out for checkpoint selection.

Datasets (`task.dataset`), each with its reader and official metric:
  squad     SQuAD v1.1 (`data/squad_examples.py`);
  triviaqa  TriviaQA, Wikipedia setting (`data/triviaqa.py`): the evidence articles of a question are its
            context, cut after `task.max_context_words` words; training spans are found by alias matching
            (distant supervision) and training questions without one are dropped; scored over the aliases;
  hotpotqa  HotpotQA, distractor setting (`data/hotpotqa.py`): "yes no " + the ten paragraphs, so yes/no
            answers are spans; scored by HotpotQA's answer F1 / EM.

Sources (`task.source`):
  hf     the dataset's hub id through `datasets` (`rajpurkar/squad`, `mandarjoshi/trivia_qa`,
         `hotpotqa/hotpot_qa`);
  files  a folder in the official release layout;
  cloze  the offline SUBSTITUTE: cloze questions generated over real text (the embedded State of the
         Union addresses, one sentence with a span blanked as the question), over passages of
         `task.passage_sentences` sentences, or over whole speeches (`passage_sentences: null`, cut to
         `task.max_context_words`; `task.train_segments` > 1 also asks over the following segments of each
         training speech): the long-document substitute. Real text, generated questions: not
         comparable with the real sets, and metrics.json and the report say so. Its trivial baselines
         (first sentence; first span of the answer's kind) are in task_info.

The test split's predictions go to `outputs/predictions.json` ({question id: answer}, the format the
official evaluation script reads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, choice, fail, positive
from sparse_runner.data import hotpotqa, triviaqa
from sparse_runner.data.cloze import answer_candidates, answer_kind, cloze_examples, long_cloze_examples
from sparse_runner.data.documents import sotu_documents, split_sentences
from sparse_runner.data.hub import load_hub_splits
from sparse_runner.data.squad_examples import QAExample, examples_from_rows, read_squad_json
from sparse_runner.example_scores import ExampleScores
from sparse_runner.io import atomic_write_text
from sparse_runner.metrics.squad import question_scores, squad_scores
from sparse_runner.models.bert import build_span_extractor
from sparse_runner.tasks.base import StepOutput
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.bert_text import CLS_ID, PAD_ID, SEP_ID, BertTextTask, FineTuningDataConfig, check_fine_tuning_data
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.squad_windows import QAFeature, make_features, predict_answers

SOURCES = ("hf", "files", "cloze")
FILES = "a folder with the official train-v1.1.json and dev-v1.1.json"
SPLITS = ("train", "val", "test")
# task.dataset -> (what task.data_dir holds for source=files, a hub id to name, its full name); its official
# metric is the squad_scores style of that name
DATASETS = {
    "squad": (FILES, "rajpurkar/squad", "SQuAD v1.1"),
    "triviaqa": (triviaqa.FILES, "mandarjoshi/trivia_qa", "TriviaQA (Wikipedia)"),
    "hotpotqa": (hotpotqa.FILES, "hotpotqa/hotpot_qa", "HotpotQA (distractor)"),
}


@dataclass
class SquadTaskConfig(FineTuningDataConfig):
    dataset: str  # squad | triviaqa | hotpotqa: the reader of source=hf|files and the official metric
    hf_path: Optional[str]
    hf_splits: dict[str, str]
    max_length: int  # tokens per window, question and 3 special tokens included
    doc_stride: int  # tokens between the starts of consecutive context windows
    max_query_length: int  # the question is cut to this many tokens
    max_answer_length: int  # tokens of a predicted answer at most
    val_size: int  # training articles (titles) held out for checkpoint selection
    max_train_examples: Optional[int]  # only the first N training questions (quick experiments)
    split_seed: int  # which articles are held out; the cloze questions too
    passage_sentences: Optional[int]  # cloze: sentences per passage; None: whole speeches (cut to max_context_words)
    questions_per_passage: int  # cloze: questions per passage
    max_context_words: Optional[int]  # triviaqa: evidence cut after this many words; cloze over whole speeches: their word budget
    train_segments: Optional[int]  # cloze over whole speeches: consecutive max_context_words segments per training speech (None: all); validation and test keep the first


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
    golds = {ex.id: list(ex.answers) for ex in examples}
    first_sentence: dict[str, str] = {}
    same_kind: dict[str, str] = {}
    for ex in examples:
        sentences = [s.strip() for s in split_sentences(ex.context)]
        first_sentence[ex.id] = sentences[0] if sentences else ""
        kind = answer_kind(ex.answers[0]) if ex.answers else "word"
        same_kind[ex.id] = ""
        for sentence in sentences:
            spans = answer_candidates(sentence)[kind]
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


@register_task("squad", config=SquadTaskConfig)
class SquadTask(BertTextTask):
    val_metrics = ("f1", "exact_match", "loss")
    primary_metric = "f1"

    @classmethod
    def check_config(cls, t) -> None:
        choice("task.dataset", t.dataset, DATASETS)
        files, hub_example, _ = DATASETS[t.dataset]
        check_fine_tuning_data(t, sources=SOURCES, files=files, hub_example=hub_example, splits=("train", "test"))
        for key in ("doc_stride", "max_query_length", "max_answer_length", "val_size", "questions_per_passage"):
            positive(f"task.{key}", t[key])
        for key in ("max_train_examples", "passage_sentences", "max_context_words", "train_segments"):
            positive(f"task.{key}", t[key], allow_none=True)
        if t.source == "cloze" and t.passage_sentences is None and t.max_context_words is None:
            fail("task.max_context_words", "is null, and cloze questions over whole speeches (task.passage_sentences=null) need a word budget",
                 "a positive int, such as 3000 for windows of 4096 tokens")
        window = t.max_length - t.max_query_length - 3
        if window < 1:
            fail("task.max_length", f"{t.max_length} leaves no context after a question of task.max_query_length={t.max_query_length} and 3 special tokens")
        if t.doc_stride > window:
            fail("task.doc_stride", f"{t.doc_stride} exceeds the smallest context window ({window} tokens) and would skip context", f"an int in 1 .. {window}")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.examples, self.data_info = self._load()
        t = self.cfg
        if t.max_train_examples is not None:
            self.examples["train"] = self.examples["train"][: t.max_train_examples]
        for split in SPLITS:
            if not self.examples[split]:
                raise ConfigError(f"task {self.name}: the {split} split has no questions")
        train = self.examples["train"]
        self.load_tokenizer(lambda: list(dict.fromkeys(ex.context for ex in train)) + [ex.question for ex in train])
        self.features = {
            split: make_features(
                self.examples[split], self.tokenizer, max_length=t.max_length, doc_stride=t.doc_stride, max_query_length=t.max_query_length,
                cls_id=CLS_ID, sep_id=SEP_ID, train=split == "train",
            )
            for split in SPLITS
        }
        self._lengths = {split: np.array([len(f.tokens) for f in fs], dtype=np.int64) for split, fs in self.features.items()}

    # ------------------------------------------------------------------------------ data
    @property
    def metric_style(self) -> str:
        """Whose official evaluation scores this task (`squad_scores` style)."""
        return "squad" if self.cfg.source == "cloze" else self.cfg.dataset

    def _load(self) -> tuple[dict[str, list[QAExample]], dict[str, Any]]:
        t = self.cfg
        if t.source == "cloze":
            return self._load_cloze()
        files, _, full_name = DATASETS[t.dataset]
        if t.source == "files":
            root = Path(t.data_dir).expanduser()
            parts = {split: self._read_files(root, split) for split in ("train", "test")}
            info = {"name": t.dataset, "source": "release", "substitute_for": None, "description": f"{full_name} files in {root}"}
        else:
            where = f"task {t.name}"
            loaded = load_hub_splits(t.hf_path, t.hf_name, splits=dict(t.hf_splits), revision=t.hf_revision, data_dir=t.hf_data_dir,
                                     data_files=t.hf_data_files, where=where, local_files=f"task.source=files task.data_dir=<{files}>")
            parts = {split: self._read_rows(ds, where=f"{t.hf_path} {t.hf_splits[split]}") for split, ds in loaded.items()}
            info = {"name": t.dataset, "source": "hub", "substitute_for": None, "description": f"{t.hf_path} through datasets"}
        titles = sorted({ex.title for ex in parts["train"]})
        if t.val_size >= len(titles):
            raise ConfigError(f"task.val_size: {t.val_size} held-out articles leave none to train on (train has {len(titles)})")
        held_out = {titles[i] for i in np.random.default_rng(t.split_seed).permutation(len(titles))[: t.val_size]}
        train = [ex for ex in parts["train"] if ex.title not in held_out]
        # Distant supervision finds no span for some questions (the answer is not in the cut evidence):
        # nothing to learn from them; they stay in val and test, scored against their golds.
        answered = [ex for ex in train if ex.answers]
        if len(answered) < len(train):
            info["train_questions_without_span"] = len(train) - len(answered)
        return {
            "train": answered,
            "val": [ex for ex in parts["train"] if ex.title in held_out],
            "test": parts["test"],
        }, info

    def _read_files(self, root: Path, split: str) -> list[QAExample]:
        t = self.cfg
        if t.dataset == "triviaqa":
            return triviaqa.read_triviaqa(root, split, max_context_words=t.max_context_words)
        if t.dataset == "hotpotqa":
            return hotpotqa.read_hotpotqa(root, split)
        name = {"train": "train-v1.1.json", "test": "dev-v1.1.json"}[split]
        if not (root / name).is_file():
            raise ConfigError(f"task.data_dir: {root} has no {name}; valid: {FILES}")
        return read_squad_json(root / name)

    def _read_rows(self, rows: Any, *, where: str) -> list[QAExample]:
        t = self.cfg
        if t.dataset == "triviaqa":
            return triviaqa.examples_from_rows(rows, where=where, max_context_words=t.max_context_words)
        if t.dataset == "hotpotqa":
            return hotpotqa.examples_from_rows(rows, where=where)
        return examples_from_rows(rows, where=where)

    def _load_cloze(self) -> tuple[dict[str, list[QAExample]], dict[str, Any]]:
        t = self.cfg
        speeches = sotu_documents()
        if t.passage_sentences is None:
            examples = {
                split: long_cloze_examples(speeches[split], seed=t.split_seed, max_words=t.max_context_words,
                                           questions_per_document=t.questions_per_passage, id_prefix=f"sotu-{split}",
                                           segments=t.train_segments if split == "train" else 1)
                for split in SPLITS
            }
            info = {"name": "sotu_long_cloze", "source": "substitute", "substitute_for": "TriviaQA and HotpotQA (long-document QA)",
                    "description": f"cloze questions generated over real text: whole State of the Union addresses (first {t.max_context_words} words) "
                                   "as the context, one of their sentences with a number, name or long word blanked as the question"}
            return examples, info
        examples = {
            split: cloze_examples(speeches[split], seed=t.split_seed, passage_sentences=t.passage_sentences,
                                  questions_per_passage=t.questions_per_passage, id_prefix=f"sotu-{split}")
            for split in SPLITS
        }
        info = {"name": "sotu_cloze", "source": "substitute", "substitute_for": "SQuAD v1.1",
                "description": "cloze questions generated over real text: passages of State of the Union addresses, a sentence with a number, name or long word blanked as the question"}
        return examples, info

    def sizes(self) -> dict[str, int]:
        return {split: len(x) for split, x in self.examples.items()}

    def lengths(self, split: str) -> np.ndarray:
        return self._lengths[split]

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "data": self.data_info,
            "questions": self.sizes(),
            "windows": {split: len(f) for split, f in self.features.items()},
            "tokenizer": self.tokenizer_info(),
        }
        if self.data_info["source"] == "substitute":
            info["baselines"] = cloze_baselines(self.examples["test"])
        return info

    # ------------------------------------------------------------------------------ model and steps
    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        return build_span_extractor(model_cfg, vocab_size=self.vocab_size, max_length=self.cfg.max_length, pad_id=PAD_ID)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        features: list[QAFeature] = [self.features[split][int(i)] for i in indices]
        tokens, lengths = pad_sequences([f.tokens for f in features], pad_id=PAD_ID, max_width=self.cfg.max_length)
        positions = torch.tensor([[f.start_position, f.end_position] for f in features], dtype=torch.long)
        return {
            "tokens": tokens.to(device, non_blocking=True),
            "lengths": None if bool((lengths == tokens.shape[1]).all()) else lengths.to(device, non_blocking=True),
            "positions": positions.to(device, non_blocking=True),  # (B, 2) start, end token (0, 0: not in this window)
            "index": np.asarray(indices, dtype=np.int64),
            "num_tokens": int(lengths.sum()),
        }

    def _loss(self, start: torch.Tensor, end: torch.Tensor, positions: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """BERT's: the mean of the start and end cross-entropies."""
        return (F.cross_entropy(start, positions[:, 0], reduction=reduction) + F.cross_entropy(end, positions[:, 1], reduction=reduction)) / 2

    def forward_loss(self, model, batch) -> StepOutput:
        start, end = model(batch["tokens"], batch["lengths"])
        loss = self._loss(start, end, batch["positions"])
        # (B, 2, N): a distribution over positions for the start and for the end (what R-Drop / SAR compare).
        return StepOutput(loss=loss, logits=torch.stack([start, end], dim=1), tokens=batch["num_tokens"])

    def eval_step(self, model, batch, split):
        start, end = model(batch["tokens"], batch["lengths"])
        loss = float(self._loss(start, end, batch["positions"], reduction="sum"))
        start, end = start.float().cpu().numpy(), end.float().cpu().numpy()
        spans = [(int(i), start[row, : len(self.features[split][i].tokens)], end[row, : len(self.features[split][i].tokens)])
                 for row, i in enumerate(batch["index"])]
        return {"loss": loss, "count": len(spans), "spans": spans}

    def _answers(self, split: str, sums) -> tuple[dict[str, str], dict[str, list[str]], list[int]]:
        """The predicted answers, the gold answers of the questions scored and those questions' positions: the
        questions that had a window evaluated (all of them unless trainer.eval_max_batches cuts the split)."""
        spans = sorted(sums.get("spans", []), key=lambda s: s[0])
        examples, features = self.examples[split], self.features[split]
        chosen = [features[i] for i, _, _ in spans]
        predictions = predict_answers(examples, chosen, [(s, e) for _, s, e in spans], self.cfg.max_answer_length)
        scored = sorted({features[i].example_index for i, _, _ in spans})
        return predictions, {examples[k].id: examples[k].golds for k in scored}, scored

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        predictions, golds, _ = self._answers(split, sums)
        scores = squad_scores(predictions, golds, style=self.metric_style)
        if output_dir is not None and split == "test":
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(output_dir) / "predictions.json", json.dumps(predictions, ensure_ascii=False, indent=0, sort_keys=True))
        return {
            f"{split}/f1": scores["f1"],
            f"{split}/exact_match": scores["exact_match"],
            f"{split}/loss": sums.get("loss", 0.0) / max(sums.get("count", 0), 1),
        }

    def example_scores(self, split: str, sums) -> ExampleScores | None:
        """Per question: its F1, in percent (the metric is their mean)."""
        predictions, golds, scored = self._answers(split, sums)
        if not scored:
            return None
        per_question = question_scores(predictions, golds, style=self.metric_style)
        return ExampleScores(f"{split}/f1", "mean", np.array([[100.0 * per_question[qid][1]] for qid in golds]), np.array(scored))
