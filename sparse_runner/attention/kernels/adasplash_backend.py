"""Optional backend: alpha-entmax attention through AdaSplash's Triton kernels (CUDA only).

AdaSplash (Goncalves, Treviso, Martins, ICML 2025; PyPI `adasplash`, deep-spin/adasplash) fuses
alpha-entmax attention like kernels/entmax_attention_triton.py, for a fixed alpha.  This module adapts
our calling convention to it and refuses, in one line, what its API cannot express:

    available() -> bool
    attention(q, k, v, alpha: float, *, key_padding_mask=None, causal=False) -> Tensor
    check_arguments(q, k, v, alpha, *, key_padding_mask=None) -> None   (the refusals, no kernel)

The call (read from adasplash 0.2.2's source): `adasplash.adasplash_v1(q, k, v, alpha=alpha,
is_causal=causal, varlen=lengths, niter=10)`, the original AdaSplash kernel, which takes any alpha in
(1, 2], causal or not.  (The 0.2 dispatcher `adasplash.adasplash` sends causal alpha = 1.5 calls to
AdaSplash-2, whose threshold is a histogram estimate refined `niter=1` times; v1 is called directly so
that every call has one behaviour.)  What its API fixes:
* q, k, v (B, H, N, D) with one length N for queries and keys (Nq == Nk), D in {16, 32, 64, 128, 256},
  contiguous (copied here if not); the score scale is 1 / sqrt(D), and not a parameter.
* Padding is a length per batch element (`varlen`): keys [0, length) are real.  A key_padding_mask
  must therefore be right padding (each row True...True False...False); any other mask is refused.
  AdaSplash also zeroes the output rows of padded *queries* (i >= length), which our other paths
  compute like any row; callers discard padded positions, so this only shows in those rows.
  `varlen` is always passed (full lengths when there is no mask): without it AdaSplash requires N to
  be a power of two.
* causal: query i sees keys j <= i (Nq == Nk, so the same rule as ours).
* alpha: a float in (1, 2] (alpha = 1 divides by alpha - 1 there: softmax belongs to SDPA); a learned
  per-head alpha is not supported (use entmax_attention_triton).
* Gradients for q, k, v.  AdaSplash saves what backward needs only when q requires grad.

Only importable where triton and adasplash are installed, and it runs on CUDA tensors only; nothing
here is exercised on a CPU machine beyond the argument checks (tests/test_triton_attention.py).
"""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["available", "attention", "check_arguments", "HEAD_DIMS", "NITER"]

HEAD_DIMS = (16, 32, 64, 128, 256)
# Halley-bisection steps of AdaSplash's threshold solver (its default).
NITER = 10


def available() -> bool:
    """True when the adasplash package (and triton) can be imported and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec("adasplash") is not None


def check_arguments(q, k, v, alpha, *, key_padding_mask=None) -> None:
    """Raise a one-line ValueError for anything AdaSplash's API cannot express (see the module doc)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError("adasplash: alpha must be a float in (1, 2] (a learned per-head alpha needs impl=triton)")
    if not 1.0 < float(alpha) <= 2.0:
        raise ValueError(f"adasplash: needs alpha in (1, 2], got {alpha} (softmax, alpha = 1, is SDPA's job)")
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"adasplash: q, k, v must be (B, H, N, D) alike, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"adasplash: needs Nq == Nk (one sequence length), got Nq={q.shape[2]}, Nk={k.shape[2]}")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"adasplash: head dim {q.shape[3]} not supported (one of {HEAD_DIMS})")
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (q.shape[0], k.shape[2]):
            raise ValueError(f"adasplash: key_padding_mask must be bool (B, N) = {(q.shape[0], k.shape[2])}, got {tuple(key_padding_mask.shape)}")
        lengths = key_padding_mask.sum(1)
        prefix = torch.arange(k.shape[2], device=key_padding_mask.device)[None, :] < lengths[:, None]
        if not torch.equal(prefix, key_padding_mask):  # one device sync, before any kernel
            raise ValueError("adasplash: key_padding_mask must be right padding (True...True False...False per row): AdaSplash takes one length per sequence")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: float,
    *,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """alpha-entmax attention by AdaSplash: q, k, v (B, H, N, D) CUDA -> (B, H, N, D), scale 1/sqrt(D).

    key_padding_mask: (B, N) bool right padding (True = real key); output rows of padded queries are
    zero.  causal: query i sees keys j <= i.  Autograd for q, k, v.
    """
    check_arguments(q, k, v, alpha, key_padding_mask=key_padding_mask)
    if not available():
        raise RuntimeError("adasplash: needs a CUDA device and the `adasplash` package (pip install adasplash)")
    if q.device.type != "cuda":
        raise ValueError(f"adasplash: needs CUDA tensors, got {q.device}")
    import adasplash

    B, _, N, _ = q.shape
    if key_padding_mask is None:
        lengths = torch.full((B,), N, dtype=torch.int32, device=q.device)
    else:
        lengths = key_padding_mask.to(q.device).sum(1, dtype=torch.int32)
    return adasplash.adasplash_v1(
        q.contiguous(), k.contiguous(), v.contiguous(), alpha=float(alpha), is_causal=bool(causal), varlen=lengths.contiguous(), niter=NITER
    )
