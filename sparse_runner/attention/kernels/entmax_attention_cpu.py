"""Fused alpha-entmax attention on CPU (model.attention_impl=cpp): the autograd wiring of the C++ kernel.

The kernel (entmax_attention_cpu.cpp, built with the entmax extension) computes a block of query rows
at a time: scores in a cache-sized buffer, one threshold per row, p v over the keys that hold weight.
It keeps one (t, F) pair per query row, so memory is O(N) as on the memory-efficient path, and the
backward recomputes the weights from it (bitwise the forward's), and the attention-dropout mask from its seed. See memory_efficient.explain_impl for
when `auto` picks it, and `cannot` for what it does not take (those calls stay on the torch paths).
"""

from __future__ import annotations

import math

import torch
from torch.autograd import Function

from sparse_runner.attention.entmax_torch import ALPHA_SOFTMAX_THRESHOLD
from sparse_runner.attention.kernels import load_entmax_cpu

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
    module = load_entmax_cpu()
    if module is None:
        raise RuntimeError("model.attention_impl=cpp needs the C++ extension, which could not be built; use memory_efficient or auto")
    b, h, n_q, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:3] != k.shape[:3] or k.shape[-1] != d:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected (B, H, N, D) with one B, H, D")
    alpha_t = alpha.reshape(-1) if torch.is_tensor(alpha) else None
    if alpha_t is not None and alpha_t.numel() not in (1, h):
        raise ValueError(f"alpha has {alpha_t.numel()} values for {h} heads")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    padding = (
        torch.empty(0, dtype=torch.uint8) if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    )
    valid = (
        torch.empty(0, dtype=torch.uint8) if mask is None
        else mask.expand(b, h, n_q, k.shape[2]).to(torch.uint8).contiguous().view(b * h, n_q, k.shape[2])
    )
    alpha_rows = (
        torch.full((h,), float(alpha), dtype=torch.float64) if alpha_t is None
        else alpha_t.detach().to(torch.float64).clamp(1.0, 2.0).expand(h).contiguous()
    )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p}: expected a rate in [0, 1)")
    seed = int(torch.randint(1 << 62, (1,)).item()) if dropout_p > 0.0 else 0
    settings = (module, padding, valid, bool(causal), alpha_rows, scale, float(dropout_p), seed)
    out = _EntmaxAttentionCPU.apply(q, k, v, alpha_t, settings)
    return out


def dropout_keep(seed: int, shape: tuple[int, int, int, int], dropout_p: float) -> torch.Tensor:
    """The keep mask (B, H, Nq, Nk) bool that the kernel draws for `seed` at rate dropout_p (for tests)."""
    b, h, n_q, n_k = shape
    return load_entmax_cpu().attention_dropout_keep(b * h, n_q, n_k, dropout_p, seed).view(b, h, n_q, n_k).bool()


class _EntmaxAttentionCPU(Function):
    @staticmethod
    def forward(ctx, q, k, v, alpha_t, settings):
        module, padding, valid, causal, alpha_rows, scale, dropout_p, seed = settings
        b, h, n_q, d = q.shape
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        # (B, H, N, D) -> (B * H, N, D) pairs; q scaled once (N x D) instead of every score (N x N).
        qs = (q.to(work) * scale).reshape(b * h, n_q, d).contiguous()
        kw = k.to(work).reshape(b * h, k.shape[2], d).contiguous()
        vw = v.to(work).reshape(b * h, v.shape[2], v.shape[3]).contiguous()
        kt, vt = kw.transpose(1, 2).contiguous(), vw.transpose(1, 2).contiguous()
        rows = rows_per_block(k.shape[2], kw.element_size())
        out, params = module.attention_forward(
            qs, kw, vw, kt, vt, padding, valid, causal, alpha_rows, ALPHA_SOFTMAX_THRESHOLD, rows, dropout_p, seed
        )
        ctx.settings, ctx.rows, ctx.shape, ctx.dtypes = settings, rows, (b, h), (q.dtype, k.dtype, v.dtype)
        ctx.save_for_backward(qs, kw, vw, kt, vt, params, alpha_t)
        return out.view(b, h, n_q, v.shape[3]).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        module, padding, valid, causal, alpha_rows, scale, dropout_p, seed = ctx.settings
        qs, kw, vw, kt, vt, params, alpha_t = ctx.saved_tensors
        b, h = ctx.shape
        need_da = alpha_t is not None and ctx.needs_input_grad[3]
        grad = grad_out.to(qs.dtype).reshape(qs.shape[0], qs.shape[1], vw.shape[2]).contiguous()
        dqs, dk, dv, da = module.attention_backward(
            qs, kw, vw, kt, vt, padding, valid, causal, alpha_rows, ALPHA_SOFTMAX_THRESHOLD, ctx.rows, dropout_p, seed, params, grad,
            need_da,
        )
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        dq = (dqs * scale).view(b, h, qs.shape[1], qs.shape[2]).to(q_dtype)
        dk = dk.view(b, h, kw.shape[1], kw.shape[2]).to(k_dtype)
        dv = dv.view(b, h, vw.shape[1], vw.shape[2]).to(v_dtype)
        dalpha = None
        if need_da:
            per_head = da.view(b, h).sum(0)  # pairs -> heads
            dalpha = (per_head if alpha_t.numel() == h else per_head.sum()).reshape(alpha_t.shape).to(alpha_t.dtype)
        return dq, dk, dv, dalpha, None
