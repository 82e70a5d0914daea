"""What the trainer needs from a task; nothing task-specific leaks into the training loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from sparse_runner.tasks.batching import plan_epoch


class Task:
    """A task owns its data splits and knows how to batch them, build its model and score it.

    Subclasses set `name`, `family`, `monitor_metrics` and implement `train_lengths`, `build_model`,
    `make_batch`, `training_step` and `evaluate`.
    """

    name: str
    family: str

    def train_lengths(self) -> np.ndarray:
        """(n_train,) lengths used for bucketing."""
        raise NotImplementedError

    def plan_epoch(self, *, seed: int, epoch: int, batch_size: int, bucket_size: int, max_tokens: int | None = None) -> list[np.ndarray]:
        return plan_epoch(self.train_lengths(), batch_size, seed=seed, epoch=epoch, bucket_size=bucket_size, max_tokens=max_tokens)

    def describe(self) -> dict[str, Any]:
        """Task facts worth keeping in metrics.json (tokenizer, metric signatures, ...)."""
        return {}

    def build_model(self, model_cfg: Any) -> nn.Module:
        raise NotImplementedError

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        """Tensors on `device`, plus `num_tokens` (int): real tokens in the batch, counted on the host."""
        raise NotImplementedError

    def training_step(self, model: nn.Module, batch: dict[str, Any], label_smoothing: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
        """Return (loss to backpropagate, stats: at least 'tokens' = real tokens in the batch)."""
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, split: str, device: torch.device, *, max_batches: int | None = None, autocast=None, output_dir=None
    ) -> dict[str, float]:
        """Metrics on a split, keyed '<split>/<metric>'; model outputs go to `output_dir` if the task writes any."""
        raise NotImplementedError

    def analysis_pass(self, model: nn.Module, split: str, device: torch.device, *, autocast=None) -> None:
        """One pass over `split` during which the analysis observes every attention layer."""
        self.evaluate(model, split, device, autocast=autocast)
