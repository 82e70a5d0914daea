"""Auxiliary losses that apply to every task: `loss = task loss + the regulariser's term`.

`regulariser=<name>` (conf/regulariser/<name>.yaml) sets `model.regulariser` and the regulariser's own
settings, `model.regulariser_options`, which the class registered under that name declares and checks, as a
pattern does its `pattern_options`. The YAML holds every option's value; the dataclass declares their types
and checks, and no defaults:

    @dataclass(frozen=True)
    class RDropOptions:
        weight: float = field(metadata={"valid": lambda w: w >= 0, "help": "a float >= 0"})

    @register_regulariser("rdrop", options=RDropOptions)
    class RDrop(Regulariser):
        def __call__(self, task, model, batch, first): ...   # uses self.options.weight

A regulariser sees the task, the model, the batch and the first pass's `StepOutput`, so it may run further
forward passes (R-Drop: the same batch again under other dropout; ERNIE-Sparse's SAR: again under another
attention topology) and compare their output distributions. It returns a `Regularised`: its weighted term,
named stats (logged as `train/<name>`) and, when it made one, the task loss of its own pass over the batch;
the trainer adds the term and averages the task loss over the passes that returned one.

Every module of this package is imported when the registry is first read (a new regulariser is one module
here plus one YAML in conf/regulariser/), and another package adds regularisers through the entry-point
group `sparse_runner.regularisers` (see `sparse_runner.registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.registry import Registry
from sparse_runner.tasks.base import StepOutput, Task


class Regularised(NamedTuple):
    """What a regulariser returns for a training step.

    loss: the regulariser's term, weighted: the trainer adds it to the loss. stats: named values for the step
    log. task_loss: the task loss of the extra forward pass the regulariser made over the same batch (R-Drop's
    second pass), or None; the trainer's task loss is then the mean of the first pass's and these. The passes
    see the same batch, so their losses are means over the same tokens (`StepOutput.loss_count`), and the mean
    keeps the trainer's token weighting across processes."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor]
    task_loss: torch.Tensor | None = None


@dataclass(frozen=True)
class NoOptions:
    """The options of a regulariser that has none."""


class Regulariser:
    """Base class of the regularisers: built once per run from its options (an instance of `Options`)."""

    name = "regulariser"
    Options: type = NoOptions

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    @classmethod
    def check_model(cls, model: Any, options: Any) -> None:
        """Raise ConfigError (`checks.fail`) when the typed `model` node cannot take this regulariser with
        `options` (SAR needs a block pattern); the options' own types and values are checked already."""

    def __call__(self, task: Task, model: nn.Module, batch: dict[str, Any], first: StepOutput) -> Regularised | None:
        """This step's term (None: nothing to add)."""
        raise NotImplementedError


# name -> Regulariser subclass, filled by @register_regulariser.
REGULARISERS: Registry[type[Regulariser]] = Registry(
    "regulariser", package="sparse_runner.training.regularisers", entry_points="sparse_runner.regularisers"
)


def register_regulariser(name: str, options: type = NoOptions) -> Callable[[type[Regulariser]], type[Regulariser]]:
    """Class decorator: make a Regulariser subclass available as `regulariser=<name>` (`model.regulariser`).

    `options` is a dataclass whose fields are the keys `model.regulariser_options` takes (their values are in
    conf/regulariser/<name>.yaml); a field's metadata may hold `valid` (a predicate on the value) and `help`
    (the valid values, in words)."""
    return REGULARISERS.register(name, Options=options)


def build_regulariser(name: str, options: Mapping[str, Any] | None = None) -> Regulariser:
    """The regulariser registered as `name` with `options` (a dict of every option field)."""
    cls = REGULARISERS[name]
    return cls(cls.Options(**(options or {})))


def check_regulariser_config(m: Any) -> None:
    """Raise ConfigError on the first invalid `model.regulariser` / `model.regulariser_options` of a typed
    `model` node."""
    from sparse_runner.attention.spec import check_options
    from sparse_runner.checks import ConfigError, choice

    choice("model.regulariser", m.regulariser, sorted(REGULARISERS))
    cls = REGULARISERS[m.regulariser]
    options = dict(m.regulariser_options or {})
    check_options("model.regulariser_options", options, cls.Options, f"regulariser {m.regulariser!r}")
    missing = sorted(f.name for f in fields(cls.Options) if f.name not in options)
    if missing:
        raise ConfigError(f"model.regulariser_options: regulariser {m.regulariser!r} needs {', '.join(missing)}; select it "
                          f"with regulariser={m.regulariser} (conf/regulariser/{m.regulariser}.yaml sets every option)")
    cls.check_model(m, cls.Options(**options))


@register_regulariser("none")
class NoRegulariser(Regulariser):
    """No auxiliary loss: the task's loss alone."""

    def __call__(self, task: Task, model: nn.Module, batch: dict[str, Any], first: StepOutput) -> None:
        return None


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
