"""Transformer encoder and a sequence classifier on top of it (LRA-style).

Every attention layer is a `MultiHeadAttention` built from one `AttentionSpec` (normaliser, pattern,
geometry, attention dropout).

Activation checkpointing (`trainer.activation_checkpointing`, switched on by
`set_activation_checkpointing`): in training, each layer of a stack keeps only its input for backward
and recomputes its inside there; evaluation, analysis and cached decoding never checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ContextManager

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from sparse_runner.attention import AttentionSpec, MultiHeadAttention
from sparse_runner.attention.layout import shifted_blocks


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    """(length, dim) fixed sinusoidal position encodings (Vaswani et al. 2017)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


def checkpointed(layer: Callable[..., torch.Tensor], *args: Any, recompute: Callable[[], ContextManager] | None = None) -> torch.Tensor:
    """layer(*args), with the activations inside `layer` recomputed in backward instead of stored.

    Non-reentrant checkpointing restores the RNG state (the same dropout masks) and the autocast state
    for the recomputation. Anything else a layer reads at forward time from outside its arguments must
    be re-established by `recompute`, a context manager factory entered around the recomputation:
    backward runs after the forward pass's own context managers (e.g. SAR's `shifted_blocks`) have exited.
    """
    context_fn = (lambda: (contextlib.nullcontext(), recompute())) if recompute is not None else torch.utils.checkpoint.noop_context_fn
    return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False, context_fn=context_fn)


def checkpointing(stack: nn.Module) -> bool:
    """Whether `stack` (a module with an `activation_checkpointing` flag) checkpoints its layers now:
    only in a training forward pass that builds a graph (never in evaluation, analysis or decoding)."""
    return stack.activation_checkpointing and stack.training and torch.is_grad_enabled()


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> int:
    """Switch per-layer activation checkpointing on every layer stack of `model`; returns how many
    stacks there are (0: the model has none, and nothing changes)."""
    stacks = [m for m in model.modules() if hasattr(m, "activation_checkpointing")]
    for stack in stacks:
        stack.activation_checkpointing = enabled
    return len(stacks)


class EncoderLayer(nn.Module):
    """Self-attention + feed-forward, each with a residual; pre- or post-LayerNorm."""

    def __init__(
        self, d_model: int, ffn_dim: int, dropout: float, norm_first: bool, attention: AttentionSpec, key: tuple[str, int], global_tokens: int = 0
    ) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(d_model, attention, key=key, global_tokens=global_tokens)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop(self.attn(self.norm1(x), key_padding_mask=key_padding_mask))
            return x + self.drop(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, key_padding_mask=key_padding_mask)))
        return self.norm2(x + self.drop(self.ffn(x)))


