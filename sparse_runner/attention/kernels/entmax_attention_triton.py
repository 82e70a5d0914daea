"""alpha-entmax attention without the n x n matrix: a FlashAttention-style Triton kernel (CUDA).

    out = alpha-entmax(scale * q k^T  [masked]) v        per (batch, head), along the keys

with alpha fixed (a float: 1 = softmax, 1.5-entmax, 2 = sparsemax) or learned per head (an (H,)
tensor that requires grad; Correia et al. 2019).  Memory is O(N): scores are produced tile by tile
(BLOCK_M query rows x BLOCK_N keys) and never stored; per query row only the threshold t and the
normaliser F are kept for the backward (AdaSplash, Goncalves et al. 2025, does the same), with os
(float32, the size of the output).  Per (BLOCK_M x BLOCK_N) tile the forward keeps a 2-byte entry of its
query tile's list of key tiles, and for the backward one byte (whether the tile holds some p > 0), which
the backward turns into 2-byte lists per key tile (`_query_tile_lists`): 5 bytes per tile, Nq Nk / 400
bytes per head with 16-bit inputs (10 MiB at 64k x 64k), the only terms that are not linear in N.  t is kept
as two float32 numbers, t = m + u (row max m, offset u): rounding t to one float32 costs up to
ulp(m) in 1 + a1 (s - t), which near the threshold is the whole of it (simulated in float32: a
sparsemax row with |m| = 100 over 65536 near-tied keys has a max error of 1.5e-5 with t rounded,
3e-8 with (m, u); 2e-6 against 5e-8 over 4096 keys).

Public API:
    available() -> bool
    entmax_attention(q, k, v, alpha, *, scale=None, key_padding_mask=None, causal=False,
                     dropout_p=0.0, training=True) -> Tensor
    dropout_seed(device) -> Tensor;  dropout_keep_mask(seed, B, H, Nq, Nk, dropout_p) -> Tensor

Conventions (the same as `sparse_runner.attention.entmax`, whose module docstring has the maths):
with a1 = alpha - 1 and scores s_j of one query row,
    p_j = [1 + a1 (s_j - t)]_+^(1/a1) / F,        F = sum_j [1 + a1 (s_j - t)]_+^(1/a1),
which is alpha-entmax(s) = [(alpha-1) s - tau]_+^(1/(alpha-1)) with tau = a1 t - 1 (F = 1 at the
true t; dividing by the computed F makes sum p = 1 to rounding whatever the solver left).  Heads with
a1 < ALPHA_SOFTMAX_THRESHOLD (5e-7) are softmax: p_j = exp(s_j - t) / F with t = m, the row max
(u = 0), so m + log F is the row's log-sum-exp.

Threshold, per row (forward kernel, one program per (batch, head, BLOCK_M query rows)):
  1. one pass over the key tiles: the row max m and the number n of visible keys;
  2. the bracket: at t = m the max entry alone gives [1]^(1/a1) = 1, so F(m) >= 1; at
     t = m + (1 - n^-a1) / a1 every visible entry has 1 + a1 (s_j - t) <= n^-a1, so F <= 1.
     F decreases in t, hence t in [m, m + (1 - n^-a1) / a1] (= [m, m + log n] as a1 -> 0).
  3. Newton on G(u) = F^a1 - 1 in u = t - m (convex and decreasing: from u = 0, the left end, the
     iterates increase monotonically to the root and never overshoot; exact in one step on a fixed
     support for sparsemax).  Each iteration is one pass over the key tiles.  An iterate that leaves
     the bracket (only rounding can do that) is replaced by the bracket's midpoint (bisection).  A
     row is done when |F - 1| <= TOL (2e-6, the torch backend's float32 tolerance) or when a step
     moves u by <= STALL * u (4 ulps: float32 cannot place t better); the rows of a program stop
     together when all are done, after MAX_ITER (40) passes at the latest.  A float32 simulation of
     this solver needed at most 8 passes (N up to 64k; random, peaked, tied rows, alpha 1+1e-6..2).
     Each pass drops from the program's list of key tiles those in which no row has p > 0 at its proven
     lower bound u_lo (SKIP_EMPTY_TILES, AdaSplash's block skipping): such a tile has none at the root
     or at any later iterate (all >= u_lo), so skipping it changes no sum, and the later passes read
     only the tiles near the support.
     MODE 15 (below) takes Halley's steps instead where they are at most twice Newton's (`_step`);
     they may overshoot, which the bracket catches, and take fewer passes (scripts/bench_kernel_passes.py).
     MODE 15 and 20 also know F on a fixed support in closed form (linear, quadratic in u): when the root
     on a pass's support lies where that support is unchanged (no w_j on it reaches 0, none off it rises
     above 0; `_exact_on_support`, EXACT_ON_SUPPORT), it is the threshold, and the row is done without the
     pass that would only have confirmed F = 1: one pass fewer per program on random scores;
  4. a last pass accumulating p v and F; out = acc / F.  When a backward may follow, the same pass
     also accumulates os = sum_j s_j v_j / sum_j s_j (see Backward) and marks, per (query tile, key
     tile), whether the tile holds any p > 0.
Softmax heads skip 2-3 (u = 0).  Fully masked rows (no visible key) give zeros: m = u = 0, F = 1.

Per score, a pass evaluates w = 1 + a1 (s - t) and its powers w^(1/a1) (F, p) and w^(1/a1 - 1)
(-dF/du, s).  For any alpha that takes a log and two exps per score, and the GPU's special-function
units, not its tensor cores, then bound the pass (16 such operations per clock per SM on Hopper).  When
every head has alpha 1.5 or 2, the kernels are compiled with those powers written out (MODE: w^2 and
w, or w and 1), which needs no special function per score.  In the general case, from alpha 1.1 on,
log w is taken directly instead of through _log1p, whose division is one more special function.

Backward (p recomputed per tile from (m, u, F); s_j = p_j^(2 - alpha) on the support, 0 elsewhere;
dP_j = dO . v_j):
    dS = s * (dP - c),  c = sum_j s_j dP_j / sum_j s_j           (0 for a fully masked row)
    dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO
    dalpha (per row) = -sum_j dP_j A_j + c sum_j A_j,  A_j = p_j (log p_j)^2 psi(-a1 log p_j),
    psi(x) = (e^x - 1 - x) / x^2 (Taylor series below x = 1, then (s_j - p_j - p_j x) / a1^2);
the per-head gradient sums the rows over batch and queries.  Softmax heads use the alpha = 1
limits (s = p, psi = 1/2), as the torch backend does.  c = dO . os, with os from the forward (as
FlashAttention's D = dO . O; for softmax os = out), so no pass over the keys computes it.  Two
kernels: `_bwd_dq_kernel` (per query tile, one pass: c, dQ and the alpha sums) and `_bwd_dkdv_kernel`
(per key tile, over the query tiles that can see it; it reads c).  Both visit only the tiles where
the forward saw some p > 0 (`SKIP_EMPTY_TILES`; exact: elsewhere p, s and dS are 0).  Every gradient
tile is written by exactly one program: no atomics, deterministic results.

Attention dropout (as FlashAttention does it): the normalised weights are dropped before p v,
    out_i = sum_j p_ij z_ij v_j,   z_ij = keep_ij / (1 - dropout_p),
with keep_ij from a counter-based RNG: Philox-4x32-10 (`tl.philox`) keyed by a 64-bit seed, on the
counter (query i, key j, batch * H + head, 0); key j is dropped when the first 32-bit output, shifted
to 31 bits, is below round(dropout_p 2^31).  Nothing is stored: the backward draws the same keep_ij
again.  The seed is one draw of torch's generator for the device per forward (`dropout_seed`), so
`torch.manual_seed` and a restored RNG state give the same masks (eagerly; a model compiled by Inductor
draws the seed with Inductor's own generator, so its masks differ from eager's, its backward still using
its forward's seed); `dropout_keep_mask` materialises them for a seed.  The backward is the one above with the dropped weights: dV = (p z)^T dO, and
dP_ij = z_ij dO_i . v_j in dS, c and dalpha.  dropout_p = 0 (or training=False) compiles the kernels
without any of this (the DROPOUT constexpr) and draws no seed.

Shapes and masks:
* q (B, H, Nq, D); k, v (B, H, Nk, D); any Nq, Nk >= 0 (no multiple of the tile needed); D <= 128
  (tiles are padded to a power of two >= 16: D in {16, 32, 64, 128} wastes nothing).  The last
  dimension must be contiguous; other strides are free (no copy of a transposed (B, N, H, D) view).
* key_padding_mask: (B, Nk) bool, True = a real key, or (B, 1 or H, Nk), one mask per head (a block pattern's
  tiles whose heads gather different keys).  causal: query i sees keys j <= i + Nk - Nq
  (the last query sees every key, as for a decoder with a cache).  A row that sees no key gives a
  zero output and zero gradients.
* dtypes: float32, bfloat16 or float16 (q, k, v alike); the output has q's dtype.  Everything
  elementwise (threshold, p, s, c, dalpha) is float32.  Scores are a float32-accumulated dot of the
  inputs (exact products for 16-bit inputs; float32 inputs use IEEE float32, not TF32).  For 16-bit
  inputs p and dS are rounded to the input dtype for the p v, dS K and dS^T Q products (tensor
  cores), as FlashAttention does; for float32 inputs everything stays float32.
* alpha: a float in [1, 2] (ValueError outside), or a tensor of shape (H,), (1, H, 1, 1) or () (one
  alpha for all heads); tensor values are used clamped to [1, 2] (not validated: that would need a device
  sync), as in `alpha_entmax`.  The usual learned parameterisation 1 + sigmoid(a) stays inside.

Devices: CUDA tensors; with TRITON_INTERPRET=1 set when this module is imported (the kernels are
decorated then; later changes of the variable do not matter), Triton's interpreter runs the same
kernels on CPU tensors (numpy; slow, for tests).
"""

