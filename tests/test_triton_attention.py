"""The Triton alpha-entmax attention kernel (attention/kernels/entmax_attention_triton.py) and the
AdaSplash backend (attention/kernels/adasplash_backend.py) against dense attention.

Reference: `alpha_entmax(scale * q k^T masked with -inf, alpha) @ v` from sparse_runner.attention.entmax
(torch backend, float64, autograd), on the same inputs upcast to float64.  With attention dropout the
reference drops the pairs the kernel drops (`dropout_keep_mask` of the seed the kernel drew), so
it is exact too; the masks themselves are checked statistically (rate, independence, expectation).

Two ways to run the kernels:
* Triton's interpreter (numpy, CPU): without CUDA this module sets TRITON_INTERPRET=1 before triton
  is first imported (@triton.jit chooses interpreter or compiler when a module is imported, triton's
  own tl.sum & co. included, and the interpreter reads the variable while it runs, so it stays set
  for the session; nothing else in this project runs Triton on a machine without CUDA).  Where that
  is not possible (a CUDA machine, or triton imported earlier in the session), one test runs the
  default subset in a fresh process instead.  Tiny shapes: N <= 70, D = 16, 16 x 16 tiles so that
  they cross tile borders.  Default run: 22 tests, ~8 s on 2 cores; the full matrix (`-m slow`, plus
  compiling the kernels to sm_90 / sm_80 cubins, no GPU needed) ~2.5 min.
* CUDA (`-m gpu`): N = 1000-4096, D = 64, float32 / bfloat16, peak memory O(N), and AdaSplash when
  the `adasplash` package is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys

import pytest
import torch

_KERNELS = "sparse_runner.attention.kernels.entmax_attention_triton"
_CUDA = torch.cuda.is_available()
# Before triton is first imported: its own library functions (tl.sum, ...) are decorated at that
# import, for the interpreter or for the compiler.
if not _CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from sparse_runner.attention.entmax import alpha_entmax  # noqa: E402

import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

T = importlib.import_module(_KERNELS)

# The interpreter works in this process only if triton itself was first imported with
# TRITON_INTERPRET=1 (not so on a CUDA machine, or when an earlier import, e.g. torch._dynamo,
# brought triton in first); otherwise test_interpreter_in_fresh_process runs the default subset.
_INTERPRETED = T._interpreting() and isinstance(tl.sum, InterpretedFunction)
interpreter = pytest.mark.skipif(not _INTERPRETED, reason="kernels not interpreted in this process (see test_interpreter_in_fresh_process)")


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def visible_keys(B, Nq, Nk, key_padding_mask=None, causal=False, device="cpu"):
    """(B, 1 or H, Nq, Nk) bool: the keys each query may attend to (the kernel's masking rules); a (B, H, Nk)
    key_padding_mask is one per head."""
    vis = torch.ones(B, 1, Nq, Nk, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        per_head = key_padding_mask if key_padding_mask.dim() == 3 else key_padding_mask[:, None]
        vis = vis & per_head[:, :, None, :].to(device)
    if causal:
        i = torch.arange(Nq, device=device)[:, None]
        j = torch.arange(Nk, device=device)[None, :]
        vis = vis & (j <= i + Nk - Nq)
    return vis


def dense_reference(q, k, v, alpha, *, scale=None, key_padding_mask=None, causal=False, dropout_keep=None, dropout_p=0.0):
    """Explicit attention in float64 with autograd: alpha-entmax(scale q k^T masked) v, or with
    dropout_keep ((B, H, Nq, Nk) bool) (alpha-entmax(...) * dropout_keep / (1 - dropout_p)) v."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    s = s.masked_fill(~visible_keys(B, Nq, Nk, key_padding_mask, causal, q.device), float("-inf"))
    a = alpha.reshape(1, -1, 1, 1) if torch.is_tensor(alpha) else alpha
    p = alpha_entmax(s, a, backend="torch")
    if dropout_keep is not None:
        p = p * dropout_keep / (1.0 - dropout_p)
    return p @ v


def kernel_keep_mask(q, k, dropout_p, torch_seed):
    """The pairs entmax_attention(q, k, ...) keeps when called right after torch.manual_seed(torch_seed)."""
    torch.manual_seed(torch_seed)
    seed = T.dropout_seed(q.device)
    return T.dropout_keep_mask(seed, q.shape[0], q.shape[1], q.shape[2], k.shape[2], dropout_p)


def run_both(q, k, v, alpha, *, dtype=torch.float32, scale=None, key_padding_mask=None, causal=False, seed=0, dropout_p=0.0):
    """(kernel, reference) results: outputs then gradients wrt q, k, v (and alpha when a tensor),
    for one random output gradient.  The kernel runs on `dtype` copies; the reference on float64
    copies of those same (rounded) values, and the output gradient is rounded to `dtype` too (the
    kernel's backward reads it in that dtype).  With dropout_p, the kernel runs after
    torch.manual_seed(seed) and the reference drops the pairs it drops (`kernel_keep_mask`)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    grad_out = torch.randn(q.shape[:3] + (v.shape[-1],), generator=g, dtype=torch.float64).to(dtype).double().to(q.device)
    kernel_extra, reference_extra = {}, {}
    if dropout_p:
        kernel_extra = dict(dropout_p=dropout_p)
        reference_extra = dict(dropout_p=dropout_p, dropout_keep=kernel_keep_mask(q, k, dropout_p, seed))
    results = []
    for run_dtype, fn, extra in ((dtype, T.entmax_attention, kernel_extra), (torch.float64, dense_reference, reference_extra)):
        leaves = [x.detach().to(dtype).to(run_dtype).requires_grad_() for x in (q, k, v)]
        a = alpha
        if torch.is_tensor(alpha):  # the kernel computes with float32 alphas: the reference gets those values
            a = alpha.detach().float().to(torch.float64 if run_dtype == torch.float64 else torch.float32).requires_grad_()
            leaves.append(a)
        if dropout_p:
            torch.manual_seed(seed)  # the kernel's dropout seed is the generator's next draw
        out = fn(*leaves[:3], a, scale=scale, key_padding_mask=key_padding_mask, causal=causal, **extra)
        grads = torch.autograd.grad((out.to(torch.float64) * grad_out).sum(), leaves)
        results.append([out.detach().double(), *[x.double() for x in grads]])
    return results


def assert_matches(got, want, tol, names=("out", "dq", "dk", "dv", "dalpha")):
    """Every tensor within tol * max(1, max |want|), and no NaN."""
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all(), f"{name}: non-finite values"
        bound = tol * max(1.0, b.abs().max().item())
        err = (a - b).abs().max().item()
        assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g}"


def random_inputs(B, H, Nq, Nk, D, *, seed=0, spread=1.0, device="cpu"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, Nq, D, generator=g, dtype=torch.float64) * spread
    k = torch.randn(B, H, Nk, D, generator=g, dtype=torch.float64) * spread
    v = torch.randn(B, H, Nk, D, generator=g, dtype=torch.float64)
    return q.to(device), k.to(device), v.to(device)


def padding(B, Nk, *, seed=0, device="cpu"):
    """(B, Nk) bool, True = real key: random holes in row 0, row 1 padded after 60 % of its keys."""
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    kpm = torch.rand(B, Nk, generator=g) < 0.75
    kpm[:, 0] = True
    if B > 1:
        kpm[1] = torch.arange(Nk) < max(1, int(0.6 * Nk))
    return kpm.to(device)


LEARNED = "learned"  # one alpha per head: (1.0, 1.6) at H = 2, a softmax head's alpha = 1 limit included
EDGES = "edges"  # one alpha per head at the ends: just above the softmax switch, and sparsemax


def alpha_for(kind, H, device="cpu"):
    if kind == LEARNED:
        return torch.linspace(1.0, 1.6, H, dtype=torch.float64, device=device)
    if kind == EDGES:
        return torch.tensor([1.0 + 1e-6, 2.0] * (H // 2), dtype=torch.float64, device=device)
    return kind


# float32 kernel vs float64 reference: observed max errors ~2e-6 relative; 2e-5 leaves a margin.
TOL32 = 2e-5


# ------------------------------------------------------------------------------------------------
# Interpreter: forward and every gradient against dense attention
# ------------------------------------------------------------------------------------------------


@interpreter
@pytest.mark.parametrize(
    "alpha, Nq, Nk, pad, causal",
    [
        (LEARNED, 37, 45, True, False),
        (1.5, 41, 19, True, True),  # Nq > Nk, causal: the first 22 rows see no key
        (EDGES, 23, 70, False, True),
    ],
)
def test_interpreter_core(alpha, Nq, Nk, pad, causal):
    """Default-run subset: learned per-head alphas with padding (one at the softmax limit, one just
    above the softmax switch, one sparsemax), 1.5-entmax causal."""
    q, k, v = random_inputs(2, 2, Nq, Nk, 16, spread=1.5)
    kpm = padding(2, Nk) if pad else None
    got, want = run_both(q, k, v, alpha_for(alpha, 2), key_padding_mask=kpm, causal=causal)
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.slow
@pytest.mark.parametrize("alpha", [1.0, 1.0 + 1e-6, 1.3, 1.5, 2.0, LEARNED, EDGES])
@pytest.mark.parametrize("pad, causal", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("Nq, Nk", [(33, 33), (17, 70), (51, 9)])
def test_interpreter_matrix(alpha, pad, causal, Nq, Nk):
    """Every alpha (softmax, just above the softmax switch, entmax, sparsemax, learned) x masks x
    lengths that are no multiple of the 16-row tiles."""
    q, k, v = random_inputs(2, 2, Nq, Nk, 16, seed=Nq + Nk, spread=1.5)
    kpm = padding(2, Nk, seed=Nq) if pad else None
    got, want = run_both(q, k, v, alpha_for(alpha, 2), key_padding_mask=kpm, causal=causal)
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.slow
@pytest.mark.parametrize("alpha", [1.25, 2.0, LEARNED])
def test_interpreter_peaked_scores(alpha):
    """Large scores: most weights exactly zero (entmax) or underflowing (softmax head of LEARNED)."""
    q, k, v = random_inputs(1, 2, 29, 53, 16, seed=5, spread=4.0)
    got, want = run_both(q, k, v, alpha_for(alpha, 2))
    assert_matches(got, want, TOL32)


def test_one_alpha_for_every_head_selects_the_specialised_formulas():
    """1.5 and 2 (a float, or a constant normaliser's one-element CPU tensor) take the formulas without
    log or exp per score; a learned alpha, several alphas or a tensor on another device the general ones."""
    assert T._mode(T._known_alpha(1.5)) == T._MODE_ENTMAX15
    assert T._mode(T._known_alpha(torch.full((1,), 2.0))) == T._MODE_SPARSEMAX
    assert T._mode(T._known_alpha(torch.full((1,), 1.5, requires_grad=True))) == T._MODE_GENERAL
    assert T._mode(T._known_alpha(torch.tensor([1.5, 1.5]))) == T._MODE_GENERAL
    for alpha in (1.0, 1.25, 1.5 + 1e-7):
        assert T._mode(T._known_alpha(alpha)) == T._MODE_GENERAL


def _kernel_run(q, k, v, alpha, mode, grad_out, dtype=torch.float32, **kwargs):
    """Output, gradients and the forward's tile table of one kernel call in a given MODE, on `dtype` copies of
    q, k, v.  Also checks the forward's list of key tiles per query tile (the dQ kernel's loop) against that
    table: the same tiles, ascending."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    alpha_t = T._alpha_tensor(alpha, q.shape[1], q.device)
    kpm = kwargs.get("key_padding_mask")
    out, *_, tiles, kv_count, kv_index = T._KERNELS(*leaves, alpha_t, None if kpm is None else kpm.to(torch.uint8), None,
                                                      1.0 / math.sqrt(q.shape[-1]), kwargs.get("causal", False), 0.0, mode, True)
    table = tiles.reshape(-1, tiles.shape[-1])
    assert kv_count.tolist() == table.sum(-1).tolist()
    for row, count, listed in zip(table, kv_count.tolist(), kv_index):
        assert listed[:count].tolist() == row.nonzero().flatten().tolist()
    grads = torch.autograd.grad((out * grad_out).sum(), leaves)
    return [out.detach(), *grads], tiles


@interpreter
@pytest.mark.parametrize("alpha, mode", [(1.5, 15), (2.0, 20)])
def test_interpreter_specialised_formulas_agree_with_the_general_ones(alpha, mode):
    """The same inputs through MODE 15 / 20 and through the general formulas (log and exp per score):
    outputs and gradients agree to float32 rounding, and so do the tiles the backward visits."""
    q, k, v = random_inputs(2, 2, 37, 45, 16, seed=11, spread=2.0)
    kpm = padding(2, 45, seed=4)
    grad_out = torch.randn(2, 2, 37, 16, generator=torch.Generator().manual_seed(3))
    special, tiles_special = _kernel_run(q, k, v, alpha, mode, grad_out, key_padding_mask=kpm, causal=True)
    general, tiles_general = _kernel_run(q, k, v, alpha, T._MODE_GENERAL, grad_out, key_padding_mask=kpm, causal=True)
    assert_matches(special, general, TOL32)
    assert torch.equal(tiles_special, tiles_general)


@interpreter
@pytest.mark.parametrize("alpha, dropout_p", [("learned", 0.0), (1.5, 0.2)])
def test_interpreter_the_kernel_compiles_into_one_graph_and_gives_eagers_results(alpha, dropout_p):
    """The kernels are registered operators with their gradient (torch.library): torch.compile with fullgraph=True
    (an error at any graph break) traces them into the graph, AOTAutograd traces the backward, and outputs and
    gradients are eager's, bit for bit; with dropout the seed is drawn inside the graph, from the same generator."""
    q, k, v = (x.float().requires_grad_() for x in random_inputs(2, 2, 21, 37, 16, seed=5))
    a = torch.tensor([1.3, 1.7], requires_grad=True) if alpha == "learned" else alpha
    kpm = padding(2, 37, seed=1)
    leaves = [q, k, v] + ([a] if torch.is_tensor(a) else [])

    def attend(q, k, v):
        return T.entmax_attention(q, k, v, a, key_padding_mask=kpm, causal=True, dropout_p=dropout_p)

    results = []
    for fn in (attend, torch.compile(attend, backend="aot_eager", fullgraph=True)):
        torch.manual_seed(3)
        out = fn(q, k, v)
        results.append([out.detach(), *torch.autograd.grad(out.square().sum(), leaves)])
    for got, want in zip(*results):
        assert torch.equal(got, want)


@interpreter
def test_interpreter_a_compiled_kernel_call_takes_every_length_in_one_graph():
    """Lengths vary from batch to batch: after the second one Dynamo traces the call with symbolic lengths, which
    the operator's fake implementation (its outputs' and tile lists' shapes) must take without a recompile."""
    graphs = []

    def count_graphs(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    alpha = torch.tensor([1.3, 1.7], requires_grad=True)
    compiled = torch.compile(lambda q, k, v, kpm: T.entmax_attention(q, k, v, alpha, key_padding_mask=kpm).square().sum(),
                             backend=count_graphs)
    for n in (20, 37, 45, 29):
        q, k, v = (x.float().requires_grad_() for x in random_inputs(2, 2, n, n, 16, seed=n))
        compiled(q, k, v, padding(2, n, seed=n)).backward()
    assert len(graphs) == 2


def test_query_tile_lists_put_the_tiles_to_visit_first_in_ascending_order():
    """The dK/dV kernel's loop lists from a tile table: per key tile its query tiles to visit, ascending, with
    their counts; a key tile with nothing to visit has count 0."""
    tiles = torch.tensor([[[1, 0, 1], [0, 0, 0]], [[1, 1, 1], [0, 1, 0]]], dtype=torch.int8)  # (B * H, 2, 3)
    q_count, q_index = T._query_tile_lists(tiles)
    assert q_count.tolist() == [1, 0, 1, 1, 2, 1] and q_index.dtype == torch.int16
    assert [q_index[r, :c].tolist() for r, c in enumerate(q_count.tolist())] == [[0], [], [0], [0], [0, 1], [0]]
    assert T._index_dtype(2**15 - 1) == torch.int16 and T._index_dtype(2**15) == torch.int32


def banded_inputs(B, H, N, D, band, strength):
    """q = k: query i and key j score `strength` * scale when they share a band of `band` positions, about 0
    otherwise, so that a sparse normaliser's weights lie in the diagonal blocks (a local attention pattern)."""
    g = torch.Generator().manual_seed(7)
    x = torch.zeros(B, H, N, D, dtype=torch.float64)
    x[..., torch.arange(N), torch.arange(N) // band] = math.sqrt(strength * math.sqrt(D))
    x = x + 0.1 * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    return x, x.clone(), v


@interpreter
@pytest.mark.parametrize("skip", [True, False])
def test_interpreter_backward_skips_the_tiles_without_weight(monkeypatch, skip):
    """Local scores (bands of 16 keys, the tile width here): the 1.6-entmax head's weights lie in the diagonal
    tiles, so the forward's tile table marks the others empty and the backward skips them; the softmax head
    (LEARNED's first) weighs every key and skips none; without skipping every tile is visited.  Gradients match
    dense attention either way."""
    monkeypatch.setattr(T, "SKIP_EMPTY_TILES", skip)
    q, k, v = banded_inputs(1, 2, 64, 16, band=16, strength=12.0)
    alpha = alpha_for(LEARNED, 2)
    got, want = run_both(q, k, v, alpha)
    assert_matches(got, want, TOL32)
    grad_out = torch.randn(1, 2, 64, 16, generator=torch.Generator().manual_seed(5))
    _, tiles = _kernel_run(q, k, v, alpha.float(), T._MODE_GENERAL, grad_out)
    assert tiles.shape == (2, 4, 4)
    assert tiles[0].bool().all()  # softmax: every tile has weight
    assert torch.equal(tiles[1].bool(), torch.eye(4, dtype=torch.bool) if skip else torch.ones(4, 4, dtype=torch.bool))


def _count_calls(monkeypatch, name: str, original) -> list[int]:
    """Count the calls of the kernel's helper `name` (the interpreter looks its helpers up at each call), which
    runs `original`: the returned list's one element is the count so far."""
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(T, name, counted)
    return calls


@interpreter
@pytest.mark.parametrize("alpha, mode", [(1.5, 15), (2.0, 20), (LEARNED, 0)])
def test_interpreter_solver_passes_skip_tiles_and_change_nothing(monkeypatch, alpha, mode):
    """Local scores, padded and causal: the forward's solver passes drop the key tiles with no p > 0 at the
    threshold's proven lower bound, so they read fewer tiles, and every output and gradient is bitwise the
    one without skipping (a dropped tile adds exact zeros to every later sum)."""
    q, k, v = banded_inputs(2, 2, 64, 16, band=16, strength=12.0)
    q, k, v = q.float(), k.float(), v.float()
    kpm = padding(2, 64, seed=4)
    grad_out = torch.randn(2, 2, 64, 16, generator=torch.Generator().manual_seed(5))
    scores = T._scores
    runs = {}
    for skip in (True, False):
        monkeypatch.setattr(T, "SKIP_EMPTY_TILES", skip)
        calls = _count_calls(monkeypatch, "_scores", scores)
        runs[skip] = (*_kernel_run(q, k, v, alpha_for(alpha, 2), mode, grad_out, key_padding_mask=kpm, causal=True), calls[0])
    (got, tiles, reads), (want, _, reads_all) = runs[True], runs[False]
    for x, y in zip(got, want):
        assert torch.equal(x, y)
    # Causal leaves 10 of the 16 tiles per head, 4 of which hold weight (the softmax head's: all 10).  The max pass and
    # the first solver pass (u_lo = 0) read every visible tile, the later passes about half: 0.82-0.85 of the reads.
    assert tiles.float().mean() < 0.6 and reads < 0.9 * reads_all


@interpreter
@pytest.mark.parametrize("alpha, mode", [(1.5, 15), (2.0, 20)])
def test_interpreter_the_root_on_a_kept_support_needs_no_confirming_pass(monkeypatch, alpha, mode):
    """MODE 15 and 20 take the root on a pass's support when the step keeps that support (EXACT_ON_SUPPORT):
    padded, causal random rows match dense attention with and without it, and with it the forward makes fewer
    solver passes (every program saves the pass that would only have confirmed F = 1)."""
    q, k, v = random_inputs(2, 2, 64, 80, 16, seed=12, spread=1.5)
    kpm = padding(2, 80, seed=6)
    steps = T._step
    passes = {}
    for exact in (True, False):
        monkeypatch.setattr(T, "EXACT_ON_SUPPORT", exact)
        calls = _count_calls(monkeypatch, "_step", steps)
        got, want = run_both(q, k, v, alpha, key_padding_mask=kpm, causal=True)
        assert_matches(got, want, TOL32)
        passes[exact] = calls[0]
    # One solver step per pass and program; 2 x 2 x 4 programs of 16 queries here (41 against 64 steps for 1.5-entmax,
    # 45 against 61 for sparsemax).
    assert passes[True] <= passes[False] - 16, passes


@interpreter
def test_interpreter_solver_passes_keep_the_tiles_a_halley_step_overshoots(monkeypatch):
    """1.5-entmax rows with a key tile of scores just inside the support at t = m (2 - 1.95 below the max), which
    leave it as t rises: Halley's first step carries t past the threshold, where that tile holds no p > 0, but the
    tile still has weight at the threshold.  Skipping decides at the proven lower bound (u_lo), so the tile stays
    and the result is bitwise the one without skipping (decided at the iterate, outputs differed by up to 0.3)."""
    D, Nk = 16, 64
    g = torch.Generator().manual_seed(188)
    row = -torch.rand(Nk, generator=g) * 8.5
    row[48:] = -1.99 + 0.05 * torch.rand(16, generator=g)
    row[0] = 0.0
    q = torch.zeros(1, 1, 16, D)
    q[..., 0] = math.sqrt(D)  # scores = scale q . k = k[..., 0]: every query row is `row`
    k = torch.zeros(1, 1, Nk, D)
    k[..., 0] = row
    v = torch.randn(1, 1, Nk, D, generator=g)
    outputs = {}
    for skip in (False, True):
        monkeypatch.setattr(T, "SKIP_EMPTY_TILES", skip)
        outputs[skip] = T.entmax_attention(q, k, v, 1.5)
    assert torch.equal(outputs[True], outputs[False])
    got, want = run_both(q.double(), k.double(), v.double(), 1.5)  # with skipping: outputs and gradients
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.parametrize("causal", [False, True])
def test_interpreter_per_head_key_padding_masks(causal):
    """A (B, H, Nk) mask, one per head (a block pattern's tiles whose heads gather different key blocks): each
    head sees its own keys, and a head that sees none gives zeros; outputs and gradients match dense attention."""
    B, H, Nq, Nk = 2, 2, 23, 37
    q, k, v = random_inputs(B, H, Nq, Nk, 16, seed=8)
    kpm = torch.rand(B, H, Nk, generator=torch.Generator().manual_seed(2)) < 0.6
    kpm[1, 0] = False  # batch 1, head 0: no key at all
    kpm[1, 1, 0] = True
    got, want = run_both(q, k, v, alpha_for(LEARNED, H), key_padding_mask=kpm, causal=causal)
    assert_matches(got, want, TOL32)
    assert got[0][1, 0].abs().max() == 0


@interpreter
def test_interpreter_fully_masked_rows_are_zero():
    """A batch element with no real key, and causal rows before the first key: zero outputs and
    zero gradients (no NaN), the other rows unaffected."""
    B, H, Nq, Nk = 2, 2, 20, 12
    q, k, v = random_inputs(B, H, Nq, Nk, 16, seed=3)
    kpm = torch.ones(B, Nk, dtype=torch.bool)
    kpm[1] = False
    got, want = run_both(q, k, v, alpha_for(LEARNED, H), key_padding_mask=kpm, causal=True)
    assert_matches(got, want, TOL32)
    out, dq, dk, dv = got[:4]
    assert out[1].abs().max() == 0 and dq[1].abs().max() == 0
    assert dk[1].abs().max() == 0 and dv[1].abs().max() == 0
    dead = Nq - Nk  # causal with Nq > Nk: query i sees keys j <= i - 8
    assert out[0, :, :dead].abs().max() == 0 and dq[0, :, :dead].abs().max() == 0
    assert out[0, :, dead:].abs().min() > 0


@interpreter
@pytest.mark.parametrize("Nq, Nk", [(1, 1), (1, 70), (70, 1)])
def test_interpreter_single_query_or_key(Nq, Nk):
    q, k, v = random_inputs(1, 2, Nq, Nk, 16, seed=Nq * 100 + Nk)
    got, want = run_both(q, k, v, alpha_for(LEARNED, 2))
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.slow
@pytest.mark.parametrize("tiles", [(32, 16), (16, 32)])
@pytest.mark.parametrize("Nq, Nk", [(45, 70), (70, 45)])
def test_interpreter_unequal_tiles(monkeypatch, tiles, Nq, Nk):
    """BLOCK_M != BLOCK_N (as on GPUs: 64 x 32, 32 x 32): the causal tile bounds on both sides."""
    monkeypatch.setattr(T, "_INTERPRETER_TILES", tiles)
    q, k, v = random_inputs(1, 2, Nq, Nk, 16, seed=17)
    got, want = run_both(q, k, v, alpha_for(LEARNED, 2), key_padding_mask=padding(1, Nk), causal=True)
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.parametrize("Nq, block_m", [(1, 16), (20, 32), (45, 64)])
def test_interpreter_few_queries_shrink_the_query_tile(monkeypatch, Nq, block_m):
    """Fewer queries than BLOCK_M (a decoding step, HST's representatives) run on a query tile of the next
    power of two, at least 16: causal bounds, padding, dropout and the learned alpha's gradient as before."""
    monkeypatch.setattr(T, "_INTERPRETER_TILES", (64, 16))
    assert T._blocks(16, torch.float32, Nq)[0] == block_m
    q, k, v = random_inputs(1, 2, Nq, 45, 16, seed=Nq)
    got, want = run_both(q, k, v, alpha_for(LEARNED, 2), key_padding_mask=padding(1, 45), causal=True, dropout_p=0.2)
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.slow
def test_interpreter_strided_inputs_scale_and_odd_head_dim():
    """q, k, v as (B, N, H, D) views transposed to (B, H, N, D) (no copy), an explicit scale, and
    D = 24 (tiles padded to 32)."""
    B, N, H, D = 2, 26, 2, 24
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(B, N, 3, H, D, generator=g, dtype=torch.float64)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    got, want = run_both(q, k, v, 1.5, scale=0.4)
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.slow
@pytest.mark.parametrize("shape", [(), (1,), (1, 2, 1, 1)])
def test_interpreter_shared_alpha_shapes(shape):
    """A tensor alpha shared by the heads (or in alpha_entmax's (1, H, 1, 1) layout) gets the
    gradient summed over the heads."""
    q, k, v = random_inputs(1, 2, 21, 21, 16, seed=11)
    alpha = torch.full(shape, 1.4, dtype=torch.float64) if shape != (1, 2, 1, 1) else torch.tensor([1.2, 1.7]).view(shape)
    got, want = run_both(q, k, v, alpha)
    assert got[4].shape == alpha.shape
    assert_matches(got, want, TOL32)


@interpreter
@pytest.mark.slow
def test_interpreter_float16_inputs():
    """16-bit inputs: output in the input dtype; p and dS are rounded to it for the products.
    (bfloat16 is left to the CUDA tests: Triton 3.9's interpreter gets tl.dot on bfloat16 wrong,
    ~1e10 errors on a plain 16 x 16 product, as numpy has no bfloat16.)"""
    q, k, v = random_inputs(1, 2, 19, 35, 16, seed=13)
    got, want = run_both(q, k, v, alpha_for(LEARNED, 2), dtype=torch.float16)
    assert got[0].abs().max() > 0
    assert_matches(got, want, 2e-2)


@interpreter
def test_interpreter_output_dtype_and_empty_inputs():
    q, k, v = random_inputs(1, 2, 5, 7, 16)
    out = T.entmax_attention(q.float(), k.float(), v.float(), 1.5)
    assert out.dtype == torch.float32 and out.shape == (1, 2, 5, 16)
    # out.sum() hands backward an expanded (stride-0) gradient: same result as a dense one.
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    expanded = torch.autograd.grad(T.entmax_attention(*leaves, 1.5).sum(), leaves)
    dense = torch.autograd.grad((T.entmax_attention(*leaves, 1.5) * torch.ones(1, 2, 5, 16)).sum(), leaves)
    assert all(torch.equal(a, b) for a, b in zip(expanded, dense))
    empty = T.entmax_attention(q[:, :, :0].float(), k.float(), v.float(), 1.5)
    assert empty.shape == (1, 2, 0, 16)
    no_keys = T.entmax_attention(q.float().requires_grad_(), k[:, :, :0].float(), v[:, :, :0].float(), 1.5)
    assert no_keys.shape == (1, 2, 5, 16) and no_keys.abs().max() == 0
    no_keys.sum().backward()


# ------------------------------------------------------------------------------------------------
# Interpreter: attention dropout
# ------------------------------------------------------------------------------------------------


@interpreter
@pytest.mark.parametrize(
    "alpha, Nq, Nk, pad, causal, dropout_p",
    [
        (LEARNED, 37, 45, True, False, 0.3),
        (1.5, 41, 19, True, True, 0.1),  # Nq > Nk, causal: the first 22 rows see no key
    ],
)
def test_interpreter_dropout_matches_explicit_with_the_same_mask(alpha, Nq, Nk, pad, causal, dropout_p):
    """Output and every gradient (dq, dk, dv, dalpha) against the float64 explicit path that drops
    the pairs the kernel drops: the backward regenerates the forward's mask, in both its kernels."""
    q, k, v = random_inputs(2, 2, Nq, Nk, 16, spread=1.5)
    kpm = padding(2, Nk) if pad else None
    got, want = run_both(q, k, v, alpha_for(alpha, 2), key_padding_mask=kpm, causal=causal, dropout_p=dropout_p, seed=3)
    assert_matches(got, want, TOL32)
    no_dropout = dense_reference(*(x.float().double() for x in (q, k, v)), alpha_for(alpha, 2), key_padding_mask=kpm, causal=causal)
    assert (want[0] - no_dropout).abs().max() > 0.1  # the mask matters for this comparison


def identity_values(B, H, N):
    """v with v[b, h, j] = e_j: attention's output row i is then the weight row p_i (N = D keys)."""
    return torch.eye(N, dtype=torch.float64).expand(B, H, N, N)


def assert_binomial_rate(dropped, n, rate, sigmas=4.0):
    """dropped out of n independent draws is rate * n within `sigmas` binomial standard deviations."""
    sigma = math.sqrt(rate * (1 - rate) / n)
    assert abs(dropped / n - rate) <= sigmas * sigma, f"dropped {dropped / n:.5f} of {n}, expected {rate} +- {sigmas * sigma:.5f}"


@interpreter
def test_interpreter_dropout_rate_is_dropout_p():
    """With v = identity the output is p * z: among the pairs with p > 0 the dropped fraction is
    dropout_p within 4 binomial standard deviations, the kept ones are scaled by 1 / (1 - dropout_p),
    and the dropped pairs are those of dropout_keep_mask, whose rate over 2^18 pairs is dropout_p
    to 4 standard deviations (1.4 % of 0.25, 5 % of 0.02: the kernel's few thousand pairs alone
    would let a threshold 10 % off pass)."""
    B, H, Nq, N, dropout_p = 2, 2, 64, 32, 0.25
    q, k, _ = random_inputs(B, H, Nq, N, N, seed=21)
    v = identity_values(B, H, N)
    alpha = alpha_for(LEARNED, H).float()
    p = T.entmax_attention(q.float(), k.float(), v.float(), alpha).double()
    torch.manual_seed(5)
    dropped_p = T.entmax_attention(q.float(), k.float(), v.float(), alpha, dropout_p=dropout_p).double()
    keep = kernel_keep_mask(q, k, dropout_p, 5)
    support = p > 0
    assert 0.2 < support.double().mean() < 0.9  # a softmax head (all keys) and a sparse one
    assert_binomial_rate((support & (dropped_p == 0)).sum().item(), support.sum().item(), dropout_p)
    assert torch.equal(support & (dropped_p != 0), support & keep)
    assert torch.allclose(dropped_p, p * keep / (1 - dropout_p), rtol=1e-6, atol=0)
    for rate in (dropout_p, 0.02):
        many = T.dropout_keep_mask(T.dropout_seed("cpu"), 2, 2, 256, 256, rate)
        assert_binomial_rate((~many).sum().item(), many.numel(), rate)


@interpreter
def test_interpreter_dropout_seeds():
    """Same torch seed: the same output, bit for bit.  Another seed, or the next call: another mask.
    Each (batch, head) draws its own mask, and the draws of one mask are independent of the pair's
    position (rows and columns drop at the rate overall)."""
    B, H, N = 2, 2, 40
    q, k, v = (x.float() for x in random_inputs(B, H, N, N, 16, seed=2))

    def run(torch_seed=None):
        if torch_seed is not None:
            torch.manual_seed(torch_seed)
        return T.entmax_attention(q, k, v, 1.0, dropout_p=0.5)

    first = run(0)
    assert torch.equal(first, run(0))
    assert not torch.equal(first, run(1))
    assert not torch.equal(run(0), run())  # the second call of a seeded sequence draws a new seed
    keep, other = kernel_keep_mask(q, k, 0.5, 0), kernel_keep_mask(q, k, 0.5, 1)
    assert (keep != other).double().mean() > 0.4
    flat = keep.reshape(B * H, N, N)
    for i in range(B * H):
        for j in range(i):
            assert (flat[i] != flat[j]).double().mean() > 0.4
    sigma = math.sqrt(0.25 / (B * H * N))  # per query row and per key column: B H N draws each
    assert (keep.double().mean((0, 1, 3)) - 0.5).abs().max() < 4.5 * sigma
    assert (keep.double().mean((0, 1, 2)) - 0.5).abs().max() < 4.5 * sigma


@interpreter
def test_interpreter_dropout_expectation_is_the_output_without_dropout():
    """One batch of 64 copies of the same inputs (each copy draws its own masks): the mean output is
    the output without dropout, within 5 standard deviations of the mean elementwise
    (Var(sum_j p_j z_j v_j) = dropout_p / (1 - dropout_p) sum_j p_j^2 v_j^2 per copy).  Softmax
    (every p_j > 0, and no threshold passes: the interpreter's time goes to the dropout)."""
    copies, Nq, Nk, dropout_p = 64, 12, 20, 0.2
    q, k, v = random_inputs(1, 1, Nq, Nk, 16, seed=8)
    q, k, v = (x.expand(copies, 1, -1, -1).float() for x in (q, k, v))
    torch.manual_seed(0)
    mean = T.entmax_attention(q, k, v, 1.0, dropout_p=dropout_p).double().mean(0)
    exact = T.entmax_attention(q[:1], k[:1], v[:1], 1.0).double()[0]
    weights = torch.softmax(q[0].double() @ k[0].double().transpose(-1, -2) / math.sqrt(16), -1)
    variance = dropout_p / (1 - dropout_p) * (weights**2) @ (v[0].double() ** 2) / copies
    assert ((mean - exact).abs() <= 5 * variance.sqrt() + 1e-6).all()
    assert (mean - exact).abs().max() > 0  # the copies did drop


@interpreter
def test_interpreter_dropout_rate_zero_is_the_kernel_without_dropout():
    """dropout_p = 0, or training=False: bit-identical output and gradients to a call without
    dropout, and torch's generator is not drawn from."""
    q, k, v = (x.float() for x in random_inputs(2, 2, 23, 30, 16, seed=4))
    alpha = alpha_for(LEARNED, 2).float()

    def results(**dropout):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, alpha)]
        out = T.entmax_attention(*leaves, key_padding_mask=padding(2, 30), causal=True, **dropout)
        return [out, *torch.autograd.grad(out.square().sum(), leaves)]

    plain = results()
    state = torch.get_rng_state()
    for dropout in (dict(dropout_p=0.0), dict(dropout_p=0.5, training=False)):
        assert all(torch.equal(a, b) for a, b in zip(results(**dropout), plain))
    assert torch.equal(torch.get_rng_state(), state)


@interpreter
def test_interpreter_attend_long_passes_dropout_to_the_kernel():
    """memory_efficient.attend_long with impl 'triton' (the model's way to the kernel) drops out:
    its output is the kernel's with the same seed, not the output without dropout."""
    from types import SimpleNamespace

    from sparse_runner.attention.memory_efficient import attend_long

    q, k, v = (x.float() for x in random_inputs(1, 2, 20, 20, 16, seed=6))
    alphas = torch.tensor([1.2, 1.7])
    normaliser = SimpleNamespace(name="alpha_entmax", kernel_alpha=lambda: alphas)
    torch.manual_seed(0)
    out, _, _ = attend_long(q, k, v, "triton", normaliser=normaliser, dropout_p=0.4)
    torch.manual_seed(0)
    assert torch.equal(out, T.entmax_attention(q, k, v, alphas, dropout_p=0.4))
    assert not torch.equal(out, T.entmax_attention(q, k, v, alphas))


@interpreter
@pytest.mark.parametrize("pattern, options", [
    pytest.param("local", {"block_size": 8}, marks=pytest.mark.slow),
    ("hst", {"block_size": 8}),
    pytest.param("bigbird", {"block_size": 4, "random_blocks": 1, "random_per_head": False}, marks=pytest.mark.slow),
    ("bigbird", {"block_size": 4, "random_blocks": 1}),   # random blocks per head: one key mask per head
])
def test_interpreter_block_pattern_tiles_through_the_kernel(monkeypatch, pattern, options):
    """On CUDA, `auto` sends a block pattern's alpha-entmax tiles through the Triton kernel, each tile a batch
    entry with its keys as the padding mask: outputs and gradients (the learned alphas' too) are the explicit
    tiles'. Here the kernel runs in the interpreter, standing in for CUDA. BigBird's random blocks drawn per head
    reach it with one mask per head."""
    from sparse_runner.attention import block_sparse
    from sparse_runner.models import build_classifier
    from sparse_runner.models.config import default_model

    def classifier():
        m = default_model(d_model=32, num_layers=1, num_heads=2, ffn_dim=32, dropout=0.0, pattern=pattern,
                          pattern_options=options, normaliser="alpha_entmax")
        torch.manual_seed(0)
        return build_classifier(m, vocab_size=20, num_classes=3, max_length=40, pad_id=0)

    tokens = torch.randint(1, 20, (2, 37), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([37, 22])
    calls = []
    kernel_path = block_sparse._attend_tiles_triton

    def counted(q, sources, valid, *args, **kwargs):
        calls.append(valid.shape[1])  # 1: one key mask for every head
        return kernel_path(q, sources, valid, *args, **kwargs)

    results = {}
    for kernel in ("triton", None):
        monkeypatch.setattr(block_sparse, "tile_kernel", lambda device, normaliser, kernel=kernel: kernel)
        monkeypatch.setattr(block_sparse, "_attend_tiles_triton", counted)
        model = classifier()
        out = model(tokens, lengths)
        out.square().sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results[kernel] = (out.detach(), grads)
    assert calls, "the kernel computed no tile"
    assert max(calls) == (2 if options.get("random_per_head", True) and pattern == "bigbird" else 1)
    torch.testing.assert_close(results["triton"][0], results[None][0], rtol=1e-4, atol=1e-5)
    assert results["triton"][1].keys() == results[None][1].keys()
    assert any("alpha" in name for name in results[None][1])
    for name, grad in results[None][1].items():
        torch.testing.assert_close(results["triton"][1][name], grad, rtol=1e-3, atol=1e-5, msg=name)


@interpreter
@pytest.mark.parametrize("normaliser, mode", [("entmax15", 15), ("sparsemax", 20), ("alpha_entmax", 0)])
def test_interpreter_a_block_patterns_tiles_take_the_formulas_of_their_alpha(monkeypatch, normaliser, mode):
    """HST tiles of 1.5-entmax and sparsemax reach the kernel with one float alpha, so it compiles their own
    formulas; learned alphas take the general ones."""
    from sparse_runner.attention import block_sparse
    from sparse_runner.models import build_classifier
    from sparse_runner.models.config import default_model

    monkeypatch.setattr(block_sparse, "tile_kernel", lambda device, normaliser: "triton")
    modes = []
    forward = T._KERNELS
    monkeypatch.setattr(T, "_KERNELS", lambda *args: modes.append(args[-2]) or forward(*args))
    m = default_model(d_model=32, num_layers=1, num_heads=2, ffn_dim=32, dropout=0.0, pattern="hst",
                      pattern_options={"block_size": 8}, normaliser=normaliser)
    model = build_classifier(m, vocab_size=20, num_classes=3, max_length=40, pad_id=0)
    model(torch.randint(1, 20, (1, 30), generator=torch.Generator().manual_seed(1)), torch.tensor([30]))
    assert modes and set(modes) == {mode}


def test_a_block_patterns_tiles_take_the_triton_kernel_only_where_every_query_of_a_tile_sees_the_same_keys():
    from sparse_runner.attention.block_sparse import triton_takes

    q = torch.zeros(2, 4, 3, 8, 64)
    assert triton_takes(torch.ones(2, 1, 3, 1, 24, dtype=torch.bool), q)
    assert triton_takes(torch.ones(2, 4, 3, 1, 24, dtype=torch.bool), q)           # per head (BigBird's random)
    assert not triton_takes(torch.ones(1, 1, 3, 8, 24, dtype=torch.bool), q)       # per query
    assert not triton_takes(torch.ones(2, 1, 3, 1, 24, dtype=torch.bool), q.double())
    assert not triton_takes(torch.ones(2, 1, 3, 1, 24, dtype=torch.bool), torch.zeros(2, 4, 3, 8, T.MAX_HEAD_DIM + 1))


@pytest.mark.skipif(_INTERPRETED, reason="the interpreter checks run in this process")
def test_interpreter_in_fresh_process():
    """The default interpreter subset in a process that sets TRITON_INTERPRET=1 before importing triton."""
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1")
    selection = ["-m", "not slow and not gpu", "-k", "not in_fresh_process"]
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", *selection]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary  # the interpreter really ran


# ------------------------------------------------------------------------------------------------
# Argument checks (no kernel launch)
# ------------------------------------------------------------------------------------------------


@interpreter
@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(alpha=2.5), ValueError, r"alpha must be in \[1, 2\]"),
        (dict(alpha=torch.ones(3)), ValueError, "alpha tensor must have shape"),
        (dict(alpha="1.5"), TypeError, "alpha must be a float or a tensor"),
        (dict(k=torch.zeros(1, 2, 7, 8)), ValueError, "k and v must be"),
        (dict(v=torch.zeros(1, 2, 7, 16, dtype=torch.float64)), TypeError, "share a dtype"),
        (dict(q=torch.zeros(1, 2, 5, 16, dtype=torch.float64)), TypeError, "not supported"),
        (dict(key_padding_mask=torch.ones(1, 6, dtype=torch.bool)), ValueError, "key_padding_mask must be"),
        (dict(q=torch.zeros(1, 2, 5, 256), k=torch.zeros(1, 2, 7, 256), v=torch.zeros(1, 2, 7, 256)), ValueError, "head dim 256"),
        (dict(dropout_p=1.0), ValueError, r"dropout_p must be a number in \[0, 1\), got 1.0"),
        (dict(dropout_p=-0.1), ValueError, r"dropout_p must be a number in \[0, 1\)"),
        (dict(dropout_p=True), ValueError, r"dropout_p must be a number in \[0, 1\)"),
    ],
)
def test_bad_arguments_are_refused(change, error, match):
    args = dict(q=torch.zeros(1, 2, 5, 16), k=torch.zeros(1, 2, 7, 16), v=torch.zeros(1, 2, 7, 16), alpha=1.5, key_padding_mask=None, dropout_p=0.0)
    args.update(change)
    with pytest.raises(error, match=match):
        T.entmax_attention(args["q"], args["k"], args["v"], args["alpha"], key_padding_mask=args["key_padding_mask"], dropout_p=args["dropout_p"])


