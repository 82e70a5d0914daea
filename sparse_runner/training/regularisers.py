"""Auxiliary losses that apply to every task: `loss = task loss + weight * regulariser`.

A regulariser sees the task, the model, the batch and the first pass's `StepOutput`, so it may run
further forward passes (R-Drop: the same batch again under other dropout; ERNIE-Sparse's SAR: again
under another attention topology) and compare their output distributions. It returns its loss and
named stats; the trainer adds `weight * loss` and logs every stat as `train/<name>`.
`trainer.regulariser` picks one by name, `trainer.regulariser_weight` sets the weight; SAR is a part of
the model (`model.sar`, ERNIE-Sparse), built by `sar(...)`, and adds to whichever of these is set.

A regulariser registers itself where it is defined (`@register_regulariser("rdrop")`); "none" stands
for no auxiliary loss. Another package adds regularisers through the entry-point group
`sparse_runner.regularisers` (see `sparse_runner.registry`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention.layout import layouts, shifted_blocks
from sparse_runner.registry import Registry
from sparse_runner.tasks.base import StepOutput, Task

# (task, model, batch, first pass) -> (loss, stats)
Regulariser = Callable[[Task, nn.Module, dict[str, Any], StepOutput], tuple[torch.Tensor, dict[str, torch.Tensor]]]

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
def r_drop(task: Task, model: nn.Module, batch: dict[str, Any], first: StepOutput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """R-Drop (Liang et al. 2021): the same batch through the model again (other dropout masks); the
    symmetric KL between the two output distributions. The second pass's own loss is not added."""
    second = task.forward_loss(model, batch)
    kl = symmetric_kl(first.logits, second.logits, first.mask)
    return kl, {"rdrop_kl": kl.detach()}


def sar(shift: int, random_shift: bool = False) -> Regulariser:
    """ERNIE-Sparse's self-attention regularisation (Liu et al. 2022; design of docs/papers.md): the same
    batch through the model again with every block boundary moved `shift` tokens right (another sparse
    topology over the same tokens); the symmetric KL between the two passes' output distributions.
    `random_shift`: draw the shift from 1 .. block_size - 1 at every step instead (from torch's global
    generator, which checkpoints save, so a resumed run draws the same shifts).
    Dropout stays on in both passes, as in training: with shift 0 SAR is R-Drop."""

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

