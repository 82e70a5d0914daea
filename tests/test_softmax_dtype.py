"""`Softmax.forward` (the dense normaliser outside SDPA) keeps a float64 input in float64 and leaves the
float32 and half-precision paths as they were (float32 arithmetic, cast back)."""

from __future__ import annotations

import torch

from sparse_runner.attention.normalisers import Softmax


def scores(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 7, generator=g, dtype=torch.float64) * 5
    x[0, 0, 2:] = float("-inf")            # masked keys
    x[1, 1, :] = float("-inf")             # a fully masked row: zeros, not NaN
    return x.to(dtype)


def test_float64_scores_are_normalised_in_float64() -> None:
    x = scores(torch.float64)
    # Differences below float32's resolution that a float32 detour would erase.
    x[2, 2, :3] = torch.tensor([1.0, 1.0 + 1e-12, 1.0 + 2e-12], dtype=torch.float64)
    out = Softmax()(x)
    expected = torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)
    assert out.dtype == torch.float64
    assert torch.equal(out, expected)
    assert out[2, 2, 0] < out[2, 2, 1] < out[2, 2, 2]
    assert torch.equal(out[1, 1], torch.zeros(7, dtype=torch.float64))


def test_float32_path_is_unchanged_bit_for_bit() -> None:
    x = scores(torch.float32)
    out = Softmax()(x)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.nan_to_num(torch.softmax(x.float(), dim=-1), nan=0.0))


def test_half_precision_is_computed_in_float32_and_cast_back() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        x = scores(dtype)
        out = Softmax()(x)
        assert out.dtype == dtype
        assert torch.equal(out, torch.nan_to_num(torch.softmax(x.float(), dim=-1), nan=0.0).to(dtype))