def test_available_follows_triton_and_device():
    assert T.available() == (T._interpreting() or _CUDA)


# ------------------------------------------------------------------------------------------------
# Compiled for real GPUs (no GPU needed): catches what the interpreter lets through
# ------------------------------------------------------------------------------------------------

# Run in a fresh process without TRITON_INTERPRET: triton.compile with an explicit target goes through
# the whole toolchain (TTIR -> TTGIR -> LLVM -> PTX -> cubin, with the ptxas that ships in the triton
# wheel); no driver or device is touched.
_COMPILE_SCRIPT = r"""
import sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sparse_runner.attention.kernels import entmax_attention_triton as T

arch, dtype_name, head_dim, masked, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
n_queries = int(sys.argv[6]) if sys.argv[6] != "any" else None
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
block_m, block_n, block_d, warps = T._blocks(head_dim, dtype, n_queries)
pointers = {name: "*" + dtype_name for name in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")}
pointers.update({name: "*fp32" for name in ("OS", "M", "U", "FS", "C", "DALPHA", "ALPHA")})
pointers.update(TILES="*i8", KV_COUNT="*i32", Q_COUNT="*i32", KV_INDEX="*i16", Q_INDEX="*i16")
pointers["KPM"] = "*u8" if masked else "*fp32"
pointers["SEED"] = "*i64" if masked else "*fp32"  # the masked builds carry dropout too (else a dummy pointer)
pointers["KEEP"] = "*u8"
common = dict(HAS_KPM=masked, CAUSAL=masked, DROPOUT=masked, MODE=mode, SKIP_TILES=masked, EXACT_STEP=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
              SOFT_THRESHOLD=T.ALPHA_SOFTMAX_THRESHOLD, DOT_PRECISION=T._DOT_PRECISION)
kernels = [
    (T._fwd_kernel, dict(TOL_F=T.TOL, STALL=T.STALL, MAX_ITER_N=T.MAX_ITER, BACKWARD=True)),
    (T._fwd_kernel, dict(TOL_F=T.TOL, STALL=T.STALL, MAX_ITER_N=T.MAX_ITER, BACKWARD=False)),
    (T._bwd_dq_kernel, dict(NEED_DALPHA=mode == T._MODE_GENERAL, PSI_SWITCH=T._PSI_SWITCH)),
    (T._bwd_dkdv_kernel, {}),
    (T._keep_mask_kernel, dict(BLOCK_M=64, BLOCK_N=64)),
]
for fn, extra in kernels:
    consts = {name: value for name, value in dict(common, **extra).items() if name in fn.arg_names}
    types = dict(pointers, SEED="*i64") if fn is T._keep_mask_kernel else pointers
    signature = {name: "constexpr" if name in consts else types.get(name, "fp32" if name in ("scale", "keep_scale") else "i32")
                 for name in fn.arg_names}
    # As the JIT specialises a launch (16-byte-aligned pointers, strides and D multiples of 16): the build that
    # runs, with vectorised loads and pipelined loops, not a plainer one.
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if signature[name].startswith("*") or (signature[name] == "i32" and (name[0] == "s" or name == "D"))}
    source = ASTSource(fn=fn, signature=signature, attrs=aligned,
                       constexprs={(fn.arg_names.index(name),): value for name, value in consts.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    assert compiled.asm["cubin"], fn.__name__
    print(fn.__name__, "shared memory", compiled.metadata.shared)
"""


