"""The distributed seam: what the trainer asks of a process group, and the single-process answers.

With `torch.distributed` initialised (torchrun, DDP -- a later issue wires it up), every rank trains
on its shard of the epoch plan, evaluation sums are added across ranks and only rank 0 writes files.
Without it (the default: one process) every function here is the identity or a no-op, so a
single-process run computes exactly what it always did.
"""

from __future__ import annotations

from typing import Any, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """True on the process that writes the run directory (rank 0)."""
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of a plan: items rank, rank + world, ... (all of them with one process)."""
    return list(items[rank() :: world_size()])


def all_reduce_sums(sums: dict[str, Any]) -> dict[str, Any]:
    """Evaluation sums of every rank added up: numbers summed, lists concatenated in rank order.

    One process: `sums` itself, untouched (so the metrics are bit-identical to the unsharded loop).
    """
    if not is_distributed():
        return sums
    gathered: list[dict[str, Any] | None] = [None] * world_size()
    # Objects rather than tensors: the sums mix ints, floats and lists (hypotheses) of any length.
    dist.all_gather_object(gathered, sums)
    total: dict[str, Any] = {}
    for part in gathered:
        add_sums(total, part or {})
    return total


def add_sums(total: dict[str, Any], part: dict[str, Any]) -> None:
    """total += part, in place: numbers added, lists extended."""
    for key, value in part.items():
        if isinstance(value, list):
            total.setdefault(key, []).extend(value)
        else:
            total[key] = total.get(key, 0) + value


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if it is True on any (a stop signal seen by one rank stops them all).
    `device`: where the backend can reduce (the GPU for NCCL)."""
    if not is_distributed():
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
