"""R-Drop (Liang et al. 2021, arXiv 2106.14448): `regulariser=rdrop` (conf/regulariser/rdrop.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from sparse_runner.tasks.base import StepOutput, Task
from sparse_runner.training.regularisers import Regularised, Regulariser, register_regulariser, symmetric_kl


@dataclass(frozen=True)
class RDropOptions:
    """The keys of `model.regulariser_options`; their values are conf/regulariser/rdrop.yaml's."""

    weight: float = field(metadata={"valid": lambda w: w >= 0, "help": "a float >= 0 (the KL term's weight)"})
    # which passes' task losses the objective holds: both (their mean, the paper) | first (the first pass's alone)
    task_loss: Literal["both", "first"]


@register_regulariser("rdrop", options=RDropOptions)
class RDrop(Regulariser):
    """The same batch through the model again (other dropout masks); the symmetric KL between the two output
    distributions is the regulariser's term, and both passes' task losses count:

        loss = (task loss 1 + task loss 2) / 2 + weight * (KL(p1 || p2) + KL(p2 || p1)) / 2

    (the trainer averages the task losses, `Regularised.task_loss`). The paper's eq. (3) sums the two task
    losses, NLL1 + NLL2 + alpha * KL: this is half of it with weight = alpha / 2, so that with dropout off
    (both passes equal, KL 0) the loss is the task loss of a run without R-Drop.
    task_loss=first: only the first pass's task loss counts, loss = task loss 1 + weight * KL; the second pass
    is then trained through the KL alone."""

    def __call__(self, task: Task, model: nn.Module, batch: dict[str, Any], first: StepOutput) -> Regularised:
        second = task.forward_loss(model, batch)
        kl = symmetric_kl(first.logits, second.logits, first.mask)
        return Regularised(self.options.weight * kl, {"rdrop_kl": kl.detach()}, second.loss if self.options.task_loss == "both" else None)