@pytest.mark.parametrize("arch, dtype, head_dim, masked, mode, n_queries", [
    (90, "fp32", 64, True, 0, "any"), (90, "bf16", 128, False, 15, "any"), (80, "fp16", 32, True, 20, "any"),
    (90, "bf16", 64, True, 0, "1"),  # one query: a 16-row query tile
])
def test_kernels_compile_to_cubin(arch, dtype, head_dim, masked, mode, n_queries):
    """Forward and both backward kernels (with dropout where masked) and the keep-mask kernel compile
    for sm_90 (H100/H200) / sm_80 (A100) at the launch configuration entmax_attention uses, for long
    sequences and for one query. In the default suite (4-6 s each on 2 CPU cores, empty Triton cache): with no
    GPU at hand, it is what catches a change that no longer builds for one."""
    import subprocess

    pytest.importorskip("triton.backends.nvidia")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when unset; 1 is its default
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, str(arch), dtype, str(head_dim), "1" if masked else "0", str(mode), n_queries],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("shared memory") == 5


# ------------------------------------------------------------------------------------------------
# CUDA
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "N, dtype, alpha, pad, causal",
    [
        (1000, torch.float32, 1.5, True, False),
        (1000, torch.float32, LEARNED, True, True),
        (1537, torch.float32, 2.0, False, True),
        (2048, torch.float32, 1.0, True, False),
        (4096, torch.float32, LEARNED, False, False),
        (1000, torch.bfloat16, 1.5, True, True),
        (4096, torch.bfloat16, LEARNED, True, False),
        (2500, torch.float16, 2.0, False, False),
    ],
)
@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA or T._interpreting(), reason="needs a CUDA device (and TRITON_INTERPRET unset)")
def test_gpu_matches_dense(N, dtype, alpha, pad, causal):
    B, H, D = 2, 4, 64
    q, k, v = random_inputs(B, H, N, N, D, seed=N, spread=1.5, device="cuda")
    kpm = padding(B, N, seed=N, device="cuda") if pad else None
    got, want = run_both(q, k, v, alpha_for(alpha, H, "cuda"), dtype=dtype, key_padding_mask=kpm, causal=causal)
    assert_matches(got, want, TOL32 if dtype == torch.float32 else 3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA or T._interpreting(), reason="needs a CUDA device (and TRITON_INTERPRET unset)")
