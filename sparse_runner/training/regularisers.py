"""Auxiliary losses that apply to every task: `loss = task loss + weight * regulariser`.

A regulariser sees the task, the model, the batch and the first pass's `StepOutput`, so it may run
further forward passes (R-Drop: the same batch again under other dropout; ERNIE-Sparse's SAR: again
under another attention topology) and compare their output distributions. It returns its loss and
named stats, and may return the task loss of the pass it made (`Regularised`); the trainer adds
`weight * loss`, averages the task loss over the passes that returned one, and logs every stat as
`train/<name>`.
`trainer.regulariser` picks one by name, `trainer.regulariser_weight` sets the weight; SAR is a part of
the model (`model.sar`, ERNIE-Sparse), built by `sar(...)`, and adds to whichever of these is set.

A regulariser registers itself where it is defined (`@register_regulariser("rdrop")`); "none" stands
for no auxiliary loss. Another package adds regularisers through the entry-point group
`sparse_runner.regularisers` (see `sparse_runner.registry`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention.layout import layouts, shifted_blocks
from sparse_runner.registry import Registry
from sparse_runner.tasks.base import StepOutput, Task


class Regularised(NamedTuple):
    """What a regulariser returns (a plain (loss, stats) pair is read as one without task_loss).

    loss: the regulariser's term, which the trainer weights. stats: named values for the step log.
    task_loss: the task loss of the extra forward pass the regulariser made over the same batch (R-Drop's
    second pass), or None; the trainer's task loss is then the mean of the first pass's and these. The
    passes see the same batch, so their losses are means over the same tokens (`StepOutput.loss_count`),
    and the mean keeps the trainer's token weighting across processes."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor]
    task_loss: torch.Tensor | None = None


# (task, model, batch, first pass) -> Regularised, or (loss, stats)
Regulariser = Callable[[Task, nn.Module, dict[str, Any], StepOutput], "Regularised | tuple[torch.Tensor, dict[str, torch.Tensor]]"]

# trainer.rdrop_task_loss: which passes' task losses R-Drop's objective holds.
RDROP_TASK_LOSSES = ("both", "first")

# name -> regulariser (None: no auxiliary loss), filled by @register_regulariser.
REGULARISERS: Registry[Regulariser | None] = Registry("regulariser", entry_points="sparse_runner.regularisers")
register_regulariser = REGULARISERS.register
REGULARISERS.add("none", None)


def symmetric_kl(logits_a: torch.Tensor, logits_b: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(KL(p_a || p_b) + KL(p_b || p_a)) / 2 over the last dim, averaged over the positions where `mask`
    (bool, logits' leading shape) is True; all positions when mask is None."""
    log_a, log_b = F.log_softmax(logits_a.float(), -1), F.log_softmax(logits_b.float(), -1)
    per_position = 0.5 * ((log_a.exp() * (log_a - log_b)).sum(-1) + (log_b.exp() * (log_b - log_a)).sum(-1))
    if mask is None:
        return per_position.mean()
    # A weighted mean rather than boolean indexing: indexing would make the host wait for the device.
    weights = mask.to(per_position.dtype)
    return (per_position * weights).sum() / weights.sum().clamp_min(1.0)


@register_regulariser("rdrop")
def r_drop(task: Task, model: nn.Module, batch: dict[str, Any], first: StepOutput, *, task_loss: str = "both") -> Regularised:
    """R-Drop (Liang et al. 2021, arXiv 2106.14448): the same batch through the model again (other dropout
    masks); the symmetric KL between the two output distributions is the regulariser's loss, and both
    passes' task losses count:

        loss = (task loss 1 + task loss 2) / 2 + weight * (KL(p1 || p2) + KL(p2 || p1)) / 2

    (the trainer averages the task losses, `Regularised.task_loss`). The paper's eq. (3) sums the two task
    losses, NLL1 + NLL2 + alpha * KL: this is half of it with weight = alpha / 2, so that with dropout off
    (both passes equal, KL 0) the loss is the task loss of a run without R-Drop.
    task_loss="first" (`trainer.rdrop_task_loss=first`): only the first pass's task loss counts, loss =
    task loss 1 + weight * KL, as the runner's R-Drop did before; the second pass is then trained through
    the KL alone."""
    if task_loss not in RDROP_TASK_LOSSES:
        raise ValueError(f"task_loss must be one of {', '.join(RDROP_TASK_LOSSES)}, got {task_loss!r}")
    second = task.forward_loss(model, batch)
    kl = symmetric_kl(first.logits, second.logits, first.mask)
    return Regularised(kl, {"rdrop_kl": kl.detach()}, second.loss if task_loss == "both" else None)


def sar(shift: int, random_shift: bool = False) -> Regulariser:
    """ERNIE-Sparse's self-attention regularisation (Liu et al. 2022; design of docs/papers.md): the same
    batch through the model again with every block boundary moved `shift` tokens right (another sparse
    topology over the same tokens); the symmetric KL between the two passes' output distributions.
    `random_shift`: draw the shift from 1 .. block_size - 1 at every step instead (from torch's global
    generator, which checkpoints save, so a resumed run draws the same shifts).
    Dropout stays on in both passes, as in training: with shift 0 SAR is R-Drop with only the first
    pass's task loss (`trainer.rdrop_task_loss=first`); the second pass's task loss is not added."""

    def regulariser(task: Task, model: nn.Module, batch: dict[str, Any], first: StepOutput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        offset = shift
        if random_shift:
            block = min(layout.block_size for layout in layouts(model))
            offset = int(torch.randint(1, max(block, 2), ()))
        with shifted_blocks(model, offset):
            second = task.forward_loss(model, batch)
        kl = symmetric_kl(first.logits, second.logits, first.mask)
        return kl, {"sar_kl": kl.detach()}

    return regulariser

