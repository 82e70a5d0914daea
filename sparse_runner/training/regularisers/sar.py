"""ERNIE-Sparse's self-attention regularisation (Liu et al. 2022): `regulariser=sar` (conf/regulariser/sar.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sparse_runner.attention.layout import layouts, shifted_blocks
from sparse_runner.checks import fail
from sparse_runner.tasks.base import StepOutput, Task
from sparse_runner.training.regularisers import Regularised, Regulariser, register_regulariser, symmetric_kl


@dataclass(frozen=True)
class SAROptions:
    """The keys of `model.regulariser_options`; their values are conf/regulariser/sar.yaml's."""

    weight: float = field(metadata={"valid": lambda w: w >= 0, "help": "a float >= 0 (lambda of the KL term)"})
    # tokens the second pass's block boundaries move right (0 <= shift < block_size)
    shift: int = field(metadata={"valid": lambda s: s >= 0, "help": "an int >= 0, below the pattern's block_size"})
    random_shift: bool  # draw the shift from 1 .. block_size - 1 at every step instead


@register_regulariser("sar", options=SAROptions)
class SAR(Regulariser):
    """The same batch through the model again with every block boundary moved `shift` tokens right (another
    sparse topology over the same tokens; design of docs/papers.md); weight * the symmetric KL between the two
    passes' output distributions. `random_shift`: draw the shift from 1 .. block_size - 1 at every step instead
    (from torch's global generator, which checkpoints save, so a resumed run draws the same shifts).
    Dropout stays on in both passes, as in training: with shift 0 SAR is R-Drop with only the first pass's task
    loss (`regulariser=rdrop model.regulariser_options.task_loss=first`); the second pass's task loss is not added."""

    @classmethod
    def check_model(cls, model: Any, options: SAROptions) -> None:
        from sparse_runner.attention import PATTERNS
        from sparse_runner.models.config import block_pattern_names

        blocks = block_pattern_names()
        if model.pattern not in blocks:
            fail("model.regulariser", f"SAR shifts block boundaries, and pattern {model.pattern!r} has none",
                 f"a block pattern ({', '.join(blocks)}), or regulariser=none")
        block_size = PATTERNS[model.pattern].Options(**(model.pattern_options or {})).block_size
        if not options.shift < block_size:
            fail("model.regulariser_options.shift", f"must be in 0 .. block_size - 1 = {block_size - 1}, got {options.shift}",
                 f"an int in [0, {block_size})")

    def __call__(self, task: Task, model: nn.Module, batch: dict[str, Any], first: StepOutput) -> Regularised:
        offset = self.options.shift
        if self.options.random_shift:
            block = min(layout.block_size for layout in layouts(model))
            offset = int(torch.randint(1, max(block, 2), ()))
        with shifted_blocks(model, offset):
            second = task.forward_loss(model, batch)
        kl = symmetric_kl(first.logits, second.logits, first.mask)
        return Regularised(self.options.weight * kl, {"sar_kl": kl.detach()})