@pytest.mark.parametrize("Nq, dtype", [(1, torch.bfloat16), (20, torch.float32), (40, torch.bfloat16)])
def test_gpu_few_queries_on_a_smaller_query_tile(Nq, dtype):
    """A decoding step's one query, and HST's one representative per tile, over 1000 keys (query tiles of 16,
    32 and 64 rows), against the explicit path."""
    q, k, v = random_inputs(2, 4, Nq, 1000, 64, seed=Nq, spread=1.5, device="cuda")
    got, want = run_both(q, k, v, alpha_for(LEARNED, 4, "cuda"), dtype=dtype, key_padding_mask=padding(2, 1000, device="cuda"), causal=True)
    assert_matches(got, want, TOL32 if dtype == torch.float32 else 3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA or T._interpreting(), reason="needs a CUDA device (and TRITON_INTERPRET unset)")
@pytest.mark.parametrize("dtype, alpha, causal", [(torch.float32, LEARNED, True), (torch.bfloat16, 1.5, False)])
def test_gpu_dropout_matches_explicit_with_the_same_mask(dtype, alpha, causal):
    """Compiled kernels with dropout: output and gradients against the explicit path with the
    kernel's mask, and the dropped fraction of a large mask within 4 binomial standard deviations."""
    B, H, N, D, dropout_p = 2, 4, 1000, 64, 0.1
    q, k, v = random_inputs(B, H, N, N, D, seed=N, spread=1.5, device="cuda")
    got, want = run_both(q, k, v, alpha_for(alpha, H, "cuda"), dtype=dtype, key_padding_mask=padding(B, N, device="cuda"), causal=causal, dropout_p=dropout_p)
    assert_matches(got, want, TOL32 if dtype == torch.float32 else 3e-2)
    keep = T.dropout_keep_mask(T.dropout_seed("cuda"), 8, 8, 1024, 1024, dropout_p)
    assert_binomial_rate((~keep).sum().item(), keep.numel(), dropout_p)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA or T._interpreting(), reason="needs a CUDA device (and TRITON_INTERPRET unset)")
