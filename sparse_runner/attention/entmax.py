"""Sparse attention normalisers: sparsemax, 1.5-entmax and alpha-entmax, with exact gradients.

    alpha-entmax(x) = argmax_{p in simplex} <p, x> + H_alpha(p)      (Tsallis entropy H_alpha)
    p_i = [(alpha - 1) x_i - tau]_+^(1 / (alpha - 1)),  tau such that sum_i p_i = 1.

alpha = 1 is softmax, alpha = 2 is sparsemax; 1 < alpha < 2 interpolates (Peters et al. 2019,
Correia et al. 2019 "Adaptively Sparse Transformers").  Valid range here: 1 <= alpha <= 2.

Public functions (all along `dim`, any dim; `backend` overrides the global choice for one call):
    sparsemax(x, dim=-1, *, backend=None)
    entmax15(x, dim=-1, *, backend=None)
    alpha_entmax(x, alpha, dim=-1, *, backend=None)
Threshold API (last dim, no autograd; for memory-efficient attention, which keeps one (t, F) per row
and recomputes the weights bitwise in backward; see entmax_threshold for the representation):
    entmax_threshold(x, alpha, *, backend=None) -> (p, params (..., 2) float64)
    entmax_from_threshold(x, alpha, params, *, backend=None) -> p
    entmax_backward(p, g, alpha, *, need_dalpha, backend=None) -> (dx, dalpha per row or None)

* `x`: float tensor of any shape, entries finite or -inf (NaN / +inf give NaN rows, as in softmax).
  float32 / float64 are computed in their own dtype; float16 / bfloat16 are computed in float32 and
  returned in the input dtype.
* `alpha`: a Python float in [1, 2] (ValueError outside), or a tensor broadcastable to x's shape with
  size 1 along `dim`: a scalar tensor, one alpha per head (shape (1, H, 1, 1) for scores
  (B, H, Nq, Nk)), or one per row.  Gradients flow to a tensor alpha (summed down to its shape).
  Tensor values are not validated (that would need a device sync); they are used clamped to [1, 2].
  The usual learned parameterisation alpha = 1 + sigmoid(a) stays inside.
* `-inf` entries get exactly 0; a fully `-inf` row gives zeros and zero gradients (never NaN).
* alpha - 1 < ALPHA_SOFTMAX_THRESHOLD is computed as softmax (the alpha -> 1 limit); its gradient wrt
  alpha is the alpha = 1 limit of dp/dalpha.

Gradients (Correia et al. 2019, Prop. 1), with s_i = p_i^(2 - alpha) on the support, 0 elsewhere:
    dL/dx = s * (g - <s, g> / sum(s))                   [Jacobian diag(s) - s s^T / sum(s)]
    dp_i/dalpha = (p_i - p~_i) / (alpha-1)^2 + (h_i - p~_i H) / (alpha-1),
        p~ = s / sum(s),  h_i = -p_i log p_i,  H = sum_j h_j.
  The alpha formula cancels catastrophically as alpha -> 1 (two O(1/(alpha-1)) terms).  Writing
  s_i = p_i exp(x_i) with x_i = -(alpha-1) log p_i and psi(x) = (e^x - 1 - x) / x^2, it is exactly
    dp_i/dalpha = -A_i + p~_i sum_j A_j,   A_i = p_i (log p_i)^2 psi(x_i)
  (expand the numerators: everything first-order in alpha-1 cancels analytically), which is accurate
  for every alpha in [1, 2] when psi uses its Taylor series for small x.  At alpha = 1 (psi = 1/2) it
  is the paper's limit (-p_i log^2 p_i + p_i sum_j p_j log^2 p_j) / 2.

Backends (same maths, tested against each other and against the `entmax` package):
* "cpp": fused C++ kernel for CPU float32/float64 (`kernels/entmax_cpu.cpp`), compiled on first use.
* "torch": pure PyTorch, vectorised, any device (CUDA included).
`set_backend("auto" | "cpp" | "torch")` or the environment variable SPARSE_RUNNER_ENTMAX_BACKEND
choose; "auto" (default) uses cpp for CPU tensors when it builds, torch otherwise.  "cpp" applies to
CPU tensors only (other devices always use torch).  If the build fails, one warning is logged and
torch is used.  `active_backend(device)` says which one runs (for metrics.json).

torch.compile: the cpp backend is an opaque extension call (a graph break); the torch backend has
data-dependent loops with host syncs and is meant for eager mode.  A compiled CUDA variant is not
provided (nothing here could test it).
"""

