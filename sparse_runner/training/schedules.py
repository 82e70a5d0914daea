"""Learning-rate schedules: linear warm-up, then constant / linear / inverse-sqrt / cosine decay.

Each returns the multiplier of the peak lr at a given optimiser step (torch's LambdaLR convention).
"""

from __future__ import annotations

import math
from functools import partial

import torch


def lr_multiplier(step: int, *, schedule: str, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        # Peak at the end of warm-up, then 1/sqrt(step) (Vaswani et al. 2017; LRA's rsqrt_decay).
        return math.sqrt(max(warmup_steps, 1) / max(step, 1))
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}; valid: constant, linear, inverse_sqrt, cosine")


def build_scheduler(optimizer: torch.optim.Optimizer, *, schedule: str, warmup_steps: int, max_steps: int, min_lr_ratio: float):
    fn = partial(lr_multiplier, schedule=schedule, warmup_steps=warmup_steps, max_steps=max_steps, min_lr_ratio=min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