@pytest.mark.parametrize("head_dim", [16, 32, 128])
def test_gpu_head_dims(head_dim):
    q, k, v = random_inputs(1, 2, 700, 900, head_dim, seed=head_dim, device="cuda")
    got, want = run_both(q, k, v, alpha_for(LEARNED, 2, "cuda"), key_padding_mask=padding(1, 900, device="cuda"), causal=True)
    assert_matches(got, want, TOL32)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA or T._interpreting(), reason="needs a CUDA device (and TRITON_INTERPRET unset)")
@pytest.mark.parametrize("dtype, alpha", [(torch.bfloat16, 1.5), (torch.bfloat16, LEARNED), (torch.float32, 2.0)])
def test_gpu_tile_skipping_is_bitwise_and_repeatable(monkeypatch, dtype, alpha):
    """Local scores at 4,096 keys: the forward's passes drop most key tiles from their lists, written and read
    back by one program between barriers, which Triton's interpreter cannot test for races. With skipping,
    three runs give bitwise the same outputs and gradients, and those of the kernel without skipping."""
    q, k, v = (x.to("cuda") for x in banded_inputs(1, 4, 4096, 64, band=64, strength=12.0))
    kpm = padding(1, 4096, device="cuda")
    grad_out = torch.randn(1, 4, 4096, 64, generator=torch.Generator().manual_seed(5)).to("cuda", dtype)
    alpha = alpha_for(alpha, 4, "cuda")  # LEARNED: 1.0 (a softmax head, which weighs every visible tile) to 1.6
    mode = T._MODE_GENERAL if torch.is_tensor(alpha) else T._mode(alpha)
    runs = []
    for skip in (True, True, True, False):
        monkeypatch.setattr(T, "SKIP_EMPTY_TILES", skip)
        runs.append(_kernel_run(q, k, v, alpha, mode, grad_out, dtype=dtype, key_padding_mask=kpm, causal=True))
    (first, tiles), *others = runs
    assert tiles[-1].float().mean() < 0.1  # skipping happened (the last head, alpha 1.6 or the fixed one)
    for results, _ in others:
        for x, y in zip(first, results):
            assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA or T._interpreting(), reason="needs a CUDA device (and TRITON_INTERPRET unset)")
