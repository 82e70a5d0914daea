"""Deterministic, resumable batch plans with length bucketing.

A plan is the list of index arrays for one epoch. It depends only on (seed, epoch, lengths), so the
data position of a run is just (epoch, batch index): a resumed run rebuilds the same plan and skips
to where it stopped, with no loader state to save.
"""

from __future__ import annotations

import numpy as np
import torch


def plan_epoch(
    lengths: np.ndarray, batch_size: int, *, seed: int, epoch: int, bucket_size: int = 1, max_tokens: int | None = None
) -> list[np.ndarray]:
    """Shuffled batches of indices for one training epoch.

    Examples are shuffled, then taken `batch_size * bucket_size` at a time and sorted by length inside
    that chunk, so each batch holds similar lengths (less padding) while batches stay random; the
    order of batches is shuffled again. The last, smaller batch of the epoch is kept.

    With `max_tokens`, a batch is instead filled with as many examples as fit in max_tokens padded
    positions (count x longest length), as translation recipes batch ("8192 tokens per batch"); the
    chunks that get sorted then hold `bucket_size` times the average batch.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    if max_tokens is not None:
        per_batch = max(1, max_tokens // max(1, int(np.mean(lengths)) if len(lengths) else 1))
        chunk = per_batch * max(1, bucket_size)
    else:
        chunk = batch_size * max(1, bucket_size)
    batches: list[np.ndarray] = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches.extend(_split(part, lengths, batch_size, max_tokens))
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]


def plan_eval(lengths: np.ndarray, batch_size: int, *, max_tokens: int | None = None) -> list[np.ndarray]:
    """Batches for evaluation: sorted by length (least padding), every example exactly once."""
    order = np.argsort(lengths, kind="stable")
    return _split(order, lengths, batch_size, max_tokens)


def _split(sorted_indices: np.ndarray, lengths: np.ndarray, batch_size: int, max_tokens: int | None) -> list[np.ndarray]:
    """Cut length-sorted indices into batches of batch_size examples, or of <= max_tokens padded
    positions when max_tokens is set (an example longer than max_tokens gets a batch of its own)."""
    if max_tokens is None:
        return [sorted_indices[i : i + batch_size] for i in range(0, len(sorted_indices), batch_size)]
    batches, start, longest = [], 0, 0
    for pos, index in enumerate(sorted_indices):
        longest = max(longest, int(lengths[index]))
        if pos > start and (pos - start + 1) * longest > max_tokens:
            batches.append(sorted_indices[start:pos])
            start, longest = pos, int(lengths[index])
    if len(sorted_indices) > start:
        batches.append(sorted_indices[start:])
    return batches


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
