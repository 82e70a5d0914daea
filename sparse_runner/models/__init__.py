"""Models built from the attention axes, and the builders tasks call with the `model` config node.

Each builder states the model keys it honours (`*_KEYS`); `config.validate` refuses a key that the
task's model would ignore, so no setting is ever silently dropped.
"""

from __future__ import annotations

from typing import Any

from sparse_runner.models.config import MODEL_KEYS, ModelConfig
from sparse_runner.models.encoder import EncoderClassifier, TransformerEncoder
from sparse_runner.models.seq2seq import TransformerSeq2Seq

# The model keys each model reads (everything else must stay at its default).
CLASSIFIER_KEYS = frozenset(MODEL_KEYS) - {"decoder_layers", "share_embeddings"}
SEQ2SEQ_KEYS = frozenset(MODEL_KEYS) - {"pooling", "positions", "pattern", "pattern_options"}


def build_classifier(m: Any, *, vocab_size: int, num_classes: int, max_length: int, pad_id: int) -> EncoderClassifier:
    kwargs = {k: m[k] for k in m if k not in ("name", "pooling", "pattern_options", "decoder_layers", "share_embeddings")}
    return EncoderClassifier(vocab_size=vocab_size, num_classes=num_classes, max_length=max_length, pooling=m.pooling, pad_id=pad_id, **kwargs)


def build_seq2seq(m: Any, *, vocab_size: int, max_positions: int, pad_id: int) -> TransformerSeq2Seq:
    kwargs = {k: m[k] for k in m if k not in ("name", "pooling", "pattern", "pattern_options", "positions")}
    return TransformerSeq2Seq(vocab_size, max_positions=max_positions, pad_id=pad_id, **kwargs)


__all__ = [
    "CLASSIFIER_KEYS",
    "SEQ2SEQ_KEYS",
    "EncoderClassifier",
    "ModelConfig",
    "TransformerEncoder",
    "TransformerSeq2Seq",
    "build_classifier",
    "build_seq2seq",
]
