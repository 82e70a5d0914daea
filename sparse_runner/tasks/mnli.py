"""MNLI (Williams et al. 2018): sentence-pair classification, as Bhojanapalli et al. (2020) fine-tune BERT on it.

Input `[CLS] premise [SEP] hypothesis [SEP]` (cut longest-first to `task.max_length`); the [CLS]
position's vector, through a tanh pooler, gives three logits (entailment, neutral, contradiction).

Splits: `train` less `task.val_size` pairs held out (seeded) for checkpoint selection; `test` is MNLI's
two development sets, matched (genres seen in training) and mismatched (five unseen genres), scored
apart: `accuracy` (= matched, the paper's MNLI column) and `accuracy_mismatched`. The official test sets
have no public labels.

Sources (`task.source`; readers in `data/mnli_pairs.py`, the substitute in `data/sotu_pairs.py`):
  hf          `nyu-mll/multi_nli` (or GLUE's: hf_path=nyu-mll/glue hf_name=mnli) through `datasets`;
  files       a folder with the official MultiNLI 1.0 JSONL release or GLUE's MNLI TSV files;
  sotu_pairs  the offline SUBSTITUTE: sentence pairs of the embedded State of the Union addresses whose
              labels are discourse relations (next sentence / same speech / another speech), not
              entailment. Real text, generated labels; metrics.json and the report say so. Its test
              split is SOTU's test speeches, all "matched" (one genre).

Baselines beside the metrics: `majority_accuracy` (the most frequent training label) and, in
metrics.json `task_info.baselines`, a word-overlap rule fitted on train (two thresholds on the share
of the hypothesis's words found in the premise): the floors a model has to beat.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, fail, positive
from sparse_runner.data.documents import sotu_documents
from sparse_runner.data.hub import load_hub_splits
from sparse_runner.data.mnli_pairs import LABELS, PairSplit, from_hub_rows, read_mnli_dir
from sparse_runner.data.sotu_pairs import SUBSTITUTE_DESCRIPTION, sotu_pairs
from sparse_runner.example_scores import ExampleScores
from sparse_runner.models.bert import build_pair_classifier
from sparse_runner.tasks.bert_text import PAD_ID, BertClassificationTask, FineTuningDataConfig, check_fine_tuning_data
from sparse_runner.tasks.classification import right_answers
from sparse_runner.tasks.registry import register_task

log = logging.getLogger(__name__)

SOURCES = ("hf", "files", "sotu_pairs")
HF_SPLIT_KEYS = ("train", "matched", "mismatched")
FILES = "a folder with multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl or GLUE's {train,dev_matched,dev_mismatched}.tsv"


@dataclass
class MnliTaskConfig(FineTuningDataConfig):
    hf_path: Optional[str]
    hf_splits: dict[str, str]
    val_size: int  # training pairs held out for checkpoint selection (the test splits stay untouched)
    max_train_examples: Optional[int]  # use only the first N training pairs (quick experiments)
    split_seed: int  # which training pairs are held out; the substitute's pairs too


# ----------------------------------------------------------------------------------------------------
# Baselines
# ----------------------------------------------------------------------------------------------------


def majority_baseline(train: PairSplit, split: PairSplit) -> float:
    """Accuracy on `split` of always answering the most frequent label of `train` (the lowest id on a tie)."""
    if not len(split):
        raise ValueError("majority_baseline: the split to score is empty")
    majority = int(np.argmax(train.label_counts()))
    return float(np.mean(split.labels == majority))


_WORD = re.compile(r"\w+")


def overlap_scores(pairs: PairSplit) -> np.ndarray:
    """(n,) float: the share of the hypothesis's distinct words (lower-cased ``\\w+``) that occur in the premise."""
    cache: dict[str, frozenset] = {}  # a premise comes with three hypotheses, and sentences recur

    def words(text: str) -> frozenset:
        found = cache.get(text)
        if found is None:
            found = cache[text] = frozenset(_WORD.findall(text.lower()))
        return found

    out = np.empty(len(pairs))
    for k, (premise, hypothesis) in enumerate(zip(pairs.premises, pairs.hypotheses)):
        h = words(hypothesis)
        out[k] = len(h & words(premise)) / len(h) if h else 0.0
    return out


@dataclass(frozen=True)
class OverlapRule:
    """Label by word overlap: `labels[0]` below `low`, `labels[1]` in [low, high), `labels[2]` from `high` on."""

    low: float
    high: float
    labels: tuple[int, int, int]
    train_accuracy: float = field(default=float("nan"), compare=False)

    def predict(self, pairs: PairSplit) -> np.ndarray:
        scores = overlap_scores(pairs)
        bins = (scores >= self.low).astype(np.int64) + (scores >= self.high)
        return np.asarray(self.labels, np.int64)[bins]


