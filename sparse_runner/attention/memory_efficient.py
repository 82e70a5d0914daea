"""Memory-efficient attention for every normaliser: query blocks, one threshold per row, recomputation.

The explicit path materialises the (B, H, Nq, Nk) scores and keeps the weights for backward: at LRA
lengths (4,000 tokens, batch 32, 4 heads) that is ~8 GB per layer before backward. Softmax avoids it
through SDPA's fused kernels; sparsemax, 1.5-entmax and alpha-entmax have no such kernel in PyTorch.
Here attention is computed block by block, a block being R query rows of some (batch, head) pairs
(`block_shape`: up to 512 rows of one pair first, so that a block's scores stay ~8 MiB):

    forward, per block:  s = (scale q_b) k^T (masked) -> p, (t, F) = entmax_threshold(s, alpha) -> out_b = p v
    saved:               q, k, v, the per-row threshold parameters (B, H, Nq, 2) float64 and, for the
                         blocks where most key blocks hold no weight, which ones do
    backward, per block: s recomputed -> p = entmax_from_threshold(s, alpha, (t, F)) (no solve, bitwise
                         the forward's weights) -> dV += p^T dO, dP = dO v^T, (dS, dalpha) from the
                         entmax Jacobian, dQ_b = scale dS k, dK += dS^T (scale q_b)

so peak memory is O(block) on top of q, k, v and their gradients instead of O(B H Nq Nk).

Sparsity is used where it is exact: a key block (KB keys) whose weights are zero for every row of a
query block contributes nothing to p v, and its gradients are zero (the entmax Jacobian is supported on
the support). When the densest pair of a block keeps at most `SKIP_BELOW` of its key blocks, the
value products, and in backward every product (scores included), run on the gathered active blocks only.
`count_skipped_blocks()` reports the fraction skipped (the analysis writes it to metrics.json).

Why by hand: PyTorch's fused attention kernels are softmax only, the `entmax` package materialises the
scores, and AdaSplash (a fused kernel) runs on CUDA only and for a fixed alpha. The same algorithm runs
as fused kernels: Triton on CUDA (kernels/entmax_attention_triton.py) and C++ on CPU
(kernels/entmax_attention_cpu.cpp). This path serves what they cannot take (a pattern mask; a head size
above the Triton kernel's; `explain_impl`), and is the reference the kernels
are tested against.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Iterator

import torch
from torch.autograd import Function

from sparse_runner.attention import entmax_thresholds
from sparse_runner.attention.block_sparse import RowGroup, record_scores

# Scores per block, in elements (pairs * R * Nk): 2^21 float32 = 8 MiB, a handful of which are live.
BLOCK_ELEMENTS = 1 << 21
MIN_BLOCK_ROWS, MAX_BLOCK_ROWS = 16, 512
KEY_BLOCK = 64  # keys per block in the sparsity bookkeeping (the unit that is skipped or kept)
# Compact the active key blocks when at most this fraction of them is active in the densest head:
# gathering costs a copy of the active blocks, which pays off only when enough of them are skipped.
SKIP_BELOW = 0.5

Alpha = float | torch.Tensor

# model.attention_impl: how a dense or causal pattern computes attention (block patterns have their own tiles).
#   auto: `explain_impl` (softmax without weights goes to SDPA before any choice is made);
#   explicit: the (Nq, Nk) scores and weights; memory_efficient: this module;
#   cpp: the fused CPU kernel (kernels/entmax_attention_cpu.py); no pattern mask;
#   triton / adasplash: the CUDA kernels (kernels/entmax_attention_triton.py, kernels/adasplash_backend.py);
#   flex: block patterns with softmax through FlexAttention on CUDA (flex_blocks.py; opt-in, unmeasured yet).
ATTENTION_IMPLS = ("auto", "explicit", "memory_efficient", "cpp", "triton", "adasplash", "flex")
GPU_IMPLS = ("triton", "adasplash")  # no mask besides padding and causality; AdaSplash: no attention dropout
CPU_IMPLS = ("cpp",)

# model.memory_efficient_from = "auto" (the default): the explicit path up to EXPLICIT_UP_TO keys where its
# scores fit, the memory-efficient path otherwise. Measured on 2 CPU cores (scripts/bench_long_attention.py: one
# layer, 8 heads, forward + backward; docs/benchmarks.md): with 2 threads on an idle machine the explicit path
# took 0.74-0.88x the memory-efficient path's time at 1,024-4,096 keys (alpha-entmax) and 1.54x at 8,192, where
# memory traffic bounds it; with 1 thread on a loaded machine it was faster at 512-2,048 keys for every sparse
# normaliser and level at 4,096 (alpha-entmax 1.17x, 1.5-entmax 0.89x, sparsemax 0.91x).
# With the fused CPU kernel (model.attention_impl=cpp) the explicit path is kept up to CPP_EXPLICIT_UP_TO keys
# only. Measured on 2 idle cores (docs/benchmarks.md), forward + backward: one layer (8 heads of 64, batch 1,
# projections included, scripts/bench_long_attention.py) took 0.92-1.0x the explicit path's time at 128-4,096
# keys for every sparse normaliser; attention alone (alpha 1.4 per head, 4,096 tokens per batch, medians of 5
# calls timed by hand) took 0.37-0.93x at 32-256 keys with heads of 16 and 64. The forward alone is slower on
# short rows, where the kernel's per-call preparation dominates: a 1-query decoding step over 40 keys took
# 508 us against 72 us, 40 queries over 40 keys 1.17 ms against 0.89 ms (batch 32, 4 heads of 64, no grad).
# Evaluation and decoding take the same choice as training, so short rows stay on the explicit path.
# "Fit": EXPLICIT_LIVE_COPIES float tensors of the layer's (B, H, Nq, Nk) scores (scores, weights and the
# backward's gradient) within EXPLICIT_MEMORY_SHARE of the device's total memory. Total, not free memory:
# a run's path, and with it its floating-point rounding, must not depend on what else the machine runs.
# On CUDA this crossover does not apply: the Triton kernel takes every length (on an H200, one layer forward
# + backward, it took 1/12 of the explicit path's time at 1k keys and 1/50 at 4k), and the memory-efficient
# path, a Python loop of small kernels, takes hundreds of times longer than either there.
MEMORY_EFFICIENT_FROM_AUTO = "auto"
EXPLICIT_UP_TO = 4096
CPP_EXPLICIT_UP_TO = 256
EXPLICIT_LIVE_COPIES = 3
EXPLICIT_MEMORY_SHARE = 0.125
# The Triton kernel's input dtypes, by element size (float64, 8 bytes, it does not take).
TRITON_ELEMENT_SIZES = (2, 4)

log = logging.getLogger(__name__)
_told_triton_missing = False


_memory_bytes: dict[str, int] = {}


def device_memory_bytes(device: torch.device) -> int:
    """Total memory of `device`: the GPU's, or the machine's physical memory for the CPU. Read once per device:
    a compiled model then finds a constant here, not a call it cannot trace (os.sysconf)."""
    key = str(device)
    if key not in _memory_bytes:
        if device.type == "cuda":
            _memory_bytes[key] = torch.cuda.get_device_properties(device).total_memory
        else:
            _memory_bytes[key] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return _memory_bytes[key]


def explicit_fits(n_scores: int, element_size: int, device: torch.device) -> bool:
    """Whether the explicit path's scores (n_scores = B * H * Nq * Nk elements) fit by the rule above."""
    return n_scores * element_size * EXPLICIT_LIVE_COPIES <= EXPLICIT_MEMORY_SHARE * device_memory_bytes(device)


