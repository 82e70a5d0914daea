"""Attention = normaliser x pattern x head geometry (see ARCHITECTURE.md).

- `NORMALISERS`: name -> function turning scores into weights along the last dim.
- `PATTERNS`: name -> pattern object saying which query-key pairs may interact.
- `MultiHeadAttention`: the one attention module every model builds on.
"""

from sparse_runner.attention.normalisers import NORMALISERS
from sparse_runner.attention.patterns import PATTERNS, Pattern
from sparse_runner.attention.multihead import MultiHeadAttention, attend

__all__ = ["NORMALISERS", "PATTERNS", "Pattern", "MultiHeadAttention", "attend"]
