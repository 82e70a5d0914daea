"""The fused CPU attention kernel (model.attention_impl=cpp, kernels/entmax_attention_cpu.{cpp,py}) against
the explicit path in float64: outputs and gradients wrt q, k, v and alpha, for every alpha, padding (a
sequence without any real key included), causality with fewer queries than keys, every block size, long
flat rows, half-precision inputs; bitwise the same gradients at any thread count; the backward's weights
bitwise the forward's; and its place in the model and the config."""

from __future__ import annotations

import math

import pytest
import torch

from sparse_runner.analysis.attention_stats import AttentionStats
from sparse_runner.attention import AttentionSpec, MultiHeadAttention, entmax
from sparse_runner.attention import memory_efficient as me
from sparse_runner.attention.kernels import entmax_attention_cpu as kernel
from sparse_runner.attention.spec import check_attention_impl_device
from sparse_runner.checks import ConfigError
from tests.test_combinations import plain  # noqa: F401  (fixture: registers the "window" pattern)
from tests.test_memory_efficient import ALPHAS, explicit, make_inputs

pytestmark = pytest.mark.skipif(not kernel.available(), reason="the C++ extension cannot be built here")


def grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad((out * g).sum(), inputs)


def against_float64(q, k, v, alpha, tol, *, absolute=False, **kwargs):
    """The kernel's output and gradients (inputs in their own dtype) against the explicit path's on the same
    inputs in float64: within `tol` of them in float64 (or with absolute=True); in float32, within tol * their
    largest magnitude, or of the explicit path's own float32 error: at most 4x it. The row kernels are shared
    (where a near-softmax head makes dq ill-conditioned, both are off by the same amount), and float32 sums
    taken in another order differ by a factor of 2 or 3 by chance; one running sum over 12,000 queries or
    20,000 keys was 6-11x off."""
    inputs = [q, k, v] + ([alpha] if torch.is_tensor(alpha) else [])
    out = kernel.entmax_attention(q, k, v, alpha, **kwargs)
    assert out.dtype == q.dtype
    got = [out, *grads(out, inputs)]
    wide = [x.detach().double().requires_grad_() for x in inputs]
    ref = explicit(*wide[:3], wide[3] if torch.is_tensor(alpha) else alpha, **kwargs)
    want = [ref, *grads(ref, wide)]
    same = None
    if q.dtype != torch.float64:
        same_out = explicit(q, k, v, alpha, **kwargs)
        same = [same_out, *grads(same_out, inputs)]
    for i, name in enumerate(["out", "dq", "dk", "dv", "dalpha"][: len(got)]):
        assert torch.isfinite(got[i]).all(), name
        err = (got[i].double() - want[i]).abs().max().item()
        if same is None or absolute:
            assert err <= tol, (name, err)
        else:
            explicit_err = (same[i].double() - want[i]).abs().max().item()
            assert err <= max(tol * want[i].abs().max().item(), 4 * explicit_err), (name, err, explicit_err)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("causal", [False, True])
def test_equals_explicit_float64(alpha, causal):
    n_q, n_k = (40, 77) if causal else (53, 131)  # causal with fewer queries: aligned to the end
    q, k, v, alpha = make_inputs(2, 3, n_q, n_k, 8, torch.float64, alpha, scale=2.0)
    padding = torch.rand(2, n_k, generator=torch.Generator().manual_seed(2)) > 0.2
    padding[1, :] = False  # a sequence without any real key: zero output, zero gradients
    against_float64(q, k, v, alpha, 1e-10, key_padding_mask=padding, causal=causal)
    out = kernel.entmax_attention(q, k, v, alpha, key_padding_mask=padding, causal=causal)
    assert out[1].abs().max() == 0


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("d", [16, 24, 64])
def test_float32_within_its_tolerance_of_float64(alpha, d):
    q, k, v, alpha = make_inputs(2, 3, 100, 300, d, torch.float32, alpha, scale=1.5)
    padding = torch.ones(2, 300, dtype=torch.bool)
    padding[0, 150:] = False
    padding[1, :7] = False  # left padding: masked inside the computed keys
    against_float64(q, k, v, alpha, 2e-5, key_padding_mask=padding)
    against_float64(q, k, v, alpha, 2e-5, causal=True)


