"""Attention statistics of Correia et al. (2019), accumulated over evaluation batches.

Definitions (docs/papers.md, matching the paper's `validate.py`):

- **density** of a head: (attention weights > 0) / (possible (query, key) pairs), numerator and
  denominator each summed over everything seen, padding ignored. "Possible" is whatever `valid_pairs`
  allows, so a causal mask gives tgt(tgt+1)/2 pairs per sentence and padding gives src_len**2 etc.
- **head diversity** of a layer: for each valid query, the generalised Jensen-Shannon divergence of the
  H head distributions, H(mean_j p_j) - mean_j H(p_j) (natural log, 0 log 0 = 0), divided by log H so
  that it lies in [0, 1]; averaged over all valid queries; 0 for a single head.
- **per-sentence head densities** (one value per batch element and head): kept as a 15-bin histogram
  over [0, 1] (np.histogram binning: half-open bins, the last one closed) instead of every value.

The accumulator is pure torch and knows nothing about models: the runner calls
`update((attention_type, layer), weights, valid_pairs)` for every attention module on every evaluation
batch. Accumulators are float64/int64 tensors on the device of the weights; nothing is copied to the host
and nothing synchronises until `summary()`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch

from sparse_runner.analysis.bins import (  # noqa: F401  (re-exported: this module's public names)
    ALPHA_BINS,
    ALPHA_RANGE,
    CANONICAL_TYPES,
    DENSITY_BINS,
    DENSITY_RANGE,
    bin_edges,
    order_types,
)


@dataclass
class _LayerAccumulator:
    num_heads: int
    device: torch.device
    nonzero: torch.Tensor = field(init=False)      # (H,) float64: weights > 0 at possible pairs
    possible: torch.Tensor = field(init=False)     # (H,) float64: possible pairs
    js_sum: torch.Tensor = field(init=False)       # () float64: sum over valid queries of normalised JS
    queries: torch.Tensor = field(init=False)      # () float64: number of valid queries
    hist: torch.Tensor = field(init=False)         # (DENSITY_BINS,) int64: per-sentence head densities
    edges: torch.Tensor = field(init=False)        # (DENSITY_BINS + 1,) float64 bin edges

    def __post_init__(self) -> None:
        f64 = dict(dtype=torch.float64, device=self.device)
        self.nonzero = torch.zeros(self.num_heads, **f64)
        self.possible = torch.zeros(self.num_heads, **f64)
        self.js_sum = torch.zeros((), **f64)
        self.queries = torch.zeros((), **f64)
        self.hist = torch.zeros(DENSITY_BINS, dtype=torch.int64, device=self.device)
        self.edges = torch.as_tensor(bin_edges(DENSITY_BINS, *DENSITY_RANGE), **f64)


class AttentionStats:
    """Accumulates per-(attention type, layer, head) statistics over evaluation batches."""

    def __init__(self) -> None:
        self._layers: dict[tuple[str, int], _LayerAccumulator] = {}

    def reset(self) -> None:
        self._layers.clear()

    def __len__(self) -> int:
        return len(self._layers)

    def keys(self) -> list[tuple[str, int]]:
        return list(self._layers)

    @torch.no_grad()
    def update(self, key: tuple[str, int], weights: torch.Tensor | Iterable, valid_pairs: torch.Tensor | None) -> None:
        """Add one batch of attention probabilities of one attention module.

        key: (attention_type, layer_index), e.g. ("encoder_self", 0).
        weights: (B, H, Nq, Nk) probabilities, rows summing to 1 over the allowed keys, exact zeros
            where sparse. A block-sparse pattern (or the memory-efficient path) gives instead an iterable
            of (weights (B, H, Q, S), valid (B, 1, Q, S)) row groups, each row over its own candidate keys
            (valid_pairs is then None), read once; the groups together are the batch (one per-sentence
            density per sentence and head).
        valid_pairs: (B, 1 or H, Nq, Nk) bool, True where the (query, key) pair is possible (padding and
            causal masks combined), or None when every pair is possible. Query rows without any valid key
            (padded queries) are ignored, whatever their weights hold (NaN included).
        """
        attn_type, layer = str(key[0]), int(key[1])
        # One pass over the groups: the memory-efficient path computes each one only when it is reached.
        groups = iter(weights) if not torch.is_tensor(weights) else iter([(weights, valid_pairs)])
        first = next(groups, None)
        if first is None:
            return
        b, h = first[0].shape[:2]
        acc = self._layers.get((attn_type, layer))
        if acc is None:
            acc = self._layers[(attn_type, layer)] = _LayerAccumulator(h, first[0].device)
        elif acc.num_heads != h:
            raise ValueError(f"{attn_type}/{layer}: {h} heads, earlier batches had {acc.num_heads}")
        nonzero_bh = possible_bh = None
        for w, valid in itertools.chain([first], groups):
            if w.dim() != 4 or tuple(w.shape[:2]) != (b, h):
                raise ValueError(f"weights must be (B, H, Nq, Nk) with one B and H, got shape {tuple(w.shape)}")
            if b == 0 or not (w.shape[2] and w.shape[3]):
                continue
            nonzero, possible = self._add_rows(acc, w, valid)
            nonzero_bh = nonzero if nonzero_bh is None else nonzero_bh + nonzero
            possible_bh = possible if possible_bh is None else possible_bh + possible
        if nonzero_bh is None:
            return

        # Density: numerator and denominator summed separately.
        acc.nonzero += nonzero_bh.sum(dim=0)
        acc.possible += possible_bh.sum(dim=0)

        # Per-sentence head densities -> histogram (np.histogram binning), sentences without pairs skipped.
        has_pairs = possible_bh > 0
        density_bh = torch.where(has_pairs, nonzero_bh / possible_bh.clamp_min(1.0), 0.0)
        bins = (torch.bucketize(density_bh, acc.edges, right=True) - 1).clamp_(0, DENSITY_BINS - 1)
        acc.hist.scatter_add_(0, bins.reshape(-1), has_pairs.reshape(-1).to(torch.int64))

    @staticmethod
    def _add_rows(acc: _LayerAccumulator, weights: torch.Tensor, valid_pairs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Head diversity of these query rows into `acc`; returns their (nonzero, possible) per (B, H)."""
        b, h, n_q, n_k = weights.shape
        positive = weights > 0
        if valid_pairs is None:
            nonzero_bh = positive.sum(dim=(2, 3), dtype=torch.float64)               # (B, H)
            possible_bh = torch.full_like(nonzero_bh, float(n_q * n_k))
            probs = weights
            query_valid = None
        else:
            if valid_pairs.dim() != 4 or valid_pairs.shape[0] != b or valid_pairs.shape[1] not in (1, h) \
                    or tuple(valid_pairs.shape[2:]) != (n_q, n_k):
                raise ValueError(
                    f"valid_pairs must be (B, 1 or H, Nq, Nk) = ({b}, 1|{h}, {n_q}, {n_k}), "
                    f"got {tuple(valid_pairs.shape)}"
                )
            valid_pairs = valid_pairs.to(device=weights.device, dtype=torch.bool)
            nonzero_bh = (positive & valid_pairs).sum(dim=(2, 3), dtype=torch.float64)
            possible_bh = valid_pairs.sum(dim=(2, 3), dtype=torch.float64).expand(b, h)
            probs = torch.where(valid_pairs, weights, weights.new_zeros(()))
            # A query counts when every head has at least one valid key for it.
            query_valid = valid_pairs.any(dim=-1).all(dim=1)                          # (B, Nq)

        # Head diversity: generalised JS over heads, per query, normalised by log H.
        if query_valid is None:
            acc.queries += float(b * n_q)
        else:
            acc.queries += query_valid.sum(dtype=torch.float64)
        if h > 1:
            work = probs if probs.dtype == torch.float64 else probs.float()
            mean_p = work.mean(dim=1)                                                  # (B, Nq, Nk)
            entropy_of_mean = -torch.special.xlogy(mean_p, mean_p).sum(dim=-1)         # (B, Nq)
            mean_entropy = -torch.special.xlogy(work, work).sum(dim=-1).mean(dim=1)    # (B, Nq)
            js = (entropy_of_mean - mean_entropy) / math.log(h)
            if query_valid is not None:
                js = torch.where(query_valid, js, js.new_zeros(()))
            acc.js_sum += js.sum(dtype=torch.float64)
        return nonzero_bh, possible_bh

    def summary(self) -> dict:
        """JSON-serialisable statistics, per attention type (display order) and layer (ascending).

        {attention_type: {
            "layers": [{"layer", "num_heads", "head_density" (list per head), "mean_density",
                        "min_density", "max_density", "js", "num_queries", "possible_pairs",
                        "sentence_density_hist": {"counts", "count"}}, ...],
            "mean_density": mean over layers' mean densities,
            "js_mean": mean over layers' JS,
            "sentence_density_hist": {"bins", "range", "edges", "counts", "count"}  # summed over layers
        }}
        Values with nothing to average (no possible pairs, no valid query) are None.
        """
        edges = bin_edges(DENSITY_BINS, *DENSITY_RANGE).tolist()
        out: dict = {}
        for attn_type in order_types(t for t, _ in self._layers):
            layers = []
            hist_total = np.zeros(DENSITY_BINS, dtype=np.int64)
            for layer in sorted(l for t, l in self._layers if t == attn_type):
                acc = self._layers[(attn_type, layer)]
                nonzero = acc.nonzero.cpu().numpy()
                possible = acc.possible.cpu().numpy()
                queries = float(acc.queries.cpu())
                hist = acc.hist.cpu().numpy()
                hist_total += hist
                head_density = [float(n / p) if p > 0 else None for n, p in zip(nonzero, possible)]
                known = [d for d in head_density if d is not None]
                if queries <= 0:
                    js = None
                elif acc.num_heads == 1:
                    js = 0.0
                else:
                    js = float(acc.js_sum.cpu()) / queries
                layers.append({
                    "layer": layer,
                    "num_heads": acc.num_heads,
                    "head_density": head_density,
                    "mean_density": float(np.mean(known)) if known else None,
                    "min_density": float(np.min(known)) if known else None,
                    "max_density": float(np.max(known)) if known else None,
                    "js": js,
                    "num_queries": int(round(queries)),
                    "possible_pairs": int(round(float(possible.sum()))),
                    "sentence_density_hist": {"counts": hist.tolist(), "count": int(hist.sum())},
                })
            densities = [l["mean_density"] for l in layers if l["mean_density"] is not None]
            js_values = [l["js"] for l in layers if l["js"] is not None]
            out[attn_type] = {
                "layers": layers,
                "mean_density": float(np.mean(densities)) if densities else None,
                "js_mean": float(np.mean(js_values)) if js_values else None,
                "sentence_density_hist": {
                    "bins": DENSITY_BINS,
                    "range": list(DENSITY_RANGE),
                    "edges": edges,
                    "counts": hist_total.tolist(),
                    "count": int(hist_total.sum()),
                },
            }
        return out