def fit_overlap_rule(train: PairSplit, quantiles: int = 200) -> OverlapRule:
    """The `OverlapRule` most accurate on `train`: two cut points among `quantiles` quantiles of its overlap
    scores, and any label for each of the three intervals (so a single cut and the majority are candidates)."""
    if not len(train):
        raise ValueError("fit_overlap_rule: the training split is empty")
    scores = overlap_scores(train)
    # cut points are scores of train (all of them when there are few distinct ones); +inf = "no cut"
    cuts = np.unique(np.concatenate([np.quantile(scores, np.linspace(0, 1, quantiles + 1), method="lower"), [np.inf]]))
    order = np.argsort(scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], train.labels[order]
    # below[c, k]: pairs of label c with a score < cuts[k]
    position = np.searchsorted(sorted_scores, cuts, side="left")
    onehot = np.zeros((len(LABELS), len(scores) + 1), np.int64)
    onehot[sorted_labels, np.arange(1, len(scores) + 1)] = 1
    below = np.cumsum(onehot, axis=1)[:, position]  # (3, cuts)
    total = below[:, -1:]
    best = (-1, 0, 0, (0, 0, 0))
    for assignment in itertools.product(range(len(LABELS)), repeat=3):
        lo, mid, hi = assignment
        # correct[a, b] = below[lo, a] + (below[mid, b] - below[mid, a]) + (total[hi] - below[hi, b]), a <= b
        correct = (below[lo] - below[mid])[:, None] + (below[mid] - below[hi])[None, :] + total[hi]
        correct = np.where(np.triu(np.ones_like(correct, dtype=bool)), correct, -1)
        a, b = np.unravel_index(int(np.argmax(correct)), correct.shape)
        if correct[a, b] > best[0]:
            best = (int(correct[a, b]), a, b, assignment)
    correct, a, b, assignment = best
    return OverlapRule(float(cuts[a]), float(cuts[b]), assignment, correct / len(scores))


def overlap_baseline(train: PairSplit, split: PairSplit) -> float:
    """Accuracy on `split` of the word-overlap rule fitted on `train` (``fit_overlap_rule``): the floor of a
    model that only counts shared words."""
    if not len(split):
        raise ValueError("overlap_baseline: the split to score is empty")
    return float(np.mean(fit_overlap_rule(train).predict(split) == split.labels))


