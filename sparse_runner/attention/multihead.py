"""Multi-head attention parameterised by normaliser x pattern x geometry.

Geometry follows Bhojanapalli et al. (2020): `head_size` is free; `None` means d_model // num_heads.
The projections map d_model -> num_heads * head_size and back, so a head size larger than
d_model / num_heads removes the low-rank bottleneck.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention.normalisers import Normaliser, Softmax, build_normaliser
from sparse_runner.attention.patterns import PATTERNS, Pattern

# Receives (key, weights (B, H, Nq, Nk), valid pairs (B, 1, Nq, Nk) bool or None) during analysis.
WeightsObserver = Callable[[tuple[str, int], torch.Tensor, "torch.Tensor | None"], None]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    normaliser: Normaliser | None = None,
    pattern: Pattern | None = None,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Attention of q over (k, v).

    Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D); key_padding_mask (B, Nk) bool, True = real token.
    Returns (output (B, H, Nq, D), weights (B, H, Nq, Nk) or None, valid pairs (B, 1, Nq, Nk) or None).
    Softmax goes through PyTorch's fused SDPA unless the weights are asked for; the other
    normalisers materialise the scores and apply `normaliser`.
    """
    normaliser = normaliser if normaliser is not None else Softmax()
    pattern = pattern or Pattern()
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = pattern.dense_mask(n_q, n_k, q.device)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = pad if mask is None else (mask & pad)

    if normaliser.fused_sdpa and not need_weights:
        if key_padding_mask is None and pattern.is_causal and n_q == n_k:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None, None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None, None

    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = normaliser(scores)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return dropped @ v, weights, mask


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with a free head size and any normaliser / pattern.

    forward(x, context=None, key_padding_mask=None, *, query_mask=None, cache=None): see `forward`.

    `key` = (attention type, layer index), e.g. ("encoder_self", 0), names the layer in analyses;
    set `observer` to receive its attention weights (evaluation only).
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
        alpha: float | None = None,
        alpha_init: float | str = "random",
        key: tuple[str, int] = ("self", 0),
    ) -> None:
        super().__init__()
        if head_size is None:
            if d_model % num_heads:
                raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}; set head_size")
            head_size = d_model // num_heads
        self.num_heads, self.head_size = num_heads, head_size
        self.normaliser = build_normaliser(normaliser, num_heads, alpha=alpha, alpha_init=alpha_init)
        self.pattern = PATTERNS[pattern]()
        self.dropout = dropout
        self.key = key
        self.observer: WeightsObserver | None = None
        inner = num_heads * head_size
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)

    @property
    def backend(self) -> str:
        """Which implementation computes this layer (recorded in metrics.json)."""
        return self.normaliser.backend_name(self.q_proj.weight.device)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *,
        query_mask: torch.Tensor | None = None,
        cache: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x (B, N, d_model) -> (B, N, d_model).

        context: (B, M, d_model) keys/values for cross-attention; None = self-attention.
        key_padding_mask: (B, M or N) bool, True = real key.
        query_mask: (B, N) bool, True = real query; only used to tell the analysis observer which
            queries count (self-attention defaults to key_padding_mask).
        cache: incremental decoding state, a dict this layer fills in place. Self-attention appends
            the new keys/values to cache["k"], cache["v"] (B, H, steps so far, D); cross-attention
            computes the context's keys/values on the first call and reuses them afterwards.
        """
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_size).transpose(1, 2)
        if cache is not None and context is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            source = x if context is None else context
            k, v = self.kv_proj(source).view(b, source.shape[1], 2, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
            if cache is not None and context is None and "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            if cache is not None:
                cache["k"], cache["v"] = k, v
        m = k.shape[2]
        observe = self.observer is not None and not self.training
        y, weights, valid = attend(
            q,
            k,
            v,
            normaliser=self.normaliser,
            pattern=self.pattern,
            key_padding_mask=key_padding_mask,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=observe,
        )
        if observe:
            if query_mask is None and context is None and cache is None:
                query_mask = key_padding_mask
            if valid is not None:  # (B or 1, 1, Nq or 1, Nk) -> (B, 1, Nq, Nk), a view
                valid = valid.expand(b, 1, n, m)
            if query_mask is not None:  # padded queries have no possible pairs (PAPERS.md A.5)
                rows = query_mask[:, None, :, None]
                valid = rows.expand(b, 1, n, m) if valid is None else (valid & rows)
            self.observer(self.key, weights.detach(), valid)
        return self.out_proj(y.transpose(1, 2).reshape(b, n, self.num_heads * self.head_size))


def attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def attention_backends(model: nn.Module) -> list[str]:
    """The implementations that compute `model`'s attention layers (recorded in metrics.json)."""
    return sorted({layer.backend for layer in attention_layers(model)})


def head_alphas(model: nn.Module) -> dict[str, list[float]]:
    """'type/layer' -> alpha of each head, for every attention layer whose normaliser has alphas."""
    out: dict[str, list[float]] = {}
    for layer in attention_layers(model):
        alphas = layer.normaliser.alphas()
        if alphas is not None:
            values = alphas.detach().float().cpu().expand(layer.num_heads)
            out[f"{layer.key[0]}/{layer.key[1]}"] = [round(float(a), 6) for a in values]
    return out


def set_observer(model: nn.Module, observer: WeightsObserver | None) -> None:
    for layer in attention_layers(model):
        layer.observer = observer

