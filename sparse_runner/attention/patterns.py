"""Attention patterns (topologies): which query-key pairs may interact, and how attention over them is computed.

A pattern is registered under a name together with the dataclass of its options (fairseq style: the
option schema lives beside the code that reads it):

    @dataclass(frozen=True)
    class LocalOptions:
        block_size: int = field(default=64, metadata={"valid": lambda b: b > 0, "help": "a positive int"})

    @register_pattern("local", options=LocalOptions)
    class LocalPattern(Pattern):
        def dense_mask(self, n_queries, n_keys, device="cpu"): ...   # uses self.options.block_size

`model.pattern=local +model.pattern_options.block_size=32` then selects it; `spec.check_attention_config`
checks the options against the dataclass (field types, `Literal` choices, the `valid` predicate).
Every module of this package is imported when the registry is first read, and another package adds
patterns through the entry-point group `sparse_runner.patterns` (see `sparse_runner.registry`).

Every pattern produces a dense boolean mask (True = may attend). `Pattern.attend` computes attention
densely under that mask; the block-sparse patterns (local and BigBird in `block_patterns.py`, HST in `hst.py`) override
`attend` with their fast path and stay testable against masked dense attention through `dense_mask`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F

from sparse_runner.attention.block_sparse import record_scores
from sparse_runner.attention.memory_efficient import attend_long, choose_impl
from sparse_runner.attention.normalisers import Normaliser
from sparse_runner.registry import Registry

# name -> Pattern subclass, filled by @register_pattern.
PATTERNS: Registry[type[Pattern]] = Registry("pattern", package="sparse_runner.attention", entry_points="sparse_runner.patterns")


@dataclass(frozen=True)
class NoOptions:
    """The options of a pattern that has none."""


def register_pattern(name: str, options: type = NoOptions) -> Callable[[type[Pattern]], type[Pattern]]:
    """Class decorator: make a Pattern subclass available as `model.pattern=<name>`.

    `options` is a dataclass whose fields (with defaults) are the keys `model.pattern_options` accepts;
    a field's metadata may hold `valid` (a predicate on the value) and `help` (the valid values, in words).
    """
    return PATTERNS.register(name, Options=options)


def build_pattern(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    global_tokens: int = 0,
    layer: int = 0,
    impl: str = "auto",
    memory_efficient_from: int | str = "auto",
) -> Pattern:
    """The pattern registered as `name`, with `options` (a dict of its option fields; missing = default).

    global_tokens: how many leading positions are global (a classifier's CLS vector); layer: the
    layer's index (seeds BigBird's random blocks); impl, memory_efficient_from: how the default
    `attend` computes attention (`memory_efficient.choose_impl`).
    """
    cls = PATTERNS[name]
    pattern = cls(cls.Options(**(options or {})), global_tokens=global_tokens, layer=layer)
    pattern.impl, pattern.memory_efficient_from = impl, memory_efficient_from
    return pattern


class Pattern:
    """Base class of the patterns. Every query sees every key unless a subclass says otherwise.

    A subclass overrides `dense_mask` (which pairs may interact) and, for a sparse fast path, `attend`.
    """

    name = "pattern"
    Options: type = NoOptions
    self_attention_only = False  # True: queries and keys are the same sequence (block patterns)
    causal = False  # True: the mask is "query i sees keys <= i" (aligned to the end), computed per block
    impl, memory_efficient_from = "auto", "auto"  # set by build_pattern; see memory_efficient.choose_impl
    # Why `attend` never reads model.attention_impl, for a pattern that computes attention its own way
    # ("": it goes through memory_efficient.choose_impl, as dense and causal attention do).
    ignores_attention_impl: ClassVar[str] = ""
    # True: `attend` also takes `layer=`, the layer's input and projections (two-stage HST projects
    # states again between its steps); MultiHeadAttention passes it.
    reads_layer = False

    @classmethod
    def masks_pairs(cls) -> bool:
        """Whether `dense_mask` restricts more than causality does (the GPU kernels take padding and
        causality only; the explicit and memory-efficient paths take any mask)."""
        return cls.dense_mask is not Pattern.dense_mask and not cls.causal

    def __init__(self, options: Any = None, *, global_tokens: int = 0, layer: int = 0) -> None:
        self.options = options if options is not None else self.Options()
        self.global_tokens, self.layer = global_tokens, layer

    def sequence_layout(self, d_model: int) -> Any:
        """The `layout.SequenceLayout` an encoder applies around its layers (block boundaries, HST's
        representative tokens), or None when the pattern needs none."""
        return None

    def dense_mask(self, n_queries: int, n_keys: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """Boolean (n_queries, n_keys) mask, True where attention is allowed; None = all allowed."""
        return None

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        normaliser: Normaliser,
        key_padding_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Attention of q over (k, v), restricted to `dense_mask` and the real keys.

        Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D); key_padding_mask (B, Nk) bool, True = real token.
        Returns (output (B, H, Nq, D), weights (B, H, Nq, Nk) or None, valid pairs as a bool mask that
        broadcasts to (B, 1, Nq, Nk): (Nq, Nk) from the pattern alone, (B, 1, Nq, Nk) with padding, or
        None when every pair is valid). A block-sparse pattern returns its weights as a list of
        `block_sparse.RowGroup`s (rows x candidate keys, each with its own valid mask) and valid None. Softmax goes through PyTorch's fused SDPA unless the weights are
        asked for; the other normalisers materialise the scores and apply `normaliser`, or, from
        `memory_efficient_from` keys, go through `memory_efficient` (query blocks, O(N) memory; the weights
        then come back as one lazily computed `RowGroup` per block).
        """
        # A causal mask is built only where the explicit path needs it (the long path works it out per block).
        mask = None if self.causal else self.dense_mask(q.shape[-2], k.shape[-2], q.device)
        if not (normaliser.fused_sdpa and not need_weights):
            impl = choose_impl(
                self.impl, self.memory_efficient_from, k.shape[-2], q.device, dropout_p=dropout_p, has_mask=mask is not None,
                threshold_form=normaliser.has_threshold_form(), n_scores=q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2],
                element_size=q.element_size(), head_dim=q.shape[-1], need_weights=need_weights,
            )
            if impl != "explicit":
                return attend_long(
                    q, k, v, impl, normaliser=normaliser, key_padding_mask=key_padding_mask, mask=mask, causal=self.causal,
                    dropout_p=dropout_p, need_weights=need_weights,
                )
        if self.causal:
            mask = self.dense_mask(q.shape[-2], k.shape[-2], q.device)
        record_scores(q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2])  # n x n, whatever the mask
        if key_padding_mask is not None:
            pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
            mask = pad if mask is None else (mask & pad)

        if normaliser.fused_sdpa and not need_weights:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None, None

        # Scaling q (N x D) rather than the scores (N x N) saves a full pass over the scores, forward and backward.
        scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))  # in place: the matmul's backward does not need its output
        weights = normaliser(scores)
        dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
        return dropped @ v, weights, mask


@register_pattern("dense")
class DensePattern(Pattern):
    """Every query sees every key (encoders, context attention)."""


@register_pattern("causal")
class CausalPattern(Pattern):
    """Query i sees keys 0..i (decoders, language models)."""

    causal = True

    def dense_mask(self, n_queries: int, n_keys: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
        if n_queries == 1:  # one new query in incremental decoding: it sees every cached key
            return None
        # Aligned to the end so that incremental decoding (1 query, n keys) sees everything before it.
        return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)

    def attend(self, q, k, v, *, normaliser, key_padding_mask=None, dropout_p=0.0, need_weights=False):
        # Without padding, SDPA's is_causal never builds the mask and may pick a faster kernel.
        if normaliser.fused_sdpa and not need_weights and key_padding_mask is None and q.shape[-2] == k.shape[-2]:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None, None
        return super().attend(
            q, k, v, normaliser=normaliser, key_padding_mask=key_padding_mask, dropout_p=dropout_p, need_weights=need_weights
        )