from __future__ import annotations

import os
from typing import Union

import torch
from torch.autograd import Function

__all__ = [
    "sparsemax",
    "entmax15",
    "alpha_entmax",
    "entmax_threshold",
    "entmax_from_threshold",
    "entmax_backward",
    "set_backend",
    "get_backend",
    "active_backend",
    "ALPHA_SOFTMAX_THRESHOLD",
    "BACKENDS",
    "BACKEND_ENV",
]

Alpha = Union[float, torch.Tensor]

# alpha - 1 below this is computed as softmax.  Why this value: alpha-entmax differs from softmax by
# about C * (alpha - 1), with C = max |dp/dalpha| at alpha = 1.  Measured in float64 against the exact
# (Newton) alpha-entmax: C <= 4 for 128 keys, <= 9 for 2048 keys and <= 17.4 for 65536 keys, the worst
# rows being a single large score holding about half the mass over a flat rest (N(0,1) scores give
# C <= 1, N(0,9) scores C <= 8).  5e-7 therefore keeps the substitution error below 1e-5
# (8.7e-6) for rows of up to 64k keys.  Above it both backends are accurate down to alpha - 1 ~ 1e-7:
# they iterate on u = (tau + 1) / (alpha - 1) with log1p, which does not degenerate as alpha -> 1.
ALPHA_SOFTMAX_THRESHOLD = 5e-7

BACKENDS = ("auto", "cpp", "torch")
BACKEND_ENV = "SPARSE_RUNNER_ENTMAX_BACKEND"

# Newton stops at |sum p - 1| <= tol and divides by sum p; the output error is then <= ~tol.
_TOL = {torch.float32: 2e-6, torch.float64: 1e-12}
# psi(x) = (e^x - 1 - x) / x^2: Taylor series below the switch, direct formula above (the direct
# formula loses log10(1 / (x^2/2)) digits, so float32 switches later than float64).
_PSI_SWITCH = {torch.float32: 1.0, torch.float64: 0.1}
_MAX_ITER = 64


def _backend_from_env() -> str:
    name = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={name!r}: expected one of {BACKENDS}")
    return name


_backend = _backend_from_env()


