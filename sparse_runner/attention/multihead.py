"""Multi-head attention parameterised by normaliser x pattern x geometry.

Geometry follows Bhojanapalli et al. (2020): `head_size` is free; `None` means d_model // num_heads.
The projections map d_model -> num_heads * head_size and back, so a head size larger than
d_model / num_heads removes the low-rank bottleneck.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention.normalisers import NORMALISERS
from sparse_runner.attention.patterns import PATTERNS, Pattern


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    normaliser: str = "softmax",
    pattern: Pattern | None = None,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention of q over (k, v).

    Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D); key_padding_mask (B, Nk) bool, True = real token.
    Returns (B, H, Nq, D). Softmax goes through PyTorch's fused SDPA; the other normalisers
    materialise the (B, H, Nq, Nk) scores and call `NORMALISERS[normaliser]`.
    """
    pattern = pattern or Pattern()
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = pattern.dense_mask(n_q, n_k, q.device)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = pad if mask is None else (mask & pad)

    if normaliser == "softmax":
        if key_padding_mask is None and pattern.is_causal and n_q == n_k:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)

    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = NORMALISERS[normaliser](scores.float()).to(q.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with a free head size.

    forward(x, context=None, key_padding_mask=None): x (B, N, d_model); context (B, M, d_model) for
    cross-attention (keys/values from context); key_padding_mask (B, M or N) bool, True = real token.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_size: int | None = None,
        *,
        normaliser: str = "softmax",
        pattern: str = "dense",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if head_size is None:
            if d_model % num_heads:
                raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}; set head_size")
            head_size = d_model // num_heads
        if normaliser not in NORMALISERS:
            raise ValueError(f"unknown normaliser {normaliser!r}; valid: {', '.join(sorted(NORMALISERS))}")
        self.num_heads, self.head_size = num_heads, head_size
        self.normaliser = normaliser
        self.pattern = PATTERNS[pattern]()
        self.dropout = dropout
        inner = num_heads * head_size
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)

    @property
    def backend(self) -> str:
        """Which implementation computes this layer (recorded in metrics.json)."""
        return "sdpa" if self.normaliser == "softmax" else f"explicit-{self.normaliser}"

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        context = x if context is None else context
        b, n, _ = x.shape
        m = context.shape[1]
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_size).transpose(1, 2)
        k, v = self.kv_proj(context).view(b, m, 2, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
        y = attend(
            q,
            k,
            v,
            normaliser=self.normaliser,
            pattern=self.pattern,
            key_padding_mask=key_padding_mask,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out_proj(y.transpose(1, 2).reshape(b, n, self.num_heads * self.head_size))
