"""Attention = normaliser x pattern x head geometry (see ARCHITECTURE.md).

- `NORMALISERS`: name -> factory of a normaliser module (softmax, sparsemax, entmax15, alpha_entmax).
- `PATTERNS`: name -> pattern object saying which query-key pairs may interact.
- `MultiHeadAttention`: the one attention module every model builds on.
"""

from sparse_runner.attention.normalisers import NORMALISERS, Normaliser, build_normaliser
from sparse_runner.attention.patterns import PATTERNS, Pattern
from sparse_runner.attention.spec import AttentionSpec, check_attention_config
from sparse_runner.attention.multihead import MultiHeadAttention, attend, attention_backends, attention_layers, head_alphas, set_observer

__all__ = [
    "AttentionSpec",
    "check_attention_config",
    "NORMALISERS",
    "Normaliser",
    "build_normaliser",
    "PATTERNS",
    "Pattern",
    "MultiHeadAttention",
    "attend",
    "attention_backends",
    "attention_layers",
    "head_alphas",
    "set_observer",
]
