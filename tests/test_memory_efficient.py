"""Memory-efficient attention (attention/memory_efficient.py) against the explicit path.

The explicit path is `alpha_entmax(masked scale q k^T) @ v` with autograd through the entmax module;
the memory-efficient path must agree with it in outputs and in gradients wrt q, k, v and alpha, for
every normaliser, with padding, causal and arbitrary masks, odd lengths, any block size, and when it
skips key blocks.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sparse_runner.analysis.attention_stats import AttentionStats
from sparse_runner.attention import AttentionSpec, MultiHeadAttention, entmax
from sparse_runner.attention import memory_efficient as me
from sparse_runner.checks import ConfigError

ALPHAS = [1.0, 1.5, 2.0, 1.3, "per_head"]


def explicit(q, k, v, alpha, key_padding_mask=None, causal=False, mask=None):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[2], k.shape[2]
    allowed = torch.ones(1, 1, n_q, n_k, dtype=torch.bool)
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    if mask is not None:
        allowed = allowed & mask
    a = alpha.view(1, -1, 1, 1) if torch.is_tensor(alpha) else alpha
    return entmax.alpha_entmax(s.masked_fill(~allowed, float("-inf")), a, dim=-1) @ v


def make_inputs(b, h, n_q, n_k, d, dtype, alpha, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, h, n_q, d, generator=g, dtype=dtype) * scale).requires_grad_()
    k = (torch.randn(b, h, n_k, d, generator=g, dtype=dtype) * scale).requires_grad_()
    v = torch.randn(b, h, n_k, d, generator=g, dtype=dtype).requires_grad_()
    if alpha == "per_head":
        alpha = torch.linspace(1.1, 1.9, h, dtype=dtype).requires_grad_()
    return q, k, v, alpha


def local_inputs(b, h, n, d, dtype, alpha, seed=0):
    """Queries and keys that attend near the diagonal (sinusoidal positions), so most key blocks of a
    query block hold no weight and are skipped."""
    pos = torch.arange(n, dtype=dtype)
    freqs = torch.exp(-torch.arange(d // 2, dtype=dtype) / (d // 2) * math.log(200.0))
    emb = torch.cat([torch.sin(pos[:, None] * freqs), torch.cos(pos[:, None] * freqs)], -1) * 6
    g = torch.Generator().manual_seed(seed)
    q = (emb + 0.1 * torch.randn(b, h, n, d, generator=g, dtype=dtype)).requires_grad_()
    k = (emb + 0.1 * torch.randn(b, h, n, d, generator=g, dtype=dtype)).requires_grad_()
    v = torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_()
    if alpha == "per_head":
        alpha = torch.linspace(1.2, 1.9, h, dtype=dtype).requires_grad_()
    return q, k, v, alpha


def compare(q, k, v, alpha, tol, **kwargs):
    """Max abs difference of the outputs and of every gradient between the two paths."""
    rows = kwargs.pop("rows_per_block", None)
    skip = kwargs.pop("skip", True)
    out = me.memory_efficient_attention(q, k, v, alpha, rows_per_block=rows, skip=skip, **kwargs)
    ref = explicit(q, k, v, alpha, **kwargs)
    inputs = [q, k, v] + ([alpha] if torch.is_tensor(alpha) else [])
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    got = torch.autograd.grad((out * g).sum(), inputs)
    want = torch.autograd.grad((ref * g).sum(), inputs)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dalpha"], [out, *got], [ref, *want]):
        assert torch.isfinite(a).all(), name
        assert (a - b).abs().max().item() <= tol, (name, (a - b).abs().max().item())


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("causal", [False, True])
def test_equals_explicit_float64(alpha, causal):
    n_q, n_k = (77, 77) if causal else (53, 131)
    q, k, v, alpha = make_inputs(2, 3, n_q, n_k, 8, torch.float64, alpha, scale=2.0)
    padding = torch.rand(2, n_k, generator=torch.Generator().manual_seed(2)) > 0.2
    padding[1, :] = False  # a sequence without any real key: zero output, zero gradients
    compare(q, k, v, alpha, 1e-10, key_padding_mask=padding, causal=causal, rows_per_block=16)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_equals_explicit_float32(alpha):
    q, k, v, alpha = make_inputs(2, 3, 100, 200, 16, torch.float32, alpha, scale=1.5)
    padding = torch.ones(2, 200, dtype=torch.bool)
    padding[0, 150:] = False
    compare(q, k, v, alpha, 2e-4, key_padding_mask=padding)


@pytest.mark.parametrize("alpha", ["per_head", 1.5])
@pytest.mark.parametrize("hole", [False, True])
def test_blocks_stop_at_the_last_real_key(alpha, hole, monkeypatch):
    """A padded batch computes no scores over the keys after a sequence's last real key, and stays exact,
    with right padding alone (masked by slices) or a masked key before the last real one (a full mask)."""
    q, k, v, alpha = make_inputs(2, 2, 320, 320, 8, torch.float64, alpha)
    padding = torch.zeros(2, 320, dtype=torch.bool)
    padding[0, :40] = True  # one key block of real keys
    padding[1, :250] = True
    padding[1, 100] = not hole
    assert me._Geometry(2, 2, 320, 320, 64, padding, None, False).tail_only is not hole
    widths = []
    scores = me._scores
    monkeypatch.setattr(me, "_scores", lambda q_b, keys_d: widths.append((q_b.shape[0], keys_d.shape[1])) or scores(q_b, keys_d))
    monkeypatch.setattr(me, "BLOCK_ELEMENTS", 64 * 320)  # one (batch, head) pair per block
    compare(q, k, v, alpha, 1e-10, key_padding_mask=padding, rows_per_block=64, skip=False)
    assert {p for p, _ in widths} == {1}
    assert {w for _, w in widths} == {64, 256}  # 40 real keys -> one block of 64; 250 -> 4 blocks


@pytest.mark.parametrize("rows", [1, 7, 64, 1000])
def test_any_block_size_and_a_pattern_mask(rows):
    q, k, v, alpha = make_inputs(1, 2, 45, 70, 4, torch.float64, "per_head")
    mask = torch.rand(45, 70, generator=torch.Generator().manual_seed(3)) > 0.5
    mask[5] = False  # a query that may see nothing
    compare(q, k, v, alpha, 1e-10, mask=mask, rows_per_block=rows)


def test_incremental_decoding_query_sees_every_key():
    q, k, v, alpha = make_inputs(2, 2, 1, 90, 8, torch.float64, 1.5)
    compare(q, k, v, alpha, 1e-10, causal=True)


@pytest.mark.parametrize("alpha", [1.5, 2.0, "per_head"])
@pytest.mark.parametrize("causal", [False, True])
def test_skipping_key_blocks_is_exact(alpha, causal):
    q, k, v, alpha = local_inputs(2, 3, 700, 16, torch.float64, alpha)
    padding = torch.rand(2, 700, generator=torch.Generator().manual_seed(4)) > 0.1
    with me.count_skipped_blocks() as blocks:
        compare(q, k, v, alpha, 1e-10, key_padding_mask=padding, causal=causal, rows_per_block=32)
    assert blocks[0] > 0 and blocks[1] / blocks[0] > 0.5  # most key blocks were skipped
    with me.count_skipped_blocks() as none:
        me.memory_efficient_attention(q, k, v, alpha, key_padding_mask=padding, causal=causal, rows_per_block=32, skip=False)
    assert none[1] == 0


def test_softmax_and_dense_rows_skip_nothing():
    q, k, v, _ = make_inputs(1, 2, 64, 640, 8, torch.float32, 1.0)
    with me.count_skipped_blocks() as blocks:
        me.memory_efficient_attention(q, k, v, 1.0)
        me.memory_efficient_attention(q * 0, k, v, 2.0)  # flat rows: every key has weight
    assert blocks[0] > 0 and blocks[1] == 0


def test_dropout_is_redrawn_identically_in_backward():
    q, k, v, _ = make_inputs(1, 2, 20, 33, 4, torch.float64, 1.5)
    alpha = torch.tensor([1.3, 1.7], dtype=torch.float64, requires_grad=True)

    def f(q, k, v, alpha):
        torch.manual_seed(0)  # the call draws its dropout seed from the global generator
        return me.memory_efficient_attention(q, k, v, alpha, dropout_p=0.3, rows_per_block=8)

    assert torch.autograd.gradcheck(f, (q, k, v, alpha), atol=1e-6, fast_mode=True)
    a, b = f(q, k, v, alpha), f(q, k, v, alpha)
    assert torch.equal(a, b) and not torch.allclose(a, me.memory_efficient_attention(q, k, v, alpha))


def test_bfloat16_inputs():
    q, k, v, alpha = make_inputs(1, 2, 40, 80, 16, torch.float32, "per_head")
    ref = me.memory_efficient_attention(q, k, v, alpha)
    out = me.memory_efficient_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), alpha)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.05
    out.float().sum().backward()
    assert alpha.grad is not None and torch.isfinite(alpha.grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0, "per_head"])
def test_half_precision_backward_uses_the_forwards_weights(dtype, alpha):
    """With v = I and dO = I, the output is the forward's weights and dV^T the backward's recomputed
    ones: bitwise equal (the backward recomputes the scores with the forward's low-precision matmul),
    also where blocks of keys without weight are skipped."""
    n = 256
    torch.manual_seed(0)
    eye = torch.eye(n).view(1, 1, n, n).to(dtype)
    k = torch.randn(1, 1, n, 32)
    q = (3 * k + torch.randn(1, 1, n, 32)).to(dtype).requires_grad_()  # each row's weight near its own key
    k = k.to(dtype)
    v = eye.clone().requires_grad_()
    a = torch.tensor([1.7]) if alpha == "per_head" else alpha
    with me.count_skipped_blocks() as skipped:
        out = me.memory_efficient_attention(q, k, v, a, rows_per_block=32)
    out.backward(eye)
    assert torch.equal(out, v.grad.transpose(-2, -1))
    assert (v.grad.float().transpose(-2, -1).sum(-1) - 1).abs().max() < 0.01
    if alpha != 1.2:  # (1.2-entmax leaves some weight in every key block here)
        assert skipped[1] > 0, "sparse rows: some key blocks are skipped"


def test_nan_scores_give_nan_rows():
    # A diverging model must show up as NaN, not be hidden as a masked key.
    q, k, v, _ = make_inputs(1, 1, 3, 70, 4, torch.float32, 1.5)
    k = k.detach().clone()
    k[0, 0, 5, 0] = float("nan")
    out = me.memory_efficient_attention(q, k, v, 1.5)
    assert torch.isnan(out).all(dim=-1).all()


# ------------------------------------------------------------------------------------------------
# Inside the model: choice of the path, the analysis, configuration
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normaliser", ["softmax", "sparsemax", "entmax15", "alpha_entmax"])
@pytest.mark.parametrize("pattern", ["dense", "causal"])
def test_layer_and_analysis_match_the_explicit_path(normaliser, pattern):
    results = {}
    for impl in ("explicit", "memory_efficient"):
        torch.manual_seed(0)
        layer = MultiHeadAttention(32, AttentionSpec(num_heads=4, normaliser=normaliser, pattern=pattern, impl=impl)).eval()
        x = torch.randn(2, 150, 32)
        padding = torch.ones(2, 150, dtype=torch.bool)
        padding[1, 100:] = False
        stats = AttentionStats()
        layer.observer = stats.update
        results[impl] = layer(x, key_padding_mask=padding), stats.summary()["self"]["layers"][0]
    (y1, s1), (y2, s2) = results["explicit"], results["memory_efficient"]
    assert (y1 - y2).abs().max() < 1e-5
    assert s1["possible_pairs"] == s2["possible_pairs"] and s1["num_queries"] == s2["num_queries"]
    assert s1["mean_density"] == pytest.approx(s2["mean_density"], abs=1e-6)
    assert s1["js"] == pytest.approx(s2["js"], abs=1e-5)


@pytest.fixture
def without_cpp_kernel(monkeypatch):
    """`auto` as on a machine where the C++ extension cannot be built (with it, the fused kernel takes the
    calls the memory-efficient path would: tests/test_entmax_attention_cpu.py, tests/test_backend_choice.py)."""
    monkeypatch.setattr(me.cpu_kernel(), "available", lambda: False)


def test_auto_switches_at_memory_efficient_from(without_cpp_kernel, monkeypatch):
    calls = []
    real = me.memory_efficient_attention
    monkeypatch.setattr(me, "memory_efficient_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    layer = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="entmax15", memory_efficient_from=100))
    layer(torch.randn(1, 99, 16))
    assert not calls
    layer(torch.randn(1, 100, 16))
    assert calls == [1]
    softmax = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="softmax", memory_efficient_from=10))
    softmax(torch.randn(1, 100, 16))  # softmax without weights stays on SDPA
    assert calls == [1]


def test_auto_threshold_is_explicit_below_the_crossover_where_the_scores_fit(without_cpp_kernel, monkeypatch):
    """memory_efficient_from=auto: explicit up to EXPLICIT_UP_TO keys unless its scores would not fit in
    EXPLICIT_MEMORY_SHARE of the device's memory; memory-efficient from the crossover on, whatever the memory."""
    cpu = torch.device("cpu")
    choose = lambda n_keys, n_scores: me.choose_impl(  # noqa: E731
        "auto", "auto", n_keys, cpu, dropout_p=0.0, has_mask=False, n_scores=n_scores, element_size=4)
    monkeypatch.setattr(me, "device_memory_bytes", lambda device: 8 * 2**30)
    fits = int(me.EXPLICIT_MEMORY_SHARE * 8 * 2**30 / (4 * me.EXPLICIT_LIVE_COPIES))
    assert choose(me.EXPLICIT_UP_TO, fits) == "explicit"
    assert choose(me.EXPLICIT_UP_TO, fits + 1) == "memory_efficient"
    assert choose(me.EXPLICIT_UP_TO + 1, 1) == "memory_efficient"
    assert choose(1024, None) == "explicit"
    # a number keeps its meaning, memory or not
    assert me.choose_impl("auto", 100, 99, cpu, dropout_p=0.0, has_mask=False, n_scores=10**15) == "explicit"
    # the layer passes its scores' size: a batch too large for memory leaves the explicit path below the crossover
    calls = []
    real = me.memory_efficient_attention
    monkeypatch.setattr(me, "memory_efficient_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    layer = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="entmax15"))
    assert layer.pattern.memory_efficient_from == "auto"
    layer(torch.randn(1, 64, 16))
    assert not calls
    monkeypatch.setattr(me, "device_memory_bytes", lambda device: 2 * 64 * 64 * 4 * me.EXPLICIT_LIVE_COPIES * 7)
    layer(torch.randn(1, 64, 16))
    assert calls == [1]


def test_total_device_memory_is_read():
    assert me.device_memory_bytes(torch.device("cpu")) > 2**28


def test_gpu_kernels_refused_on_cpu_in_one_line():
    layer = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="entmax15", impl="triton"))
    with pytest.raises(RuntimeError, match="needs a CUDA device") as err:
        layer(torch.randn(1, 10, 16))
    assert "\n" not in str(err.value)


