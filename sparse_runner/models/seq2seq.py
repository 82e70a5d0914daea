"""Encoder-decoder transformer for translation (Vaswani et al. 2017), sparse attention everywhere.

One `AttentionSpec` builds all three attention types, so the chosen normaliser and head geometry
are used everywhere, as in Correia et al. (2019): encoder self-attention ("encoder_self", with the
configured pattern), decoder self-attention ("decoder_self", causal) and encoder-decoder attention
("context", dense); every layer of every type has its own per-head alpha for alpha-entmax.

Decoding is incremental: `decode(..., cache=...)` feeds only the new target tokens and keeps the
keys/values of earlier steps (and of the encoder output) in `cache`, so a step costs O(prefix) and
not O(prefix^2). `reorder_cache` follows beam search's choice of surviving hypotheses.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention import AttentionSpec, MultiHeadAttention
from sparse_runner.models.encoder import TransformerEncoder, checkpointed, checkpointing, sinusoidal_positions

DecoderCache = list[dict[str, dict[str, torch.Tensor]]]


class DecoderLayer(nn.Module):
    """Causal self-attention, context attention over the encoder output, feed-forward."""

    def __init__(self, d_model: int, ffn_dim: int, dropout: float, norm_first: bool, attention: AttentionSpec, layer: int) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, attention.with_pattern("causal"), key=("decoder_self", layer))
        self.context_attn = MultiHeadAttention(d_model, attention.with_pattern("dense"), key=("context", layer))
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(3))
        self.drop = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, memory, memory_mask, target_mask, cache):
        blocks = (
            lambda h: self.self_attn(h, query_mask=target_mask, cache=None if cache is None else cache["self"]),
            lambda h: self.context_attn(
                h, memory, memory_mask, query_mask=target_mask, cache=None if cache is None else cache["context"]
            ),
            self.ffn,
        )
        for block, norm in zip(blocks, self.norms):
            if self.norm_first:
                x = x + self.drop(block(norm(x)))
            else:
                x = norm(x + self.drop(block(x)))
        return x


class TransformerSeq2Seq(nn.Module):
    """Transformer encoder-decoder over one joint vocabulary.

    forward(src (B, S) long, src_lengths (B,) long or None, tgt_in (B, T) long) -> logits (B, T, V).
    `tgt_in` is the target shifted right (BOS first); padding (id `pad_id`) sits at the end of each row.
    src_lengths=None means no source padding.

    attention: the spec of every attention layer; the encoder's self-attention uses its pattern, the
    decoder's self-attention is causal and the context attention dense.
    share_embeddings: one matrix for source embeddings, target embeddings and the output projection
    (possible because the BPE vocabulary is joint); False keeps a separate source embedding and ties
    only the target embedding to the output projection.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        attention: AttentionSpec,
        d_model: int,
        num_layers: int,
        ffn_dim: int,
        dropout: float,
        norm_first: bool,
        decoder_layers: int | None = None,
        share_embeddings: bool = True,
        max_positions: int = 1024,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.encoder = TransformerEncoder(
            vocab_size, max_positions, attention=attention, d_model=d_model, num_layers=num_layers, ffn_dim=ffn_dim,
            dropout=dropout, positions="sinusoidal", norm_first=norm_first, pad_id=pad_id,
        )
        self.embed = self.encoder.embed if share_embeddings else nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)  # the output projection's scale (tied)
        with torch.no_grad():
            self.embed.weight[pad_id].zero_()
        self.register_buffer("positions", sinusoidal_positions(max_positions, d_model), persistent=False)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, ffn_dim, dropout, norm_first, attention, layer=i)
            for i in range(num_layers if decoder_layers is None else decoder_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.scale = math.sqrt(d_model)
        self.activation_checkpointing = False  # the decoder's layers; the encoder has its own flag (encoder.set_activation_checkpointing)

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """src (B, S) -> (memory (B, S, d_model), memory_mask (B, S) bool True = real, or None)."""
        mask = None if src_lengths is None else torch.arange(src.shape[1], device=src.device)[None, :] < src_lengths[:, None]
        return self.encoder(src, key_padding_mask=mask), mask

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None,
        *,
        target_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V) for target tokens tgt_in (B, T).

        With `cache` (from `new_cache`), tgt_in holds only the tokens not yet fed; their positions
        continue after the cached ones. target_mask (B, T) marks real target tokens (analysis only:
        causal attention never lets a real query see padding that follows it).
        """
        offset = 0 if cache is None or "k" not in cache[0]["self"] else cache[0]["self"]["k"].shape[2]
        t = tgt_in.shape[1]
        if offset + t > self.positions.shape[0]:
            raise ValueError(f"target of {offset + t} positions exceeds max_positions={self.positions.shape[0]}")
        x = self.drop(self.embed(tgt_in) * self.scale + self.positions[offset : offset + t])
        if cache is None and checkpointing(self):
            # Never with a cache: the recomputation would append the same keys/values to it twice.
            for layer in self.layers:
                x = checkpointed(layer, x, memory, memory_mask, target_mask, None)
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, memory, memory_mask, target_mask, None if cache is None else cache[i])
        return F.linear(self.final_norm(x), self.embed.weight)

    def forward(self, src, src_lengths, tgt_in, target_mask=None):
        memory, memory_mask = self.encode(src, src_lengths)
        return self.decode(tgt_in, memory, memory_mask, target_mask=target_mask)

    def new_cache(self) -> DecoderCache:
        return [{"self": {}, "context": {}} for _ in self.layers]

    @staticmethod
    def reorder_cache(cache: DecoderCache, index: torch.Tensor) -> None:
        """Keep rows `index` (1-D long) of every cached tensor, in place (beam search's survivors)."""
        for layer in cache:
            for part in layer.values():
                for name in part:
                    part[name] = part[name].index_select(0, index)
