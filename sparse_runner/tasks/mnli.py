"""MNLI (Williams et al. 2018): sentence-pair classification, as Bhojanapalli et al. (2020) fine-tune BERT on it.

Input `[CLS] premise [SEP] hypothesis [SEP]` (cut longest-first to `task.max_length`); the [CLS]
position's vector, through a tanh pooler, gives three logits (entailment, neutral, contradiction).

Splits: `train` less `task.val_size` pairs held out (seeded) for checkpoint selection; `test` is MNLI's
two development sets, matched (genres seen in training) and mismatched (five unseen genres), scored
apart: `accuracy` (= matched, the paper's MNLI column) and `accuracy_mismatched`. The official test sets
have no public labels.

Sources (`task.source`, data layer in `mnli_data.py`):
  hf          `nyu-mll/multi_nli` (or GLUE's: hf_path=nyu-mll/glue hf_name=mnli) through `datasets`;
  files       a folder with the official MultiNLI 1.0 JSONL release or GLUE's MNLI TSV files;
  sotu_pairs  the offline SUBSTITUTE: sentence pairs of the embedded State of the Union addresses whose
              labels are discourse relations (next sentence / same speech / another speech), not
              entailment. Real text, generated labels; metrics.json and the report say so. Its test
              split is SOTU's test speeches, all "matched" (one genre).

Baselines beside the metrics: `majority_accuracy` (the most frequent training label) and, in
metrics.json `task_info.baselines`, a word-overlap rule fitted on train.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, fail, positive
from sparse_runner.data.hub import load_hub_splits
from sparse_runner.models.bert import build_pair_classifier
from sparse_runner.tasks import mnli_data
from sparse_runner.tasks.base import StepOutput
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.bert_text import PAD_ID, BertTextTask, FineTuningDataConfig, check_fine_tuning_data
from sparse_runner.tasks.mnli_data import LABELS, PairSplit
from sparse_runner.tasks.registry import register_task

log = logging.getLogger(__name__)

SOURCES = ("hf", "files", "sotu_pairs")
HF_SPLIT_KEYS = ("train", "matched", "mismatched")
FILES = "a folder with multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl or GLUE's {train,dev_matched,dev_mismatched}.tsv"


@dataclass
class MnliTaskConfig(FineTuningDataConfig):
    name: str = "mnli"
    family: str = "mnli"
    hf_path: Optional[str] = "nyu-mll/multi_nli"
    hf_splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "matched": "validation_matched", "mismatched": "validation_mismatched"})
    max_length: int = 128
    val_size: int = 2000  # training pairs held out for checkpoint selection (the test splits stay untouched)
    max_train_examples: Optional[int] = None  # use only the first N training pairs (quick experiments)
    split_seed: int = 0  # which training pairs are held out; the substitute's pairs too


@register_task("mnli", config=MnliTaskConfig)
class MnliTask(BertTextTask):
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
            parts = mnli_data.sotu_pairs(mnli_data.sotu_documents(), seed=t.split_seed)
            info = {"name": "sotu_pairs", "source": "substitute", "substitute_for": "MNLI", "description": mnli_data.SUBSTITUTE_DESCRIPTION}
            self.skipped = 0
            return {"train": parts["train"], "val": parts["val"], "test": parts["test"]}, info
        if t.source == "files":
            parts = mnli_data.read_mnli_dir(Path(t.data_dir).expanduser())
            info = {"name": "mnli", "source": "release", "substitute_for": None, "description": f"MultiNLI files in {t.data_dir}"}
        else:
            where = f"task {t.name}"
            loaded = load_hub_splits(
                t.hf_path, t.hf_name, splits={"train": t.hf_splits["train"], "validation_matched": t.hf_splits["matched"],
                                              "validation_mismatched": t.hf_splits["mismatched"]},
                revision=t.hf_revision, data_dir=t.hf_data_dir, data_files=t.hf_data_files, where=where, local_files=f"task.source=files task.data_dir=<{FILES}>",
            )
            parts = {split: mnli_data.from_hub_rows(ds, matched=split != "validation_mismatched", where=f"{t.hf_path} {split}") for split, ds in loaded.items()}
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
        baselines: dict[str, Any] = {"majority": mnli_data.majority_baseline(train, test.select(test.matched))}
        rule = mnli_data.fit_overlap_rule(train)
        for part, mask in (("", test.matched), ("_mismatched", ~test.matched)):
            if mask.any():
                chosen = test.select(mask)
                baselines["majority" + part] = mnli_data.majority_baseline(train, chosen)
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

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        tokens, lengths = pad_sequences([self.examples[split][int(i)] for i in indices], pad_id=PAD_ID, max_width=self.cfg.max_length)
        part = self.pairs[split]
        return {
            "tokens": tokens.to(device, non_blocking=True),
            "lengths": None if bool((lengths == tokens.shape[1]).all()) else lengths.to(device, non_blocking=True),
            "labels": torch.from_numpy(part.labels[indices]).to(device, non_blocking=True),
            "matched": torch.from_numpy(part.matched[indices]).to(device, non_blocking=True),
            "num_tokens": int(lengths.sum()),
        }

    def forward_loss(self, model, batch) -> StepOutput:
        logits = model(batch["tokens"], batch["lengths"])
        loss = F.cross_entropy(logits.float(), batch["labels"], label_smoothing=self.label_smoothing)
        return StepOutput(loss=loss, logits=logits, tokens=batch["num_tokens"])

    def eval_step(self, model, batch, split):
        logits = model(batch["tokens"], batch["lengths"])
        labels, matched = batch["labels"], batch["matched"]
        right = logits.argmax(-1) == labels
        return {
            "loss": float(F.cross_entropy(logits.float(), labels, reduction="sum")),
            "count": len(labels),
            "correct_matched": int((right & matched).sum()),
            "count_matched": int(matched.sum()),
            "correct_mismatched": int((right & ~matched).sum()),
            "count_mismatched": int((~matched).sum()),
            "majority_matched": int(((labels == self.majority_label) & matched).sum()),
        }

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
