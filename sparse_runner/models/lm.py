"""Decoder-only Transformer language model (the LM1B models of Bhojanapalli et al. 2020).

The layer stack is `TransformerEncoder`'s with every self-attention causal; the output projection is
the input embedding (tied), so the model's parameters are the attention and feed-forward blocks plus
one vocabulary matrix.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention import AttentionSpec
from sparse_runner.models.encoder import TransformerEncoder


class CausalLM(nn.Module):
    """forward(tokens (B, N) long, lengths (B,) long or None) -> next-token logits (B, N, vocab).

    Position i sees tokens 0..i. Padding sits after `lengths` (None: no padding); a real position never
    attends to it (it comes later), so the mask only tells the attention analysis which queries count.
    """

    def __init__(self, vocab_size: int, max_length: int, *, attention: AttentionSpec, pad_id: int = 0, **encoder: Any) -> None:
        """`encoder`: the other keyword arguments of `TransformerEncoder` (d_model, num_layers, ...)."""
        super().__init__()
        self.body = TransformerEncoder(
            vocab_size, max_length, attention=attention.with_pattern("causal"), pad_id=pad_id, attention_type="decoder_self", **encoder
        )
        # Tied: the embedding is also the output projection, so it starts at the output layer's scale.
        nn.init.normal_(self.body.embed.weight, std=encoder["d_model"] ** -0.5)
        with torch.no_grad():
            self.body.embed.weight[pad_id].zero_()

    @property
    def max_length(self) -> int:
        return self.body.max_length

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        mask = None if lengths is None else torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        return F.linear(self.body(tokens, key_padding_mask=mask), self.body.embed.weight)
