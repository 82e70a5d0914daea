"""Histogram bins and attention-type order shared by the statistics (torch) and the figures (no torch).

Kept apart from `attention_stats` so that drawing figures from a saved summary, as sparse-report does,
never imports torch.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

# The paper's histograms: 15 equal bins over [0, 1] for densities, over [1, 2] for learned alphas.
DENSITY_BINS = 15
DENSITY_RANGE = (0.0, 1.0)
ALPHA_BINS = 15
ALPHA_RANGE = (1.0, 2.0)

# Display order of the paper's attention types; any other type follows in first-seen order.
CANONICAL_TYPES = ("encoder_self", "context", "decoder_self")


def bin_edges(bins: int, lo: float, hi: float) -> np.ndarray:
    """The bin edges np.histogram uses for `bins=bins, range=(lo, hi)`."""
    return np.linspace(lo, hi, bins + 1)


def order_types(types: Iterable[str]) -> list[str]:
    """Attention types in display order: encoder_self, context, decoder_self, then the rest as given."""
    types = list(dict.fromkeys(types))
    return [t for t in CANONICAL_TYPES if t in types] + [t for t in types if t not in CANONICAL_TYPES]
