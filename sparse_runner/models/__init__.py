"""Models built from the attention axes."""

from sparse_runner.models.encoder import EncoderClassifier, TransformerEncoder

__all__ = ["EncoderClassifier", "TransformerEncoder"]
