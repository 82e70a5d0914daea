"""Analysis of trained attention: density, head diversity (JS), learned alphas, and the paper's figures.

Importing the package does not import torch: sparse-report draws the figures (`analysis.figures`) from
saved summaries and must stay torch-free. The torch-based statistics are loaded on first use.
"""

from sparse_runner.analysis.bins import (
    ALPHA_BINS,
    ALPHA_RANGE,
    CANONICAL_TYPES,
    DENSITY_BINS,
    DENSITY_RANGE,
    order_types,
)

_TORCH_NAMES = ("AttentionStats", "alpha_summary")


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        from sparse_runner.analysis import attention_stats

        return getattr(attention_stats, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
