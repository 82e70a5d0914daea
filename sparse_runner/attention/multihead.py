"""Multi-head attention parameterised by normaliser x pattern x geometry (one `AttentionSpec`).

Geometry follows Bhojanapalli et al. (2020): `head_size` is free; `None` means d_model // num_heads.
The projections map d_model -> num_heads * head_size and back, so a head size larger than
d_model / num_heads removes the low-rank bottleneck.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.attention import flex_blocks
from sparse_runner.attention.block_sparse import tile_kernel
from sparse_runner.attention.memory_efficient import explain_impl
from sparse_runner.attention.normalisers import Normaliser, Softmax, build_normaliser
from sparse_runner.attention.patterns import Pattern, build_pattern
from sparse_runner.attention.spec import AttentionSpec

# Receives (key, weights (B, H, Nq, Nk), valid pairs (B, 1, Nq, Nk) bool or None) during analysis; for a
# block-sparse pattern or the memory-efficient path, (key, iterable of (weights (B, H, Q, S), valid
# (B, 1, Q, S)), None): groups of query rows, each over its own candidate keys (see block_sparse.RowGroup),
# to be consumed once.
WeightsObserver = Callable[[tuple[str, int], "torch.Tensor | Iterable", "torch.Tensor | None"], None]
# Receives (layer type, backend, reason) from every forward pass without weights (`backend_choice`).
BackendRecorder = Callable[[str, str, str], None]

log = logging.getLogger(__name__)


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
    """`pattern.attend` with defaults: softmax, dense. Shapes and returns: see `Pattern.attend`."""
    pattern = pattern if pattern is not None else build_pattern("dense")
    normaliser = normaliser if normaliser is not None else Softmax()
    return pattern.attend(q, k, v, normaliser=normaliser, key_padding_mask=key_padding_mask, dropout_p=dropout_p, need_weights=need_weights)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention built from an `AttentionSpec`: any normaliser, pattern and head size.

    forward(x, context=None, key_padding_mask=None, *, query_mask=None, cache=None): see `forward`.

    `key` = (attention type, layer index), e.g. ("encoder_self", 0), names the layer in analyses;
    set `observer` to receive its attention weights (evaluation only).
    """

    def __init__(
        self, d_model: int, spec: AttentionSpec, *, key: tuple[str, int] = ("self", 0), bias: bool = True, global_tokens: int = 0
    ) -> None:
        """global_tokens: leading positions that a block-sparse pattern treats as global (a CLS vector)."""
        super().__init__()
        num_heads, head_size = spec.num_heads, spec.head_size
        if head_size is None:
            if d_model % num_heads:
                raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}; set head_size")
            head_size = d_model // num_heads
        self.num_heads, self.head_size = num_heads, head_size
        # Before the projections: a learned alpha draws from the RNG, and a seed's initial weights
        # depend on that order.
        self.normaliser = build_normaliser(spec.normaliser, num_heads, spec.normaliser_options)
        self.pattern = build_pattern(
            spec.pattern,
            spec.pattern_options,
            global_tokens=global_tokens,
            layer=key[1],
            impl=spec.impl,
            memory_efficient_from=spec.memory_efficient_from,
        )
        self.dropout = spec.dropout
        self.key = key
        self.observer: WeightsObserver | None = None
        self.backend_recorder: BackendRecorder | None = None
        inner = num_heads * head_size
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)

    def backend_choice(self, q: torch.Tensor, k: torch.Tensor, key_padding_mask: torch.Tensor | None, dropout_p: float) -> tuple[str, str]:
        """(backend, reason) of `pattern.attend` on these inputs without weights, as metrics.json records them:
        the backend is 'sdpa', 'triton', 'memory_efficient', 'adasplash', 'flex' or, for the explicit path, its
        normaliser's kernel (`Normaliser.backend_name`, e.g. 'entmax15-cpp'); the reason starts with the path
        ("explicit: CPU, 512 keys <= 4096"; `memory_efficient.explain_impl`)."""
        pattern, normaliser = self.pattern, self.normaliser
        if pattern.impl == flex_blocks.IMPL and getattr(pattern, "flex_engine", ""):
            why = flex_blocks.refusal(normaliser, dropout_p, need_weights=False)
            if why is None:
                return "flex", f"flex: pattern {pattern.name}, model.attention_impl=flex: {pattern.flex_engine} through FlexAttention"
            backend = normaliser.backend_name(q.device)
            return backend, f"{backend}: pattern {pattern.name} ({pattern.ignores_attention_impl}); model.attention_impl=flex not taken: {why}"
        if pattern.ignores_attention_impl:
            kernel = tile_kernel(q.device, normaliser) if pattern.impl == "auto" and not normaliser.fused_sdpa else None
            if kernel == "cpp":
                return "cpp", f"cpp: pattern {pattern.name} ({pattern.ignores_attention_impl}), CPU, threshold-form normaliser"
            if kernel == "triton":
                return "triton", (f"triton: pattern {pattern.name} ({pattern.ignores_attention_impl}), CUDA, threshold-form "
                                  "normaliser; tiles whose heads or queries see different keys: explicit")
            backend = normaliser.backend_name(q.device)
            return backend, f"{backend}: pattern {pattern.name} ({pattern.ignores_attention_impl})"
        if normaliser.fused_sdpa:
            return "sdpa", "sdpa: softmax"
        impl, reason = explain_impl(
            pattern.impl, pattern.memory_efficient_from, k.shape[-2], q.device, dropout_p=dropout_p, has_mask=pattern.masks_pairs(),
            threshold_form=normaliser.has_threshold_form(), n_scores=q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2],
            element_size=q.element_size(), head_dim=q.shape[-1], key_padding=key_padding_mask is not None, causal=pattern.causal,
        )
        return (normaliser.backend_name(q.device) if impl == "explicit" else impl), reason

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
        query_mask: (B, N) bool, True = real query; it only tells the analysis observer which
            queries count (self-attention defaults to key_padding_mask).
        cache: incremental decoding state, a dict this layer fills in place. Self-attention appends
            the new keys/values to cache["k"], cache["v"] (B, H, steps so far, D); cross-attention
            computes the context's keys/values on the first call and reuses them afterwards.
        """
        b, n, _ = x.shape
        q = self._project_q(x)
        if cache is not None and context is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            k, v = self._project_kv(x if context is None else context)
            if cache is not None and context is None and "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            if cache is not None:
                cache["k"], cache["v"] = k, v
        m = k.shape[2]
        observe = self.observer is not None and not self.training
        dropout_p = self.dropout if self.training else 0.0
        # Not while torch.compile traces: the record is plain Python (logging, a dict), kept out of the graph.
        if self.backend_recorder is not None and not observe and not torch.compiler.is_compiling():
            self.backend_recorder(self.key[0], *self.backend_choice(q, k, key_padding_mask, dropout_p))
        y, weights, valid = self.pattern.attend(
            q,
            k,
            v,
            normaliser=self.normaliser,
            key_padding_mask=key_padding_mask,
            dropout_p=dropout_p,
            need_weights=observe,
            **({"layer": _LayerProjections(self)} if self.pattern.reads_layer else {}),
        )
        if observe:
            if query_mask is None and context is None and cache is None:
                query_mask = key_padding_mask
            if not torch.is_tensor(weights):  # row groups (block-sparse, memory-efficient), each with its own valid mask
                # A generator: memory-efficient attention computes each group only when it is reached.
                # A valid mask without padding may be one for the whole batch: the analysis counts per sequence.
                groups = (
                    (g.weights.detach(), (g.valid if query_mask is None else g.valid & query_mask[:, None, g.rows, None]).expand(b, -1, -1, -1))
                    for g in weights
                )
                self.observer(self.key, groups, None)
            else:
                if valid is not None:  # broadcastable, e.g. (Nq, Nk) -> (B, 1, Nq, Nk), a view
                    valid = valid.expand(b, 1, n, m)
                if query_mask is not None:  # padded queries have no possible pairs (docs/papers.md)
                    rows = query_mask[:, None, :, None]
                    valid = rows.expand(b, 1, n, m) if valid is None else (valid & rows)
                self.observer(self.key, weights.detach(), valid)
        return self._project_out(y)

    def _heads(self, projected: torch.Tensor) -> torch.Tensor:
        """(B, N, H * D) -> (B, H, N, D), a view."""
        b, n, _ = projected.shape
        return projected.view(b, n, self.num_heads, self.head_size).transpose(1, 2)

    def _project_q(self, states: torch.Tensor) -> torch.Tensor:
        """(B, N, d_model) -> q (B, H, N, D)."""
        return self._heads(self.q_proj(states))

    def _project_kv(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, M, d_model) -> k, v, each (B, H, M, D).

        kv_proj's two halves are applied one by one: k and v then each come out dense, every position's
        heads side by side, which SDPA reads in place (the fused CPU kernel reads views of a joint kv
        projection ~1.5x slower, so block-sparse attention would copy them), and their gradients reach
        the weights without being stacked into one joint gradient first."""
        weights = self.kv_proj.weight.chunk(2)
        biases = self.kv_proj.bias.chunk(2) if self.kv_proj.bias is not None else (None, None)
        return tuple(self._heads(F.linear(states, w, bias)) for w, bias in zip(weights, biases))

    def _project_out(self, heads: torch.Tensor) -> torch.Tensor:
        """(B, H, N, D) -> (B, N, d_model)."""
        b, h, n, d = heads.shape
        return self.out_proj(heads.transpose(1, 2).reshape(b, n, h * d))