def choose_impl(impl: str, memory_efficient_from: int | str, n_keys: int, device: torch.device, **facts) -> str:
    """The implementation that runs: 'explicit', 'memory_efficient', 'cpp', 'triton' or 'adasplash' (`explain_impl`)."""
    return explain_impl(impl, memory_efficient_from, n_keys, device, **facts)[0]


def explain_impl(
    impl: str, memory_efficient_from: int | str, n_keys: int, device: torch.device, *, dropout_p: float, has_mask: bool,
    threshold_form: bool = True, n_scores: int | None = None, element_size: int = 4, head_dim: int | None = None,
    need_weights: bool = False, key_padding: bool = False, causal: bool = False,
) -> tuple[str, str]:
    """(implementation, reason): which of 'explicit', 'memory_efficient', 'cpp', 'triton', 'adasplash'
    computes a layer's attention, and a one-line reason that starts with it ("triton: CUDA, threshold-form
    normaliser, padding mask"; recorded in metrics.json as `attention_backend_reason`).

    `auto` on CUDA: the Triton kernel at every length, attention dropout included, for a threshold-form
    normaliser it can take (no mask besides padding and causality, head_dim <= its MAX_HEAD_DIM, a half or
    float32 dtype: element_size 2 or 4; head_dim None: not known, taken as fitting). When the analysis
    needs the weights (need_weights), the explicit path where the crossover rule keeps it: it has them at
    once, while beside the kernel they are computed again block by block.
    `auto` on CPU: the explicit path up to CPP_EXPLICIT_UP_TO keys (where `explicit_fits`), the fused C++
    kernel above, for a threshold-form normaliser without a pattern mask, attention dropout included (the
    analysis's weights as on CUDA). Otherwise, and on every other device, the explicit path up to a
    crossover and the memory-efficient path beyond it: memory_efficient_from keys, or for "auto"
    EXPLICIT_UP_TO keys where `explicit_fits(n_scores, element_size)` (n_scores None: fits). A
    memory_efficient_from set to a number moves the kernel's crossover as well.
    threshold_form: whether the normaliser is an alpha-entmax (`Normaliser.has_threshold_form`); `auto`
    keeps any other normaliser on the explicit path, the only one that computes it (a forced impl that
    cannot compute it is refused by `config.validate`, `spec.check_attention_impl`).
    key_padding, causal: the masks a call has besides `has_mask` (named in the reason only).
    Forced GPU kernels on a CPU tensor, or without the package, and a forced cpp kernel off the CPU,
    without the extension or on a call it cannot take, are refused in one line."""
    if impl in GPU_IMPLS:
        module = gpu_backend(impl)
        if device.type != "cuda" or not module.available():
            why = "a CUDA device" if device.type != "cuda" else ("triton" if impl == "triton" else "the adasplash package")
            raise RuntimeError(f"model.attention_impl={impl} needs {why}; use memory_efficient (any device) or auto")
        return impl, f"{impl}: model.attention_impl={impl}"
    if impl in CPU_IMPLS:
        if device.type != "cpu" or not cpu_kernel().available():
            why = "a CPU device" if device.type != "cpu" else "the C++ extension, which could not be built here"
            raise RuntimeError(f"model.attention_impl={impl} needs {why}; use memory_efficient (any device) or auto")
        kernel_cannot = cpu_kernel().cannot(has_mask=has_mask)
        if kernel_cannot is not None:
            raise RuntimeError(f"model.attention_impl={impl} cannot take {kernel_cannot}; use memory_efficient or auto")
        return impl, f"{impl}: model.attention_impl={impl}"
    if impl != "auto":
        return impl, f"{impl}: model.attention_impl={impl}"
    if not threshold_form:
        return "explicit", "explicit: a normaliser without a threshold form"
    where = device.type.upper() if device.type in ("cpu", "cuda") else device.type
    masks = [name for name, present in (("padding", key_padding), ("causal", causal)) if present]
    masks = f"{' and '.join(masks) or 'no'} mask"
    dropout = ", attention dropout" if dropout_p > 0.0 else ""
    if device.type == "cpu":
        kernel_cannot = cpu_kernel().cannot(has_mask=has_mask)
        if kernel_cannot is None and _cpp_available():
            if need_weights and _crossover(memory_efficient_from, n_keys, n_scores, element_size, device)[0] == "explicit":
                return "explicit", f"explicit: CPU, weights for the analysis, {_count(n_keys)} keys"
            path, why = _crossover(memory_efficient_from, n_keys, n_scores, element_size, device, CPP_EXPLICIT_UP_TO)
            if path == "explicit":
                return "explicit", f"explicit: CPU, {why}"
            return "cpp", f"cpp: CPU, threshold-form normaliser, {masks}{dropout}, {why}"
        where = f"CPU, {kernel_cannot or 'the C++ extension unavailable'}"
    if device.type == "cuda":
        kernel_cannot = _triton_cannot(has_mask, head_dim, element_size)
        if kernel_cannot is None and _triton_available():
            if need_weights and _crossover(memory_efficient_from, n_keys, n_scores, element_size, device)[0] == "explicit":
                return "explicit", f"explicit: CUDA, weights for the analysis, {_count(n_keys)} keys"
            return "triton", f"triton: CUDA, threshold-form normaliser, {masks}{dropout}"
        where = f"CUDA, {kernel_cannot or 'triton not installed'}"
    impl, why = _crossover(memory_efficient_from, n_keys, n_scores, element_size, device)
    return impl, f"{impl}: {where}, {why}"


