"""`AttentionSpec`: everything one attention layer is built from, in one object.

It is made once from the `model` config node (`AttentionSpec.from_config`) and handed to every
attention layer a model builds; a layer type that needs another topology (a decoder's causal
self-attention, context attention) asks for a copy with `spec.with_pattern(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sparse_runner.checks import choice, fail


@dataclass(frozen=True)
class AttentionSpec:
    """normaliser x pattern x head geometry, plus the layer's attention dropout."""

    num_heads: int
    head_size: int | None = None  # None: d_model // num_heads
    normaliser: str = "softmax"
    alpha: float | None = None  # alpha_entmax: fixed alpha; None learns one per head
    alpha_init: float | str = "random"
    pattern: str = "dense"
    pattern_options: dict[str, Any] = field(default_factory=dict)
    dropout: float = 0.0

    @classmethod
    def from_config(cls, m: Any) -> "AttentionSpec":
        return cls(
            num_heads=m.num_heads,
            head_size=m.head_size,
            normaliser=m.normaliser,
            alpha=m.alpha,
            alpha_init=m.alpha_init,
            pattern=m.pattern,
            pattern_options=dict(m.get("pattern_options") or {}),
            dropout=m.attention_dropout,
        )

    def with_pattern(self, pattern: str, **options: Any) -> "AttentionSpec":
        return replace(self, pattern=pattern, pattern_options=options)


def check_attention_config(m: Any) -> None:
    """Raise ConfigError on the first invalid attention key of a typed `model` node."""
    from sparse_runner.attention.normalisers import NORMALISERS
    from sparse_runner.attention.patterns import PATTERNS

    choice("model.normaliser", m.normaliser, sorted(NORMALISERS))
    if m.alpha is not None and not 1.0 <= m.alpha <= 2.0:
        fail("model.alpha", f"must be in [1, 2], got {m.alpha}", "a float in [1, 2] (fixed alpha), or null to learn one per head")
    if m.alpha_init != "random":
        try:
            init = float(m.alpha_init)
        except (TypeError, ValueError):
            init = None
        if init is None or not 1.0 < init < 2.0:
            fail("model.alpha_init", f"unknown value {m.alpha_init!r}", "random (a ~ N(0,1), as Correia et al.) or a float in (1, 2)")
    choice("model.pattern", m.pattern, sorted(PATTERNS))