from __future__ import annotations

import math
import os
from typing import Optional, Union

import torch
from torch import Tensor

try:  # an optional dependency (the [gpu] extra): the module imports without it, available() is False
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

from sparse_runner.attention.entmax_torch import ALPHA_SOFTMAX_THRESHOLD
from sparse_runner.attention.kernels.operator import KernelOperator

__all__ = ["available", "entmax_attention", "dropout_seed", "dropout_keep_mask", "MAX_HEAD_DIM"]

Alpha = Union[float, torch.Tensor]

MAX_HEAD_DIM = 128
# Newton passes per forward at most (a safety net: see STALL for the measured need).
MAX_ITER = 40
# |F - 1| at which a row's threshold is accepted (the torch backend's float32 tolerance) ...
TOL = 2e-6
# ... or once a Newton step moves u = t - m by at most STALL * u (2^-21: 4 ulps), where float32 cannot
# resolve the threshold further.  Simulated in float32 on 64k-key rows (random, peaked, tied, |m| = 100):
# at most 8 passes, errors against float64 alpha-entmax as with 40 passes on the F criterion alone.
STALL = 2.0**-21
# The kernels' MODE: per-score formulas specialised at compile time when every head has alpha 1.5 (powers
# 2 and 1 instead of log and exp) or 2 (linear), the general ones otherwise (`_unnormalised`).
_MODE_GENERAL, _MODE_ENTMAX15, _MODE_SPARSEMAX = 0, 15, 20
# Both read at each call; the GPU benchmark (scripts/bench_long_attention.py) times each setting against
# the other.  Whether a single alpha of 1.5 or 2 takes its MODE ...
SPECIALISE_ALPHA = True
# ... and whether the forward's later passes and the backward visit only the key tiles that can hold some p > 0
# (AdaSplash's block skipping; exact: the others add zeros).
SKIP_EMPTY_TILES = True
# ... and whether MODE 15 and 20 take the root on a pass's support as the threshold when the step keeps that
# support (`_exact_on_support`), which saves the pass that would only have confirmed it.
EXACT_ON_SUPPORT = True
# psi(x) = (e^x - 1 - x) / x^2: series below, direct formula above (entmax_torch.py's float32 switch).
_PSI_SWITCH = 1.0


