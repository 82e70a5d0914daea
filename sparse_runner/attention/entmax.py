"""Sparse attention normalisers: sparsemax, 1.5-entmax and alpha-entmax, with exact gradients.

    alpha-entmax(x) = argmax_{p in simplex} <p, x> + H_alpha(p)      (Tsallis entropy H_alpha)
    p_i = [(alpha - 1) x_i - tau]_+^(1 / (alpha - 1)),  tau such that sum_i p_i = 1.

alpha = 1 is softmax, alpha = 2 is sparsemax; 1 < alpha < 2 interpolates (Peters et al. 2019,
Correia et al. 2019 "Adaptively Sparse Transformers").  Valid range here: 1 <= alpha <= 2.

Public functions (all along `dim`, any dim; `backend` overrides the global choice for one call):
    sparsemax(x, dim=-1, *, backend=None)
    entmax15(x, dim=-1, *, backend=None)
    alpha_entmax(x, alpha, dim=-1, *, backend=None)
The threshold API (last dim, no autograd: entmax_threshold, entmax_from_threshold, entmax_backward) is
in entmax_thresholds.py; the "torch" backend's solvers in entmax_torch.py, the float32 polish of their
threshold in entmax_polish.py.

* `x`: float tensor of any shape, entries finite or -inf (NaN / +inf give NaN rows, as in softmax).
  float32 / float64 are computed in their own dtype; float16 / bfloat16 are computed in float32 and
  returned in the input dtype.
* `alpha`: a Python float in [1, 2] (ValueError outside), or a tensor broadcastable to x's shape with
  size 1 along `dim`: a scalar tensor, one alpha per head (shape (1, H, 1, 1) for scores
  (B, H, Nq, Nk)), or one per row.  Gradients flow to a tensor alpha (summed down to its shape).
  Tensor values are not validated (that would need a device sync); they are used clamped to [1, 2].
  The usual learned parameterisation alpha = 1 + sigmoid(a) stays inside.
* `-inf` entries get exactly 0; a fully `-inf` row gives zeros and zero gradients (never NaN).
* alpha - 1 < ALPHA_SOFTMAX_THRESHOLD (entmax_torch.py) is computed as softmax (the alpha -> 1 limit);
  its gradient wrt alpha is the alpha = 1 limit of dp/dalpha.

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

torch.compile: the cpp backend is a registered operator there (`_cpp_entmax_traced`), an opaque call inside
the graph; the torch backend has data-dependent loops with host syncs and is meant for eager mode.  A compiled CUDA variant is not
provided (nothing here could test it).
"""

from __future__ import annotations

import os

import torch
from torch.autograd import Function

from sparse_runner.attention.entmax_polish import Alpha
from sparse_runner.attention.entmax_torch import ALPHA_SOFTMAX_THRESHOLD, torch_backward, torch_forward
from sparse_runner.attention.kernels.operator import KernelOperator

__all__ = [
    "sparsemax",
    "entmax15",
    "alpha_entmax",
    "set_backend",
    "get_backend",
    "active_backend",
    "BACKENDS",
    "BACKEND_ENV",
]

BACKENDS = ("auto", "cpp", "torch")
BACKEND_ENV = "SPARSE_RUNNER_ENTMAX_BACKEND"


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


def cpp_module():
    """The compiled C++ kernels (kernels/entmax_cpu.cpp), built on the first call; None where they cannot be built."""
    from sparse_runner.attention.kernels import load_entmax_cpu

    return load_entmax_cpu()


def active_backend(device: torch.device | str = "cpu", backend: str | None = None) -> str:
    """'cpp' or 'torch': the backend that computes tensors on `device` (builds the kernel if needed)."""
    name = backend or _backend
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "torch" or torch.device(device).type != "cpu":
        return "torch"
    return "cpp" if cpp_module() is not None else "torch"


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
    alpha = check_alpha(alpha, x, dim)
    if x.numel() == 0:  # nothing to normalise (and no row to take a max over)
        return x.clone()
    xc = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    if active_backend(x.device, backend) == "cpp":
        if torch.compiler.is_compiling():
            out = _cpp_entmax_traced(xc, alpha, dim)
        else:  # the C++ module carries its own autograd node (backward without Python)
            alpha_t = alpha if torch.is_tensor(alpha) else scalar_alpha(alpha)
            out = cpp_module().entmax(xc, alpha_t, dim, ALPHA_SOFTMAX_THRESHOLD)
    elif isinstance(alpha, float):
        out = _EntmaxFunction.apply(xc, None, alpha, dim)
    else:
        out = _EntmaxFunction.apply(xc, alpha, None, dim)
    return out if out.dtype == x.dtype else out.to(x.dtype)