def _count(n: int) -> str:
    """n written in a reason. Under torch.compile, which records no reason (`MultiHeadAttention.forward`), "N":
    formatting a traced length would make Dynamo specialise the graph to that length, one recompile per length."""
    return "N" if torch.compiler.is_compiling() else str(n)


def _crossover(
    memory_efficient_from: int | str, n_keys: int, n_scores: int | None, element_size: int, device: torch.device,
    explicit_up_to: int = EXPLICIT_UP_TO,
) -> tuple[str, str]:
    """('explicit' or 'memory_efficient', why) by the crossover rule (explicit_up_to keys, `explicit_fits`)."""
    if memory_efficient_from == MEMORY_EFFICIENT_FROM_AUTO:
        if n_keys > explicit_up_to:
            return "memory_efficient", f"{_count(n_keys)} keys > {explicit_up_to}"
        if n_scores is not None and not explicit_fits(n_scores, element_size, device):
            return "memory_efficient", f"{_count(n_keys)} keys, the explicit scores exceed 1/{round(1 / EXPLICIT_MEMORY_SHARE)} of its memory"
        return "explicit", f"{_count(n_keys)} keys <= {explicit_up_to}"
    if n_keys < memory_efficient_from:
        return "explicit", f"{_count(n_keys)} keys < model.memory_efficient_from={memory_efficient_from}"
    return "memory_efficient", f"{_count(n_keys)} keys >= model.memory_efficient_from={memory_efficient_from}"


