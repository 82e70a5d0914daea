"""Attention = normaliser x pattern x head geometry (docs/guide.md, "The attention axes").

- `NORMALISERS`: name -> normaliser class (softmax, sparsemax, entmax15, alpha_entmax), filled by
  `@register_normaliser`.
- `PATTERNS`: name -> Pattern class (which query-key pairs may interact, and how attention over them
  is computed), filled by `@register_pattern`: dense, causal, and the block-sparse local, bigbird, hst.
  Both are `sparse_runner.registry.Registry`s: every module of this package is imported on first lookup.
- `AttentionSpec`: the one config object every attention layer is built from.
- `MultiHeadAttention`: the one attention module every model builds on.
"""

from sparse_runner.attention.normalisers import NORMALISERS, Normaliser, build_normaliser, register_normaliser
from sparse_runner.attention.patterns import PATTERNS, Pattern, build_pattern, register_pattern
from sparse_runner.attention.spec import ATTENTION_KEYS, AttentionSpec, check_attention_config, check_attention_impl
from sparse_runner.attention.multihead import MultiHeadAttention, attend, attention_backends, attention_layers, head_alphas, set_observer

__all__ = [
    "ATTENTION_KEYS",
    "AttentionSpec",
    "check_attention_config",
    "check_attention_impl",
    "NORMALISERS",
    "Normaliser",
    "build_normaliser",
    "register_normaliser",
    "PATTERNS",
    "Pattern",
    "build_pattern",
    "register_pattern",
    "MultiHeadAttention",
    "attend",
    "attention_backends",
    "attention_layers",
    "head_alphas",
    "set_observer",
]