class TransformerEncoder(nn.Module):
    """Token embeddings + positions + a stack of EncoderLayers, every one's self-attention built from `attention`.

    forward(tokens (B, N) long, key_padding_mask (B, N) bool True = real) -> (B, N, d_model).
    A block-sparse pattern brings a `layout` (attention/layout.py) applied around the layers: it may
    add positions (HST's representative tokens, SAR's shifted block boundaries) that `forward` removes
    again before returning.
    """

    def __init__(
        self,
        vocab_size: int,
        max_length: int,
        *,
        attention: AttentionSpec,
        d_model: int,
        num_layers: int,
        ffn_dim: int,
        dropout: float,
        positions: str,
        norm_first: bool,
        pad_id: int | None = 0,
        attention_type: str = "encoder_self",
        global_tokens: int = 0,
    ) -> None:
        """attention_type names the layers' self-attention in analyses ("decoder_self" in a language model);
        global_tokens: leading positions (a CLS vector) that block-sparse patterns treat as global."""
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.max_length = max_length
        if positions == "learned":
            self.positions = nn.Parameter(torch.randn(max_length, d_model) * 0.02)
        else:
            self.register_buffer("positions", sinusoidal_positions(max_length, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, ffn_dim, dropout, norm_first, attention, key=(attention_type, i), global_tokens=global_tokens)
            for i in range(num_layers)
        )
        self.layout = self.layers[0].attn.pattern.sequence_layout(d_model) if num_layers else None
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.scale = math.sqrt(d_model)
        self.activation_checkpointing = False  # set_activation_checkpointing

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, N) token ids, or (B, N, d_model) already embedded (e.g. with a CLS vector in front)."""
        if x.dim() == 2:
            x = self.embed(x) * self.scale
        n = x.shape[1]
        if n > self.max_length:
            raise ValueError(f"sequence of {n} positions exceeds the model's max_length={self.max_length}")
        x = self.drop(x + self.positions[:n])
        if self.layout is not None:
            x, key_padding_mask, n = self.layout.enter(x, key_padding_mask, self.positions[:n])
        if checkpointing(self):
            # The layout's shift (SAR's second pass) already shaped x and the mask, which the
            # recomputation gets again as arguments; the shift itself is put back around the
            # recomputation too, so nothing a layer might read differs from its forward pass.
            shift = self.layout.shift if self.layout is not None else 0
            for layer in self.layers:
                x = checkpointed(layer, x, key_padding_mask, recompute=lambda: shifted_blocks(self, shift))
        else:
            for layer in self.layers:
                x = layer(x, key_padding_mask)
        x = self.final_norm(x)
        return x if self.layout is None else self.layout.leave(x, n)


class EncoderClassifier(nn.Module):
    """Sequence classification: encoder, pooling (learned CLS vector in front, or mean), MLP head.

    forward(tokens (B, N) long, lengths (B,) long or None) -> logits (B, num_classes). Positions after
    `lengths` are padding; attention never looks at them and mean pooling ignores them. pad_id=None
    (images: every value is a pixel) gives the embedding no padding row.
    `encoder`: the keyword arguments of `TransformerEncoder` (attention, d_model, ...).
    """

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, *, pooling: str, **encoder: Any) -> None:
        super().__init__()
        self.pooling = pooling
        extra = 1 if pooling == "cls" else 0
        self.encoder = TransformerEncoder(vocab_size, max_length + extra, global_tokens=extra, **encoder)
        d_model = self.encoder.embed.embedding_dim
        if pooling == "cls":
            self.cls = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.head = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, num_classes))

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) tokens -> (B, d_model) pooled representation; lengths=None means no padding (no mask is built)."""
        b, n = tokens.shape
        valid = None if lengths is None else torch.arange(n, device=tokens.device)[None, :] < lengths[:, None]  # (B, N)
        x = self.encoder.embed(tokens) * self.encoder.scale
        if self.pooling == "cls":
            x = torch.cat([self.cls.expand(b, 1, -1).to(x.dtype), x], dim=1)
            if valid is not None:
                valid = torch.cat([valid.new_ones(b, 1), valid], dim=1)
        h = self.encoder(x, key_padding_mask=valid)
        if self.pooling == "cls":
            return h[:, 0]
        if valid is None:
            return h.mean(1)
        w = valid[..., None].to(h.dtype)
        return (h * w).sum(1) / w.sum(1).clamp_min(1.0)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encode(tokens, lengths))


class DualEncoderClassifier(EncoderClassifier):
    """Two-tower pair classification (LRA Retrieval): both documents go through the SAME encoder
    separately (no attention between them), and MLP([x1, x2, x1 * x2, x1 - x2]) scores the pair.

    forward(tokens1 (B, N1), lengths1 (B,) or None, tokens2 (B, N2), lengths2) -> logits (B, num_classes).
    """

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, *, pooling: str, **encoder: Any) -> None:
        super().__init__(vocab_size, num_classes, max_length, pooling=pooling, **encoder)
        d_model = self.encoder.embed.embedding_dim
        self.head = nn.Sequential(nn.Linear(4 * d_model, d_model), nn.ReLU(), nn.Linear(d_model, num_classes))

    def forward(self, tokens1: torch.Tensor, lengths1: torch.Tensor | None, tokens2: torch.Tensor, lengths2: torch.Tensor | None) -> torch.Tensor:
        b = tokens1.shape[0]
        # One encoder call for both towers: the two documents of a pair are padded to one width and
        # stacked along the batch, which is what "separately" means for attention (rows never mix).
        width = max(tokens1.shape[1], tokens2.shape[1])
        tokens = torch.cat([F.pad(tokens1, (0, width - tokens1.shape[1])), F.pad(tokens2, (0, width - tokens2.shape[1]))])
        if lengths1 is None and lengths2 is None and tokens1.shape[1] == tokens2.shape[1]:
            lengths = None  # nothing padded: no mask
        else:
            lengths = torch.cat([t.new_full((b,), t.shape[1]) if n is None else n for t, n in ((tokens1, lengths1), (tokens2, lengths2))])
        x1, x2 = self.encode(tokens, lengths).split(b)
        return self.head(torch.cat([x1, x2, x1 * x2, x1 - x2], dim=-1))