@register_task("mnli", config=MnliTaskConfig)
class MnliTask(BertClassificationTask):
    val_metrics = ("accuracy", "loss")
    primary_metric = "accuracy"

    @classmethod
    def check_config(cls, t) -> None:
        check_fine_tuning_data(t, sources=SOURCES, files=FILES, hub_example="nyu-mll/multi_nli, or nyu-mll/glue with task.hf_name=mnli", splits=HF_SPLIT_KEYS)
        if t.max_length < 5:
            fail("task.max_length", f"must hold [CLS] a [SEP] b [SEP], got {t.max_length}", "an int >= 5 (the paper: 128)")
        positive("task.val_size", t.val_size)
        positive("task.max_train_examples", t.max_train_examples, allow_none=True)

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        pairs, self.data_info = self._load()
        if self.cfg.max_train_examples is not None:
            pairs["train"] = pairs["train"].select(np.arange(min(self.cfg.max_train_examples, len(pairs["train"]))))
        for split, part in pairs.items():
            if len(part) == 0:
                raise ConfigError(f"task {self.name}: the {split} split has no labelled pairs")
        self.pairs = pairs
        self.load_tokenizer(lambda: pairs["train"].premises + pairs["train"].hypotheses)
        self.examples = {split: self._encode(part) for split, part in pairs.items()}
        self._lengths = {split: np.array([len(x) for x in ex], dtype=np.int64) for split, ex in self.examples.items()}
        self.majority_label = int(pairs["train"].label_counts().argmax())

    # ------------------------------------------------------------------------------ data
    def _load(self) -> tuple[dict[str, PairSplit], dict[str, Any]]:
        """{train, val, test} pairs and what they are (metrics.json task_info.data)."""
        t = self.cfg
        if t.source == "sotu_pairs":
            parts = sotu_pairs(sotu_documents(), seed=t.split_seed)
            info = {"name": "sotu_pairs", "source": "substitute", "substitute_for": "MNLI", "description": SUBSTITUTE_DESCRIPTION}
            self.skipped = 0
            return {"train": parts["train"], "val": parts["val"], "test": parts["test"]}, info
        if t.source == "files":
            parts = read_mnli_dir(Path(t.data_dir).expanduser())
            info = {"name": "mnli", "source": "release", "substitute_for": None, "description": f"MultiNLI files in {t.data_dir}"}
        else:
            where = f"task {t.name}"
            loaded = load_hub_splits(
                t.hf_path, t.hf_name, splits={"train": t.hf_splits["train"], "validation_matched": t.hf_splits["matched"],
                                              "validation_mismatched": t.hf_splits["mismatched"]},
                revision=t.hf_revision, data_dir=t.hf_data_dir, data_files=t.hf_data_files, where=where, local_files=f"task.source=files task.data_dir=<{FILES}>",
            )
            parts = {split: from_hub_rows(ds, matched=split != "validation_mismatched", where=f"{t.hf_path} {split}") for split, ds in loaded.items()}
            info = {"name": "mnli", "source": "hub", "substitute_for": None, "description": f"{t.hf_path} through datasets"}
        self.skipped = sum(part.skipped for part in parts.values())  # rows without a gold label, in the files read
        train = parts["train"]
        held_out = np.random.default_rng(t.split_seed).permutation(len(train))
        if t.val_size >= len(train):
            raise ConfigError(f"task.val_size: {t.val_size} leaves no training pairs (train has {len(train)})")
        val_index, train_index = np.sort(held_out[: t.val_size]), np.sort(held_out[t.val_size :])
        test = PairSplit.concat([parts["validation_matched"], parts["validation_mismatched"]])
        return {"train": train.select(train_index), "val": train.select(val_index), "test": test}, info

    def _encode(self, part: PairSplit) -> list[np.ndarray]:
        """[CLS] premise [SEP] hypothesis [SEP], the longer side cut first until it fits max_length."""
        premises, hypotheses = self.tokenizer.encode(part.premises), self.tokenizer.encode(part.hypotheses)
        room = self.cfg.max_length - 3
        out = []
        for a, b in zip(premises, hypotheses):
            if len(a) + len(b) > room:
                keep_b = min(len(b), max(room // 2, room - len(a)))
                a, b = a[: room - keep_b], b[:keep_b]
            out.append(np.asarray(self.pack(a, b), dtype=np.int64))
        return out

    def sizes(self) -> dict[str, int]:
        return {split: len(part) for split, part in self.pairs.items()}

    def lengths(self, split: str) -> np.ndarray:
        return self._lengths[split]

    def describe(self) -> dict[str, Any]:
        train, test = self.pairs["train"], self.pairs["test"]
        baselines: dict[str, Any] = {"majority": majority_baseline(train, test.select(test.matched))}
        rule = fit_overlap_rule(train)
        for part, mask in (("", test.matched), ("_mismatched", ~test.matched)):
            if mask.any():
                chosen = test.select(mask)
                baselines["majority" + part] = majority_baseline(train, chosen)
                baselines["word_overlap" + part] = float((rule.predict(chosen) == chosen.labels).mean())
        return {
            "data": self.data_info,
            "labels": list(LABELS),
            "examples": self.sizes(),
            "test_matched": int(test.matched.sum()),
            "test_mismatched": int((~test.matched).sum()),
            "skipped_without_gold_label": self.skipped,
            "tokenizer": self.tokenizer_info(),
            "baselines": baselines,
        }

    # ------------------------------------------------------------------------------ model and steps
    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        return build_pair_classifier(model_cfg, vocab_size=self.vocab_size, num_classes=len(LABELS), max_length=self.cfg.max_length, pad_id=PAD_ID)

    def split_labels(self, split: str) -> np.ndarray:
        return self.pairs[split].labels

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        batch = super().make_batch(split, indices, device)
        batch["matched"] = torch.from_numpy(self.pairs[split].matched[indices]).to(device, non_blocking=True)
        return batch

    def eval_step(self, model, batch, split):
        logits = model(batch["tokens"], batch["lengths"])
        labels, matched = batch["labels"], batch["matched"]
        right = logits.argmax(-1) == labels
        sums = {
            "loss": float(F.cross_entropy(logits.float(), labels, reduction="sum")),
            "count": len(labels),
            "correct_matched": int((right & matched).sum()),
            "count_matched": int(matched.sum()),
            "correct_mismatched": int((right & ~matched).sum()),
            "count_mismatched": int((~matched).sum()),
            "majority_matched": int(((labels == self.majority_label) & matched).sum()),
        }
        if split == "test":  # per matched example (the metric's), for example_scores
            sums["right"] = [(i, r) for i, r, m in zip(np.asarray(batch["indices"]).tolist(), right.tolist(), matched.tolist()) if m]
        return sums

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        matched = max(sums.get("count_matched", 0), 1)
        out = {
            f"{split}/loss": sums.get("loss", 0.0) / max(sums.get("count", 0), 1),
            f"{split}/accuracy": sums.get("correct_matched", 0) / matched,
            f"{split}/majority_accuracy": sums.get("majority_matched", 0) / matched,
        }
        if sums.get("count_mismatched", 0):
            out[f"{split}/accuracy_mismatched"] = sums["correct_mismatched"] / sums["count_mismatched"]
        return out

    def example_scores(self, split: str, sums) -> ExampleScores | None:
        return right_answers(f"{split}/accuracy", sums.get("right", []))  # the matched examples: the metric's
