"""The "torch" backend of alpha-entmax in plain PyTorch, any device: the forward solvers (sparsemax,
1.5-entmax, Newton for general alpha) and the backward from the output (entmax.py derives the gradients).

Each forward solver returns the row's threshold (sparsemax, 1.5-entmax: tau in float64) or the weights and
their threshold variable u (general alpha); float32 thresholds of general alpha are polished where the
float32 solve's error would show (entmax_polish.py).
"""

from __future__ import annotations

import torch

from sparse_runner.attention.entmax_polish import Alpha, polish_output

# alpha - 1 below this is computed as softmax.  Why this value: alpha-entmax differs from softmax by
# about C * (alpha - 1), with C = max |dp/dalpha| at alpha = 1.  Measured in float64 against the exact
# (Newton) alpha-entmax: C <= 4 for 128 keys, <= 9 for 2048 keys and <= 17.4 for 65536 keys, the worst
# rows being a single large score holding about half the mass over a flat rest (N(0,1) scores give
# C <= 1, N(0,9) scores C <= 8).  5e-7 therefore keeps the substitution error below 1e-5
# (8.7e-6) for rows of up to 64k keys.  Above it both backends are accurate down to alpha - 1 ~ 1e-7:
# they iterate on u = (tau + 1) / (alpha - 1) with log1p, which does not degenerate as alpha -> 1.
ALPHA_SOFTMAX_THRESHOLD = 5e-7

# Newton stops at |sum p - 1| <= tol and divides by sum p; the output error is then <= ~tol.
_TOL = {torch.float32: 2e-6, torch.float64: 1e-12}
# psi(x) = (e^x - 1 - x) / x^2: Taylor series below the switch, direct formula above (the direct
# formula loses log10(1 / (x^2/2)) digits, so float32 switches later than float64).
_PSI_SWITCH = {torch.float32: 1.0, torch.float64: 0.1}
_MAX_ITER = 64


# ------------------------------------------------------------------------------------------------
# "torch" backend: forward
# ------------------------------------------------------------------------------------------------


def torch_forward(x: torch.Tensor, alpha: Alpha, dim: int) -> torch.Tensor:
    """alpha-entmax along dim in plain PyTorch; alpha float or tensor (x dtype, size 1 along dim)."""
    m = x.amax(dim=dim, keepdim=True)  # NaN if the row holds one
    dead = m == float("-inf")  # fully masked rows: output zeros
    bad = m.isnan() | (m == float("inf"))  # NaN / +inf scores: NaN rows, as softmax
    skip = dead | bad
    y = x - m.masked_fill(skip, 0.0)  # <= 0, max entry 0; dead rows stay all -inf
    if isinstance(alpha, float):
        a1 = alpha - 1.0
        if a1 < ALPHA_SOFTMAX_THRESHOLD:
            p = torch.softmax(y, dim)
        elif alpha == 2.0:
            hi, lo = _split(sparsemax_torch(y, dim), y.dtype)
            p = ((y - hi) - lo).clamp_min(0.0)
        elif alpha == 1.5:
            hi, lo = _split(entmax15_torch(y, dim, skip), y.dtype)
            p = ((y / 2 - hi) - lo).clamp_min(0.0).square()
        else:
            p = polish_output(x, y, *newton_torch(y, a1, dim, skip), a1, m, dim, skip)
    else:
        a1 = (alpha - 1.0).clamp(0.0, 1.0)
        soft = a1 < ALPHA_SOFTMAX_THRESHOLD
        a1 = a1.masked_fill(soft, 0.5)  # 0.5: any valid value, replaced below
        p = polish_output(x, y, *newton_torch(y, a1, dim, skip), a1, m, dim, skip | soft)
        if bool(soft.any()):
            p = torch.where(soft, torch.softmax(y, dim), p)
    return p.masked_fill(dead, 0.0).masked_fill(bad, float("nan"))