def test_gpu_per_head_key_padding_masks():
    B, H, N = 2, 4, 1000
    q, k, v = random_inputs(B, H, N, N, 64, seed=3, spread=1.5, device="cuda")
    kpm = torch.rand(B, H, N, generator=torch.Generator().manual_seed(2)).lt(0.6).to("cuda")
    got, want = run_both(q, k, v, alpha_for(LEARNED, H, "cuda"), dtype=torch.bfloat16, key_padding_mask=kpm, causal=True)
    assert_matches(got, want, 3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA or T._interpreting(), reason="needs a CUDA device (and TRITON_INTERPRET unset)")
def test_gpu_peak_memory_is_linear_in_length():
    """Forward + backward at N = 2048 and 8192: peak memory above the inputs grows ~4x (O(N)), not
    ~16x (an (N, N) matrix per head would be 4 x 8192^2 x 4 bytes = 1 GiB at 8192)."""

    def peak_extra(N):
        q, k, v = (x.to(torch.bfloat16).requires_grad_() for x in random_inputs(1, 4, N, N, 64, device="cuda"))
        alpha = torch.tensor([1.1, 1.3, 1.5, 1.9], device="cuda", requires_grad=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = T.entmax_attention(q, k, v, alpha, causal=True)
        out.sum().backward()  # also a stride-0 (expanded) output gradient
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    peak_extra(1024)  # warm-up: compilation and allocator caches outside the measurement
    small, large = peak_extra(2048), peak_extra(8192)
    assert large < 6 * small, (small, large)
    assert large < 64 * 2**20, large  # q, k, v, out and grads of (4, 8192, 64) bf16 are 4 MiB each


# ------------------------------------------------------------------------------------------------
# AdaSplash backend
# ------------------------------------------------------------------------------------------------

A = importlib.import_module("sparse_runner.attention.kernels.adasplash_backend")


def test_adasplash_available_needs_package_and_cuda():
    assert A.available() == (_CUDA and importlib.util.find_spec("adasplash") is not None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(alpha=1.0), r"alpha in \(1, 2\]"),
        (dict(key_padding_mask=torch.tensor([[True, False, True, True, True, True, True]])), "right padding"),
        (dict(k=torch.zeros(1, 2, 6, 16), v=torch.zeros(1, 2, 6, 16)), "Nq == Nk"),
        (dict(q=torch.zeros(1, 2, 7, 24), k=torch.zeros(1, 2, 7, 24), v=torch.zeros(1, 2, 7, 24)), "head dim"),
    ],
)
def test_adasplash_refuses_what_it_cannot_express(kwargs, match):
    """Checked before any kernel (so on CPU too): one-line ValueErrors naming the problem."""
    args = dict(q=torch.zeros(1, 2, 7, 16), k=torch.zeros(1, 2, 7, 16), v=torch.zeros(1, 2, 7, 16), alpha=1.5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        A.check_arguments(args["q"], args["k"], args["v"], args["alpha"], key_padding_mask=args.get("key_padding_mask"))


@pytest.mark.gpu
@pytest.mark.skipif(not A.available(), reason="needs CUDA and the adasplash package")
@pytest.mark.parametrize("alpha, pad, causal", [(1.5, False, False), (1.5, True, True), (2.0, True, False), (1.25, False, True)])
def test_gpu_adasplash_matches_dense(alpha, pad, causal):
    """AdaSplash against the dense reference on the real query rows (it zeroes padded queries).

    Looser than our kernel's tolerance: AdaSplash runs 10 Halley-bisection steps on the threshold and
    does not divide by sum p, so its weights sum to 1 only as well as those steps converge."""
    B, H, N, D = 2, 4, 1000, 64
    q, k, v = random_inputs(B, H, N, N, D, seed=1, device="cuda")
    lengths = torch.tensor([N, 700], device="cuda")
    kpm = (torch.arange(N, device="cuda")[None, :] < lengths[:, None]) if pad else None
    g = torch.Generator().manual_seed(0)
    grad_out = torch.randn(B, H, N, D, generator=g, dtype=torch.float64).to("cuda")
    if kpm is not None:
        grad_out = grad_out * kpm[:, None, :, None]  # padded query rows are discarded by callers
    results = []
    for fn, dtype in ((A.attention, torch.float32), (dense_reference, torch.float64)):
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = fn(*leaves, alpha, key_padding_mask=kpm, causal=causal)
        if kpm is not None:
            out = out * kpm[:, None, :, None]
        grads = torch.autograd.grad((out.double() * grad_out).sum(), leaves)
        results.append([out.detach().double(), *[x.double() for x in grads]])
    assert_matches(*results, 5e-3)