@pytest.mark.parametrize("rows", [(8, 8), (4, 64)])
def test_any_block_size(monkeypatch, rows):
    monkeypatch.setattr(kernel, "MIN_ROWS", rows[0])
    monkeypatch.setattr(kernel, "MAX_ROWS", rows[1])
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 1)  # the smallest block: MIN_ROWS rows
    q, k, v, alpha = make_inputs(1, 2, 37, 37, 8, torch.float64, "per_head")
    against_float64(q, k, v, alpha, 1e-10, causal=True)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 1.75])
def test_long_flat_rows_at_general_alpha(alpha):
    """Rows of 20,000 nearly equal scores, where a float32 threshold solved carelessly is off by far more
    than float32's resolution of the weights (the polished thresholds of the row kernels). The outputs are
    means of about 20,000 values of v: float32 sums them to within about 1e-7."""
    g = torch.Generator().manual_seed(0)
    q = (0.01 * torch.randn(1, 1, 8, 16, generator=g)).requires_grad_()
    k = (0.01 * torch.randn(1, 1, 20000, 16, generator=g)).requires_grad_()
    v = torch.randn(1, 1, 20000, 16, generator=g).requires_grad_()
    against_float64(q, k, v, alpha, 1e-6, absolute=True)


@pytest.mark.parametrize("alpha", [1.25, 2.0])
def test_many_queries_per_key(alpha):
    """dk and dv sum over 12,000 queries: as close to float64 as the explicit path's blocked products."""
    g = torch.Generator().manual_seed(0)
    q = (0.3 * torch.randn(1, 1, 12000, 16, generator=g)).requires_grad_()
    k = (0.3 * torch.randn(1, 1, 300, 16, generator=g)).requires_grad_()
    v = torch.randn(1, 1, 300, 16, generator=g).requires_grad_()
    against_float64(q, k, v, alpha, 1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_computed_in_float32(dtype):
    q, k, v, alpha = make_inputs(1, 2, 40, 300, 16, torch.float32, "per_head")
    ref = kernel.entmax_attention(q, k, v, alpha)
    half = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out = kernel.entmax_attention(*half, alpha)
    assert out.dtype == dtype
    assert (out.float() - ref).abs().max() < 0.05
    out.float().sum().backward()
    assert all(x.grad.dtype == dtype and torch.isfinite(x.grad).all() for x in half)
    assert alpha.grad is not None and torch.isfinite(alpha.grad).all()


def test_gradcheck_float64():
    q, k, v, alpha = make_inputs(1, 2, 9, 13, 4, torch.float64, "per_head", scale=2.0)
    padding = torch.ones(1, 13, dtype=torch.bool)
    padding[0, 10:] = False
    assert torch.autograd.gradcheck(
        lambda q, k, v, a: kernel.entmax_attention(q, k, v, a, key_padding_mask=padding, causal=True), (q, k, v, alpha), atol=1e-7
    )


def test_gradients_are_bitwise_the_same_at_any_thread_count():
    q, k, v, alpha = make_inputs(4, 3, 70, 300, 16, torch.float32, "per_head", scale=1.5)
    inputs = [q, k, v, alpha]
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out = kernel.entmax_attention(q, k, v, alpha)
            results.append([out, *grads(out, inputs)])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0, "per_head"])
def test_backward_recomputes_the_forwards_weights_bitwise(alpha):
    """With v = I and dO = I, the output is the forward's weights and dV^T the backward's recomputed ones."""
    n = 300
    torch.manual_seed(0)
    eye = torch.eye(n).view(1, 1, n, n)
    k = torch.randn(1, 1, n, 32)
    q = (3 * k + torch.randn(1, 1, n, 32)).requires_grad_()
    v = eye.clone().requires_grad_()
    a = torch.tensor([1.7]) if alpha == "per_head" else alpha
    out = kernel.entmax_attention(q, k, v, a)
    out.backward(eye)
    assert torch.equal(out, v.grad.transpose(-2, -1))
    assert (out.sum(-1) - 1).abs().max() < 1e-5


