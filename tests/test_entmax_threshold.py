"""The threshold API of sparse_runner.attention.entmax: entmax_threshold, entmax_from_threshold and
entmax_backward (no autograd; memory-efficient attention keeps (t, F) per row and recomputes the
weights in backward, so recomputation must give the forward's weights bitwise)."""

from __future__ import annotations

import pytest
import torch

from sparse_runner.attention import entmax as E
from sparse_runner.attention import entmax_thresholds as T

entmax_pkg = pytest.importorskip("entmax")

ALPHAS = [1.0, 1.2, 1.5, 2.0, "head"]
DTYPES = [torch.float32, torch.float64]


def scores(n: int = 37, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    """(B=2, H=3, R=5, n) scores with -inf masks, a fully masked row and a single-entry row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, n, generator=g, dtype=torch.float64) * 3
    x[0, 1, :, n // 3 :] = float("-inf")  # a padding mask
    x[1, 0, torch.rand(5, n, generator=g) < 0.4] = float("-inf")
    x[1, 0, :, 0] = 0.5  # ... that keeps one finite entry
    x[0, 2, 3] = float("-inf")  # a fully masked row
    x[1, 2, 4, 1:] = float("-inf")  # one finite entry
    return x.to(dtype)


def make_alpha(alpha, dtype, seed: int = 1):
    if alpha != "head":
        return alpha
    g = torch.Generator().manual_seed(seed)
    a = 1 + torch.sigmoid(torch.randn(1, 3, 1, 1, generator=g, dtype=torch.float64))
    a[0, 1] = 1.5  # a tensor alpha exactly 1.5 takes the 1.5 path of the C++ kernel
    return a.to(dtype)


def reference(x: torch.Tensor, alpha) -> torch.Tensor:
    """float64 oracle: the entmax package (bisection / exact sort), softmax; masked rows -> 0."""
    x = x.double()
    dead = (x == float("-inf")).all(-1, keepdim=True)
    xs = torch.where(dead, 0.0, x)
    if isinstance(alpha, float) and alpha == 1.0:
        ref = torch.softmax(xs, -1)
    elif isinstance(alpha, float) and alpha == 2.0:
        ref = entmax_pkg.sparsemax(xs, -1)
    elif isinstance(alpha, float) and alpha == 1.5:
        ref = entmax_pkg.entmax15(xs, -1)
    else:
        a = alpha if isinstance(alpha, float) else alpha.double().expand(x.shape[:-1] + (1,))
        ref = entmax_pkg.entmax_bisect(xs, a, dim=-1, n_iter=100)
    return torch.where(dead, 0.0, ref)


@pytest.mark.parametrize("n", [1, 37, 129, 1000])
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_threshold_matches_entmax_and_reproduces_bitwise(backend, dtype, alpha, n):
    x = scores(n, dtype)
    a = make_alpha(alpha, dtype)
    p, params = T.entmax_threshold(x, a, backend=backend)
    assert p.shape == x.shape and p.dtype == dtype
    assert params.shape == x.shape[:-1] + (2,) and params.dtype == torch.float64
    assert not p.isnan().any() and not params.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    assert (p.double() - reference(x, a)).abs().max().item() <= tol
    assert (p - E.alpha_entmax(x, a, backend=backend)).abs().max().item() <= tol
    assert (p[x == float("-inf")] == 0).all()
    assert (p[0, 2, 3] == 0).all()  # fully masked row
    assert torch.equal(T.entmax_from_threshold(x, a, params, backend=backend), p)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_from_threshold_on_column_subsets_and_other_layouts(backend, dtype, alpha):
    """Each weight depends on its own score only: any column subset (as memory-efficient attention's
    gathered key blocks) and any layout give the forward's weights bitwise."""
    x = scores(203, dtype, seed=2)
    a = make_alpha(alpha, dtype)
    p, params = T.entmax_threshold(x, a, backend=backend)
    cols = torch.tensor([0, 5, 6, 7, 64, 65, 100, 150, 201, 202])
    assert torch.equal(T.entmax_from_threshold(x[..., cols], a, params, backend=backend), p[..., cols])
    assert torch.equal(T.entmax_from_threshold(x[..., 17:150], a, params, backend=backend), p[..., 17:150])
    # non-contiguous input: same result as its contiguous copy
    xt = x.transpose(0, 2).contiguous().transpose(0, 2)
    p2, params2 = T.entmax_threshold(xt, a, backend=backend)
    assert torch.equal(p2, p) and torch.equal(params2, params)


def test_fully_masked_rows(backend):
    x = torch.full((3, 11), float("-inf"))
    for alpha in (1.0, 1.3, 1.5, 2.0, torch.full((3, 1), 1.7)):
        p, params = T.entmax_threshold(x, alpha, backend=backend)
        assert (p == 0).all() and not params.isnan().any()
        assert (params[:, 0] == float("inf")).all() and (params[:, 1] == 1).all()
        assert (T.entmax_from_threshold(x, alpha, params, backend=backend) == 0).all()


@pytest.mark.parametrize("alpha", [1.0, 1.2, 1.5, 2.0, "head"])
def test_cpp_and_torch_thresholds_agree(cpp, alpha):
    for dtype, tol in ((torch.float32, 2e-6), (torch.float64, 1e-12)):
        x = scores(129, dtype, seed=3)
        a = make_alpha(alpha, dtype)
        p_c, prm_c = T.entmax_threshold(x, a, backend="cpp")
        p_t, prm_t = T.entmax_threshold(x, a, backend="torch")
        assert (p_c - p_t).abs().max().item() <= tol
        live = prm_c[..., 0].isfinite()
        assert torch.equal(live, prm_t[..., 0].isfinite())
        assert torch.allclose(prm_c[live], prm_t[live], rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_entmax_backward_matches_autograd_and_column_subsets(backend, dtype, alpha):
    x = scores(77, dtype, seed=4)
    a = make_alpha(alpha, dtype)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    need_da = torch.is_tensor(a)
    xg = x.clone().requires_grad_()
    ag = a.clone().requires_grad_() if need_da else a
    out = E.alpha_entmax(xg, ag, backend=backend)
    grads = torch.autograd.grad((out * g).sum(), (xg, ag) if need_da else (xg,))
    p, _ = T.entmax_threshold(x, a, backend=backend)
    dx, da = T.entmax_backward(p, g, a, need_dalpha=need_da, backend=backend)
    assert dx.shape == x.shape and dx.dtype == dtype
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-9)
    assert torch.allclose(dx, grads[0], **tol)
    if not need_da:
        assert da is None
    else:
        assert da.shape == x.shape[:-1] + (1,) and da.dtype == dtype
        assert torch.allclose(da.sum(dim=(0, 2, 3)).reshape(a.shape), grads[1], **tol)
    # On a column subset holding every row's support the results are the same (exactly: same sums).
    support = (p > 0).flatten(0, -2).any(0)
    cols = torch.nonzero(support | (torch.arange(x.shape[-1]) % 5 == 0)).squeeze(1)
    dx_s, da_s = T.entmax_backward(p[..., cols], g[..., cols], a, need_dalpha=need_da, backend=backend)
    assert torch.allclose(dx_s, dx[..., cols], atol=1e-6 if dtype == torch.float32 else 1e-14, rtol=0)
    assert (dx[..., ~support] == 0).all()
    if need_da:
        assert torch.allclose(da_s, da, atol=1e-6 if dtype == torch.float32 else 1e-14, rtol=0)


def test_threshold_api_validation():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="float32 or float64"):
        T.entmax_threshold(x.half(), 1.5)
    with pytest.raises(ValueError, match=r"alpha must be in \[1, 2\]"):
        T.entmax_threshold(x, 2.5)
    p, params = T.entmax_threshold(x, 1.5)
    with pytest.raises(ValueError, match="float64"):
        T.entmax_from_threshold(x, 1.5, params.float())
    with pytest.raises(ValueError, match="do not match"):
        T.entmax_from_threshold(x, 1.5, torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="must match"):
        T.entmax_backward(p, torch.zeros(3, 5), 1.5, need_dalpha=False)