# Read once: @triton.jit picks the interpreter or the compiler when this module is imported.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _interpreting() -> bool:
    """Whether the kernels below run in Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRET


def available() -> bool:
    """True when triton imports and there is a CUDA device, or TRITON_INTERPRET=1 (CPU interpreter)."""
    return triton is not None and (_interpreting() or torch.cuda.is_available())


# ------------------------------------------------------------------------------------------------
# Kernels (defined only when triton imports; `available()` guards every launch)
# ------------------------------------------------------------------------------------------------

if triton is not None:
    # Device helpers.  Under the interpreter every call of a @triton.jit helper re-patches
    # triton.language (~0.4 ms a call, most of the interpreter's time here); called as plain Python
    # functions they run inside the kernel's own patched scope and give the same results.
    _helper = (lambda fn: fn) if _interpreting() else triton.jit

    @_helper
    def _expm1(x):
        """exp(x) - 1 without cancellation: 4 series terms below |x| = 0.01 (relative error < 1e-10),
        exp(x) - 1 above (relative error <= 6e-8 / |x| <= 6e-6).  Only Newton steps and the bracket
        use it, so these errors cost at most an iteration."""
        series = x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0))))
        return tl.where(tl.abs(x) < 1e-2, series, tl.exp(x) - 1.0)

    @_helper
    def _log1p(z):
        """log(1 + z) for z > -1, accurate for small |z| (Goldberg's trick: the rounding of w = 1 + z
        cancels in log(w) * z / (w - 1)); needed because a1 (s - t) is tiny as alpha -> 1."""
        w = 1.0 + z
        return tl.where(w == 1.0, z, tl.log(w) * (z / tl.where(w == 1.0, 1.0, w - 1.0)))

    @_helper
    def _psi_series(x):
        """psi(x) = (e^x - 1 - x) / x^2 = sum_j x^j / (j+2)!, 9 terms (rel. error < 3e-8 for x < 1)."""
        r = x * (1.0 / 3628800.0) + 1.0 / 362880.0
        r = r * x + 1.0 / 40320.0
        r = r * x + 1.0 / 5040.0
        r = r * x + 1.0 / 720.0
        r = r * x + 1.0 / 120.0
        r = r * x + 1.0 / 24.0
        r = r * x + 1.0 / 6.0
        r = r * x + 0.5
        return r

    @_helper
    def _visible(q_idx, k_idx, Nq, Nk, kpm_row_ptr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr):
        """Bool tile: key k_idx exists, is not padding, and (causal) k_idx <= q_idx + Nk - Nq.

        q_idx, k_idx: 2-D index tensors that broadcast to the tile, e.g. offs_m[:, None] and
        offs_n[None, :] for a (BLOCK_M, BLOCK_N) tile, or the transposed pair for (BLOCK_N, BLOCK_M).
        """
        vis = (k_idx < Nk) & (q_idx >= 0)  # the second term only broadcasts to the full tile
        if HAS_KPM:
            vis = vis & (tl.load(kpm_row_ptr + k_idx, mask=k_idx < Nk, other=0) != 0)
        if CAUSAL:
            vis = vis & (k_idx <= q_idx + (Nk - Nq))
        return vis

    @_helper
    def _dropout_scale(seed, bh, q_idx, k_idx, drop_below, keep_scale):
        """Float tile z = keep / (1 - dropout_p): 0 where (query, key) is dropped, keep_scale elsewhere.

        q_idx, k_idx: 2-D index tensors broadcasting to the tile (as for `_visible`); bh: the program's
        batch * H + head; seed: int64 scalar.  The Philox counter is (q, k, bh, 0) whatever the tile
        layout, so every kernel draws the same keep for a pair.  Kept when the first output's top 31
        bits are >= drop_below = round(dropout_p 2^31) (P(drop) = drop_below / 2^31).
        """
        c0 = q_idx + k_idx * 0  # broadcast both indices to the full tile
        c1 = k_idx + q_idx * 0
        c2 = c0 * 0 + bh
        r, _, _, _ = tl.philox(seed, c0, c1, c2, c2 * 0)
        return tl.where((r >> 1).to(tl.int32, bitcast=True) >= drop_below, keep_scale, 0.0)

    @_helper
    def _scores(q, k_ptrs, kv_mask, scale, DOT_PRECISION: tl.constexpr):
        """(BLOCK_M, BLOCK_N) float32 scores scale * q k^T for one key tile (k rows at k_ptrs)."""
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        return tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale

    # From this a1 (alpha >= 1.1) on, _unnormalised takes log(1 + z) as log of the rounded 1 + z: its
    # rounding costs <= 2^-25 / (a1 w) <= 3e-7 / w relatively in pt = w^(1/a1), which is small where pt
    # is not, and it saves _log1p's division (a special function on the GPU) per score.
    _LOG_DIRECT_FROM = tl.constexpr(0.1)

    @_helper
    def _support(d, a1, vis, MODE: tl.constexpr):
        """Bool tile: the visible keys with p > 0 at the threshold t = m + u, d = (s - m) - u, i.e. 1 + a1 d > 0
        (a1 = 0.5 in MODE 15, 1 in MODE 20, the head's a1 otherwise: 0 for softmax, which keeps every visible key)."""
        if MODE == 15:
            return vis & (0.5 * d > -1.0)
        elif MODE == 20:
            return vis & (d > -1.0)
        else:
            return vis & (a1 * d > -1.0)

    @_helper
    def _unnormalised(s, m, u, a1, is_soft, vis, MODE: tl.constexpr):
        """Unnormalised weights of a score tile: (pt, qt, log_pt, support), 0 outside the support.

            pt = [1 + a1 (s - t)]_+^(1/a1)   (softmax: exp(s - t)),  so that p = pt / F,
            qt = pt^(1 - a1) = [1 + a1 (s - t)]_+^(1/a1 - 1)   (softmax: pt).
        qt is both -dF/du's term (Newton) and, up to a factor per row, the backward's s_j = p_j^(2 - alpha).
        s: a score tile; m, u: per-query statistics (t = m + u), 2-D and broadcast along the key axis
        (m[:, None] for a (BLOCK_M, BLOCK_N) tile, m[None, :] for its transpose); a1: the head's
        alpha - 1, 0 for a softmax head (is_soft, a scalar bool); vis: the visible keys.
        MODE (constexpr): _MODE_ENTMAX15 or _MODE_SPARSEMAX when every head has that alpha: powers 2 and 1,
        no transcendental function per score (in the general case, 0, four per score: log, division,
        two exp; the GPU's special-function units, not its tensor cores, bound such a pass).  log_pt is
        computed in the general mode only (the alpha gradient's only reader).
        s - t is formed as (s - m) - u: s - m is exact near the max, and u keeps its own precision.
        """
        d = (s - m) - u
        support = _support(d, a1, vis, MODE)
        if MODE == 15:
            w = tl.where(support, 1.0 + 0.5 * d, 0.0)
            return w * w, w, d, support
        elif MODE == 20:
            return tl.where(support, 1.0 + d, 0.0), support.to(tl.float32), d, support
        else:
            z = a1 * d
            if a1 >= _LOG_DIRECT_FROM:  # one special function less per score (see _LOG_DIRECT_FROM)
                log_w = tl.log(tl.where(support, 1.0 + z, 1.0))
            else:
                log_w = _log1p(tl.where(support, z, 0.0))
            log_pt = tl.where(is_soft, d, log_w * (1.0 / tl.maximum(a1, 1e-30)))  # one division per tile
            pt = tl.where(support, tl.exp(log_pt), 0.0)
            qt = tl.where(support, tl.exp(log_pt - log_w), 0.0)  # softmax: log_w = 0, qt = pt
            return pt, qt, log_pt, support

    @_helper
    def _step(f, qq, n_sup, a1, MODE: tl.constexpr):
        """The solver's step in u = t - m from sums at the current u: f = F, qq = -dF/du, n_sup = |support|.

        Newton on G = F^a1 - 1: G / -G' = F (1 - F^-a1) / (a1 Q) (Q > 0 whenever F > 0: both sum the same
        support).  MODE 15: Halley instead, on G = sqrt(F) - 1, whose second derivative comes free (d^2F/du^2
        is half the support's size): Newton's step / (1 - L / 2) with L = G G'' / G'^2 =
        (sqrt(F) - 1)(F |S| - Q^2) / (sqrt(F) Q^2), >= 0 left of the root (F |S| >= Q^2: Cauchy-Schwarz);
        taken where L <= 1, Newton's step elsewhere.
        """
        step = f * -_expm1(-a1 * tl.log(tl.maximum(f, 1e-30))) / (a1 * tl.maximum(qq, 1e-30))
        if MODE == 15:
            r = tl.sqrt(tl.maximum(f, 0.0))
            lev = (r - 1.0) * (f * n_sup - qq * qq) / tl.maximum(r * qq * qq, 1e-30)
            step = tl.where((lev >= 0.0) & (lev <= 1.0), step / (1.0 - 0.5 * lev), step)
        return step

    @_helper
    def _exact_on_support(f, qq, n_sup, MODE: tl.constexpr):
        """MODE 15 and 20: the step delta in u after which F = 1 exactly if the support does not change, from
        the sums at the current u over its support S (f = F, qq = -dF/du, n_sup = |S|); and the shift of every
        w_j = 1 + a1 (s_j - t) that the step makes (w_j - shift is w_j at u + delta).

        Sparsemax: F(u + delta) = f - |S| delta, so delta = (f - 1) / |S| (Newton's own step).
        1.5-entmax: with w_j the support's terms, F(u + delta) = sum (w_j - delta / 2)^2 = f - qq delta +
        |S| delta^2 / 4; its smaller root (F decreases there), NaN where the parabola stays above 1 (the
        support must shrink first).  Written as 2 (f - 1) / (qq + sqrt(disc)) rather than (qq - sqrt(disc))
        / (|S| / 2): no cancellation when delta is small, which it is near the root.  (MODE 20: qq is |S|.)
        """
        if MODE == 15:
            disc = qq * qq - n_sup * (f - 1.0)
            delta = tl.where(disc >= 0.0, 2.0 * (f - 1.0) / tl.maximum(qq + tl.sqrt(tl.maximum(disc, 0.0)), 1e-30), float("nan"))
            return delta, 0.5 * delta
        else:
            delta = (f - 1.0) / tl.maximum(qq, 1.0)
            return delta, delta

    @triton.jit
    def _fwd_kernel(
        Q, K, V, O, OS, M, U, FS, TILES, KV_COUNT, KV_INDEX, ALPHA, KPM, SEED,
        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, sosb, sosh, sosm, skpmb, skpmh,
        H, Nq, Nk, D, n_key_tiles, scale, drop_below, keep_scale,
        HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, MODE: tl.constexpr, BACKWARD: tl.constexpr,
        SKIP_TILES: tl.constexpr, EXACT_STEP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        SOFT_THRESHOLD: tl.constexpr, TOL_F: tl.constexpr, STALL: tl.constexpr, MAX_ITER_N: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        # int64: b * stride_b overflows int32 for tensors of 2^31 elements or more.
        b = (pid_bh // H).to(tl.int64)
        h = (pid_bh % H).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        arange_n = tl.arange(0, BLOCK_N)
        row_ok = offs_m < Nq
        d_ok = offs_d < D

        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        k_base = K + b * skb + h * skh
        v_base = V + b * svb + h * svh
        kpm_row = KPM + b * skpmb + h * skpmh  # skpmh = 0: one mask for every head
        a1 = tl.minimum(tl.maximum(tl.load(ALPHA + h).to(tl.float32) - 1.0, 0.0), 1.0)
        is_soft = a1 < SOFT_THRESHOLD
        a1_eff = tl.where(is_soft, 0.0, a1)  # what _unnormalised takes: 0 for softmax heads
        a1_safe = tl.maximum(a1, SOFT_THRESHOLD)  # divisions by a1 below are discarded for softmax heads

        # Causal: this tile's last row sees keys < (pid_m + 1) BLOCK_M + Nk - Nq; no tile past that.
        n_end = Nk
        if CAUSAL:
            n_end = tl.minimum(Nk, (pid_m + 1) * BLOCK_M + Nk - Nq)
        # The key tiles the passes after the first visit, listed in ascending order: every tile at first; each
        # solver pass keeps those that can still hold p > 0 (SKIP_TILES); the last pass leaves the backward's
        # list.  Passes write entries no later read of their own pass reaches (entry `kept` <= i), and one thread
        # writes entry i' only after `keep`, a reduction over all warps, which every warp reaches after reading
        # its entries up to i'; the barrier after each pass makes the writes visible to all of the program's
        # threads before the next pass reads.  Every thread must reach that barrier: the loops' conditions
        # (n_listed, busy, it) are the same in all of them.
        tile_row = pid_bh.to(tl.int64) * tl.cdiv(Nq, BLOCK_M) + pid_m
        list_row = KV_INDEX + tile_row * n_key_tiles
        n_listed = tl.cdiv(n_end, BLOCK_N)

        # Pass 1: row max and number of visible keys.
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        n_vis = tl.zeros((BLOCK_M,), tl.float32)
        for j in range(0, n_listed):
            offs_n = j * BLOCK_N + arange_n
            kv_mask = (offs_n < Nk)[:, None] & d_ok[None, :]
            s = _scores(q, k_base + offs_n[:, None] * skn + offs_d[None, :], kv_mask, scale, DOT_PRECISION)
            vis = _visible(offs_m[:, None], offs_n[None, :], Nq, Nk, kpm_row, HAS_KPM, CAUSAL)
            m = tl.maximum(m, tl.max(tl.where(vis, s, float("-inf")), 1))
            n_vis += tl.sum(vis.to(tl.float32), 1)
            tl.store(list_row + j, j)  # cast to the list's int16 or int32 by the store
        tl.debug_barrier()
        live = m > float("-inf")
        m = tl.where(live, m, 0.0)

        # Newton (MODE 15: Halley) on u = t - m inside [0, (1 - n^-a1) / a1]; rows that converged stay put.
        # (Estimating F at u = 0 during pass 1 at the running max, to save the first pass, cost passes:
        # the entries that leave the support as the max rises stay in such sums; counted with
        # scripts/bench_kernel_passes.py, 1.5-entmax took 7.1 passes instead of 6.6 at N = 256.)
        u = tl.zeros((BLOCK_M,), tl.float32)
        u_lo = tl.zeros((BLOCK_M,), tl.float32)
        u_hi = -_expm1(-a1_safe * tl.log(tl.maximum(n_vis, 1.0))) / a1_safe
        busy = tl.sum((live & row_ok).to(tl.int32), 0)
        busy = tl.where(is_soft, 0, busy)  # softmax heads: t = m, nothing to solve
        it = 0
        settled = offs_m < 0  # rows whose threshold is found (kept across passes)
        while (busy > 0) & (it < MAX_ITER_N):
            f = tl.zeros((BLOCK_M,), tl.float32)
            qq = tl.zeros((BLOCK_M,), tl.float32)  # sum_j qt_j = -dF/du
            n_sup = tl.zeros((BLOCK_M,), tl.float32)  # the support's size |S| (MODE 15: d^2F/du^2 = |S| / 2)
            # MODE 15 and 20: the least w_j = 1 + a1 (s_j - t) on the support and the largest off it (visible keys):
            # whether a step keeps the support as it is (`_exact_on_support`).
            w_in = tl.full((BLOCK_M,), float("inf"), tl.float32)
            w_out = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            kept = tl.zeros((), tl.int32)
            for i in range(0, n_listed):
                j = tl.load(list_row + i).to(tl.int32)
                offs_n = j * BLOCK_N + arange_n
                kv_mask = (offs_n < Nk)[:, None] & d_ok[None, :]
                s = _scores(q, k_base + offs_n[:, None] * skn + offs_d[None, :], kv_mask, scale, DOT_PRECISION)
                vis = _visible(offs_m[:, None], offs_n[None, :], Nq, Nk, kpm_row, HAS_KPM, CAUSAL)
                pt, qt, d, support = _unnormalised(s, m[:, None], u[:, None], a1_eff, is_soft, vis, MODE)
                f += tl.sum(pt, 1)
                qq += tl.sum(qt, 1)
                if MODE == 15:
                    n_sup += tl.sum(support.to(tl.float32), 1)
                if EXACT_STEP and (MODE == 15 or MODE == 20):
                    if MODE == 15:
                        w = 1.0 + 0.5 * d
                    else:
                        w = 1.0 + d
                    w_in = tl.minimum(w_in, tl.min(tl.where(support, w, float("inf")), 1))
                    w_out = tl.maximum(w_out, tl.max(tl.where(vis & ~support, w, float("-inf")), 1))
                # AdaSplash's skipping: a tile none of whose keys has p > 0 at a proven lower bound of the threshold,
                # t = m + u_lo (F >= 1 there), has none at the threshold itself or at any later iterate (u >= u_lo),
                # so it is dropped from the list.  Not at u, which Halley's steps may carry past the threshold.
                if SKIP_TILES:
                    reach = _support((s - m[:, None]) - u_lo[:, None], a1_eff, vis & row_ok[:, None], MODE)
                    keep = tl.max(reach.to(tl.int32))
                    tl.store(list_row + kept, j, mask=keep > 0)
                    kept += keep
                else:
                    kept += 1
            tl.debug_barrier()
            n_listed = kept
            u_lo = tl.where(f >= 1.0, u, u_lo)
            u_hi = tl.where(f < 1.0, u, u_hi)
            u_new = u + _step(f, qq, n_sup, a1_safe, MODE)
            inside = (u_new >= u_lo) & (u_new <= u_hi) & (u_new == u_new)
            u_new = tl.where(inside, u_new, 0.5 * (u_lo + u_hi))
            # Done: sum p = 1 to TOL_F, or the step moves u by at most a few ulps (a large
            # support resolves F - 1 only to |support| * ulp(u), which can exceed TOL_F).
            done = (tl.abs(f - 1.0) <= TOL_F) | (tl.abs(u_new - u) <= STALL * u) | ~live
            u_done = u
            if EXACT_STEP and (MODE == 15 or MODE == 20):
                # ... or the step to the root on this pass's support keeps that support: no w_j on it reaches 0 and
                # none off it rises above 0, so F = 1 at u + delta without another pass to check it.  Only inside the
                # bracket, at or right of u_lo, where the tiles dropped from the list hold no p > 0 either.
                delta, shift = _exact_on_support(f, qq, n_sup, MODE)
                exact = (w_in - shift > 0.0) & (w_out - shift <= 0.0) & (u + delta >= u_lo) & (u + delta <= u_hi) & ~done
                u_done = tl.where(exact, u + delta, u)
                done = done | exact
            u = tl.where(settled, u, tl.where(done, u_done, u_new))
            settled = settled | done
            busy = tl.sum((~settled & row_ok).to(tl.int32), 0)
            it += 1

        # Last pass: acc = sum_j pt_j z_j v_j and F = sum_j pt_j (z the dropout scale, 1 without
        # dropout), out = acc / F.  For the backward also os = sum_j qt_j z_j v_j / sum_j qt_j, so that
        # its c = sum_j s_j dP_j / sum_j s_j is dO . os (s_j = qt_j F^(a1 - 1): the factor cancels),
        # as FlashAttention's D = dO . O, and whether the tile (this query tile, key tile) holds any
        # p > 0: the backward skips the tiles that do not (exactly: their p, s and dS are all 0), from
        # the table (the key tiles' lists) and from this pass's list (the query tile's).
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        f = tl.zeros((BLOCK_M,), tl.float32)
        if BACKWARD:
            acc_s = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
            sum_s = tl.zeros((BLOCK_M,), tl.float32)
            tiles_row = TILES + tile_row * n_key_tiles
            kept = tl.zeros((), tl.int32)
        if DROPOUT:
            seed = tl.load(SEED)
        for i in range(0, n_listed):
            j = tl.load(list_row + i).to(tl.int32)
            offs_n = j * BLOCK_N + arange_n
            kv_mask = (offs_n < Nk)[:, None] & d_ok[None, :]
            s = _scores(q, k_base + offs_n[:, None] * skn + offs_d[None, :], kv_mask, scale, DOT_PRECISION)
            vis = _visible(offs_m[:, None], offs_n[None, :], Nq, Nk, kpm_row, HAS_KPM, CAUSAL)
            pt, qt, _, support = _unnormalised(s, m[:, None], u[:, None], a1_eff, is_soft, vis, MODE)
            f += tl.sum(pt, 1)
            if DROPOUT:
                z = _dropout_scale(seed, pid_bh, offs_m[:, None], offs_n[None, :], drop_below, keep_scale)
                pt = pt * z
            v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
            acc += tl.dot(pt.to(v.dtype), v, input_precision=DOT_PRECISION)
            if BACKWARD:
                sum_s += tl.sum(qt, 1)
                if DROPOUT:
                    qt = qt * z
                acc_s += tl.dot(qt.to(v.dtype), v, input_precision=DOT_PRECISION)
                if SKIP_TILES:  # the tiles the backward visits: those with some p > 0 ...
                    keep = tl.max((support & row_ok[:, None]).to(tl.int32))
                else:  # ... or every tile visited here
                    keep = tl.full((), 1, tl.int32)
                tl.store(tiles_row + j, keep.to(tl.int8))
                tl.store(list_row + kept, j, mask=keep > 0)
                kept += keep
        f = tl.where(f > 0.0, f, 1.0)  # fully masked rows: acc = 0, and F = 1 keeps the backward finite
        out = acc / f[:, None]
        tl.store(O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        stat = pid_bh * Nq + offs_m
        tl.store(M + stat, m, mask=row_ok)
        tl.store(U + stat, u, mask=row_ok)
        tl.store(FS + stat, f, mask=row_ok)
        if BACKWARD:
            tl.store(KV_COUNT + tile_row, kept)
            o_s = acc_s / tl.where(sum_s > 0.0, sum_s, 1.0)[:, None]
            tl.store(OS + b * sosb + h * sosh + offs_m[:, None] * sosm + offs_d[None, :], o_s, mask=row_ok[:, None] & d_ok[None, :])

    @triton.jit
    def _bwd_dq_kernel(
        Q, K, V, DO, DQ, OS, M, U, FS, C, DALPHA, KV_COUNT, KV_INDEX, ALPHA, KPM, SEED,
        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdqb, sdqh, sdqm, sosb, sosh, sosm, skpmb, skpmh,
        H, Nq, Nk, D, n_key_tiles, scale, drop_below, keep_scale,
        HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, MODE: tl.constexpr, NEED_DALPHA: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        SOFT_THRESHOLD: tl.constexpr, PSI_SWITCH: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        # int64: b * stride_b overflows int32 for tensors of 2^31 elements or more.
        b = (pid_bh // H).to(tl.int64)
        h = (pid_bh % H).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        arange_n = tl.arange(0, BLOCK_N)
        row_ok = offs_m < Nq
        d_ok = offs_d < D
        qd_mask = row_ok[:, None] & d_ok[None, :]

        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :], mask=qd_mask, other=0.0)
        do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdom + offs_d[None, :], mask=qd_mask, other=0.0)
        o_s = tl.load(OS + b * sosb + h * sosh + offs_m[:, None] * sosm + offs_d[None, :], mask=qd_mask, other=0.0)
        stat = pid_bh * Nq + offs_m
        m = tl.load(M + stat, mask=row_ok, other=0.0)
        u = tl.load(U + stat, mask=row_ok, other=0.0)
        log_f = tl.log(tl.load(FS + stat, mask=row_ok, other=1.0))
        k_base = K + b * skb + h * skh
        v_base = V + b * svb + h * svh
        kpm_row = KPM + b * skpmb + h * skpmh  # skpmh = 0: one mask for every head
        tile_row = pid_bh.to(tl.int64) * tl.cdiv(Nq, BLOCK_M) + pid_m  # this query tile's list of key tiles
        a1 = tl.minimum(tl.maximum(tl.load(ALPHA + h).to(tl.float32) - 1.0, 0.0), 1.0)
        is_soft = a1 < SOFT_THRESHOLD
        a1_eff = tl.where(is_soft, 0.0, a1)  # softmax heads: s = p and psi = 1/2, the alpha = 1 limits
        a1_sq = tl.where(is_soft, 1.0, a1 * a1)
        inv_f = tl.exp(-log_f)  # p = pt / F
        s_factor = tl.exp((a1_eff - 1.0) * log_f)  # s = p^(1 - a1) = qt F^(a1 - 1)

        if DROPOUT:
            seed = tl.load(SEED)

        # c = sum_j s_j dP_j / sum_j s_j = dO . os (the forward's os), dP_j = z_j dO . v_j.
        c = tl.sum(do.to(tl.float32) * o_s, 1)
        tl.store(C + stat, c, mask=row_ok)

        # One pass: dQ = scale sum_j dS_j k_j, dS_j = s_j (dP_j - c); and the alpha sums,
        # dalpha (per row) = c sum_j A_j - sum_j A_j dP_j.
        dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        sum_a = tl.zeros((BLOCK_M,), tl.float32)
        sum_adp = tl.zeros((BLOCK_M,), tl.float32)
        # The key tiles the forward found some p > 0 in (every tile it visited without SKIP_EMPTY_TILES), listed
        # in ascending order by the forward's last pass, so that the loop has no branch and pipelines as a dense one.
        for i in range(0, tl.load(KV_COUNT + tile_row)):
            start_n = tl.load(KV_INDEX + tile_row * n_key_tiles + i).to(tl.int32) * BLOCK_N
            offs_n = start_n + arange_n
            kv_mask = (offs_n < Nk)[:, None] & d_ok[None, :]
            k = tl.load(k_base + offs_n[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            vis = _visible(offs_m[:, None], offs_n[None, :], Nq, Nk, kpm_row, HAS_KPM, CAUSAL)
            pt, qt, log_pt, support = _unnormalised(s, m[:, None], u[:, None], a1_eff, is_soft, vis, MODE)
            sw = qt * s_factor[:, None]
            v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            if DROPOUT:
                dp = dp * _dropout_scale(seed, pid_bh, offs_m[:, None], offs_n[None, :], drop_below, keep_scale)
            ds = sw * (dp - c[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
            if NEED_DALPHA:  # A_j = p_j (log p_j)^2 psi(-a1 log p_j)
                p = pt * inv_f[:, None]
                log_p = log_pt - log_f[:, None]
                x = -a1_eff * log_p
                a_small = p * log_p * log_p * _psi_series(x)
                a_big = (sw - p - p * x) / a1_sq  # = p (e^x - 1 - x) / a1^2 without overflow
                a = tl.where(support, tl.where(x < PSI_SWITCH, a_small, a_big), 0.0)
                sum_a += tl.sum(a, 1)
                sum_adp += tl.sum(a * dp, 1)
        dq = dq * scale
        tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=qd_mask)
        if NEED_DALPHA:
            tl.store(DALPHA + stat, c * sum_a - sum_adp, mask=row_ok)

    @triton.jit
    def _bwd_dkdv_kernel(
        Q, K, V, DO, DK, DV, M, U, FS, C, Q_COUNT, Q_INDEX, ALPHA, KPM, SEED,
        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom,
        sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, skpmb, skpmh,
        H, Nq, Nk, D, n_key_tiles, scale, drop_below, keep_scale,
        HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, MODE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        SOFT_THRESHOLD: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_bh = tl.program_id(1)
        # int64: b * stride_b overflows int32 for tensors of 2^31 elements or more.
        b = (pid_bh // H).to(tl.int64)
        h = (pid_bh % H).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        arange_m = tl.arange(0, BLOCK_M)
        col_ok = offs_n < Nk
        d_ok = offs_d < D
        kv_mask = col_ok[:, None] & d_ok[None, :]

        k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdob + h * sdoh
        kpm_row = KPM + b * skpmb + h * skpmh  # skpmh = 0: one mask for every head
        tile_col = pid_bh.to(tl.int64) * n_key_tiles + pid_n  # this key tile's list of query tiles
        n_query_tiles = tl.cdiv(Nq, BLOCK_M)
        a1 = tl.minimum(tl.maximum(tl.load(ALPHA + h).to(tl.float32) - 1.0, 0.0), 1.0)
        is_soft = a1 < SOFT_THRESHOLD
        a1_eff = tl.where(is_soft, 0.0, a1)

        if DROPOUT:
            seed = tl.load(SEED)

        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        # The tiles here are transposed, (BLOCK_N keys, BLOCK_M queries), so that the products
        # P^T dO and dS^T Q take register tiles as they come (no transpose of p or dS).
        # The query tiles that the forward found some p > 0 in with this key tile (causal: none that cannot see it).
        for i in range(0, tl.load(Q_COUNT + tile_col)):
            start_m = tl.load(Q_INDEX + tile_col * n_query_tiles + i).to(tl.int32) * BLOCK_M
            offs_m = start_m + arange_m
            row_ok = offs_m < Nq
            q_t = tl.load(q_base + offs_m[None, :] * sqm + offs_d[:, None], mask=row_ok[None, :] & d_ok[:, None], other=0.0)
            do = tl.load(do_base + offs_m[:, None] * sdom + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            stat = pid_bh * Nq + offs_m
            m = tl.load(M + stat, mask=row_ok, other=0.0)
            u = tl.load(U + stat, mask=row_ok, other=0.0)
            log_f = tl.log(tl.load(FS + stat, mask=row_ok, other=1.0))
            c = tl.load(C + stat, mask=row_ok, other=0.0)
            s_t = tl.dot(k, q_t, input_precision=DOT_PRECISION) * scale
            # Queries past Nq were loaded as 0 (scores 0): drop them explicitly.
            vis = _visible(offs_m[None, :], offs_n[:, None], Nq, Nk, kpm_row, HAS_KPM, CAUSAL) & row_ok[None, :]
            pt, qt, _, _ = _unnormalised(s_t, m[None, :], u[None, :], a1_eff, is_soft, vis, MODE)
            p_t = pt * tl.exp(-log_f)[None, :]
            sw_t = qt * tl.exp((a1_eff - 1.0) * log_f)[None, :]
            if DROPOUT:  # dV takes the dropped weights p z, dS the dropped dP z
                z_t = _dropout_scale(seed, pid_bh, offs_m[None, :], offs_n[:, None], drop_below, keep_scale)
                p_t = p_t * z_t
            dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
            if DROPOUT:
                dp_t = dp_t * z_t
            ds_t = sw_t * (dp_t - c[None, :])
            dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), input_precision=DOT_PRECISION)
        dk = dk * scale
        tl.store(DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + b * sdvb + h * sdvh + offs_n[:, None] * sdvn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)

    @triton.jit
    def _keep_mask_kernel(SEED, KEEP, Nq, Nk, drop_below, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """KEEP[bh, i, j] = 1 where the kernels above keep (query i, key j) of (batch * H + head) bh."""
        pid_bh = tl.program_id(2)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        z = _dropout_scale(tl.load(SEED), pid_bh, offs_m[:, None], offs_n[None, :], drop_below, 1.0)
        index = (pid_bh.to(tl.int64) * Nq + offs_m[:, None]) * Nk + offs_n[None, :]
        tl.store(KEEP + index, (z != 0.0).to(tl.uint8), mask=(offs_m < Nq)[:, None] & (offs_n < Nk)[None, :])


# ------------------------------------------------------------------------------------------------
# Launch configuration
# ------------------------------------------------------------------------------------------------


def _blocks(head_dim: int, dtype: torch.dtype, n_queries: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps); n_queries: the call's query count (None: as many as it takes).

    Chosen without timings on hardware, from the register use of the sm_90 (H100/H200) builds as the JIT
    specialises a launch (16-byte-aligned pointers and strides: vectorised, pipelined loads), compiled here
    with Triton's bundled ptxas: the smallest tiles that keep every kernel free of register spills.  16-bit
    inputs: 64 x 32 tiles on 4 warps at D <= 64 (at most 234 registers, with dropout), 8 warps at D = 128
    (at most 230).  float32 inputs (IEEE dots run on the FMA units, their operands all in registers): 32 x 32
    tiles on 8 warps, no spills at D = 64 with dropout (on 4 warps the forward spills 608 bytes per thread).
    Counted with cuobjdump -res-usage on the builds of commit 2d58689's kernels.
    The interpreter gets 16 x 16 tiles so that small test shapes cross tile borders (tl.dot needs
    dimensions >= 16).
    Fewer queries than BLOCK_M (a decoding step's one query, HST's representatives, one per tile) shrink the
    query tile to the next power of two, at least 16: the program loads the same key tiles, and its scores and
    threshold passes cover 16 rows instead of 64.  (Unmeasured on a GPU: fewer operations on the same loads.)
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    if _interpreting():
        block_m, block_n, warps = *_INTERPRETER_TILES, 1
    elif dtype == torch.float32:
        block_m, block_n, warps = 32, 32, 8
    else:
        block_m, block_n, warps = 64, 32, (4 if block_d <= 64 else 8)
    # Comparisons only (no bit tricks), and none at 16: under torch.compile n_queries is symbolic, and each
    # comparison is a guard on it (at most two graphs more, for 16 and 32 queries or fewer).
    while n_queries is not None and block_m > 16 and n_queries <= block_m // 2:
        block_m //= 2
    return block_m, block_n, block_d, warps


# (BLOCK_M, BLOCK_N) under the interpreter; tests also try unequal tiles (the GPU ones are unequal).
_INTERPRETER_TILES = (16, 16)

# float32 dots in IEEE float32, not Triton's default TF32 (10-bit mantissa: ~1e-3 relative error in
# the scores).  For 16-bit inputs the setting changes nothing (their products are exact in float32).
_DOT_PRECISION = "ieee"


def _drop_below(dropout_p: float) -> int:
    """The kernels' integer dropout threshold: a pair is dropped when its 31 random bits are below it."""
    return min(round(dropout_p * 2.0**31), 2**31 - 1)


def _dropout_args(dropout_p: float) -> tuple[int, float]:
    """The kernels' (drop_below, keep_scale) arguments; (0, 1) without dropout."""
    return (_drop_below(dropout_p), 1.0 / (1.0 - dropout_p)) if dropout_p > 0.0 else (0, 1.0)


def dropout_seed(device: torch.device | str) -> torch.Tensor:
    """A fresh dropout seed: a (1,) int64 tensor on `device`, one draw of torch's generator for that
    device.  A forward with dropout draws its seed this way before anything else, so after
    `torch.manual_seed(s)` this call returns the seed of the next such forward."""
    return torch.randint(1 << 62, (1,), dtype=torch.int64, device=device)


def dropout_keep_mask(seed: torch.Tensor, batch: int, heads: int, n_queries: int, n_keys: int, dropout_p: float) -> torch.Tensor:
    """(batch, heads, n_queries, n_keys) bool on seed's device: True where entmax_attention with this
    seed and dropout_p keeps a (query, key) pair (the same counter-based draws as the kernels)."""
    if not available():
        raise RuntimeError("dropout_keep_mask needs the `triton` package and a CUDA device (or TRITON_INTERPRET=1)")
    keep = torch.empty((batch, heads, n_queries, n_keys), dtype=torch.uint8, device=seed.device)
    if keep.numel():
        grid = (triton.cdiv(n_queries, 64), triton.cdiv(n_keys, 64), batch * heads)
        _keep_mask_kernel[grid](seed, keep, n_queries, n_keys, _drop_below(dropout_p), BLOCK_M=64, BLOCK_N=64)
    return keep.bool()


def _index_dtype(n_tiles: int) -> torch.dtype:
    """The tile lists' index dtype: int16 while tile indices fit (32-key tiles: up to 1M keys), int32 beyond."""
    return torch.int16 if n_tiles < 2**15 else torch.int32


def _query_tile_lists(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dK/dV kernel's loops from the forward's tile table (B * H, query tiles, key tiles), 1 = visit:
    per key tile, the number of query tiles to visit (q_count) and their indices, ascending, first in each row
    (q_index).  FlexAttention's BlockMask keeps its blocks in this form (kv_num_blocks, kv_indices); the
    forward leaves the query tiles' lists of key tiles in it too (kv_count, kv_index)."""
    table = tiles.transpose(1, 2).reshape(-1, tiles.shape[1])
    q_index = torch.argsort(table, dim=-1, descending=True, stable=True).to(_index_dtype(tiles.shape[1]))
    return table.sum(-1, dtype=torch.int32), q_index


def _row_stride_ok(x: torch.Tensor) -> torch.Tensor:
    """x with a contiguous last dimension (the kernels index it with stride 1)."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _forward(
    q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, kpm: Optional[Tensor], seed: Optional[Tensor],
    scale: float, causal: bool, dropout_p: float, mode: int, backward: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The forward kernel.  q, k, v (B, H, N, D); alpha (H,); kpm: the key padding mask as uint8 (B, Nk),
    (B, 1, Nk) or (B, H, Nk); seed: `dropout_seed`'s draw when dropout_p > 0; mode: `_mode(alpha)`; backward:
    whether a backward may follow.  Returns out (B, H, Nq, D) and what the backward reads: os, m, u, F, the tile
    table and the query tiles' lists of key tiles (kv_count, kv_index); os and the table are 1-element stand-ins
    without a backward."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    q, k, v = _row_stride_ok(q), _row_stride_ok(k), _row_stride_ok(v)
    has_kpm, dropout = kpm is not None, dropout_p > 0.0
    alpha32, kpm, kpm_strides, seed = _kernel_arguments(alpha, kpm, seed, dropout)
    block_m, block_n, block_d, warps = _blocks(D, q.dtype, Nq)
    out, o_s, m, u, f, tiles, kv_count, kv_index = _forward_outputs(q, Nk, backward)
    n_key_tiles = kv_index.shape[1]
    if out.numel() and Nk:
        grid = (triton.cdiv(Nq, block_m), B * H)
        _fwd_kernel[grid](
            q, k, v, out, o_s, m, u, f, tiles, kv_count, kv_index, alpha32, kpm, seed,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *o_s.stride()[:3],
            *kpm_strides,
            H, Nq, Nk, D, n_key_tiles, float(scale), *_dropout_args(dropout_p),
            HAS_KPM=has_kpm, CAUSAL=bool(causal), DROPOUT=dropout, MODE=mode, BACKWARD=bool(backward), SKIP_TILES=SKIP_EMPTY_TILES, EXACT_STEP=EXACT_ON_SUPPORT,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            SOFT_THRESHOLD=ALPHA_SOFTMAX_THRESHOLD, TOL_F=TOL, STALL=STALL, MAX_ITER_N=MAX_ITER,
            DOT_PRECISION=_DOT_PRECISION, num_warps=warps,
        )  # fmt: skip
    else:  # no query, no key or no head: nothing to attend to (zeros, like a fully masked row)
        out.zero_()
        m.zero_()
        u.zero_()
        f.fill_(1.0)
    return out, o_s, m, u, f, tiles, kv_count, kv_index


def _kernel_arguments(alpha: Tensor, kpm: Optional[Tensor], seed: Optional[Tensor], dropout: bool):
    """(alpha32, kpm, kpm's (batch, head) strides, seed) as the kernels take them: alpha as float32, and alpha32 as a
    stand-in pointer for an absent mask or seed.  A (B, Nk) or (B, 1, Nk) mask serves every head (head stride 0), a
    (B, H, Nk) one is one per head."""
    alpha32 = alpha.detach().to(torch.float32).contiguous()
    if kpm is None:
        kpm, kpm_strides = alpha32, (0, 0)
    else:
        kpm = kpm.contiguous()
        kpm_strides = (kpm.stride(0), kpm.stride(1) if kpm.dim() == 3 and kpm.shape[1] > 1 else 0)
    return alpha32, kpm, kpm_strides, seed if dropout else alpha32


def _forward_outputs(q: Tensor, n_keys: int, backward: bool) -> tuple[Tensor, ...]:
    """The forward's outputs, allocated (the fake implementation returns them as they are)."""
    B, H, Nq, D = q.shape
    block_m, block_n, _, _ = _blocks(D, q.dtype, Nq)
    n_query_tiles, n_key_tiles = -(-Nq // block_m), -(-n_keys // block_n)
    stats = [torch.empty((B, H, Nq), dtype=torch.float32, device=q.device) for _ in range(3)]  # m, u, F
    # For the backward: os = sum_j s_j z_j v_j / sum_j s_j (float32: its c = dO . os is a difference
    # the gradients hinge on), and per (query tile, key tile) whether the tile holds some p > 0.
    # kv_index: per query tile, the key tiles its passes visit (the forward's scratch, then the backward's list).
    o_s = torch.zeros((B, H, Nq, D) if backward else (1, 1, 1, 1), dtype=torch.float32, device=q.device)
    tiles = torch.zeros((B * H, n_query_tiles, n_key_tiles) if backward else (1, 1, 1), dtype=torch.int8, device=q.device)
    kv_count = torch.zeros(B * H * n_query_tiles if backward else 1, dtype=torch.int32, device=q.device)
    kv_index = torch.empty((B * H * n_query_tiles, n_key_tiles), dtype=_index_dtype(n_key_tiles), device=q.device)
    return (torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device), o_s, *stats, tiles, kv_count, kv_index)


def _backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, kpm: Optional[Tensor], seed: Optional[Tensor],
    o_s: Tensor, m: Tensor, u: Tensor, f: Tensor, tiles: Tensor, kv_count: Tensor, kv_index: Tensor,
    scale: float, causal: bool, dropout_p: float, mode: int, need_dalpha: bool, need_dkdv: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward kernels: (dq, dk, dv, dalpha (H,) float32), dk and dv empty unless need_dkdv, dalpha empty
    unless need_dalpha.  The other arguments are `_forward`'s, and what it returned."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    q, k, v = _row_stride_ok(q), _row_stride_ok(k), _row_stride_ok(v)
    if not (q.numel() and k.numel()):  # nothing was attended to: every gradient is zero
        dk, dv = (torch.zeros_like(k), torch.zeros_like(v)) if need_dkdv else (_not_asked(q), _not_asked(q))
        return torch.zeros_like(q), dk, dv, torch.zeros(H, dtype=torch.float32, device=q.device) if need_dalpha else _not_asked(q)
    has_kpm, dropout = kpm is not None, dropout_p > 0.0
    alpha32, kpm, kpm_strides, seed = _kernel_arguments(alpha, kpm, seed, dropout)
    dropout_args = _dropout_args(dropout_p)
    do = _row_stride_ok(grad_out.to(q.dtype))
    # Every element of these is written by exactly one program (masked stores cover Nq x D / Nk x D).
    dq = torch.empty_like(q)
    c = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    dalpha_rows = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device) if need_dalpha else c  # c: unused pointer
    block_m, block_n, block_d, warps = _blocks(D, q.dtype, Nq)
    n_key_tiles = tiles.shape[2]
    common = dict(
        HAS_KPM=has_kpm, CAUSAL=bool(causal), DROPOUT=dropout, MODE=mode,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        SOFT_THRESHOLD=ALPHA_SOFTMAX_THRESHOLD, DOT_PRECISION=_DOT_PRECISION, num_warps=warps,
    )  # fmt: skip
    # Runs first even when only k or v need gradients: it writes c, which the key tiles read.
    _bwd_dq_kernel[(triton.cdiv(Nq, block_m), B * H)](
        q, k, v, do, dq, o_s, m, u, f, c, dalpha_rows, kv_count, kv_index, alpha32, kpm, seed,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3], *o_s.stride()[:3], *kpm_strides,
        H, Nq, Nk, D, n_key_tiles, float(scale), *dropout_args, NEED_DALPHA=need_dalpha, PSI_SWITCH=_PSI_SWITCH, **common,
    )  # fmt: skip
    dk, dv = _not_asked(q), _not_asked(q)
    if need_dkdv:
        q_count, q_index = _query_tile_lists(tiles)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        _bwd_dkdv_kernel[(triton.cdiv(Nk, block_n), B * H)](
            q, k, v, do, dk, dv, m, u, f, c, q_count, q_index, alpha32, kpm, seed,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
            *dk.stride()[:3], *dv.stride()[:3], *kpm_strides,
            H, Nq, Nk, D, n_key_tiles, float(scale), *dropout_args, **common,
        )  # fmt: skip
    return dq, dk, dv, dalpha_rows.sum((0, 2)) if need_dalpha else _not_asked(q)


def _not_asked(q: Tensor) -> Tensor:
    """A gradient that was not asked for: empty, and a fresh tensor each time (an operator's outputs may not alias)."""
    return q.new_empty(0)


def _fake_forward(q, k, v, alpha, kpm, seed, scale, causal, dropout_p, mode, backward):
    return _forward_outputs(q, k.shape[2], backward)


def _fake_backward(grad_out, q, k, v, alpha, kpm, seed, o_s, m, u, f, tiles, kv_count, kv_index, scale, causal, dropout_p, mode,
                   need_dalpha, need_dkdv):
    q, k, v = _row_stride_ok(q), _row_stride_ok(k), _row_stride_ok(v)  # as `_backward` allocates its gradients
    dkdv = (torch.empty_like(k), torch.empty_like(v)) if need_dkdv else (_not_asked(q), _not_asked(q))
    return torch.empty_like(q), *dkdv, torch.empty(q.shape[1], dtype=torch.float32, device=q.device) if need_dalpha else _not_asked(q)


def _save(ctx, inputs, outputs) -> None:
    q, k, v, alpha, kpm, seed, scale, causal, dropout_p, mode, _ = inputs
    ctx.save_for_backward(q, k, v, alpha, kpm, seed, *outputs[1:])
    ctx.settings = (scale, causal, dropout_p, mode)


def _gradients(ctx, grads, backward):
    """Gradients for q, k, v and alpha (the other inputs take none)."""
    q, k, v, alpha, kpm, seed, *saved = ctx.saved_tensors
    need = ctx.needs_input_grad
    dq, dk, dv, dalpha = backward(grads[0], q, k, v, alpha, kpm, seed, *saved, *ctx.settings, need[3], need[1] or need[2])
    return (
        dq, dk if need[1] else None, dv if need[2] else None, dalpha.to(alpha.dtype) if need[3] else None,
        *(None,) * 7,  # kpm, seed, scale, causal, dropout_p, mode, backward
    )


# As torch.library operators under torch.compile (kernels/operator.py), so a compiled model keeps them in its graph.
_KERNELS = KernelOperator("entmax_attention_triton", _forward, _backward, fake_forward=_fake_forward, fake_backward=_fake_backward,
                          save=_save, gradients=_gradients)


# ------------------------------------------------------------------------------------------------
# Public entry point
# ------------------------------------------------------------------------------------------------


def entmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: Alpha,
    *,
    scale: float | None = None,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    training: bool = True,
) -> torch.Tensor:
    """alpha-entmax attention, O(N) memory.  q (B, H, Nq, D), k / v (B, H, Nk, D) -> (B, H, Nq, D).

    alpha: float in [1, 2] or a tensor of shape (H,), (1, H, 1, 1) or () (gradients flow to it).
    scale: score scale, default 1 / sqrt(D).
    key_padding_mask: (B, Nk) bool, True = real key, or (B, H, Nk), per head.  causal: query i sees keys j <= i + Nk - Nq.
    dropout_p: attention dropout rate in [0, 1), applied when `training` (as F.dropout); each such
    call draws its seed from torch's generator for the device (module docstring: Attention dropout).
    Autograd for q, k, v and a tensor alpha.  See the module docstring for dtypes and devices.
    """
    if not available():
        raise RuntimeError(
            "entmax_attention (Triton) needs the `triton` package and a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)"
        )
    _check_inputs(q, k, v, key_padding_mask)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"entmax_attention: dropout_p must be a number in [0, 1), got {dropout_p!r}")
    B, H, Nq, D = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    alpha = _known_alpha(alpha)
    alpha_t = _alpha_tensor(alpha, H, q.device)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(q.device)
    rate = float(dropout_p) if training else 0.0
    backward = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, alpha_t))
    kpm = None if key_padding_mask is None else key_padding_mask.to(torch.uint8)
    seed = dropout_seed(q.device) if rate > 0.0 else None  # the first draw of the call (`dropout_seed`)
    mode = _mode(alpha) if SPECIALISE_ALPHA else _MODE_GENERAL
    return _KERNELS(q, k, v, alpha_t, kpm, seed, float(scale), bool(causal), rate, mode, backward)[0]


def _check_inputs(q, k, v, key_padding_mask) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not torch.is_tensor(x) or x.dim() != 4:
            raise ValueError(f"entmax_attention: {name} must be a 4-D tensor (B, H, N, D)")
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"entmax_attention: dtype {q.dtype} not supported (float32, bfloat16, float16)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"entmax_attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, _, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[1] != H or k.shape[3] != D:
        raise ValueError(
            f"entmax_attention: k and v must be (B, H, Nk, D) = ({B}, {H}, Nk, {D}); got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if D > MAX_HEAD_DIM:
        raise ValueError(f"entmax_attention: head dim {D} > {MAX_HEAD_DIM} is not supported")
    if not (q.device == k.device == v.device):
        raise ValueError("entmax_attention: q, k, v must be on one device")
    if _interpreting():
        if q.device.type != "cpu":
            raise ValueError("entmax_attention: with TRITON_INTERPRET=1 the tensors must be on the CPU")
    elif q.device.type != "cuda":
        raise ValueError(f"entmax_attention: needs CUDA tensors, got {q.device} (the dense path handles CPU)")
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) not in ((B, k.shape[2]), (B, 1, k.shape[2]), (B, H, k.shape[2])):
            raise ValueError(
                f"entmax_attention: key_padding_mask must be a bool (B, Nk) = ({B}, {k.shape[2]}) or (B, 1 or H, Nk) = "
                f"({B}, {H}, {k.shape[2]}) tensor, got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )


def _known_alpha(alpha: Alpha) -> Alpha:
    """A one-element CPU tensor that takes no gradient (a constant normaliser's `alphas()`) as its float,
    so that `_mode` sees it; anything else as it is (reading a CUDA tensor would wait for the device)."""
    if torch.is_tensor(alpha) and alpha.device.type == "cpu" and alpha.numel() == 1 and not alpha.requires_grad:
        return float(alpha)
    return alpha


def _mode(alpha: Alpha) -> int:
    """The kernels' MODE for alpha: the specialised formulas of 1.5-entmax or sparsemax when alpha is that
    float, the general ones (any alpha per head) otherwise."""
    if not torch.is_tensor(alpha) and not isinstance(alpha, bool):
        if float(alpha) == 1.5:
            return _MODE_ENTMAX15
        if float(alpha) == 2.0:
            return _MODE_SPARSEMAX
    return _MODE_GENERAL


def _alpha_tensor(alpha: Alpha, heads: int, device: torch.device) -> torch.Tensor:
    """alpha as an (H,) tensor on `device`.  A float is checked and filled in.  A tensor may have
    shape (), (1,), (H,) or (1, H, 1, 1) (alpha_entmax's per-head broadcast shape); it is reshaped
    and expanded, so autograd sums a shared alpha's gradient over the heads."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, torch.Tensor)):
        raise TypeError(f"alpha must be a float or a tensor, got {type(alpha).__name__}")
    if not torch.is_tensor(alpha):
        alpha = float(alpha)
        if not 1.0 <= alpha <= 2.0:
            raise ValueError(f"alpha must be in [1, 2], got {alpha}")
        return torch.full((heads,), alpha, dtype=torch.float32, device=device)
    shape = tuple(alpha.shape)
    if shape not in ((), (1,), (heads,)) and (len(shape) != 4 or shape[0] != 1 or shape[2:] != (1, 1) or shape[1] not in (1, heads)):
        raise ValueError(f"alpha tensor must have shape (), ({heads},) or (1, {heads}, 1, 1), got {tuple(alpha.shape)}")
    if not alpha.is_floating_point():
        alpha = alpha.to(torch.float32)
    return alpha.to(device).reshape(-1).expand(heads)
