"""What the trainer needs from a task: the step contract. Nothing task-specific leaks into the trainer.

A task owns its data splits and knows how to batch them, build its model, compute a training loss and
score evaluation batches. The trainer owns every loop (training, evaluation, analysis), so a
regulariser, sharding across processes or a new logger applies to every task at once:

    training:    batch = make_batch("train", indices, device); out = forward_loss(model, batch)
    evaluation:  for each batch of eval_plan(split): sums += eval_step(model, batch, split)
                 metrics = finalise(split, sums, output_dir)
    at the end:  write_outputs(model, output_dir)  (best model: samples and such)
    analysis:    for each batch of eval_plan("val"): analysis_step(model, batch)

`eval_step` returns *sums* (numbers are added over batches, lists concatenated), never ratios, so
the trainer can add them up across processes before `finalise` turns them into metrics, and
`example_scores` the per-example statistics behind the test metric (lists of (example index, ...)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from sparse_runner.example_scores import ExampleScores
from sparse_runner.tasks.batching import plan_epoch, plan_eval

EvalSums = dict[str, Any]  # name -> number (added over batches) or list (concatenated)


@dataclass
class TaskConfig:
    """Keys every task family has; a family's schema extends this dataclass."""

    name: str
    # family: the registered task family (its Task class: data, model builder, loss, metrics); the report
    # files runs into paper tables by it.
    family: str
    max_length: int


@dataclass
class StepOutput:
    """One training forward pass.

    loss: scalar to backpropagate. logits: the model's output scores, (..., C) over the last dim, and
    mask: bool over logits' leading dims, True where a position counts (None = all) -- what a
    regulariser comparing two passes (R-Drop, SAR) needs. tokens: real tokens in the batch (a host int,
    for throughput). stats: extra named values for the step log (tensors or floats; logged as window
    means, `train/<name>`). loss_count: what `loss` is the mean over, when not the batch's examples
    (target tokens, masked positions; a host int): under DDP each rank's mean is weighted by its share
    of it, so that the ranks together compute the mean over the whole batch.
    """

    loss: torch.Tensor
    logits: torch.Tensor
    tokens: int
    mask: torch.Tensor | None = None
    stats: dict[str, torch.Tensor | float] = field(default_factory=dict)
    loss_count: int | None = None


class Task:
    """Base class of every task family; register a subclass with `@register_task` (tasks/registry.py).

    Class attributes a family sets:
      val_metrics     metric names `trainer.monitor` may select on the validation split ("accuracy",
                      "loss", ...); the first is what `trainer.monitor=auto` picks.
      primary_metric  the headline test metric ("accuracy", "bleu"): metrics.json records it as
                      `primary_metric` and the report's tables show it.
      model_keys      the `model.*` keys the family's model reads; any other key must stay at its default.
      data_parallel   whether training may run under a multi-process launcher (DDP).
    """

    family: ClassVar[str]  # set by @register_task
    config_class: ClassVar[type] = TaskConfig  # set by @register_task
    val_metrics: ClassVar[tuple[str, ...]] = ("loss",)
    primary_metric: ClassVar[str] = "loss"
    model_keys: ClassVar[frozenset[str]] = frozenset()
    # False: the task cannot split its training batches across processes (torchrun / DDP).
    data_parallel: ClassVar[bool] = True

    @classmethod
    def check_config(cls, t: Any) -> None:
        """Raise ConfigError (one line) for an invalid typed `task` node (beyond what its types say)."""

    def __init__(self, cfg: Any) -> None:
        """cfg: the whole validated run config (the task reads cfg.task, and cfg.trainer / cfg.paths
        for evaluation batch sizes, label smoothing and its cache)."""
        self.cfg = cfg.task
        self.name = cfg.task.name
        self.max_length = cfg.task.max_length
        self.cache_dir = cfg.paths.cache_dir
        self.eval_batch_size, self.eval_batch_tokens = cfg.trainer.batch_size, cfg.trainer.batch_tokens
        self.label_smoothing = cfg.trainer.label_smoothing

    # ------------------------------------------------------------------------------ data
    def sizes(self) -> dict[str, int]:
        """Examples per split."""
        raise NotImplementedError

    def lengths(self, split: str) -> np.ndarray:
        """(n,) lengths of a split's examples, for bucketing and evaluation batches."""
        raise NotImplementedError

    def train_lengths(self) -> np.ndarray:
        return self.lengths("train")

    def plan_epoch(self, *, seed: int, epoch: int, batch_size: int, bucket_size: int, max_tokens: int | None = None) -> list[np.ndarray]:
        return plan_epoch(self.train_lengths(), batch_size, seed=seed, epoch=epoch, bucket_size=bucket_size, max_tokens=max_tokens)

    def eval_plan(self, split: str) -> list[np.ndarray]:
        """Evaluation batches of a split: every example once, sorted by length."""
        return plan_eval(self.lengths(split), self.eval_batch_size, max_tokens=self.eval_batch_tokens)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        """Tensors on `device`, plus `num_tokens` (int): real tokens in the batch, counted on the host."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Task facts worth keeping in metrics.json (tokenizer, metric signatures, ...)."""
        return {}

    # ------------------------------------------------------------------------------ model
    def build_model(self, model_cfg: Any) -> nn.Module:
        raise NotImplementedError

    def forward_loss(self, model: nn.Module, batch: dict[str, Any]) -> StepOutput:
        """The training forward pass and loss (label smoothing: self.label_smoothing)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------ evaluation
    def eval_step(self, model: nn.Module, batch: dict[str, Any], split: str) -> EvalSums:
        """Sums over one evaluation batch (model in eval mode, no gradients)."""
        raise NotImplementedError

    def finalise(self, split: str, sums: EvalSums, output_dir: Path | None = None) -> dict[str, float]:
        """Metrics '<split>/<name>' from a whole split's sums; model outputs go to `output_dir` if the
        task writes any (it is None except on the main process)."""
        raise NotImplementedError

    def example_scores(self, split: str, sums: EvalSums) -> ExampleScores | None:
        """The split's per-example statistics, from the same sums as `finalise` (sparse_runner/example_scores.py):
        what its primary metric is made of, so that intervals can resample test examples. None where the task
        keeps none. Called on the main process, after the test evaluation."""
        return None

    def write_outputs(self, model: nn.Module, output_dir: Path) -> None:
        """Files made with the final (best) model besides the metrics, e.g. a generated sample; called
        on the main process after the test evaluation, model in eval mode, no gradients."""

    def analysis_step(self, model: nn.Module, batch: dict[str, Any]) -> None:
        """One batch of the pass during which the analysis observes every attention layer."""
        self.eval_step(model, batch, "val")
