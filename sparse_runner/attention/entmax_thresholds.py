"""Threshold API of alpha-entmax (last dim, no autograd): for callers that keep one threshold per row
instead of the weights. Memory-efficient attention keeps one (t, F) per row and recomputes a block's
weights bitwise in backward from them; see entmax_threshold for the representation.

    entmax_threshold(x, alpha, *, backend=None) -> (p, params (..., 2) float64)
    entmax_from_threshold(x, alpha, params, *, backend=None) -> p
    entmax_backward(p, g, alpha, *, need_dalpha, backend=None) -> (dx, dalpha per row or None)

The backends are those of entmax.py (`backend` overrides its global choice for one call).
"""

from __future__ import annotations

import torch

from sparse_runner.attention.entmax import active_backend, check_alpha, cpp_module, scalar_alpha
from sparse_runner.attention.entmax_polish import Alpha, a1_parts, general_weights, polished_u, x_minus_t
from sparse_runner.attention.entmax_torch import (
    ALPHA_SOFTMAX_THRESHOLD,
    entmax15_torch,
    newton_torch,
    sparsemax_torch,
    torch_backward,
)

__all__ = ["entmax_threshold", "entmax_from_threshold", "entmax_backward"]


def entmax_threshold(x: torch.Tensor, alpha: Alpha, *, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """alpha-entmax along the last dim, and per-row parameters that reproduce it.  No autograd.

    x: (..., n) float32 / float64, any layout (made contiguous internally), entries finite or -inf.
    alpha: float in [1, 2], or a tensor broadcastable to x.shape[:-1] + (1,) (e.g. (1, H, 1, 1) for
        x (B, H, R, n)); tensor values are used clamped to [1, 2].
    Returns (p, params):
      p: (..., n), x's dtype: alpha-entmax(x, alpha) (zeros on fully -inf rows, NaN rows where x holds
         a NaN or +inf).
      params: (..., 2) float64, (t, F) per row, with which entmax_from_threshold(x, alpha, params)
         gives p bitwise: p is itself computed from them.  The representation (a1 = alpha - 1):
           w_i = [1 + a1 (x_i - t)]_+^(1/a1)    (softmax rows, a1 < ALPHA_SOFTMAX_THRESHOLD: exp(x_i - t)),
           p_i = w_i * dtype(1 / F),
         where x_i - t is carried in x's dtype as two parts (t = t_hi + t_lo, and the exact rounding
         error of x_i - t_hi, by TwoSum), and 1 + a1 (x_i - t) as its rounded value plus a
         correction (a1 and 1/a1 as float64 values), so that the support's small weights keep their
         precision on long rows (a single float32 subtraction of t biases every weight the same way:
         1e-5 errors at 10k keys).  float32 thresholds are polished where the float32 solver's error
         would show (flat rows, entries near the edge of the support; measured: output and gradient
         within 2e-6 of float64 relative to their maxima, alpha 1.2-1.9, up to 20k keys, N(0, 1)
         scores times 1e-3 to 10; tests/test_entmax_precision.py).  The
         arithmetic is spelled out in _torch_weights and entmax_cpu.cpp (`weight`).  t = max(x) + u
         (softmax: t = max(x)); F = sum_i w_i (about 1 except for softmax).  A fully -inf row has
         (t, F) = (+inf, 1) (weights 0 for any x), a NaN row (NaN, NaN).
    The backends ('cpp', 'torch') each reproduce their own p; they agree to rounding, not bitwise.
    """
    x, n = _check_threshold_x(x, "entmax_threshold")
    alpha = check_alpha(alpha, x, x.dim() - 1)
    if x.numel() == 0:
        return x.clone(), x.new_empty(x.shape[:-1] + (2,), dtype=torch.float64)
    if active_backend(x.device, backend) == "cpp":
        p, params = cpp_module().threshold(x.reshape(-1, n).contiguous(), _cpp_alpha_rows(alpha, x), ALPHA_SOFTMAX_THRESHOLD)
        return p.view(x.shape), params.view(x.shape[:-1] + (2,))
    return _torch_threshold(x.contiguous(), _torch_alpha(alpha, x))


def entmax_from_threshold(
    x: torch.Tensor, alpha: Alpha, params: torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """The weights of entmax_threshold recomputed from its params, in one elementwise pass.  No autograd.

    x: (..., n) as for entmax_threshold; alpha: the same alpha; params: (..., 2) float64 from
    entmax_threshold (its leading dims must broadcast to x.shape[:-1]).  Gives the forward's p bitwise
    (same backend), and each column only depends on its own score: x may be any subset of the
    forward's columns (the result is that subset of p).
    """
    x, n = _check_threshold_x(x, "entmax_from_threshold")
    alpha = check_alpha(alpha, x, x.dim() - 1)
    if not torch.is_tensor(params) or params.dtype != torch.float64 or params.shape[-1:] != (2,):
        raise ValueError("entmax_from_threshold: params must be the (..., 2) float64 tensor of entmax_threshold")
    try:
        params = params.to(x.device).expand(x.shape[:-1] + (2,))
    except RuntimeError:
        raise ValueError(
            f"entmax_from_threshold: params of shape {tuple(params.shape)} do not match x of shape {tuple(x.shape)}"
        ) from None
    if x.numel() == 0:
        return x.clone()
    if active_backend(x.device, backend) == "cpp":
        p = cpp_module().from_threshold(
            x.reshape(-1, n).contiguous(), _cpp_alpha_rows(alpha, x), params.reshape(-1, 2).contiguous(), ALPHA_SOFTMAX_THRESHOLD
        )
        return p.view(x.shape)
    return _torch_from_threshold(x.contiguous(), _torch_alpha(alpha, x), params)


def entmax_backward(
    p: torch.Tensor, g: torch.Tensor, alpha: Alpha, *, need_dalpha: bool, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Vector-Jacobian product of alpha-entmax along the last dim, from its output.  No autograd.

    p: (..., n) alpha-entmax output (float32 / float64); g: dL/dp, same shape (cast to p's dtype);
    alpha: as for entmax_threshold.  Returns (dx, dalpha_rows): dx (..., n) in p's dtype;
    dalpha_rows (..., 1) in p's dtype (dL/dalpha of each row; the caller sums it down to alpha's
    shape), or None unless need_dalpha.
    Column subsets: a column with p = 0 contributes nothing (its dx is 0 and it enters no sum), so on
    any subset of the columns that contains the support, dx is that subset of the full dx and
    dalpha_rows is the full one.
    """
    p, n = _check_threshold_x(p, "entmax_backward")
    if g.shape != p.shape:
        raise ValueError(f"entmax_backward: g of shape {tuple(g.shape)} must match p of shape {tuple(p.shape)}")
    alpha = check_alpha(alpha, p, p.dim() - 1)
    g = g.to(p.dtype)
    if p.numel() == 0:
        return torch.zeros_like(p), (p.new_zeros(p.shape[:-1] + (1,)) if need_dalpha else None)
    if active_backend(p.device, backend) == "cpp":
        dx, da = cpp_module().backward(
            p.reshape(-1, n).contiguous(), g.reshape(-1, n).contiguous(), _cpp_alpha_rows(alpha, p),
            ALPHA_SOFTMAX_THRESHOLD, need_dalpha,
        )
        return dx.view(p.shape), (da.view(p.shape[:-1] + (1,)).to(p.dtype) if need_dalpha else None)
    dx, da = torch_backward(p, g, _torch_alpha(alpha, p), -1, need_dalpha)
    if need_dalpha:
        da = da.expand(p.shape[:-1] + (1,)).to(p.dtype)
    return dx, da


def _check_threshold_x(x: torch.Tensor, name: str) -> tuple[torch.Tensor, int]:
    if not torch.is_tensor(x) or x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name}: x must be a float32 or float64 tensor")
    if x.dim() == 0:
        raise ValueError(f"{name}: x must have at least one dimension")
    return x.detach(), x.shape[-1]


def _cpp_alpha_rows(alpha: Alpha, x: torch.Tensor) -> torch.Tensor:
    """alpha as the C++ entry points take it: one float64 per row of x.reshape(-1, n), or one value."""
    if not torch.is_tensor(alpha):
        return scalar_alpha(alpha).reshape(1)
    a = alpha.detach()
    if a.numel() == 1:
        return a.reshape(1).to(torch.float64)
    return a.expand(x.shape[:-1] + (1,)).reshape(-1).to(torch.float64).contiguous()


def _torch_alpha(alpha: Alpha, x: torch.Tensor) -> Alpha:
    """A tensor alpha in x's dtype, clamped to [1, 2] (the C++ contract); a float as it is."""
    return alpha if not torch.is_tensor(alpha) else alpha.detach().to(x.dtype).clamp(1.0, 2.0)


# ------------------------------------------------------------------------------------------------
# "torch" backend: threshold API
# ------------------------------------------------------------------------------------------------


def _torch_threshold(x: torch.Tensor, alpha: Alpha) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, params) of entmax_threshold along the last dim; alpha float or tensor (x dtype, clamped)."""
    m = x.amax(-1, keepdim=True)  # NaN if the row holds one
    bad = m.isnan() | (m == float("inf"))  # NaN rows, as softmax gives
    dead = m == float("-inf")
    skip = dead | bad
    y = x - m.masked_fill(skip, 0.0)
    if isinstance(alpha, float):
        a1 = alpha - 1.0
        if a1 < ALPHA_SOFTMAX_THRESHOLD:
            u = torch.zeros_like(m, dtype=torch.float64)
        elif alpha == 2.0:  # p = [y - tau]_+ = 1 + (y - u)
            u = 1.0 + sparsemax_torch(y, -1)
        elif alpha == 1.5:  # p = (y / 2 - tau)^2 = (1 + (y - u) / 2)^2
            u = 2.0 + 2.0 * entmax15_torch(y, -1, skip)
        else:
            u = polished_u(x, y, *newton_torch(y, a1, -1, skip), a1, m, skip)
    else:
        a1 = (alpha - 1.0).clamp(0.0, 1.0)
        soft = a1 < ALPHA_SOFTMAX_THRESHOLD
        a1 = a1.masked_fill(soft, 0.5)
        u = polished_u(x, y, *newton_torch(y, a1, -1, skip), a1, m, skip | soft)
        u = torch.where(soft, 0.0, u)
    t = (m.double() + u).masked_fill(dead, float("inf")).masked_fill(bad, float("nan"))
    w = _torch_weights(x, alpha, t)
    F = w.sum(-1, keepdim=True, dtype=torch.float64).masked_fill(dead, 1.0).masked_fill(bad, float("nan"))
    p = (w * (1.0 / F).to(x.dtype)).masked_fill(bad, float("nan"))
    return p, torch.cat([t.expand_as(F), F], -1)


def _torch_from_threshold(x: torch.Tensor, alpha: Alpha, params: torch.Tensor) -> torch.Tensor:
    t, F = params[..., :1], params[..., 1:]
    w = _torch_weights(x, alpha, t)
    return (w * (1.0 / F).to(x.dtype)).masked_fill(t.isnan() | F.isnan(), float("nan"))


def _torch_weights(x: torch.Tensor, alpha: Alpha, t: torch.Tensor) -> torch.Tensor:
    """Unnormalised weights w of the threshold representation (see entmax_threshold); t float64.
    Same arithmetic as the C++ `weight` (entmax_cpu.cpp explains it): x - t carried as r + c
    (TwoSum), d = h + delta with h = 1 + a1 (r + c) rounded once and delta its error (_general_d)."""
    r, c = x_minus_t(x, t)
    if isinstance(alpha, float):
        a1 = alpha - 1.0
        if a1 < ALPHA_SOFTMAX_THRESHOLD:
            return torch.exp(r + c)
        if alpha == 2.0:
            return ((1.0 + r) + c).clamp_min(0.0)
        if alpha == 1.5:
            h = torch.addcmul(torch.ones_like(r), r, torch.full_like(r, 0.5))
            delta = torch.addcmul(torch.addcmul(1.0 - h, r, torch.full_like(r, 0.5)), c, torch.full_like(r, 0.5))
            return torch.where(h > 0, h + delta, 0.0).clamp_min(0.0).square()  # -inf entries: delta is NaN
        return general_weights(r, c, a1_parts(a1, r))
    a1 = (alpha - 1.0).clamp(0.0, 1.0)
    soft = a1 < ALPHA_SOFTMAX_THRESHOLD
    return torch.where(soft, torch.exp(r + c), general_weights(r, c, a1_parts(a1.masked_fill(soft, 1.0), r)))