def _triton_cannot(has_mask: bool, head_dim: int | None, element_size: int) -> str | None:
    """What keeps the Triton kernel from a call (a phrase for the reason), or None when it can take it."""
    if has_mask:
        return "a pattern mask"
    if head_dim is not None and head_dim > gpu_backend("triton").MAX_HEAD_DIM:
        return f"head size {head_dim} > {gpu_backend('triton').MAX_HEAD_DIM}"
    if element_size not in TRITON_ELEMENT_SIZES:
        return "float64"
    return None


def cpu_kernel():
    """The fused CPU kernel's module (kernels/entmax_attention_cpu.py)."""
    from sparse_runner.attention.kernels import entmax_attention_cpu

    return entmax_attention_cpu


def _cpp_available() -> bool:
    """Whether the fused CPU kernel can run (the extension says once why it cannot be built)."""
    return cpu_kernel().available()


def _triton_available() -> bool:
    """Whether the Triton kernel can run; where it cannot on a CUDA machine, says so once in the log."""
    global _told_triton_missing
    if gpu_backend("triton").available():
        return True
    if not _told_triton_missing:
        _told_triton_missing = True
        log.warning("triton is not installed: sparse attention on CUDA takes the explicit and memory-efficient torch "
                    "paths, which are far slower there (pip install -e '.[gpu]' adds it)")
    return False


def gpu_backend(name: str):
    """The module of GPU kernel `name` ('triton' or 'adasplash'), imported on first use."""
    if name == "triton":
        from sparse_runner.attention.kernels import entmax_attention_triton as module
    else:
        from sparse_runner.attention.kernels import adasplash_backend as module
    return module

_skip_counter: list[int] | None = None


@contextlib.contextmanager
def count_skipped_blocks() -> Iterator[list[int]]:
    """Inside the block, memory-efficient attention adds [key blocks, key blocks skipped] (summed over
    batch, heads and query blocks, forward passes only) to the two-element list this yields."""
    global _skip_counter
    outer, _skip_counter = _skip_counter, [0, 0]
    try:
        yield _skip_counter
    finally:
        _skip_counter = outer


def _record_skips(total: int, skipped: int) -> None:
    if _skip_counter is not None:
        _skip_counter[0] += int(total)
        _skip_counter[1] += int(skipped)


