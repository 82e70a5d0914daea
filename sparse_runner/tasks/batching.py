"""Deterministic, resumable batch plans with length bucketing.

A plan is the list of index arrays for one epoch. It depends only on (seed, epoch, lengths), so the
data position of a run is just (epoch, batch index): a resumed run rebuilds the same plan and skips
to where it stopped, with no loader state to save.
"""

from __future__ import annotations

import numpy as np
import torch


def plan_epoch(lengths: np.ndarray, batch_size: int, *, seed: int, epoch: int, bucket_size: int = 1) -> list[np.ndarray]:
    """Shuffled batches of indices for one training epoch.

    Examples are shuffled, then taken `batch_size * bucket_size` at a time and sorted by length inside
    that chunk, so each batch holds similar lengths (less padding) while batches stay random; the
    order of batches is shuffled again. The last, smaller batch of the epoch is kept.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    chunk = batch_size * max(1, bucket_size)
    batches: list[np.ndarray] = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]


def plan_eval(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Batches for evaluation: sorted by length (least padding), every example exactly once."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def pad_sequences(seqs: list[np.ndarray], pad_id: int = 0, multiple: int = 8, max_width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence, rounded up to `multiple` (friendlier kernel shapes) but
    never beyond `max_width`: tokens (B, N) long, lengths (B,) long."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    width = int(-(-lengths.max() // multiple) * multiple)
    if max_width is not None:
        width = min(width, max(max_width, int(lengths.max())))
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = seq
    return torch.from_numpy(out), torch.from_numpy(lengths)
