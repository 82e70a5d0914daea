"""Fused alpha-entmax attention on CPU (model.attention_impl=cpp): the autograd wiring of the C++ kernel.

The kernel (entmax_attention_cpu.cpp, built with the entmax extension) computes a block of query rows
at a time: scores in a cache-sized buffer, one threshold per row, p v over the keys that hold weight.
It keeps one (t, F) pair per query row, so memory is O(N) as on the memory-efficient path, and the
backward recomputes the weights from it (bitwise the forward's), and the attention-dropout mask from its seed. See memory_efficient.explain_impl for
when `auto` picks it, and `cannot` for what it does not take (those calls stay on the torch paths).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from sparse_runner.attention.entmax_torch import ALPHA_SOFTMAX_THRESHOLD
from sparse_runner.attention.kernels import load_entmax_cpu
from sparse_runner.attention.kernels.operator import KernelOperator

# Query rows per block: the block's scores, weights and their gradients (4 buffers of rows x keys)
# stay within about 512 KiB, a core's L2 on the machines measured, down to 8 rows at 4k keys.
BLOCK_BYTES = 1 << 17
MIN_ROWS, MAX_ROWS = 8, 64
# Input dtypes it computes in float32 (bf16 and fp16 are widened; the result is cast back).
WIDENED = (torch.bfloat16, torch.float16)


def available() -> bool:
    """Whether the C++ extension (which holds the kernel) is built or can be built here."""
    return load_entmax_cpu() is not None


def cannot(*, has_mask: bool) -> str | None:
    """What keeps the kernel from a call (a phrase for `explain_impl`'s reason), or None when it takes it.
    Every floating dtype is taken (half types are widened to float32), and attention dropout."""
    if has_mask:
        return "a pattern mask"
    return None


def rows_per_block(n_keys: int, element_size: int) -> int:
    return max(MIN_ROWS, min(MAX_ROWS, BLOCK_BYTES // max(1, n_keys * element_size) // 4 * 4))


def entmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: float | torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """alpha-entmax attention of q over (k, v) on CPU. Differentiable in q, k, v and a tensor alpha.

    q (B, H, Nq, D); k (B, H, Nk, D); v (B, H, Nk, Dv) -> (B, H, Nq, Dv) in q's dtype (computed in
    float32, or float64 for float64 inputs).
    alpha: a float in [1, 2] or one alpha per head, (H,) or (1, H, 1, 1); a tensor gets its gradient.
    key_padding_mask: (B, Nk) bool, True = real key. mask: bool broadcastable to (B, H, Nq, Nk), True = the
        pair may interact (copied as one byte per pair: for block patterns' tiles, whose scores are that size).
    causal: query i sees keys j <= i + Nk - Nq.
    A query without any key gets a zero output and zero gradients.
    dropout_p: dropout on the weights; the keep mask is a hash of (seed, pair, query, key), the seed one draw
        from torch's generator per call, so the backward draws the same mask (`dropout_keep` returns it).
    """
    if load_entmax_cpu() is None:
        raise RuntimeError("model.attention_impl=cpp needs the C++ extension, which could not be built; use memory_efficient or auto")
    b, h, n_q, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:3] != k.shape[:3] or k.shape[-1] != d:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected (B, H, N, D) with one B, H, D")
    if torch.is_tensor(alpha) and alpha.numel() not in (1, h):
        raise ValueError(f"alpha has {alpha.numel()} values for {h} heads")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p}: expected a rate in [0, 1)")
    # One alpha per head in float64; a tensor alpha keeps its graph (its gradient flows back through the expand).
    alpha_rows = (
        alpha.reshape(-1).to(torch.float64).expand(h) if torch.is_tensor(alpha)
        else torch.full((h,), float(alpha), dtype=torch.float64)
    )
    padding = None if key_padding_mask is None else key_padding_mask.to(torch.uint8)
    valid = None if mask is None else mask.expand(b, h, n_q, k.shape[2]).to(torch.uint8)
    seed = torch.randint(1 << 62, (1,)) if dropout_p > 0.0 else None
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out, *_ = _KERNEL(q, k, v, alpha_rows, padding, valid, seed, bool(causal), scale, float(dropout_p))
    return out


def dropout_keep(seed: int, shape: tuple[int, int, int, int], dropout_p: float) -> torch.Tensor:
    """The keep mask (B, H, Nq, Nk) bool that the kernel draws for `seed` at rate dropout_p (for tests)."""
    b, h, n_q, n_k = shape
    return load_entmax_cpu().attention_dropout_keep(b * h, n_q, n_k, dropout_p, seed).view(b, h, n_q, n_k).bool()


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _pairs(x: Tensor) -> Tensor:
    """(B, H, N, D) -> (B * H, N, D), contiguous, in the work dtype (a view of a contiguous float32 x)."""
    return x.to(_work_dtype(x.dtype)).reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3]).contiguous()  # not -1: N may be 0


def _transposed(x: Tensor) -> Tensor:
    """(P, N, D) -> (P, D, N), contiguous, always a copy (an operator's outputs may not alias its inputs)."""
    return x.transpose(1, 2).clone(memory_format=torch.contiguous_format)


def _flat_masks(padding: Optional[Tensor], valid: Optional[Tensor], pairs: int) -> tuple[Tensor, Tensor]:
    """The masks as the kernel takes them: contiguous uint8, valid as (B * H, Nq, Nk), an empty tensor for none."""
    none = torch.empty(0, dtype=torch.uint8)
    return (
        none if padding is None else padding.contiguous(),
        none if valid is None else valid.contiguous().view(pairs, valid.shape[2], valid.shape[3]),
    )


def _forward(
    q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, padding: Optional[Tensor], valid: Optional[Tensor],
    seed: Optional[Tensor], causal: bool, scale: float, dropout_p: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """out (B, H, Nq, Dv) in q's dtype, and for the backward: per query row (t, F) float64, and the kernel's
    scaled q and transposed k and v.  alpha (H,) float64; padding (B, Nk) and valid (B, H, Nq, Nk) uint8; seed (1,)
    int64 when dropout_p > 0."""
    b, h, n_q, _ = q.shape
    # q scaled once (N x D) instead of every score (N x N); k and v also transposed, for the kernel's two products.
    qs, kw, vw = _pairs(q.to(_work_dtype(q.dtype)) * scale), _pairs(k), _pairs(v)
    kt, vt = _transposed(kw), _transposed(vw)
    padding, valid = _flat_masks(padding, valid, b * h)
    out, params = load_entmax_cpu().attention_forward(
        qs, kw, vw, kt, vt, padding, valid, causal, alpha.detach().clamp(1.0, 2.0).contiguous(), ALPHA_SOFTMAX_THRESHOLD,
        rows_per_block(k.shape[2], kw.element_size()), dropout_p, 0 if seed is None else int(seed),
    )
    return out.view(b, h, n_q, v.shape[3]).to(q.dtype), params, qs, kt, vt


def _backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, padding: Optional[Tensor], valid: Optional[Tensor],
    seed: Optional[Tensor], params: Tensor, qs: Tensor, kt: Tensor, vt: Tensor, causal: bool, scale: float,
    dropout_p: float, need_dalpha: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv in their inputs' dtypes, dalpha (H,) float64, empty unless need_dalpha); the weights are
    recomputed from `_forward`'s params (bitwise its own), the dropout mask from the seed."""
    b, h, n_q, d = q.shape
    kw, vw = _pairs(k), _pairs(v)
    padding, valid = _flat_masks(padding, valid, b * h)
    grad = grad_out.to(qs.dtype).reshape(b * h, n_q, vw.shape[2]).contiguous()
    dqs, dk, dv, da = load_entmax_cpu().attention_backward(
        qs, kw, vw, kt, vt, padding, valid, causal, alpha.detach().clamp(1.0, 2.0).contiguous(), ALPHA_SOFTMAX_THRESHOLD,
        rows_per_block(k.shape[2], kw.element_size()), dropout_p, 0 if seed is None else int(seed), params, grad, need_dalpha,
    )
    dalpha = da.view(b, h).sum(0) if need_dalpha else da  # pairs -> heads
    return (dqs * scale).view(q.shape).to(q.dtype), dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype), dalpha


def _fake_forward(q, k, v, alpha, padding, valid, seed, causal, scale, dropout_p):
    b, h, n_q, d = q.shape
    n_k, work = k.shape[2], _work_dtype(q.dtype)
    return (
        q.new_empty((b, h, n_q, v.shape[3])), q.new_empty((b * h, n_q, 2), dtype=torch.float64),
        q.new_empty((b * h, n_q, d), dtype=work), k.new_empty((b * h, d, n_k), dtype=work), v.new_empty((b * h, v.shape[3], n_k), dtype=work),
    )


def _fake_backward(grad_out, q, k, v, alpha, padding, valid, seed, params, qs, kt, vt, causal, scale, dropout_p, need_dalpha):
    dalpha = alpha.new_empty(alpha.shape[0] if need_dalpha else 0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dalpha


def _save(ctx, inputs, outputs) -> None:
    q, k, v, alpha, padding, valid, seed, causal, scale, dropout_p = inputs
    ctx.save_for_backward(q, k, v, alpha, padding, valid, seed, *outputs[1:])
    ctx.settings = (causal, scale, dropout_p)


def _gradients(ctx, grads, backward):
    """Gradients for q, k, v and alpha (the masks, the seed and the settings take none)."""
    need_dalpha = ctx.needs_input_grad[3]
    dq, dk, dv, dalpha = backward(grads[0], *ctx.saved_tensors, *ctx.settings, need_dalpha)
    return dq, dk, dv, dalpha if need_dalpha else None, *(None,) * 6


_KERNEL = KernelOperator("entmax_attention_cpu", _forward, _backward, fake_forward=_fake_forward, fake_backward=_fake_backward,
                         save=_save, gradients=_gradients, device_types="cpu")
