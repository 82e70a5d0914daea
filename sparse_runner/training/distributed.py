"""The distributed seam: what the trainer asks of a process group, and the single-process answers.

Under torchrun (or a multi-task SLURM step, see `cluster.export_distributed_env`) `setup` joins the
process group: gloo on CPU, NCCL on GPU. Then every global batch of the epoch plan is split across the
ranks (`split_batch`), DistributedDataParallel averages the gradients, evaluation batches are sharded and
their sums added across ranks, and only rank 0 writes files. Because the plan is made of *global*
batches (trainer.batch_size / batch_tokens count over all processes), N processes train on the same
data in the same order as one, and a run can resume on a different number of processes.

Without a process group (the default: one process) every function here is the identity or a no-op, so a
single-process run computes exactly what it always did.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
from typing import Any, Sequence, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from sparse_runner.training.stopping import blocked_in_new_threads

T = TypeVar("T")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank; before the group is joined, the launcher's RANK (so that rank 0 alone takes
    the run directory's lock from the start)."""
    return dist.get_rank() if is_distributed() else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def launched() -> bool:
    """True when a launcher (torchrun, or SLURM via cluster.export_distributed_env) started several processes."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


# How long a collective may wait for a rank. A rank that failed alone makes the others wait this long
# (torchrun, or srun --kill-on-bad-exit=1, ends them sooner); rank 0's longest solo work (the end analysis,
# a test set's outputs) must fit in it.
_TIMEOUT = datetime.timedelta(minutes=30)


def setup(device: torch.device) -> None:
    """Join the process group the launcher describes (RANK, WORLD_SIZE, MASTER_ADDR ...); a no-op for one
    process or when already joined (a multirun's later jobs)."""
    if is_distributed() or not launched():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # CUDA tensors (DDP's gradients) go through NCCL, CPU tensors (host numbers, stop signals) through gloo.
    with blocked_in_new_threads():   # the group's threads never take a stop signal meant for the main thread
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo", timeout=_TIMEOUT)
    atexit.register(teardown)


def teardown() -> None:
    """Leave the process group (registered at exit by `setup`). DDP's reducer holds the group, and the
    trainer that holds DDP sits in reference cycles, which Python would only free during interpreter
    shutdown, after the group is destroyed: gloo's threads then abort the process ("terminate called
    without an active exception", about one exit in eight), and the launcher reports a failed rank for a
    finished run. Collecting first frees them while the group is alive."""
    if is_distributed():
        gc.collect()
        dist.destroy_process_group()


def is_main() -> bool:
    """True on the process that writes the run directory (rank 0)."""
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of a plan: items rank, rank + world, ... (all of them with one process)."""
    return list(items[rank() :: world_size()])


def split_batch(indices: np.ndarray) -> tuple[np.ndarray, bool]:
    """This rank's part of a global training batch, and whether it counts.

    Rank r takes examples r, r + N, ... (a length-sorted batch gives every rank similar lengths). A rank
    left without an example (a batch smaller than N) still has to take part in the step: it gets a copy of
    one, which does not count (its loss weight is 0, see `loss_weight`).
    """
    n = world_size()
    if n == 1:
        return indices, True
    part = indices[rank()::n]
    return (part, True) if len(part) else (indices[:1], False)


def loss_weight(count: int) -> float:
    """The weight of this rank's mean loss: N x its share of what the batch's loss is a mean over (`count`:
    examples, target tokens, masked positions ...). DDP averages gradients over the N ranks, so the
    weighted means average to the mean over the whole batch, as one process computes it. 1 for one process."""
    n = world_size()
    if n == 1:
        return 1.0
    total = sum_over_ranks([float(count)])[0]
    return n * count / total if total > 0 else 0.0


def sum_over_ranks(values: list[float]) -> list[float]:
    """Element-wise sums of host numbers over ranks, in float64. They travel as a CPU tensor, through gloo
    (the group has a gloo backend for CPU tensors also on GPUs, `setup`): no CUDA synchronisation."""
    if not is_distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def gather_objects(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order (a one-element list with one process)."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: T) -> T:
    """Rank 0's `obj` on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_sums(sums: dict[str, Any]) -> dict[str, Any]:
    """Evaluation sums of every rank added up: numbers summed, lists concatenated in rank order.

    One process: `sums` itself, untouched (so the metrics are bit-identical to the unsharded loop).
    """
    if not is_distributed():
        return sums
    total: dict[str, Any] = {}
    # Objects rather than tensors: the sums mix ints, floats and lists (hypotheses) of any length.
    for part in gather_objects(sums):
        add_sums(total, part or {})
    return total


def add_sums(total: dict[str, Any], part: dict[str, Any]) -> None:
    """total += part, in place: numbers added, lists extended."""
    for key, value in part.items():
        if isinstance(value, list):
            total.setdefault(key, []).extend(value)
        else:
            total[key] = total.get(key, 0) + value


def max_over_ranks(value: int) -> int:
    """The largest of every rank's `value` (a stop signal's number, 0 for none: one rank's signal stops all,
    and every rank knows which signal it was). A CPU tensor: through gloo, no CUDA synchronisation."""
    if not is_distributed():
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