def set_backend(name: str) -> None:
    """Choose the backend for later calls: 'auto' (default), 'cpp' or 'torch'."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    _backend = name


def get_backend() -> str:
    """The configured backend name ('auto', 'cpp' or 'torch'), not necessarily the one that runs."""
    return _backend


def _cpp_module():
    from sparse_runner.attention.kernels import load_entmax_cpu

    return load_entmax_cpu()


def active_backend(device: torch.device | str = "cpu", backend: str | None = None) -> str:
    """'cpp' or 'torch': the backend that computes tensors on `device` (builds the kernel if needed)."""
    name = backend or _backend
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "torch" or torch.device(device).type != "cpu":
        return "torch"
    return "cpp" if _cpp_module() is not None else "torch"


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------


def sparsemax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """Sparsemax (alpha = 2) along `dim`: Euclidean projection onto the simplex.  Same shape as x."""
    return alpha_entmax(x, 2.0, dim, backend=backend)


def entmax15(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """1.5-entmax along `dim` (exact, sort-free).  Same shape as x."""
    return alpha_entmax(x, 1.5, dim, backend=backend)


def alpha_entmax(x: torch.Tensor, alpha: Alpha, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """alpha-entmax along `dim`.  Same shape and dtype as x.

    alpha: float in [1, 2], or a tensor broadcastable to x.shape with size 1 along `dim` (scalar,
    per head e.g. (1, H, 1, 1) for x (B, H, Nq, Nk), or per row); a tensor alpha receives gradients.
    backend: override the global choice for this call ('auto', 'cpp', 'torch').
    """
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise TypeError("alpha_entmax: x must be a floating-point tensor")
    if x.dim() == 0:
        raise ValueError("alpha_entmax: x must have at least one dimension")
    dim = _normalise_dim(dim, x.dim())
    alpha = _check_alpha(alpha, x, dim)
    if x.numel() == 0:  # nothing to normalise (and no row to take a max over)
        return x.clone()
    xc = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    if active_backend(x.device, backend) == "cpp":
        # The C++ module carries its own autograd node (backward without Python).
        alpha_t = alpha if torch.is_tensor(alpha) else _scalar_alpha(alpha)
        out = _cpp_module().entmax(xc, alpha_t, dim, ALPHA_SOFTMAX_THRESHOLD)
    elif isinstance(alpha, float):
        out = _EntmaxFunction.apply(xc, None, alpha, dim)
    else:
        out = _EntmaxFunction.apply(xc, alpha, None, dim)
    return out if out.dtype == x.dtype else out.to(x.dtype)


# ------------------------------------------------------------------------------------------------
# Threshold API (no autograd): for callers that keep one threshold per row instead of the weights
# (memory-efficient attention recomputes a block's weights in backward from them).
# ------------------------------------------------------------------------------------------------


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
    alpha = _check_alpha(alpha, x, x.dim() - 1)
    if x.numel() == 0:
        return x.clone(), x.new_empty(x.shape[:-1] + (2,), dtype=torch.float64)
    if active_backend(x.device, backend) == "cpp":
        p, params = _cpp_module().threshold(x.reshape(-1, n).contiguous(), _cpp_alpha_rows(alpha, x), ALPHA_SOFTMAX_THRESHOLD)
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
    alpha = _check_alpha(alpha, x, x.dim() - 1)
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
        p = _cpp_module().from_threshold(
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
    alpha = _check_alpha(alpha, p, p.dim() - 1)
    g = g.to(p.dtype)
    if p.numel() == 0:
        return torch.zeros_like(p), (p.new_zeros(p.shape[:-1] + (1,)) if need_dalpha else None)
    if active_backend(p.device, backend) == "cpp":
        dx, da = _cpp_module().backward(
            p.reshape(-1, n).contiguous(), g.reshape(-1, n).contiguous(), _cpp_alpha_rows(alpha, p),
            ALPHA_SOFTMAX_THRESHOLD, need_dalpha,
        )
        return dx.view(p.shape), (da.view(p.shape[:-1] + (1,)).to(p.dtype) if need_dalpha else None)
    dx, da = _torch_backward(p, g, _torch_alpha(alpha, p), -1, need_dalpha)
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
        return _scalar_alpha(alpha).reshape(1)
    a = alpha.detach()
    if a.numel() == 1:
        return a.reshape(1).to(torch.float64)
    return a.expand(x.shape[:-1] + (1,)).reshape(-1).to(torch.float64).contiguous()


def _torch_alpha(alpha: Alpha, x: torch.Tensor) -> Alpha:
    """A tensor alpha in x's dtype, clamped to [1, 2] (the C++ contract); a float as it is."""
    return alpha if not torch.is_tensor(alpha) else alpha.detach().to(x.dtype).clamp(1.0, 2.0)


_SCALAR_ALPHAS: dict[float, torch.Tensor] = {}


def _scalar_alpha(alpha: float) -> torch.Tensor:
    """A float alpha as a cached 0-d float64 CPU tensor (what the C++ entry point takes)."""
    t = _SCALAR_ALPHAS.get(alpha)
    if t is None:
        if len(_SCALAR_ALPHAS) > 256:
            _SCALAR_ALPHAS.clear()
        t = _SCALAR_ALPHAS[alpha] = torch.tensor(alpha, dtype=torch.float64)
    return t


def _normalise_dim(dim: int, ndim: int) -> int:
    if not -ndim <= dim < ndim:
        raise IndexError(f"dim {dim} out of range for a {ndim}-D tensor")
    return dim % ndim


