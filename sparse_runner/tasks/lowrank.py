"""The low-rank bottleneck of Bhojanapalli et al. (2020), Theorem 1, as a small fitting experiment.

One fixed problem, drawn from `task.seed`: an input X (d x n, Gaussian, so of full column rank when
d >= n) and target attention matrices P with strictly positive entries (one distribution over the n keys
per query: softmax of Gaussian logits with standard deviation `task.target_scale`). Heads of size d_p are
fitted to P by gradient descent on KL(P || softmax((W_k X)^T (W_q X) / sqrt(d_p))), every head at once
(the trainer's optimiser on one summed loss; heads share nothing, so the sum trains each independently):

  sweep        one head per d_p in `task.head_sizes` (null: 1 .. 2n), all fitting the same P_0
  multi-head   for each h in `task.num_heads`: h heads of size d/h ("standard") and h heads of size n
               ("fixed"), head i fitting P_i in both, so the two variants face the same targets

Theorem 1: with d_p >= n every P is reachable (KL -> 0); below n a generic P is not, and the best KL
stays above 0. (Softmax ignores a constant added to a query's scores, a rank-one change of the score
matrix, so in fact d_p = n - 1 already suffices for a generic P; d_p = n - 2 does not.)

There is no data set to generalise to: the question is what a head of size d_p can represent at all, so
the fit itself is the measurement. "train", "val" and "test" are the same single problem; `val/loss`
selects the checkpoint with the best overall fit, and `test/...` reports that checkpoint.

Metrics, per split (KL in nats, mean over the n queries of a head):
  <split>/kl/dp_<k>        the sweep head of size k
  <split>/kl/standard_h<h> mean over the h heads of size d/h
  <split>/kl/fixed_h<h>    mean over the h heads of size n
  <split>/loss             sum over every head: the training objective (selection, primary metric)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from sparse_runner.checks import fail, positive
from sparse_runner.models.lowrank import LowRankHeads
from sparse_runner.tasks.base import StepOutput, Task, TaskConfig
from sparse_runner.tasks.registry import register_task


@dataclass
class LowRankTaskConfig(TaskConfig):
    max_length: int  # unused: the sequence length is seq_len
    seq_len: int  # n: keys and queries
    d_model: int  # d: rows of X (d >= n for Theorem 1's full column rank)
    head_sizes: Optional[list[int]]  # the d_p sweep; null = 1 .. 2n
    num_heads: list[int]  # h of the multi-head comparison
    target_scale: float  # standard deviation of the target logits
    seed: int  # draws X and the targets


SPLITS = ("train", "val", "test")


def sweep_sizes(t: Any) -> list[int]:
    """The d_p of the sweep: task.head_sizes, or 1 .. 2n."""
    return list(t.head_sizes) if t.head_sizes is not None else list(range(1, 2 * t.seq_len + 1))


@dataclass
class Group:
    """Heads reported together as one metric (their mean KL)."""

    name: str  # the metric name after `<split>/kl/`
    head_size: int
    targets: list[int]  # which target each head fits


def head_groups(t: Any) -> list[Group]:
    """Every head the model holds, grouped by the metric that reports it, in model order."""
    groups = [Group(f"dp_{k}", k, [0]) for k in sweep_sizes(t)]
    for h in t.num_heads:
        groups.append(Group(f"standard_h{h}", t.d_model // h, list(range(h))))
        groups.append(Group(f"fixed_h{h}", t.seq_len, list(range(h))))
    return groups


def draw_problem(t: Any, num_targets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """X: (d, n) ~ N(0, 1), and `num_targets` targets (T, n_queries, n_keys), rows softmax(N(0, s^2)).

    The targets are float64, normalised in float64: a KL near 0 is only meaningful (and >= 0) between
    distributions that sum to 1 far beyond float32's 1e-7.
    """
    generator = torch.Generator().manual_seed(t.seed)
    x = torch.randn(t.d_model, t.seq_len, generator=generator)
    logits = t.target_scale * torch.randn(num_targets, t.seq_len, t.seq_len, generator=generator, dtype=torch.float64)
    return x, torch.softmax(logits, dim=-1)


@register_task("lowrank", config=LowRankTaskConfig)
class LowRankTask(Task):
    val_metrics = ("loss",)
    primary_metric = "loss"
    # The heads read no `model.*` key: their sizes are the experiment's (task.head_sizes, task.num_heads),
    # and softmax is what the theorem is about. `name` is the only key left free (it changes nothing).
    model_keys = frozenset({"name"})
    # One fixed problem, fitted as a whole (a batch of one): nothing to split across processes.
    data_parallel = False

    @classmethod
    def check_config(cls, t) -> None:
        if t.seq_len < 2:
            fail("task.seq_len", f"must be >= 2 (one distribution over n keys per query), got {t.seq_len}")
        positive("task.d_model", t.d_model)
        positive("task.target_scale", t.target_scale)
        positive("task.seed", t.seed, allow_zero=True)
        if t.head_sizes is not None and not t.head_sizes:
            fail("task.head_sizes", "is empty", "a list of head sizes, or null for 1 .. 2 * seq_len")
        for k in t.head_sizes or []:
            positive("task.head_sizes", k)
        for key, values in (("head_sizes", t.head_sizes or []), ("num_heads", t.num_heads)):
            if len(set(values)) < len(values):
                fail(f"task.{key}", f"lists a value twice ({list(values)}); each names one metric")
        for h in t.num_heads:
            if h <= 0 or t.d_model % h:
                fail("task.num_heads", f"{h} does not divide task.d_model={t.d_model} (standard heads have size d/h)",
                     "positive divisors of task.d_model")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        t = self.cfg
        self.groups = head_groups(t)
        self.head_sizes = [g.head_size for g in self.groups for _ in g.targets]
        self.x, targets = draw_problem(t, max([1, *t.num_heads]))
        self.targets = targets[[i for g in self.groups for i in g.targets]]  # (H, n, n): each head's own
        # Where each group's heads sit in the model: a metric is the mean KL of a slice.
        bounds = np.cumsum([0] + [len(g.targets) for g in self.groups])
        self.slices = {g.name: slice(int(a), int(b)) for g, a, b in zip(self.groups, bounds[:-1], bounds[1:])}

    # ------------------------------------------------------------------------------ data: one problem
    def sizes(self) -> dict[str, int]:
        return {split: 1 for split in SPLITS}

    def lengths(self, split: str) -> np.ndarray:
        return np.array([self.cfg.seq_len])

    def plan_epoch(self, **_: Any) -> list[np.ndarray]:
        return [np.array([0])]  # every step sees the whole problem

    def eval_plan(self, split: str) -> list[np.ndarray]:
        return [np.array([0])]

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        return {"x": self.x.to(device), "targets": self.targets.to(device), "num_tokens": self.targets.shape[0] * self.cfg.seq_len}

    def describe(self) -> dict[str, Any]:
        t = self.cfg
        return {"n": t.seq_len, "d": t.d_model, "sweep_head_sizes": sweep_sizes(t), "multihead_heads": list(t.num_heads),
                "heads_fitted": len(self.head_sizes), "splits": "train = val = test: the one fixed problem"}

    # ------------------------------------------------------------------------------ model and steps
    def build_model(self, model_cfg: Any) -> LowRankHeads:
        return LowRankHeads(self.head_sizes, self.cfg.d_model)

    def forward_loss(self, model, batch) -> StepOutput:
        kl, scores = model.kl(batch["x"], batch["targets"])
        return StepOutput(loss=kl.sum(), logits=scores, tokens=batch["num_tokens"])

    def eval_step(self, model, batch, split):
        kl, _ = model.kl(batch["x"], batch["targets"])
        kl = kl.double().cpu()
        sums = {f"kl/{name}": float(kl[where].sum()) for name, where in self.slices.items()}
        return {**sums, "loss": float(kl.sum()), "count": 1}

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        count = max(sums.get("count", 0), 1)  # evaluations added up (one per process that had the batch)
        metrics = {f"{split}/loss": sums.get("loss", 0.0) / count}
        for g in self.groups:
            metrics[f"{split}/kl/{g.name}"] = sums.get(f"kl/{g.name}", 0.0) / count / len(g.targets)
        return metrics

    def analysis_step(self, model, batch) -> None:
        """Nothing to observe: the heads are not attention layers of a network (trainer.analysis is moot)."""
