"""Attention patterns (topologies): which query-key pairs may interact.

Every pattern can produce a dense boolean mask (True = may attend), so any sparse implementation of
a pattern is testable against masked dense attention. Block-sparse patterns (HST, local, BigBird
style) register here with their fast paths later.
"""

from __future__ import annotations

import torch


class Pattern:
    """Dense attention: every query sees every key."""

    name = "dense"
    is_causal = False

    def dense_mask(self, n_queries: int, n_keys: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """Boolean (n_queries, n_keys) mask, True where attention is allowed; None = all allowed."""
        return None


class CausalPattern(Pattern):
    """Query i sees keys 0..i (decoders, language models)."""

    name = "causal"
    is_causal = True

    def dense_mask(self, n_queries: int, n_keys: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
        if n_queries == 1:  # one new query in incremental decoding: it sees every cached key
            return None
        # Aligned to the end so that incremental decoding (1 query, n keys) sees everything before it.
        return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)


PATTERNS: dict[str, type[Pattern]] = {"dense": Pattern, "causal": CausalPattern}