def _check_alpha(alpha: Alpha, x: torch.Tensor, dim: int) -> Alpha:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, torch.Tensor)):
        raise TypeError(f"alpha must be a float or a tensor, got {type(alpha).__name__}")
    if not torch.is_tensor(alpha):
        alpha = float(alpha)
        if not 1.0 <= alpha <= 2.0:
            raise ValueError(f"alpha must be in [1, 2], got {alpha}")
        return alpha
    row_shape = list(x.shape)
    row_shape[dim] = 1
    # Broadcastable to row_shape: no more dims, and each trailing size is 1 or row_shape's.
    a_shape = alpha.shape
    offset = len(row_shape) - len(a_shape)
    ok = offset >= 0 and all(a == 1 or a == r for a, r in zip(a_shape, row_shape[offset:]))
    if not ok:
        raise ValueError(
            f"alpha of shape {tuple(alpha.shape)} must broadcast to {tuple(row_shape)} (x's shape with size 1 along dim {dim})"
        )
    if not alpha.is_floating_point():
        alpha = alpha.to(x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32)
    return alpha.to(x.device)


# ------------------------------------------------------------------------------------------------
# Autograd wiring
# ------------------------------------------------------------------------------------------------


class _EntmaxFunction(Function):
    """The "torch" backend: x (float32/64) -> alpha-entmax(x) along dim; alpha_t (tensor) or alpha_f
    (float) is given.  (The "cpp" backend has the same wiring in C++: kernels/entmax_cpu.cpp.)"""

    @staticmethod
    def forward(ctx, x, alpha_t, alpha_f, dim):
        ctx.dim, ctx.alpha_f = dim, alpha_f
        ctx.alpha_shape = None if alpha_t is None else alpha_t.shape
        ctx.alpha_dtype = None if alpha_t is None else alpha_t.dtype
        alpha = alpha_f if alpha_t is None else alpha_t.detach().to(x.dtype)
        out = _torch_forward(x.detach(), alpha, dim)
        ctx.save_for_backward(out, None if alpha_t is None else alpha)
        return out

    @staticmethod
    def backward(ctx, grad):
        need_da = ctx.alpha_shape is not None and ctx.needs_input_grad[1]
        out, alpha = ctx.saved_tensors
        alpha = ctx.alpha_f if alpha is None else alpha
        dx, da = _torch_backward(out, grad.to(out.dtype), alpha, ctx.dim, need_da)
        if need_da:
            da = da.sum_to_size(ctx.alpha_shape).to(ctx.alpha_dtype)
        if not ctx.needs_input_grad[0]:
            dx = None
        return dx, da, None, None


# ------------------------------------------------------------------------------------------------
# "torch" backend: forward
# ------------------------------------------------------------------------------------------------


def _torch_forward(x: torch.Tensor, alpha: Alpha, dim: int) -> torch.Tensor:
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
            hi, lo = _split(_sparsemax_torch(y, dim), y.dtype)
            p = ((y - hi) - lo).clamp_min(0.0)
        elif alpha == 1.5:
            hi, lo = _split(_entmax15_torch(y, dim, skip), y.dtype)
            p = ((y / 2 - hi) - lo).clamp_min(0.0).square()
        else:
            p = _polish_output(x, y, *_newton_torch(y, a1, dim, skip), a1, m, dim, skip)
    else:
        a1 = (alpha - 1.0).clamp(0.0, 1.0)
        soft = a1 < ALPHA_SOFTMAX_THRESHOLD
        a1 = a1.masked_fill(soft, 0.5)  # 0.5: any valid value, replaced below
        p = _polish_output(x, y, *_newton_torch(y, a1, dim, skip), a1, m, dim, skip | soft)
        if bool(soft.any()):
            p = torch.where(soft, torch.softmax(y, dim), p)
    return p.masked_fill(dead, 0.0).masked_fill(bad, float("nan"))


