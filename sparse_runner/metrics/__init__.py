"""Task metrics that need more than a few lines (translation quality)."""

from sparse_runner.metrics.translation import translation_scores

__all__ = ["translation_scores"]
