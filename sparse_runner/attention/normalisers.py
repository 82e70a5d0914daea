"""Normalisers: functions mapping attention scores to weights along the last dimension.

Contract for every entry of `NORMALISERS`: `fn(scores) -> weights`, same shape as `scores`
(..., n_keys); entries that are -inf (masked) get weight exactly 0; a row that is entirely -inf
gives zeros, never NaN. The sparse normalisers (sparsemax, entmax15, alpha-entmax) register here.

`softmax` is special: dense softmax attention never materialises its weights but goes through
`torch.nn.functional.scaled_dot_product_attention` (see multihead.attend); the function here is
the explicit path used when weights are needed (analysis) or a pattern SDPA cannot express.
"""

from __future__ import annotations

from typing import Callable

import torch

Normaliser = Callable[[torch.Tensor], torch.Tensor]


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim; fully masked (-inf) rows give zeros instead of NaN."""
    weights = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(weights, nan=0.0)


NORMALISERS: dict[str, Normaliser] = {
    "softmax": masked_softmax,
}