def explicit_dropped(q, k, v, alpha, keep, rate, causal=False):
    """The explicit path (as tests/test_memory_efficient.py's `explicit`) with the weights multiplied by
    keep / (1 - rate) before v."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(s.shape[-1] - s.shape[-2]), float("-inf"))
    a = alpha.view(1, -1, 1, 1) if torch.is_tensor(alpha) else alpha
    return (entmax.alpha_entmax(s, a, dim=-1) * keep / (1 - rate)) @ v


@pytest.mark.parametrize("alpha", [1.5, "per_head"])
@pytest.mark.parametrize("rows", [8, 64])
def test_dropout_equals_the_explicit_path_with_the_kernels_mask(alpha, rows, monkeypatch):
    """At any block size: the mask is a function of (seed, pair, query, key) alone."""
    monkeypatch.setattr(kernel, "MIN_ROWS", rows)
    monkeypatch.setattr(kernel, "MAX_ROWS", rows)
    rate, seed = 0.3, 12345
    monkeypatch.setattr(torch, "randint", lambda *args, **kw: torch.tensor([seed]))  # the kernel's seed draw
    q, k, v, alpha = make_inputs(2, 3, 40, 70, 8, torch.float64, alpha, scale=2.0)
    keep = kernel.dropout_keep(seed, (2, 3, 40, 70), rate).double()
    inputs = [q, k, v] + ([alpha] if torch.is_tensor(alpha) else [])
    out = kernel.entmax_attention(q, k, v, alpha, causal=True, dropout_p=rate)
    ref = explicit_dropped(q, k, v, alpha, keep, rate, causal=True)
    for a, b in zip([out, *grads(out, inputs)], [ref, *grads(ref, inputs)]):
        assert (a - b).abs().max().item() < 1e-10


def test_dropout_masks_keep_their_rate_and_differ_by_seed():
    rate = 0.2
    keep = kernel.dropout_keep(7, (4, 8, 64, 512), rate)
    n = keep.numel()
    assert abs(keep.float().mean().item() - (1 - rate)) < 4 * (rate * (1 - rate) / n) ** 0.5
    assert not torch.equal(keep, kernel.dropout_keep(8, (4, 8, 64, 512), rate))
    assert keep[:, :, :, 0].float().mean().item() == pytest.approx(1 - rate, abs=0.05)  # no stuck column
    q, k, v, alpha = make_inputs(1, 2, 50, 300, 16, torch.float32, "per_head")
    torch.manual_seed(3)
    a = kernel.entmax_attention(q, k, v, alpha, dropout_p=rate)
    torch.manual_seed(3)
    assert torch.equal(a, kernel.entmax_attention(q, k, v, alpha, dropout_p=rate))  # the seed comes from torch's generator
    assert not torch.equal(a, kernel.entmax_attention(q, k, v, alpha, dropout_p=rate))


def test_nan_scores_give_nan_rows():
    q, k, v, _ = make_inputs(1, 1, 3, 300, 4, torch.float32, 1.5)
    k = k.detach().clone()
    k[0, 0, 5, 0] = float("nan")
    assert torch.isnan(kernel.entmax_attention(q, k, v, 1.5)).all()


# ------------------------------------------------------------------------------------------------
# In the model and the config
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normaliser", ["sparsemax", "entmax15", "alpha_entmax"])
@pytest.mark.parametrize("pattern", ["dense", "causal"])
def test_layer_and_analysis_match_the_explicit_path(normaliser, pattern):
    results = {}
    for impl in ("explicit", "cpp"):
        torch.manual_seed(0)
        layer = MultiHeadAttention(32, AttentionSpec(num_heads=4, normaliser=normaliser, pattern=pattern, impl=impl))
        x = torch.randn(2, 150, 32)
        padding = torch.ones(2, 150, dtype=torch.bool)
        padding[1, 100:] = False
        y = layer(x, key_padding_mask=padding)
        y.square().sum().backward()
        layer.eval()
        stats = AttentionStats()
        layer.observer = stats.update
        layer(x, key_padding_mask=padding)
        results[impl] = y, [p.grad for p in layer.parameters()], stats.summary()["self"]["layers"][0]
    (y1, g1, s1), (y2, g2, s2) = results["explicit"], results["cpp"]
    assert (y1 - y2).abs().max() < 1e-5
    assert all((a - b).abs().max() < 1e-4 for a, b in zip(g1, g2))
    assert s1["mean_density"] == pytest.approx(s2["mean_density"], abs=1e-6)


def test_auto_takes_the_kernel_above_its_crossover_and_the_layer_says_so():
    layer = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="entmax15"))
    for n, path in ((me.CPP_EXPLICIT_UP_TO, "explicit"), (me.CPP_EXPLICIT_UP_TO + 1, "cpp")):
        q = torch.randn(1, 2, n, 8)
        backend, reason = layer.backend_choice(q, q, None, 0.0)
        assert reason.startswith(f"{path}: CPU")


def test_a_pattern_mask_is_refused_in_one_line(tiny_config, plain):
    with pytest.raises(ConfigError) as error:
        tiny_config("model=entmax15", "model.attention_impl=cpp", "model.pattern=window")
    assert str(error.value).startswith("model.attention_impl: 'cpp' cannot apply the mask of pattern 'window'")
    assert "\n" not in str(error.value)
    tiny_config("model=entmax15", "model.attention_impl=cpp", "model.attention_dropout=0.1")  # dropout is taken


def test_cpp_is_refused_on_cuda(tiny_config):
    cfg = tiny_config("model=entmax15", "model.attention_impl=cpp")
    with pytest.raises(ConfigError, match=r"^model.attention_impl: cpp is the CPU kernel, and this run is on cuda"):
        check_attention_impl_device(cfg.model, torch.device("cuda"))



@pytest.mark.parametrize("pattern", ["local", "bigbird", "hst"])
@pytest.mark.parametrize("normaliser", ["sparsemax", "entmax15", "alpha_entmax"])
def test_block_patterns_compute_their_tiles_through_the_kernel(pattern, normaliser, monkeypatch):
    """A block pattern with a sparse normaliser on CPU sends its tiles (gathered keys, shared keys, masks) to
    the kernel: outputs and every gradient as the explicit tiles give them, in float64."""
    calls = []
    real = kernel.entmax_attention
    results = {}
    for built in (True, False):
        monkeypatch.setattr(kernel, "available", lambda built=built: built)
        monkeypatch.setattr(kernel, "entmax_attention", lambda *a, **kw: calls.append(built) or real(*a, **kw))
        torch.manual_seed(0)
        spec = AttentionSpec(num_heads=4, normaliser=normaliser, pattern=pattern, pattern_options={"block_size": 8})
        layer = MultiHeadAttention(32, spec).double()
        x = torch.randn(2, 70, 32, dtype=torch.float64, requires_grad=True)
        padding = torch.ones(2, 70, dtype=torch.bool)
        padding[1, 50:] = False
        y = layer(x, key_padding_mask=padding)
        y.square().sum().backward()
        results[built] = [y, x.grad, *(p.grad for p in layer.parameters())]
        reason = layer.backend_choice(x[:, None].expand(-1, 4, -1, -1), x[:, None].expand(-1, 4, -1, -1), padding, 0.0)
        assert reason[0] == ("cpp" if built else layer.normaliser.backend_name(x.device)), reason
    assert calls and set(calls) == {True}  # the kernel ran, and only where it is built
    for a, b in zip(results[True], results[False]):
        assert (a - b).abs().max().item() < 1e-10


@pytest.mark.parametrize("n_q, n_k", [(0, 5), (5, 0), (0, 0)])
def test_no_query_or_no_key_gives_zeros_and_zero_gradients(n_q, n_k):
    q = torch.randn(2, 2, n_q, 16, requires_grad=True)
    k, v = (torch.randn(2, 2, n_k, 16, requires_grad=True) for _ in range(2))
    out = kernel.entmax_attention(q, k, v, 1.5)
    assert out.shape == (2, 2, n_q, 16) and not out.any()
    (out.sum() + 0.0 * (k.sum() + v.sum())).backward()
    assert not q.grad.any() and not k.grad.any() and not v.grad.any()

