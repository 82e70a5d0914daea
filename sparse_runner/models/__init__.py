"""Models built from the attention axes, and the builders tasks call with the `model` config node.

Each builder states the model keys it reads (`*_KEYS`); `config.validate` refuses a key that the
task's model would ignore, so no setting is ever silently dropped.
"""

from __future__ import annotations

from typing import Any

from sparse_runner.attention import ATTENTION_KEYS, AttentionSpec
from sparse_runner.models.config import ModelConfig
from sparse_runner.models.encoder import DualEncoderClassifier, EncoderClassifier, TransformerEncoder
from sparse_runner.models.lm import CausalLM
from sparse_runner.models.seq2seq import TransformerSeq2Seq

# The model keys each builder reads (every other key must stay at its default; `name` and the regulariser,
# which the trainer runs, are free: models/config.py EVERY_FAMILY).
CLASSIFIER_KEYS = ATTENTION_KEYS | {"d_model", "num_layers", "ffn_dim", "dropout", "positions", "norm_first", "pooling"}
# A language model is causal whatever model.pattern says, so it does not read the pattern keys.
LM_KEYS = (ATTENTION_KEYS - {"pattern", "pattern_options"}) | {"d_model", "num_layers", "ffn_dim", "dropout", "positions", "norm_first"}
# BERT-style models (masked LM, SQuAD, MNLI) start from a pre-trained encoder with `init_from`; their
# [CLS] is a token, so there is no pooling choice.
BERT_KEYS = (CLASSIFIER_KEYS - {"pooling"}) | {"init_from"}
SEQ2SEQ_KEYS = ATTENTION_KEYS | {"d_model", "num_layers", "ffn_dim", "dropout", "norm_first", "decoder_layers", "share_embeddings"}


def build_classifier(m: Any, *, vocab_size: int, num_classes: int, max_length: int, pad_id: int | None, pairs: bool = False) -> EncoderClassifier:
    """An EncoderClassifier from the `model` node `m` (reads CLASSIFIER_KEYS); with `pairs`, the
    two-tower DualEncoderClassifier that scores document pairs."""
    return (DualEncoderClassifier if pairs else EncoderClassifier)(
        vocab_size, num_classes, max_length, pooling=m.pooling, attention=AttentionSpec.from_config(m), d_model=m.d_model,
        num_layers=m.num_layers, ffn_dim=m.ffn_dim, dropout=m.dropout, positions=m.positions, norm_first=m.norm_first, pad_id=pad_id,
    )


def build_lm(m: Any, *, vocab_size: int, max_length: int, pad_id: int) -> CausalLM:
    """A decoder-only CausalLM from the `model` node `m` (reads LM_KEYS)."""
    return CausalLM(
        vocab_size, max_length, attention=AttentionSpec.from_config(m), d_model=m.d_model, num_layers=m.num_layers,
        ffn_dim=m.ffn_dim, dropout=m.dropout, positions=m.positions, norm_first=m.norm_first, pad_id=pad_id,
    )


def build_seq2seq(m: Any, *, vocab_size: int, max_positions: int, pad_id: int) -> TransformerSeq2Seq:
    """A TransformerSeq2Seq from the `model` node `m` (reads SEQ2SEQ_KEYS)."""
    return TransformerSeq2Seq(
        vocab_size, attention=AttentionSpec.from_config(m), d_model=m.d_model, num_layers=m.num_layers, ffn_dim=m.ffn_dim,
        dropout=m.dropout, norm_first=m.norm_first, decoder_layers=m.decoder_layers, share_embeddings=m.share_embeddings,
        max_positions=max_positions, pad_id=pad_id,
    )


__all__ = [
    "BERT_KEYS",
    "CLASSIFIER_KEYS",
    "LM_KEYS",
    "CausalLM",
    "SEQ2SEQ_KEYS",
    "DualEncoderClassifier",
    "EncoderClassifier",
    "ModelConfig",
    "TransformerEncoder",
    "TransformerSeq2Seq",
    "build_classifier",
    "build_lm",
    "build_seq2seq",
]