def block_shape(pairs: int, n_keys: int, n_queries: int, rows: int | None = None) -> tuple[int, int]:
    """(pairs per block, query rows per block): a block's scores hold about BLOCK_ELEMENTS numbers.

    Rows first (up to MAX_BLOCK_ROWS: the matmuls of a block are per (batch, head) pair, and short ones
    run far below the machine's speed), then as many (batch, head) pairs as fit."""
    if rows is None:
        rows = max(MIN_BLOCK_ROWS, min(MAX_BLOCK_ROWS, BLOCK_ELEMENTS // max(1, n_keys)))
    rows = max(1, min(n_queries, rows))
    return max(1, min(pairs, BLOCK_ELEMENTS // max(1, rows * n_keys))), rows


def memory_efficient_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: Alpha,
    *,
    key_padding_mask: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    rows_per_block: int | None = None,
    skip: bool = True,
) -> torch.Tensor:
    """alpha-entmax attention of q over (k, v) without the (Nq, Nk) matrices. Differentiable in q, k, v, alpha.

    q (B, H, Nq, D); k, v (B, H, Nk, D) -> (B, H, Nq, D), in q's dtype (scores and weights in float32,
    or float64 for float64 inputs).
    alpha: a float in [1, 2] (1 = softmax, 1.5 = 1.5-entmax, 2 = sparsemax) or a tensor of one alpha
        per head, shape (H,) or (1, H, 1, 1); a tensor receives gradients.
    key_padding_mask: (B, Nk) bool, True = real key. mask: (Nq, Nk) bool, True = may attend.
    causal: query i sees keys j <= i + Nk - Nq (aligned to the end; key blocks past it are never computed).
    A query without any allowed key gets a zero output and zero gradients.
    dropout_p: dropout on the weights (its mask is drawn again, identically, in backward).
    rows_per_block: query rows per block (default: `block_shape`); skip: use the key-block sparsity.
    """
    b, h, n_q, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:3] != k.shape[:3] or k.shape[-1] != d:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected (B, H, N, D) with one B, H, D")
    alpha_f, alpha_t = (float(alpha), None) if not torch.is_tensor(alpha) else (None, alpha.reshape(-1))
    if alpha_t is not None and alpha_t.numel() not in (1, h):
        raise ValueError(f"alpha has {alpha_t.numel()} values for {h} heads")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    seed = int(torch.randint(1 << 62, (1,)).item()) if dropout_p > 0.0 else 0
    geometry = _Geometry(b, h, n_q, k.shape[2], rows_per_block, key_padding_mask, mask, causal)
    settings = (geometry, alpha_f, scale, dropout_p, seed, skip)
    # (B, H, N, D) -> (B * H, N, D): every block is some (batch, head) pairs x some query rows.
    pairs = [x.reshape(b * h, x.shape[2], x.shape[3]) for x in (q, k, v)]
    return _MemoryEfficientAttention.apply(*pairs, alpha_t, settings).view(b, h, n_q, v.shape[-1])


def attend_long(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    impl: str,
    *,
    normaliser,
    key_padding_mask: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
):
    """`Pattern.attend` through `impl` ('memory_efficient', 'cpp', 'triton' or 'adasplash'): (out, weights, None).

    weights (when asked for) is an iterable of `block_sparse.RowGroup`s, one per query block, each
    computed when it is reached, so the analysis never holds the (Nq, Nk) matrix either."""
    record_scores(q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2])
    alpha = normaliser.kernel_alpha()
    if impl == "cpp":
        out = cpu_kernel().entmax_attention(q, k, v, alpha, key_padding_mask=key_padding_mask, causal=causal, dropout_p=dropout_p)
    elif impl == "triton":
        out = gpu_backend("triton").entmax_attention(q, k, v, alpha, key_padding_mask=key_padding_mask, causal=causal, dropout_p=dropout_p)
    elif impl == "adasplash":
        if torch.is_tensor(alpha):
            raise ValueError("model.attention_impl=adasplash takes a fixed alpha only (softmax, sparsemax, entmax15, or alpha_entmax with model.normaliser_options.alpha set)")
        out = gpu_backend("adasplash").attention(q, k, v, alpha, key_padding_mask=key_padding_mask, causal=causal)
    else:
        out = memory_efficient_attention(q, k, v, alpha, key_padding_mask=key_padding_mask, mask=mask, causal=causal, dropout_p=dropout_p)
    if not need_weights:
        return out, None, None
    return out, _RowGroups(q, k, alpha, key_padding_mask, mask, causal), None


class _RowGroups:
    """The weights of one attention call as `RowGroup`s, one query block at a time (see `block_weights`).

    Each block's scores and thresholds are computed again here rather than kept from the forward pass
    that produced the output: keeping them would hold the (Nq, Nk) weights this path exists to avoid.
    Analysis only (evaluation, no gradients)."""

    def __init__(self, q, k, alpha, key_padding_mask, mask, causal) -> None:
        self.args = (q, k, alpha)
        self.kwargs = dict(key_padding_mask=key_padding_mask, mask=mask, causal=causal)

    def __iter__(self) -> Iterator[RowGroup]:
        q, k, alpha = self.args
        b = q.shape[0]
        for r0, r1, weights, valid in block_weights(q, k, alpha, **self.kwargs):
            keys = torch.arange(weights.shape[-1], device=q.device)[None]
            if valid is None:
                valid = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=q.device)
            valid = valid.expand(b, 1, r1 - r0, weights.shape[-1])
            yield RowGroup(torch.arange(r0, r1, device=q.device), keys, weights, valid)


