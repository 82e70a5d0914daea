"""The threshold weights in extended precision, and the float32 polish of a solver's threshold.

The weights of a threshold t (entmax_thresholds.entmax_threshold describes the representation) are
w_i = [1 + a1 (x_i - t)]_+^(1/a1), a1 = alpha - 1, with x_i - t carried as two parts (x_minus_t), a1 and
1/a1 as two parts each (a1_parts), and d = 1 + a1 (x_i - t) as its rounded value plus a correction
(general_d), so that long rows keep the precision of their small weights. The float32 solves of
entmax_torch.py are polished with Newton steps on these weights (polish_output, polished_u).
"""

from __future__ import annotations

from typing import Union

import torch

# alpha as the entmax functions take it: a float in [1, 2], or a tensor broadcastable to the rows.
Alpha = Union[float, torch.Tensor]


def x_minus_t(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x - t (t float64) as r + c in x's dtype: r = x - t_hi rounded, c its exact error (TwoSum) - t_lo."""
    t_hi = t.to(x.dtype)
    t_lo = torch.where(t.isfinite(), t - t_hi.double(), 0.0).to(x.dtype)
    r = x - t_hi
    bb = r - x
    c = torch.where(r > float("-inf"), ((x - (r - bb)) + (-t_hi - bb)) - t_lo, 0.0)
    return r, c


def a1_parts(a1: Alpha, like: torch.Tensor) -> tuple:
    """a1 = alpha - 1 (a float, or a tensor in like's dtype) as (hi, lo, k_hi, k_lo) in like's dtype:
    a1 = hi + lo (lo None for a tensor: its value is exact) and k = 1 / a1 = k_hi + k_lo (k in float64).
    The weights use the exact alpha: float32 hi and k_hi alone are another alpha, whose d differ by
    ~1e-10 near the edge of a long flat support (0.3 % of its smallest weights, 4e-5 of the gradient
    at 20k keys)."""
    if isinstance(a1, float):
        hi = torch.tensor(a1, dtype=like.dtype, device=like.device)
        k_hi = torch.tensor(1.0 / a1, dtype=like.dtype, device=like.device)
        lo = torch.tensor(a1 - hi.item(), dtype=like.dtype, device=like.device)
        return hi, lo, k_hi, torch.tensor(1.0 / a1 - k_hi.item(), dtype=like.dtype, device=like.device)
    k = 1.0 / a1.double()
    k_hi = k.to(like.dtype)
    return a1, None, k_hi, (k - k_hi.double()).to(like.dtype)


def general_weights(r: torch.Tensor, c: torch.Tensor, a1: tuple) -> torch.Tensor:
    """[1 + a1 (r + c)]_+^k (a1 from a1_parts) with log d = log h + delta / h (accurate as a1 -> 0
    and near d = 0)."""
    h, delta, k = _general_d(r, c, a1)
    log_d = torch.log(h) + delta / h
    return torch.where(k, torch.exp(torch.addcmul(log_d * a1[3], log_d, a1[2])), 0.0)


def _general_d(r: torch.Tensor, c: torch.Tensor, a1: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """d = 1 + a1 (r + c) as h + delta (|delta| << h), and the support k = d > 0 (h = 1 off it).
    The C++ `general_d` is the same arithmetic (it explains the two forms)."""
    hi, lo_a = a1[0], a1[1]
    h = torch.addcmul(torch.ones_like(r), hi, r)
    delta = torch.addcmul(torch.addcmul(1.0 - h, hi, r), hi, c)
    prod = hi * r
    s0 = 1.0 + prod
    lo = torch.addcmul(torch.addcmul(-prod, hi, r), hi, c)
    if lo_a is not None:
        delta = torch.addcmul(delta, lo_a, r)
        lo = torch.addcmul(lo, lo_a, r)
    d = s0 + lo
    low = prod < -0.5
    h = torch.where(low, d, h)
    delta = torch.where(low, (s0 - d) + lo, delta)
    k = h > 0  # -inf entries: h = -inf or NaN (masked)
    return torch.where(k, h, 1.0), delta, k


# float32 general alpha: the solver's u and sums are float32, which leaves every d = 1 + a1 (y - u)
# off by about the same amount (measured |a1 (t32 - t64)| <= 1.3 * 2^-24 on N(0, 1) rows scaled by
# 1e-3 to 10, both backends).  A shared error delta of d moves p_i by k p_i delta / d_i (k = 1/a1), at most
# k delta / d_max relative to max p, and s_i = p_i^(2 - alpha) ~ d_i^e (e = k - 1) by e s_i delta / d_i,
# at most e (d_min / d_max)^e delta / d_min relative to max s (for e < 1, alpha > 1.5, the smallest
# d of the support dominates).  Flat rows (d_max ~ n^-a1) and rows with an entry close to the edge
# of the support make these large: 0.1 on the gradient at 20k keys, alpha 1.9.  Rows where the bound
# exceeds _POLISH_TOL get their threshold t polished by Newton steps on the threshold weights
# (entmax_threshold's representation, exact to ~1e-15 in d), with float64 sums, and their output
# written from those weights.  (No threshold makes this exact: an entry within delta of the edge, in
# or out of the support, can still be off by (delta / d_max)^e relative to max s, and delta is
# ~1e-12 after float32 polishing, ~1e-15 after the float64 step below.)
_F32_BIAS = 2.0**-23
_POLISH_TOL = 4e-6
_POLISH_STEPS = 4
# The float32 threshold weights themselves are off by ~3e-7 each (rounding of log d and k log d) and
# their sum F by a bias of up to ~3e-8 (measured; C++ 2-3e-8, here < 1e-8), so polished t is off by
# ~a1 1e-7 / Q in d (Q = sum w / d), which still matters where an entry lies within ~1e-6 of the
# edge (1 row in 32 at 20k flat keys, alpha 1.76 / 1.9, had a gradient error of 2e-5 / 5e-5): such
# rows take a last Newton step with float64 weights.
_F32_WEIGHTS_BIAS = 1e-7


def _bias_effect(delta, a1, dmax: torch.Tensor, dmin: torch.Tensor) -> torch.Tensor:
    """Bound on the relative error of p and of s = p^(2 - alpha) caused by a shared error delta in d."""
    e = 1.0 / a1 - 1.0
    return delta * torch.maximum(1.0 / (a1 * dmax), e * (dmin / dmax) ** e / dmin)


def _polish_rows(y: torch.Tensor, p: torch.Tensor, u: torch.Tensor, a1: Alpha, dim: int, skip: torch.Tensor):
    """Rows (bool, size 1 along dim) of a float32 solve whose threshold needs polishing."""
    a1d = a1 if isinstance(a1, float) else a1.double()
    dmax = (1.0 - a1d * u.double()).clamp_min(1e-30)
    dmin = torch.where(p > 0, 1.0 + a1 * (y - u), float("inf")).amin(dim, keepdim=True).double()
    return (_bias_effect(_F32_BIAS, a1d, dmax, dmin.clamp(1e-30, 1.0)) > _POLISH_TOL) & ~skip


def _polish_t(x: torch.Tensor, a1: Alpha, t: torch.Tensor) -> torch.Tensor:
    """Newton steps on G(t) = F(t)^a1 - 1 with F = sum of the threshold weights of x (K, n) float32;
    a1 float or (K, 1), t (K, 1) float64.  Stops once the error the last step leaves (its quadratic
    term) moves p and s by at most _POLISH_TOL (_bias_effect)."""
    parts = a1_parts(a1, x)
    a1d = a1 if isinstance(a1, float) else a1.double()
    todo = torch.ones_like(t, dtype=torch.bool)
    for _ in range(_POLISH_STEPS):
        h, delta, k = _general_d(*x_minus_t(x, t), parts)
        log_d = torch.log(h) + delta / h
        w = torch.where(k, torch.exp(torch.addcmul(log_d * parts[3], log_d, parts[2])), 0.0)
        rd = torch.where(k, 1.0 / h, 0.0)
        q = w * rd
        F = w.sum(-1, keepdim=True, dtype=torch.float64)
        Q = q.sum(-1, keepdim=True, dtype=torch.float64)
        M2 = (q * rd).sum(-1, keepdim=True, dtype=torch.float64)
        dmax = torch.where(k, h, 0.0).amax(-1, keepdim=True).double()
        dmin = torch.where(k, h, float("inf")).amin(-1, keepdim=True).double()
        dt = -torch.expm1(-a1d * torch.log(F)) * F / (a1d * Q)
        dt = torch.where(todo & dt.isfinite(), dt, 0.0)
        t = t + dt
        rest = (1.0 - a1d) * (M2 - Q * Q / F).clamp_min(0.0) / (2.0 * Q) * dt * dt
        todo = todo & (_bias_effect(a1d * rest, a1d, dmax, dmin) > _POLISH_TOL)
        if not bool(todo.any()):
            break
    last = (_bias_effect(a1d * _F32_WEIGHTS_BIAS / Q, a1d, dmax, dmin) > _POLISH_TOL)[:, 0]
    if bool(last.any()):
        a1l = a1d if isinstance(a1d, float) else a1d[last]
        d = 1.0 + a1l * (x[last].double() - t[last])
        w = torch.where(d > 0, d.clamp_min(0.0) ** (1.0 / a1l), 0.0)
        F = w.sum(-1, keepdim=True)
        Q = torch.where(d > 0, w / d, 0.0).sum(-1, keepdim=True)
        dt = -torch.expm1(-a1l * torch.log(F)) * F / (a1l * Q)
        t = t.clone()
        t[last] = t[last] + torch.where(dt.isfinite(), dt, 0.0)
    return t


def polished_u(x, y, p, u, a1: Alpha, m, skip) -> torch.Tensor:
    """u (float64, last dim) of newton_torch, polished where _polish_rows says so (float32)."""
    u = u.double()
    if x.dtype != torch.float32:
        return u
    sel = _polish_rows(y, p, u.float(), a1, -1, skip)
    if bool(sel.any()):
        rows = sel[..., 0]
        a1s = a1 if isinstance(a1, float) else a1.expand(sel.shape)[rows]
        t = _polish_t(x[rows], a1s, m[rows].double() + u[rows])
        u = u.clone()
        u[rows] = t - m[rows].double()
    return u


def polish_output(x, y, p, u, a1: Alpha, m, dim: int, skip) -> torch.Tensor:
    """p of newton_torch (float32: the rows that need it rewritten from polished thresholds)."""
    if x.dtype != torch.float32:
        return p
    sel = _polish_rows(y, p, u, a1, dim, skip)
    if not bool(sel.any()):
        return p
    rows = sel.movedim(dim, -1)[..., 0]
    xs = x.movedim(dim, -1)[rows]
    a1s = a1 if isinstance(a1, float) else a1.expand(sel.shape).movedim(dim, -1)[rows]
    t = _polish_t(xs, a1s, (m.double() + u.double()).movedim(dim, -1)[rows])
    w = general_weights(*x_minus_t(xs, t), a1_parts(a1s, xs))
    F = w.sum(-1, keepdim=True, dtype=torch.float64)
    p = p.movedim(dim, -1).clone()
    p[rows] = w * (1.0 / F).to(w.dtype)
    return p.movedim(-1, dim)
