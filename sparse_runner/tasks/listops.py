"""LRA ListOps: 10-way classification of nested MIN/MAX/MED/SM expressions (Tay et al. 2021).

Data come from `listops_data` (the generator and the official release reader); this module turns
them into batches, builds the encoder classifier and scores it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.models import build_classifier
from sparse_runner.tasks import listops_data
from sparse_runner.tasks.base import Task
from sparse_runner.tasks.batching import pad_sequences, plan_eval


class ListOpsTask(Task):
    family = "listops"

    def __init__(self, task_cfg: Any, *, cache_dir: str, batch_size: int, batch_tokens: int | None = None) -> None:
        self.name = task_cfg.name
        self.max_length = task_cfg.max_length
        self.eval_batch_size, self.eval_batch_tokens = batch_size, batch_tokens
        g = task_cfg.generator
        data_dir = os.path.expanduser(task_cfg.data_dir) if task_cfg.data_dir else None
        self.splits = listops_data.prepare_listops(
            data_dir=data_dir,
            cache_dir=os.path.expanduser(cache_dir),
            num_train=g.num_train,
            num_val=g.num_val,
            num_test=g.num_test,
            min_length=g.min_length,
            max_length=g.max_length,
            max_depth=g.max_depth,
            max_args=g.max_args,
            seed=g.seed,
        )
        self._lengths = {s: np.minimum(d.lengths(), self.max_length) for s, d in self.splits.items()}
        counts = np.bincount(self.splits["train"].labels, minlength=listops_data.NUM_CLASSES)
        self.majority_label = int(counts.argmax())

    def sizes(self) -> dict[str, int]:
        return {s: len(d) for s, d in self.splits.items()}

    def train_lengths(self) -> np.ndarray:
        return self._lengths["train"]

    def build_model(self, model_cfg: Any) -> nn.Module:
        return build_classifier(
            model_cfg, vocab_size=len(listops_data.VOCAB), num_classes=listops_data.NUM_CLASSES, max_length=self.max_length, pad_id=listops_data.PAD_ID
        )

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        data = self.splits[split]
        seqs = [data.sequence(int(i))[: self.max_length] for i in indices]
        tokens, lengths = pad_sequences(seqs, pad_id=listops_data.PAD_ID, max_width=self.max_length)
        labels = torch.from_numpy(data.labels[indices])
        return {
            "tokens": tokens.to(device, non_blocking=True),
            # None when nothing is padded: the model then needs no mask (and SDPA its fastest kernel).
            # Decided here, on the CPU, so the GPU never has to report back.
            "lengths": None if bool((lengths == tokens.shape[1]).all()) else lengths.to(device, non_blocking=True),
            "labels": labels.to(device, non_blocking=True),
            "num_tokens": int(lengths.sum()),
        }

    def training_step(self, model, batch, label_smoothing: float = 0.0):
        logits = model(batch["tokens"], batch["lengths"])
        loss = F.cross_entropy(logits.float(), batch["labels"], label_smoothing=label_smoothing)
        return loss, {"tokens": batch["num_tokens"], "examples": len(batch["labels"])}

    @torch.no_grad()
    def evaluate(self, model, split, device, *, max_batches=None, autocast=None, output_dir=None):
        was_training = model.training
        model.eval()
        plan = plan_eval(self._lengths[split], self.eval_batch_size, max_tokens=self.eval_batch_tokens)[:max_batches]
        loss_sum, correct, majority, count = 0.0, 0, 0, 0
        for indices in plan:
            batch = self.make_batch(split, indices, device)
            with autocast or contextlib.nullcontext():
                logits = model(batch["tokens"], batch["lengths"])
            loss_sum += float(F.cross_entropy(logits.float(), batch["labels"], reduction="sum"))
            correct += int((logits.argmax(-1) == batch["labels"]).sum())
            majority += int((batch["labels"] == self.majority_label).sum())
            count += len(indices)
        model.train(was_training)
        return {
            f"{split}/loss": loss_sum / max(count, 1),
            f"{split}/accuracy": correct / max(count, 1),
            # Predicting the most frequent training label: the floor a model has to beat.
            f"{split}/majority_accuracy": majority / max(count, 1),
        }