def _split(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 threshold as hi + lo in dtype: y - t evaluated as (y - hi) - lo keeps its precision
    (a float32 t alone shifts every entry the same way by up to half an ulp of t, which on thousands
    of entries in the support moves the row sum by ~1e-4)."""
    hi = t.to(dtype)
    return hi, torch.where(t.isfinite(), t - hi.double(), 0.0).to(dtype)


def _sparsemax_torch(y: torch.Tensor, dim: int) -> torch.Tensor:
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


def _entmax15_torch(y: torch.Tensor, dim: int, dead: torch.Tensor) -> torch.Tensor:
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


def _newton_torch(y: torch.Tensor, a1: Alpha, dim: int, dead: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    a1 float or (K, 1), t (K, 1) float64.  Stops when the error the last step leaves (its quadratic
    term) no longer matters by _bias_effect."""
    parts = _a1_parts(a1, x)
    a1d = a1 if isinstance(a1, float) else a1.double()
    todo = torch.ones_like(t, dtype=torch.bool)
    for _ in range(_POLISH_STEPS):
        h, delta, k = _general_d(*_x_minus_t(x, t), parts)
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


def _polished_u(x, y, p, u, a1: Alpha, m, skip) -> torch.Tensor:
    """u (float64, last dim) of _newton_torch, polished where _polish_rows says so (float32)."""
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


def _polish_output(x, y, p, u, a1: Alpha, m, dim: int, skip) -> torch.Tensor:
    """p of _newton_torch (float32: the rows that need it rewritten from polished thresholds)."""
    if x.dtype != torch.float32:
        return p
    sel = _polish_rows(y, p, u, a1, dim, skip)
    if not bool(sel.any()):
        return p
    rows = sel.movedim(dim, -1)[..., 0]
    xs = x.movedim(dim, -1)[rows]
    a1s = a1 if isinstance(a1, float) else a1.expand(sel.shape).movedim(dim, -1)[rows]
    t = _polish_t(xs, a1s, (m.double() + u.double()).movedim(dim, -1)[rows])
    w = _general_weights(*_x_minus_t(xs, t), _a1_parts(a1s, xs))
    F = w.sum(-1, keepdim=True, dtype=torch.float64)
    p = p.movedim(dim, -1).clone()
    p[rows] = w * (1.0 / F).to(w.dtype)
    return p.movedim(-1, dim)


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
            u = 1.0 + _sparsemax_torch(y, -1)
        elif alpha == 1.5:  # p = (y / 2 - tau)^2 = (1 + (y - u) / 2)^2
            u = 2.0 + 2.0 * _entmax15_torch(y, -1, skip)
        else:
            u = _polished_u(x, y, *_newton_torch(y, a1, -1, skip), a1, m, skip)
    else:
        a1 = (alpha - 1.0).clamp(0.0, 1.0)
        soft = a1 < ALPHA_SOFTMAX_THRESHOLD
        a1 = a1.masked_fill(soft, 0.5)
        u = _polished_u(x, y, *_newton_torch(y, a1, -1, skip), a1, m, skip | soft)
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
    r, c = _x_minus_t(x, t)
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
        return _general_weights(r, c, _a1_parts(a1, r))
    a1 = (alpha - 1.0).clamp(0.0, 1.0)
    soft = a1 < ALPHA_SOFTMAX_THRESHOLD
    return torch.where(soft, torch.exp(r + c), _general_weights(r, c, _a1_parts(a1.masked_fill(soft, 1.0), r)))


def _x_minus_t(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x - t (t float64) as r + c in x's dtype: r = x - t_hi rounded, c its exact error (TwoSum) - t_lo."""
    t_hi = t.to(x.dtype)
    t_lo = torch.where(t.isfinite(), t - t_hi.double(), 0.0).to(x.dtype)
    r = x - t_hi
    bb = r - x
    c = torch.where(r > float("-inf"), ((x - (r - bb)) + (-t_hi - bb)) - t_lo, 0.0)
    return r, c


def _a1_parts(a1: Alpha, like: torch.Tensor) -> tuple:
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


def _general_weights(r: torch.Tensor, c: torch.Tensor, a1: tuple) -> torch.Tensor:
    """[1 + a1 (r + c)]_+^k (a1 from _a1_parts) with log d = log h + delta / h (accurate as a1 -> 0
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


# ------------------------------------------------------------------------------------------------
# "torch" backend: backward
# ------------------------------------------------------------------------------------------------


def _psi_series(x: torch.Tensor) -> torch.Tensor:
    """psi(x) = (e^x - 1 - x) / x^2 = sum_j x^j / (j+2)!, 9 terms (rel. error < 3e-8 for x < 1)."""
    r = torch.full_like(x, 1.0 / 3628800)
    for c in (362880, 40320, 5040, 720, 120, 24, 6, 2):
        r = r * x + 1.0 / c
    return r


def _torch_backward(p: torch.Tensor, g: torch.Tensor, alpha: Alpha, dim: int, need_da: bool):
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
