"""Sequence classification (LRA-style): token ids in, one label out.

`SequenceClassificationTask` does the batching, model, loss and scoring; a concrete family only says
where its data come from by returning a `ClassificationData` from `load_data()` (ListOps, LRA Text,
Image and Pathfinder; Retrieval also overrides batching, for pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.example_scores import ExampleScores
from sparse_runner.models import CLASSIFIER_KEYS, build_classifier
from sparse_runner.tasks.base import StepOutput, Task
from sparse_runner.tasks.batching import pad_sequences


class ClassificationSplit(Protocol):
    """One split: `len(split)` examples, `sequence(i)` token ids (1-D ints), `labels` (n,) ints,
    `lengths()` (n,) ints."""

    labels: np.ndarray

    def __len__(self) -> int: ...

    def sequence(self, i: int) -> np.ndarray: ...

    def lengths(self) -> np.ndarray: ...


@dataclass
class ClassificationData:
    """What a sequence-classification family provides: its splits ("train", "val", "test") and
    vocabulary; id `pad_id` pads (and is never a real token); None when every id is real and all
    sequences have one length (image pixels). `info` describes the data for metrics.json and the
    report: {"name", "source": release | hub | generated | substitute, "substitute_for", "description"}."""

    splits: dict[str, ClassificationSplit]
    vocab_size: int
    num_classes: int
    pad_id: int | None = 0
    info: dict[str, Any] = field(default_factory=dict)


class SequenceClassificationTask(Task):
    """Accuracy-selected classification with an encoder classifier; sequences cut to task.max_length."""

    val_metrics = ("accuracy", "loss")
    primary_metric = "accuracy"
    model_keys = CLASSIFIER_KEYS

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.data = self.load_data()
        self.splits = self.data.splits
        self._lengths = {s: np.minimum(d.lengths(), self.max_length) for s, d in self.splits.items()}
        counts = np.bincount(self.splits["train"].labels, minlength=self.data.num_classes)
        self.majority_label = int(counts.argmax())

    def load_data(self) -> ClassificationData:
        raise NotImplementedError

    def sizes(self) -> dict[str, int]:
        return {s: len(d) for s, d in self.splits.items()}

    def describe(self) -> dict[str, Any]:
        counts = {s: np.bincount(d.labels, minlength=self.data.num_classes).tolist() for s, d in self.splits.items()}
        return {"data": self.data.info, "examples": self.sizes(), "label_counts": counts} if self.data.info else {"examples": self.sizes()}

    def lengths(self, split: str) -> np.ndarray:
        return self._lengths[split]

    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        d = self.data
        return build_classifier(model_cfg, vocab_size=d.vocab_size, num_classes=d.num_classes, max_length=self.max_length, pad_id=d.pad_id)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        data = self.splits[split]
        seqs = [data.sequence(int(i))[: self.max_length] for i in indices]
        tokens, lengths = pad_sequences(seqs, pad_id=self.data.pad_id or 0, max_width=self.max_length)
        labels = torch.from_numpy(data.labels[indices])
        return {
            "tokens": tokens.to(device, non_blocking=True),
            # None when nothing is padded: the model then needs no mask (and SDPA its fastest kernel).
            # Decided here, on the CPU, so the GPU never has to report back.
            "lengths": None if bool((lengths == tokens.shape[1]).all()) else lengths.to(device, non_blocking=True),
            "labels": labels.to(device, non_blocking=True),
            "num_tokens": int(lengths.sum()),
            "indices": indices,
        }

    def logits(self, model, batch) -> torch.Tensor:
        """(B, num_classes) scores of a batch from make_batch."""
        return model(batch["tokens"], batch["lengths"])

    def forward_loss(self, model, batch) -> StepOutput:
        logits = self.logits(model, batch)
        loss = F.cross_entropy(logits.float(), batch["labels"], label_smoothing=self.label_smoothing)
        return StepOutput(loss=loss, logits=logits, tokens=batch["num_tokens"])

    def eval_step(self, model, batch, split):
        logits = self.logits(model, batch)
        labels = batch["labels"]
        right = logits.argmax(-1) == labels
        sums = {
            "loss": float(F.cross_entropy(logits.float(), labels, reduction="sum")),
            "correct": int(right.sum()),
            "majority": int((labels == self.majority_label).sum()),
            "count": len(labels),
        }
        if split == "test":  # per example, for example_scores
            sums["right"] = list(zip(np.asarray(batch["indices"]).tolist(), right.tolist()))
        return sums

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        count = max(sums.get("count", 0), 1)
        return {
            f"{split}/loss": sums.get("loss", 0.0) / count,
            f"{split}/accuracy": sums.get("correct", 0) / count,
            # Predicting the most frequent training label: the floor a model has to beat.
            f"{split}/majority_accuracy": sums.get("majority", 0) / count,
        }

    def example_scores(self, split: str, sums) -> ExampleScores | None:
        return right_answers(f"{split}/accuracy", sums.get("right", []))


def right_answers(metric: str, pairs: list[tuple[int, bool]]) -> ExampleScores | None:
    """An accuracy's per-example statistics: (example index, right or not) pairs in any order."""
    if not pairs:
        return None
    pairs = sorted(pairs)
    return ExampleScores(metric, "mean", np.array([[float(r)] for _, r in pairs]), np.array([i for i, _ in pairs]))