@dataclass
class _LayerProjections:
    """A layer's projections, for a pattern that projects states again (`hst.LayerProjections`)."""

    attention: MultiHeadAttention

    def q_linear(self, u: torch.Tensor) -> torch.Tensor:
        return self.attention._heads(F.linear(u, self.attention.q_proj.weight))

    def kv_linear(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # One matmul for both (a few rows: their layout does not matter, unlike the layer's k and v).
        a, (b, r, _) = self.attention, u.shape
        return tuple(t.transpose(1, 2) for t in F.linear(u, a.kv_proj.weight).view(b, r, 2, a.num_heads, a.head_size).unbind(2))

    def out(self, heads: torch.Tensor) -> torch.Tensor:
        return self.attention._project_out(heads)


def attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


class AttentionBackends:
    """Which backend computed each type of attention layer of a model, and why, as its forward passes
    (without weights) meet them (`MultiHeadAttention.backend_choice`); the first time a layer type meets a
    backend, one INFO line says so."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, str]] = {}  # layer type -> {backend: the reason it was first chosen}

    def __call__(self, layer_type: str, backend: str, reason: str) -> None:
        backends = self.seen.setdefault(layer_type, {})
        if backend not in backends:
            backends[backend] = reason
            log.info("attention %s: %s (%s)", layer_type, backend, reason)

    def fields(self) -> dict[str, object]:
        """metrics.json's `attention_backend` (the backends, sorted, comma-separated) and
        `attention_backend_reason` ({layer type: reasons, "; "-separated in the order they were met})."""
        return {
            "attention_backend": ",".join(sorted({b for backends in self.seen.values() for b in backends})),
            "attention_backend_reason": {kind: "; ".join(backends.values()) for kind, backends in sorted(self.seen.items())},
        }


def attention_backends(model: nn.Module) -> AttentionBackends:
    """A record of the backends `model`'s attention layers run from now on (the layers report to it)."""
    backends = AttentionBackends()
    for layer in attention_layers(model):
        layer.backend_recorder = backends
    return backends


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