def _split(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 threshold as hi + lo in dtype: y - t evaluated as (y - hi) - lo keeps its precision
    (a float32 t alone shifts every entry the same way by up to half an ulp of t, which on thousands
    of entries in the support moves the row sum by ~1e-4)."""
    hi = t.to(dtype)
    return hi, torch.where(t.isfinite(), t - hi.double(), 0.0).to(dtype)


def sparsemax_torch(y: torch.Tensor, dim: int) -> torch.Tensor:
    """The threshold tau (float64, size 1 along dim) of p = [y - tau]_+ (alpha = 2).  Newton on the
    piecewise-linear sum [y - tau]_+ - 1 from tau = -1 is Michelot's projection: tau = (sum_S y - 1) / |S|
    on the current support S, exact once S stops shrinking.  Sums in float64: the row sum of the
    output is 1 - (the error of sum_S y)."""
    support = y > -1.0
    for _ in range(y.shape[dim] + 1):
        count = support.sum(dim, keepdim=True).clamp_min(1)
        tau = (torch.where(support, y, 0.0).sum(dim, keepdim=True, dtype=torch.float64) - 1.0) / count
        hi, lo = _split(tau, y.dtype)
        new_support = (y - hi) - lo > 0
        if torch.equal(new_support, support):
            break
        support = new_support
    return tau


def entmax15_torch(y: torch.Tensor, dim: int, dead: torch.Tensor) -> torch.Tensor:
    """The threshold tau (float64, size 1 along dim) of p = [y / 2 - tau]_+^2 (alpha = 1.5).  With
    z = y / 2, on the current support S (tau <= tau*, so S contains the true support) the root of
    sum_S (z - t)^2 = 1 is closed-form; it is tau* exactly when it keeps all of S non-negative.  Rows
    where it does not take a Newton step on sqrt(sum p) - 1 (convex, decreasing: from the left it
    never overshoots) and try again.  The root's S1^2 - c (S2 - 1) cancels when tau was far from it
    relative to the spread of S (flat rows: by a factor ~c), so such a root is evaluated once more at
    the new tau, where nothing cancels; sums are float64."""
    z = y / 2
    tau = torch.full_like(dead, -1.0, dtype=torch.float64)
    polished = torch.zeros_like(dead)
    for _ in range(_MAX_ITER):
        hi, lo = _split(tau, y.dtype)
        d = ((z - hi) - lo).clamp_min(0.0)
        support = d > 0
        count = support.sum(dim, keepdim=True).double()
        s1 = d.sum(dim, keepdim=True, dtype=torch.float64)
        s2 = (d * d).sum(dim, keepdim=True, dtype=torch.float64)
        dmin = torch.where(support, d, float("inf")).amin(dim, keepdim=True).double()
        f = s2 - 1.0
        disc = s1 * s1 - count * f
        e = f / (s1 + disc.clamp_min(0.0).sqrt())  # rationalised root: no cancellation as e -> 0
        exact = (disc >= 0) & (e <= dmin)
        done = (exact & (polished | (s1 * s1 <= 16.0 * disc))) | dead
        tau = torch.where(exact, tau + e, tau + (s2 - s2.sqrt()) / s1)
        if bool(done.all()):
            break
        polished = exact
    return tau


def newton_torch(y: torch.Tensor, a1: Alpha, dim: int, dead: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """General alpha, a1 = alpha - 1 > 0 (float or tensor): (p, u), u of size 1 along dim.

    Variable u >= 0 with tau = a1 u - 1:  p_i = [1 + a1 (y_i - u)]_+^(1/a1).  At u = 0 the max entry
    alone gives 1, so F(u) = sum p >= 1.  Newton on G(u) = F^a1 - 1 (the k-norm of d(u) minus 1,
    k = 1/a1: convex and decreasing, so steps from the left never overshoot; exact in one step for
    softmax and on a fixed support for sparsemax):  u += F (1 - F^-a1) / (a1 Q),  Q = sum p / d.
    Safeguard: bisection inside the known bracket [0, (1 - n^-a1) / a1] (tau in [-1, -n^-a1]: all
    mass on the max, or uniform over the n finite entries) whenever an iterate leaves it.
    """
    tol = _TOL[y.dtype]
    n_finite = (y > float("-inf")).sum(dim, keepdim=True).clamp_min(1).to(y.dtype)
    u_lo = torch.zeros_like(n_finite)
    u_hi = -torch.expm1(-a1 * torch.log(n_finite)) / a1
    u = u_lo
    for _ in range(_MAX_ITER):
        t = a1 * (y - u)
        support = t > -1.0
        log_d = torch.log1p(t.clamp_min(-1.0))  # log d, accurate when |t| << 1 (alpha near 1)
        p = torch.where(support, torch.exp(log_d / a1), 0.0)
        F = p.sum(dim, keepdim=True)
        if bool((((F - 1.0).abs() <= tol) | dead).all()):
            break
        Q = torch.where(support, p / (1.0 + t), 0.0).sum(dim, keepdim=True)
        u_lo = torch.where(F >= 1.0, u, u_lo)
        u_hi = torch.where(F < 1.0, u, u_hi)
        u_new = u + F * -torch.expm1(-a1 * torch.log(F)) / (a1 * Q)
        inside = torch.isfinite(u_new) & (u_new >= u_lo) & (u_new <= u_hi)
        u = torch.where(inside, u_new, 0.5 * (u_lo + u_hi))
    return p / F, u


# ------------------------------------------------------------------------------------------------
# "torch" backend: backward
# ------------------------------------------------------------------------------------------------


def _psi_series(x: torch.Tensor) -> torch.Tensor:
    """psi(x) = (e^x - 1 - x) / x^2 = sum_j x^j / (j+2)!, 9 terms (rel. error < 3e-8 for x < 1)."""
    r = torch.full_like(x, 1.0 / 3628800)
    for c in (362880, 40320, 5040, 720, 120, 24, 6, 2):
        r = r * x + 1.0 / c
    return r


def torch_backward(p: torch.Tensor, g: torch.Tensor, alpha: Alpha, dim: int, need_da: bool):
    """(dx, dalpha per row with size 1 along dim, or None) from the saved output p and grad g."""
    if isinstance(alpha, float):
        a1 = alpha - 1.0
        soft = a1 < ALPHA_SOFTMAX_THRESHOLD
        a1_eff = 0.0 if soft else a1
    else:
        a1 = (alpha - 1.0).clamp(0.0, 1.0)
        soft = a1 < ALPHA_SOFTMAX_THRESHOLD
        a1_eff = a1.masked_fill(soft, 0.0)  # softmax rows: s = p, psi = 1/2 (the alpha = 1 limits)
    log_p = None
    if isinstance(alpha, float) and not need_da and (alpha == 2.0 or alpha == 1.5 or soft):
        s = (p > 0).to(p.dtype) if alpha == 2.0 and not soft else (p if soft else p.sqrt())
    else:
        # p below the smallest normal number is treated as outside the support: its s = p^(2-alpha)
        # is < 1e-30 whenever it can underflow (see entmax_cpu.cpp), and its log is unreliable.
        support = p >= torch.finfo(p.dtype).tiny
        log_p = torch.log(torch.where(support, p, 1.0))
        s = torch.where(support, torch.exp((1.0 - a1_eff) * log_p), 0.0)
    ss = s.sum(dim, keepdim=True)
    c = torch.where(ss > 0, (s * g).sum(dim, keepdim=True) / ss, 0.0)  # fully masked rows: 0
    dx = s * (g - c)
    if not need_da:
        return dx, None
    xx = -a1_eff * log_p
    a1_sq = (a1_eff * a1_eff).masked_fill(soft, 1.0) if torch.is_tensor(a1_eff) else (a1_eff**2 or 1.0)
    a_small = p * log_p * log_p * _psi_series(xx)
    a_big = (s - p - p * xx) / a1_sq
    A = torch.where(support, torch.where(xx < _PSI_SWITCH[p.dtype], a_small, a_big), 0.0)
    da = -(g * A).sum(dim, keepdim=True) + c * A.sum(dim, keepdim=True)
    return dx, da