_SCALAR_ALPHAS: dict[float, torch.Tensor] = {}


def scalar_alpha(alpha: float) -> torch.Tensor:
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


def check_alpha(alpha: Alpha, x: torch.Tensor, dim: int) -> Alpha:
    """alpha as the solvers take it: a float in [1, 2], or a floating-point tensor on x's device that broadcasts
    to x's shape with size 1 along `dim`; TypeError or ValueError (one line) otherwise."""
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
        out = torch_forward(x.detach(), alpha, dim)
        ctx.save_for_backward(out, None if alpha_t is None else alpha)
        return out

    @staticmethod
    def backward(ctx, grad):
        need_da = ctx.alpha_shape is not None and ctx.needs_input_grad[1]
        out, alpha = ctx.saved_tensors
        alpha = ctx.alpha_f if alpha is None else alpha
        dx, da = torch_backward(out, grad.to(out.dtype), alpha, ctx.dim, need_da)
        if need_da:
            da = da.sum_to_size(ctx.alpha_shape).to(ctx.alpha_dtype)
        if not ctx.needs_input_grad[0]:
            dx = None
        return dx, da, None, None


# Under torch.compile the C++ kernels are called as registered operators (kernels/operator.py): Dynamo cannot trace
# the pybind module's `entmax` (a graph break per call), and its C++ autograd node, which eager calls keep (it costs
# less per call than an operator's Python autograd on small inputs), is opaque to AOTAutograd.


def _cpp_entmax_traced(x: torch.Tensor, alpha: Alpha, dim: int) -> torch.Tensor:
    """The "cpp" backend's alpha-entmax along `dim` through `_CPP_ROWS` (x float32/64; alpha as `check_alpha` leaves it)."""
    x_last = x.movedim(dim, -1).contiguous()
    if not torch.is_tensor(alpha):
        alpha_rows = torch.full((1,), alpha, dtype=torch.float64)
    elif alpha.numel() == 1:
        alpha_rows = alpha.to(torch.float64).reshape(1)
    else:  # one alpha per row of x_last, its gradient summed back to alpha's shape by the expand
        row_shape = list(x.shape)
        row_shape[dim] = 1
        alpha_rows = alpha.to(torch.float64).expand(row_shape).movedim(dim, -1).reshape(-1)
    p = _CPP_ROWS(x_last.view(-1, x_last.shape[-1]), alpha_rows)
    return p.view(x_last.shape).movedim(-1, dim)


def _cpp_rows(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """alpha-entmax over the rows of x (rows, n), contiguous; alpha (1,) or (rows,) float64."""
    return cpp_module().forward(x, alpha.detach().contiguous(), ALPHA_SOFTMAX_THRESHOLD)


def _cpp_rows_backward(p: torch.Tensor, grad: torch.Tensor, alpha: torch.Tensor, need_dalpha: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dalpha per row float64, empty unless need_dalpha) for `_cpp_rows`'s output p."""
    dx, dalpha = cpp_module().backward(p, grad.to(p.dtype).contiguous(), alpha.detach().contiguous(), ALPHA_SOFTMAX_THRESHOLD, need_dalpha)
    return dx, dalpha


def _cpp_rows_save(ctx, inputs, p) -> None:
    ctx.save_for_backward(p, inputs[1])


def _cpp_rows_gradients(ctx, grads, backward):
    p, alpha = ctx.saved_tensors
    need_dalpha = ctx.needs_input_grad[1]
    dx, dalpha = backward(p, grads[0], alpha, need_dalpha)
    if alpha.numel() == 1 and need_dalpha:
        dalpha = dalpha.sum().reshape(1)
    return dx, dalpha if need_dalpha else None


_CPP_ROWS = KernelOperator(
    "entmax_rows_cpu", _cpp_rows, _cpp_rows_backward, device_types="cpu", save=_cpp_rows_save, gradients=_cpp_rows_gradients,
    fake_forward=lambda x, alpha: torch.empty_like(x),
    fake_backward=lambda p, grad, alpha, need: (torch.empty_like(p), p.new_empty(p.shape[0] if need else 0, dtype=torch.float64)),
)