def test_config_keys_are_checked(tiny_config):
    with pytest.raises(ConfigError, match="model.attention_impl") as err:
        tiny_config("model.attention_impl=fast")
    assert "memory_efficient" in str(err.value) and "\n" not in str(err.value)
    for bad in ("0", "fast"):
        with pytest.raises(ConfigError, match="model.memory_efficient_from") as err:
            tiny_config(f"model.memory_efficient_from={bad}")
        assert "auto" in str(err.value) and "\n" not in str(err.value)
    assert tiny_config().model.memory_efficient_from == "auto"
    assert tiny_config("model.memory_efficient_from=2048").model.memory_efficient_from == 2048
    assert tiny_config("model=entmax", "model.attention_impl=memory_efficient").model.attention_impl == "memory_efficient"


@pytest.mark.slow  # two fresh processes and an explicit 4k x 4k step; the benchmarks measure the same per row and length
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs")
def test_peak_memory_grows_linearly_not_quadratically():
    """At 4,096 keys the explicit path holds (N, N) float32 scores, weights and their gradients (64 MiB
    each); the memory-efficient path a few (128, N) blocks (2 MiB each) and the (N, D) gradients. Measured
    as the resident-set high-water mark of a fresh process around one forward+backward."""
    script = textwrap.dedent(
        """
        import sys, torch
        from sparse_runner.attention import memory_efficient as me, entmax

        def kib(field):
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))

        torch.manual_seed(0)
        n, impl = 4096, sys.argv[1]
        q, k, v = (torch.randn(1, 1, n, 32, requires_grad=True) for _ in range(3))

        def step():
            if impl == "explicit":
                out = entmax.alpha_entmax((q @ k.transpose(-2, -1)) / 32 ** 0.5, 1.5) @ v
            else:
                out = me.memory_efficient_attention(q, k, v, 1.5, rows_per_block=128)
            torch.autograd.grad(out.sum(), (q, k, v))

        step()  # one-time costs (kernel load, lazy inits)
        open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current RSS
        before = kib("VmRSS")
        step()
        print((kib("VmHWM") - before) / 1024)
        """
    )
    # Every block >= 64 KiB is its own mapping, returned when freed: the resident set tracks live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    growth = {}
    for impl in ("explicit", "memory_efficient"):
        done = subprocess.run([sys.executable, "-c", script, impl], capture_output=True, text=True, check=True, env=env)
        growth[impl] = float(done.stdout.strip().splitlines()[-1])
    assert growth["explicit"] > 100  # MiB: scores, weights and their gradients
    assert growth["memory_efficient"] < growth["explicit"] / 4, growth


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("impl", ["triton", "adasplash"])
def test_gpu_kernels_refused_before_training_on_cpu(tiny_config, tmp_path, impl):
    from sparse_runner.run import run

    with pytest.raises(ConfigError, match=f"model.attention_impl: {impl} needs a CUDA device") as err:
        run(tiny_config("model=entmax15", f"model.attention_impl={impl}", "trainer.device=cpu"), tmp_path / "run")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()