def alpha_summary(alphas: dict[tuple[str, int], list[float]]) -> dict:
    """Learned alphas per attention type with the paper's histogram (15 equal bins over [1, 2]).

    alphas: {(attention_type, layer): [alpha per head]}. Returns, per attention type (display order):
    {"layers": [{"layer", "alphas"}], "alphas": all heads, layer by layer, "bins", "range", "edges",
     "counts" (np.histogram), "count" (number of alphas), "out_of_range" (alphas outside [1, 2])}.
    """
    grouped: dict[str, list[tuple[int, list[float]]]] = {}
    for (attn_type, layer), values in alphas.items():
        if isinstance(values, torch.Tensor):
            values = values.detach().to("cpu", torch.float64).numpy()
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        grouped.setdefault(str(attn_type), []).append((int(layer), [float(v) for v in values]))
    out: dict = {}
    for attn_type in order_types(grouped):
        layers = sorted(grouped[attn_type], key=lambda item: item[0])
        flat = [a for _, values in layers for a in values]
        counts, edges = np.histogram(np.asarray(flat, dtype=np.float64), bins=ALPHA_BINS, range=ALPHA_RANGE)
        out[attn_type] = {
            "layers": [{"layer": layer, "alphas": values} for layer, values in layers],
            "alphas": flat,
            "bins": ALPHA_BINS,
            "range": list(ALPHA_RANGE),
            "edges": edges.tolist(),
            "counts": counts.astype(int).tolist(),
            "count": len(flat),
            "out_of_range": len(flat) - int(counts.sum()),
        }
    return out
