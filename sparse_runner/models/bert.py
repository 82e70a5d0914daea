"""BERT-style models (Bhojanapalli et al. 2020's Tables 1-2): one `TransformerEncoder`, and a head per stage.

    MaskedLM                pre-training: logits over the vocabulary at the masked positions
    SpanExtractor           SQuAD: a start and an end logit per token
    SentencePairClassifier  MNLI: logits from the first token ([CLS]) through a tanh pooler

All three keep the encoder under the attribute `encoder`, so fine-tuning loads a pre-trained run's
`encoder.*` weights into any of them (`sparse_runner.pretrained`) and adds a freshly initialised head.
Inputs start with the [CLS] token, which block-sparse patterns treat as global (`global_tokens=1`).
The vocabulary is the task's subword vocabulary plus one id for [MASK] (`tasks/bert_text.py`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention import AttentionSpec
from sparse_runner.models.encoder import TransformerEncoder


def _padding_mask(tokens: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor | None:
    """(B, N) bool, True = a real token; None when nothing is padded (attention then needs no mask)."""
    return None if lengths is None else torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]


class BertEncoder(nn.Module):
    """The shared body: `encoder` (a TransformerEncoder over token ids, position 0 global).

    encode(tokens (B, N) long, lengths (B,) long or None) -> (B, N, d_model).
    """

    def __init__(self, vocab_size: int, max_length: int, *, pad_id: int, **encoder: Any) -> None:
        super().__init__()
        self.encoder = TransformerEncoder(vocab_size, max_length, pad_id=pad_id, global_tokens=1, **encoder)
        # The encoder multiplies embeddings by sqrt(d_model); this scale makes them N(0, 1) after it,
        # and suits the tied output layer of the masked LM (as in the causal LM).
        d_model = encoder["d_model"]
        nn.init.normal_(self.encoder.embed.weight, std=d_model**-0.5)
        with torch.no_grad():
            self.encoder.embed.weight[pad_id].zero_()

    @property
    def d_model(self) -> int:
        return self.encoder.embed.embedding_dim

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(tokens, key_padding_mask=_padding_mask(tokens, lengths))


class MaskedLM(BertEncoder):
    """Masked language modelling (Devlin et al. 2019): encoder, then at the positions to predict a
    dense + GELU + LayerNorm transform and the tied embedding as output layer (plus a bias).

    forward(tokens (B, N), lengths (B,) or None, positions (B, N) bool or None) ->
    logits (P, vocab) at the P positions where `positions` is True (all B*N when None): the output
    layer runs on the masked positions only, ~15 % of the tokens.
    """

    def __init__(self, vocab_size: int, max_length: int, *, pad_id: int, **encoder: Any) -> None:
        super().__init__(vocab_size, max_length, pad_id=pad_id, **encoder)
        d = self.d_model
        self.transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encode(tokens, lengths)
        h = h.flatten(0, 1) if positions is None else h[positions]
        return F.linear(self.transform(h), self.encoder.embed.weight, self.output_bias)


class SpanExtractor(BertEncoder):
    """Extractive QA (SQuAD, as BERT): forward(tokens, lengths) -> (start, end) logits, each (B, N), float32.
    Padding positions get -1e9 (not -inf: a regulariser's KL between two passes stays finite), so no span
    starts or ends there."""

    def __init__(self, vocab_size: int, max_length: int, *, pad_id: int, **encoder: Any) -> None:
        super().__init__(vocab_size, max_length, pad_id=pad_id, **encoder)
        self.span = nn.Linear(self.d_model, 2)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.span(self.encode(tokens, lengths)).float()  # (B, N, 2)
        mask = _padding_mask(tokens, lengths)
        if mask is not None:
            logits = logits.masked_fill(~mask[..., None], -1e9)
        start, end = logits.unbind(-1)
        return start, end


class SentencePairClassifier(BertEncoder):
    """Sentence-pair classification (MNLI, as BERT): `[CLS] a [SEP] b [SEP]` in, the [CLS] position's
    vector through a tanh pooler and a linear layer out. forward(tokens, lengths) -> (B, num_classes)."""

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, *, pad_id: int, dropout: float, **encoder: Any) -> None:
        super().__init__(vocab_size, max_length, pad_id=pad_id, dropout=dropout, **encoder)
        d = self.d_model
        self.pooler = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Dropout(dropout))
        self.head = nn.Linear(d, num_classes)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.pooler(self.encode(tokens, lengths)[:, 0]))


def _encoder_kwargs(m: Any) -> dict[str, Any]:
    return dict(
        attention=AttentionSpec.from_config(m), d_model=m.d_model, num_layers=m.num_layers, ffn_dim=m.ffn_dim,
        dropout=m.dropout, positions=m.positions, norm_first=m.norm_first,
    )


def build_masked_lm(m: Any, *, vocab_size: int, max_length: int, pad_id: int) -> MaskedLM:
    return MaskedLM(vocab_size, max_length, pad_id=pad_id, **_encoder_kwargs(m))


def build_span_extractor(m: Any, *, vocab_size: int, max_length: int, pad_id: int) -> SpanExtractor:
    return SpanExtractor(vocab_size, max_length, pad_id=pad_id, **_encoder_kwargs(m))


def build_pair_classifier(m: Any, *, vocab_size: int, num_classes: int, max_length: int, pad_id: int) -> SentencePairClassifier:
    return SentencePairClassifier(vocab_size, num_classes, max_length, pad_id=pad_id, **_encoder_kwargs(m))