def block_weights(
    q: torch.Tensor, k: torch.Tensor, alpha: Alpha, *, key_padding_mask=None, mask=None, causal=False, scale=None
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor | None]]:
    """The weights block by block, for the analysis: yields (r0, r1, weights (B, H, r1 - r0, S), valid
    (B or 1, 1, r1 - r0, S) bool or None), S = keys rounded up to whole key blocks (the padding is not
    valid). Every block holds all heads (the analysis compares heads). No gradients."""
    b, h, n_q, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rows = max(1, BLOCK_ELEMENTS // max(1, b * h * k.shape[2]))
    geo = _Geometry(b, h, n_q, k.shape[2], rows, key_padding_mask, mask, causal, pairs_per_block=b * h)
    alpha_f, alpha_t = (float(alpha), None) if not torch.is_tensor(alpha) else (None, alpha.reshape(-1))
    qs = (q * scale).reshape(b * h, n_q, d)
    kp = _pad_keys(k.reshape(b * h, k.shape[2], d), geo.n_key_blocks * KEY_BLOCK)
    with torch.no_grad():
        for p0, p1, r0, r1 in geo.blocks():
            keys = torch.arange(geo.key_end(p0, p1, r1), device=q.device)
            s = _scores(qs[p0:p1, r0:r1], _take_keys(kp, keys))
            valid = geo.valid(p0, p1, r0, r1, keys)
            if valid is not None:
                s.masked_fill_(~valid, float("-inf"))
            p, _ = entmax_thresholds.entmax_threshold(s, geo.alpha(alpha_f, alpha_t, p0, p1))
            if valid is not None:  # pairs -> (B, 1, R, S): the pattern's validity is the same for every head
                valid = valid.expand(p1 - p0, r1 - r0, -1).view(b, h, r1 - r0, -1)[:, :1]
            yield r0, r1, p.view(b, h, r1 - r0, -1), valid


# ------------------------------------------------------------------------------------------------
# Geometry of one call: blocks of (batch, head) pairs x query rows, padded key blocks, masks per block
# ------------------------------------------------------------------------------------------------


class _Geometry:
    """Which (query, key) pairs exist, block by block. Keys are padded to whole KEY_BLOCKs (masked).

    Tensors are seen as (P, N, D) with P = B * H (batch-major pairs); pair i is batch i // H, head i % H."""

    def __init__(self, b, h, n_queries, n_keys, rows, key_padding_mask, mask, causal, pairs_per_block=None) -> None:
        self.b, self.h, self.n_queries, self.n_keys = b, h, n_queries, n_keys
        pairs, self.rows = block_shape(b * h, n_keys, n_queries, rows)
        self.pairs_per_block = pairs_per_block or pairs
        self.n_key_blocks = -(-n_keys // KEY_BLOCK)
        # (P, Nk): one row per pair (cheap: bools), so that every mask is indexed the same way.
        self.key_padding_mask = None if key_padding_mask is None else key_padding_mask.repeat_interleave(h, dim=0)
        # Keys after a pair's last real key get no weight, so a block stops at the last real key of its
        # pairs: a padded batch computes no scores over its trailing padding (exact; it saves the padding's
        # share of the work, large where the lengths in a batch vary).
        self.real_keys = None
        if key_padding_mask is not None:
            positions = torch.arange(1, n_keys + 1, device=key_padding_mask.device)
            last = (key_padding_mask * positions).amax(dim=1).clamp_min(1)  # (B,): 1 + the last real key
            self.real_keys = last.repeat_interleave(h).tolist()
        # Right padding only (no pattern mask, not causal): a pair's invalid keys are exactly those from its
        # last real key on, so masking is a slice fill instead of a pass over the whole score block.
        self.tail_only = not causal and mask is None
        if self.tail_only and key_padding_mask is not None:
            self.tail_only = bool((key_padding_mask == (positions[None] <= last[:, None])).all())
        self.mask, self.causal = mask, causal
        self.offset = n_keys - n_queries  # causal: query i sees keys <= i + offset

    def blocks(self) -> Iterator[tuple[int, int, int, int]]:
        """(p0, p1, r0, r1): pairs p0..p1 x query rows r0..r1."""
        pairs = self.b * self.h
        for p0 in range(0, pairs, self.pairs_per_block):
            for r0 in range(0, self.n_queries, self.rows):
                yield p0, min(pairs, p0 + self.pairs_per_block), r0, min(self.n_queries, r0 + self.rows)

    def key_end(self, p0: int, p1: int, r1: int) -> int:
        """Pairs p0..p1, rows before r1 see keys before key_end, in whole key blocks: all keys, or up to the
        causal limit, or up to the last real key of these pairs."""
        last = self.n_keys if not self.causal else min(self.n_keys, max(1, r1 + self.offset))
        if self.real_keys is not None:
            last = min(last, max(self.real_keys[p0:p1]))
        return -(-last // KEY_BLOCK) * KEY_BLOCK

    def alpha(self, alpha_f: float | None, alpha_t: torch.Tensor | None, p0: int, p1: int) -> Alpha:
        """A float, or the alphas of pairs p0..p1 as (pairs, 1, 1) (pair i has head i % H's alpha)."""
        if alpha_t is None:
            return alpha_f
        heads = torch.arange(p0, p1, device=alpha_t.device) % self.h
        return alpha_t.detach().expand(self.h)[heads].view(-1, 1, 1)

    def mask_scores(self, s: torch.Tensor, p0: int, p1: int, r0: int, r1: int, keys: torch.Tensor) -> None:
        """Sets the scores s (pairs, R, S) of the pairs that are not allowed (`valid`) to -inf, in place."""
        if self.tail_only and keys.dim() == 1:
            if self.real_keys is None:  # only the padding of the last key block
                s[..., self.n_keys:] = float("-inf")
                return
            for i, end in enumerate(self.real_keys[p0:p1]):
                s[i, :, end:] = float("-inf")
            return
        valid = self.valid(p0, p1, r0, r1, keys)
        if valid is not None:
            s.masked_fill_(~valid, float("-inf"))

    def valid(self, p0: int, p1: int, r0: int, r1: int, keys: torch.Tensor) -> torch.Tensor | None:
        """bool, broadcastable to (pairs, R, S), for key positions `keys` ((S,) shared, or (pairs, S) per
        pair; positions >= n_keys pad the last key block), or None when every pair is valid."""
        parts = []
        per_pair = keys.dim() == 2
        if self.n_key_blocks * KEY_BLOCK > self.n_keys:
            parts.append((keys < self.n_keys)[..., None, :] if per_pair else (keys < self.n_keys)[None, None, :])
        safe = keys.clamp_max(self.n_keys - 1)
        if self.key_padding_mask is not None:
            kpm = self.key_padding_mask[p0:p1]
            parts.append((kpm.gather(1, safe) if per_pair else kpm[:, safe])[:, None, :])
        if self.causal:
            limit = (torch.arange(r0, r1, device=keys.device) + self.offset)[:, None]  # (R, 1)
            parts.append((safe[:, None, :] <= limit) if per_pair else (safe[None, :] <= limit)[None])
        if self.mask is not None:
            m = self.mask[r0:r1]  # (R, Nk)
            if per_pair:
                parts.append(m[None].expand(p1 - p0, -1, -1).gather(2, safe[:, None, :].expand(-1, r1 - r0, -1)))
            else:
                parts.append(m[:, safe][None])
        if not parts:
            return None
        out = parts[0]
        for part in parts[1:]:
            out = out & part
        return out


def _scores(q_b: torch.Tensor, keys_d: torch.Tensor) -> torch.Tensor:
    """q_b keys_d^T, (P, R, S), with q_b already scaled. Float32 (float64 for float64 inputs) whatever
    the input dtype: the threshold needs the precision."""
    s = q_b @ keys_d.transpose(-2, -1)
    return s if s.dtype in (torch.float32, torch.float64) else s.float()


def _pad_keys(x: torch.Tensor, n: int) -> torch.Tensor:
    """x (P, N, D) zero-padded to n >= N positions (x itself when n == N)."""
    return x if n == x.shape[1] else torch.nn.functional.pad(x, (0, 0, 0, n - x.shape[1]))


def _take_keys(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """x (P, N_pad, D) at key positions `keys`: (S,) = a prefix (a view), (P, S) = gathered per pair."""
    if keys.dim() == 1:
        return x[:, : keys.numel()]
    return x.gather(1, keys[..., None].expand(-1, -1, x.shape[-1]))


def _add_keys(dx: torch.Tensor, keys: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """dx (P, N_pad, D) += a @ b ((P, S, D)) at key positions `keys` (as in `_take_keys`), in place."""
    if keys.dim() == 1:
        dx[:, : keys.numel()].baddbmm_(a, b)  # no temporary, no extra pass
    else:
        dx.scatter_add_(1, keys[..., None].expand(-1, -1, dx.shape[-1]), a @ b)


def _active_key_blocks(p: torch.Tensor) -> torch.Tensor:
    """(P, nb) bool: which KEY_BLOCKs of p (P, R, nb * KEY_BLOCK) hold any weight."""
    n_p, r, s = p.shape
    return p.view(n_p, r, s // KEY_BLOCK, KEY_BLOCK).amax(dim=(1, 3)) > 0


def _compact_keys(active: torch.Tensor) -> torch.Tensor | None:
    """Key positions (P, C * KEY_BLOCK) of the active blocks (C = the most any pair keeps; pairs with
    fewer are padded with inactive blocks, whose weights are zero), or None when too few are skipped."""
    nb = active.shape[-1]
    count = int(active.sum(-1).max())
    if count > SKIP_BELOW * nb:
        return None
    order = torch.argsort((~active).to(torch.int8), dim=-1, stable=True)[..., : max(count, 1)]  # active blocks first
    return (order[..., None] * KEY_BLOCK + torch.arange(KEY_BLOCK, device=active.device)).flatten(-2)


def _dropout_mask(shape, p: float, seed: int, block: int, device) -> torch.Tensor:
    """The keep mask of one block, scaled by 1 / (1 - p); drawn from (seed, block), so backward gets it again."""
    g = torch.Generator(device=device).manual_seed(seed + block)
    return (torch.rand(shape, generator=g, device=device) >= p).float().div_(1.0 - p)


# ------------------------------------------------------------------------------------------------
# The autograd function (on (P, N, D) views, P = batch x heads)
# ------------------------------------------------------------------------------------------------


class _MemoryEfficientAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, alpha_t, settings):
        geo, alpha_f, scale, dropout_p, seed, skip = settings
        n_pad = geo.n_key_blocks * KEY_BLOCK
        kp, vp = _pad_keys(k, n_pad), _pad_keys(v, n_pad)
        qs = q * scale  # scaling q (N x D) instead of every score block (N x N)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
        params, compact = [], []
        skips = _SkipSchedule(skip and alpha_f != 1.0)  # softmax never leaves a block empty: do not look
        for i, (p0, p1, r0, r1) in enumerate(geo.blocks()):
            keys = torch.arange(geo.key_end(p0, p1, r1), device=q.device)
            s = _scores(qs[p0:p1, r0:r1], _take_keys(kp[p0:p1], keys))
            geo.mask_scores(s, p0, p1, r0, r1, keys)
            p, prm = entmax_thresholds.entmax_threshold(s, geo.alpha(alpha_f, alpha_t, p0, p1))
            del s
            params.append(prm)
            kept = skips.compact(p)
            compact.append(kept)
            if kept is not None:
                p = p.gather(2, kept[:, None, :].expand(-1, r1 - r0, -1))
                keys = kept
            if dropout_p > 0.0:
                p = p * _dropout_mask(p.shape, dropout_p, seed, i, q.device)
            out[p0:p1, r0:r1] = p.to(v.dtype) @ _take_keys(vp[p0:p1], keys)
        _record_skips(skips.total, skips.skipped)
        ctx.settings, ctx.compact = settings, compact
        ctx.save_for_backward(qs, k, v, alpha_t, *params)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        geo, alpha_f, scale, dropout_p, seed, skip = ctx.settings
        qs, k, v, alpha_t, *params = ctx.saved_tensors
        need_da = alpha_t is not None and ctx.needs_input_grad[3]
        n_pad = geo.n_key_blocks * KEY_BLOCK
        work = torch.float64 if qs.dtype == torch.float64 else torch.float32
        # The scores are recomputed from the forward's operands in their own dtype (a bf16 / fp16 matmul
        # there, as in the forward): scores recomputed in float32 would not match the forward's threshold,
        # and the weights would neither be the forward's nor sum to one. The products of the backward
        # run in `work`.
        k_in = _pad_keys(k, n_pad)
        kp, vp = k_in.to(work), _pad_keys(v, n_pad).to(work)
        qw, grad_out = qs.to(work), grad_out.to(work)
        dq = torch.empty_like(qw)
        dk = torch.zeros(k.shape[0], n_pad, k.shape[-1], dtype=work, device=qs.device)
        dv = torch.zeros(v.shape[0], n_pad, v.shape[-1], dtype=work, device=qs.device)
        da = torch.zeros(qs.shape[0], dtype=work, device=qs.device) if need_da else None  # per pair
        for i, (p0, p1, r0, r1) in enumerate(geo.blocks()):
            kept = ctx.compact[i]
            keys = kept if kept is not None else torch.arange(geo.key_end(p0, p1, r1), device=qs.device)
            q_b, kk, vv = qw[p0:p1, r0:r1], _take_keys(kp[p0:p1], keys), _take_keys(vp[p0:p1], keys)
            s = _scores(qs[p0:p1, r0:r1], kk if k_in is kp else _take_keys(k_in[p0:p1], keys))
            geo.mask_scores(s, p0, p1, r0, r1, keys)
            alpha = geo.alpha(alpha_f, alpha_t, p0, p1)
            p = entmax_thresholds.entmax_from_threshold(s, alpha, params[i])  # the forward's weights, no solve
            del s
            g = grad_out[p0:p1, r0:r1]
            dp = g @ vv.transpose(-2, -1)  # (pairs, R, S)
            pd = p
            if dropout_p > 0.0:
                keep = _dropout_mask(p.shape, dropout_p, seed, i, qs.device)
                pd, dp = p * keep, dp.mul_(keep)
            _add_keys(dv[p0:p1], keys, pd.transpose(-2, -1), g)
            ds, da_rows = entmax_thresholds.entmax_backward(p, dp, alpha, need_dalpha=need_da)  # d loss / d (scaled scores)
            del p, pd, dp
            dq[p0:p1, r0:r1] = ds @ kk
            _add_keys(dk[p0:p1], keys, ds.transpose(-2, -1), q_b)
            if need_da:
                da[p0:p1] += da_rows.sum(dim=(1, 2)).to(work)
        n_k = geo.n_keys
        dq, dk, dv = (dq * scale).to(qs.dtype), dk[:, :n_k].to(k.dtype), dv[:, :n_k].to(v.dtype)
        if need_da:
            da = da.view(geo.b, geo.h).sum(0)  # pairs -> heads
            da = (da if alpha_t.numel() == geo.h else da.sum()).reshape(alpha_t.shape).to(alpha_t.dtype)
        return dq, dk, dv, da, None


class _SkipSchedule:
    """When to look for key blocks without weight, and the bookkeeping of what was skipped.

    Looking costs a pass over the block's weights. Where a look finds too few empty blocks to compact,
    the next look comes after twice as many blocks (up to 8): dense heads stop paying for it, and rows
    that grow sparser along the sequence are still found. Skipping is exact either way."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.wait, self.gap = enabled, 0, 1
        self.total = self.skipped = 0

    def compact(self, p: torch.Tensor) -> torch.Tensor | None:
        """Key positions to keep for the block's weights p (pairs, R, S) (see `_compact_keys`), or None."""
        pairs, nb = p.shape[0], p.shape[-1] // KEY_BLOCK
        self.total += pairs * nb
        if not self.enabled:
            return None
        if self.wait > 0:
            self.wait -= 1
            return None
        kept = _compact_keys(_active_key_blocks(p))
        if kept is None:
            self.gap = min(8, self.gap * 2)
            self.wait = self.gap - 1
        else:
            self.gap = 1
            self.skipped += pairs * (nb - kept.shape[-1] // KEY_BLOCK)
        return kept
