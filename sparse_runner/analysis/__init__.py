"""Analysis of trained attention: density, head diversity (JS), learned alphas, and the paper's figures."""

from sparse_runner.analysis.attention_stats import (
    ALPHA_BINS,
    ALPHA_RANGE,
    CANONICAL_TYPES,
    DENSITY_BINS,
    DENSITY_RANGE,
    AttentionStats,
    alpha_summary,
    order_types,
)

__all__ = [
    "ALPHA_BINS",
    "ALPHA_RANGE",
    "CANONICAL_TYPES",
    "DENSITY_BINS",
    "DENSITY_RANGE",
    "AttentionStats",
    "alpha_summary",
    "order_types",
]
