"""Combinations of the attention axes that cannot work are refused in one line by the pre-flight (before
any job is written): an attention_impl that no layer reads, a memory-efficient impl for a normaliser
without a threshold form, and what the GPU kernels cannot do. What works keeps working: auto and explicit
everywhere, a seq2seq decoder's own layers, and `auto` sends a normaliser without a threshold form to the
explicit path at any length."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from sparse_runner.attention import NORMALISERS, PATTERNS, AttentionSpec, MultiHeadAttention, Normaliser, Pattern, register_normaliser, register_pattern
from sparse_runner.checks import ConfigError
from sparse_runner.cli import preflight
from tests.conftest import TINY


class PlainSoftmax(Normaliser):
    """Softmax without `alphas`: no threshold form, so only the explicit path computes it."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(torch.softmax(scores.float(), dim=-1), nan=0.0).to(scores.dtype)


class OwnAlpha(PlainSoftmax):
    """An alpha-entmax (it gives `alphas`) that does not say its alpha before it is built."""

    def alphas(self) -> torch.Tensor:
        return torch.full((1,), 1.5)


@dataclass(frozen=True)
class WindowOptions:
    width: int = field(default=1, metadata={"valid": lambda w: w >= 0, "help": "an int >= 0"})


class WindowPattern(Pattern):
    """Query i sees keys i - width .. i + width: a mask besides padding and causality."""

    def dense_mask(self, n_queries, n_keys, device="cpu"):
        i = torch.arange(n_queries, device=device)[:, None]
        j = torch.arange(n_keys, device=device)[None, :]
        return (j - i).abs() <= self.options.width


@pytest.fixture
def plain(monkeypatch):
    """Registers PlainSoftmax as "plain", OwnAlpha as "own_alpha" and WindowPattern as "window" for one test."""
    monkeypatch.setattr(NORMALISERS, "_items", dict(NORMALISERS.load()))
    monkeypatch.setattr(PATTERNS, "_items", dict(PATTERNS.load()))
    register_normaliser("plain")(PlainSoftmax)
    register_normaliser("own_alpha")(OwnAlpha)
    register_pattern("window", options=WindowOptions)(WindowPattern)


def refused(overrides: list[str], tiny: bool = True) -> str:
    with pytest.raises(ConfigError) as info:
        preflight((TINY if tiny else []) + overrides, multirun=False)
    message = str(info.value)
    assert "\n" not in message
    return message


REFUSED = {
    "block-triton": (
        ["pattern=hst", "model.attention_impl=triton"],
        "model.attention_impl: 'triton' does not apply to pattern 'hst' (block patterns compute their own blocks); valid with hst: auto, explicit",
    ),
    "block-memory-efficient": (
        ["model=bigbird", "model.attention_impl=memory_efficient"],
        "model.attention_impl: 'memory_efficient' does not apply to pattern 'bigbird' (block patterns compute their own blocks); valid with bigbird: auto, explicit",
    ),
    "no-threshold-form": (
        ["model.normaliser=plain", "model.attention_impl=memory_efficient"],
        "model.normaliser: 'plain' has no threshold form for the memory-efficient path (model.attention_impl=memory_efficient); "
        "valid: softmax, sparsemax, entmax15, alpha_entmax, own_alpha (or model.attention_impl auto, explicit)",
    ),
    "no-threshold-form-triton": (
        ["model.normaliser=plain", "model.attention_impl=triton"],
        "model.normaliser: 'plain' has no threshold form for the memory-efficient path (model.attention_impl=triton)",
    ),
    "mask-on-gpu-kernel": (
        ["model.pattern=window", "model.normaliser=entmax15", "model.attention_impl=triton"],
        "model.attention_impl: 'triton' cannot apply the mask of pattern 'window' (the fused kernels take padding and causal masks only); "
        "valid with window: auto, explicit, memory_efficient",
    ),
    "dropout-on-adasplash": (
        ["normaliser=entmax15", "model.attention_dropout=0.1", "model.attention_impl=adasplash"],
        "model.attention_impl: 'adasplash' has no attention dropout, and model.attention_dropout is 0.1; "
        "valid with attention dropout: auto, explicit, memory_efficient, triton",
    ),
    "adasplash-learned-alpha": (
        ["normaliser=alpha_entmax", "model.attention_impl=adasplash"],
        "model.attention_impl: 'adasplash' takes one fixed alpha in (1, 2], and 'alpha_entmax' learns one alpha per head (model.normaliser_options.alpha is null); "
        "valid with alpha_entmax: auto, explicit, memory_efficient, triton",
    ),
    "adasplash-softmax": (
        ["normaliser=softmax", "model.attention_impl=adasplash"],
        "model.attention_impl: 'adasplash' takes one fixed alpha in (1, 2], and 'softmax' has alpha 1",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_combination_that_cannot_work_is_refused_in_one_line(case, plain):
    overrides, expected = REFUSED[case]
    assert refused(overrides).startswith(expected)


def test_adasplash_is_refused_with_a_decoder():
    message = refused(["experiment=mt_cpu", "normaliser=entmax15", "model.attention_impl=adasplash"], tiny=False)
    assert message.startswith("model.attention_impl: 'adasplash' needs as many queries as keys"), message
    assert message.endswith("valid with a decoder: auto, explicit, memory_efficient, triton")


WORKS = {
    "block-auto": ["pattern=hst"],
    "block-explicit": ["pattern=local", "model.attention_impl=explicit"],
    "no-threshold-form-auto": ["model.normaliser=plain", "model.memory_efficient_from=8"],
    "no-threshold-form-explicit": ["model.normaliser=plain", "model.attention_impl=explicit"],
    "mask-memory-efficient": ["model.pattern=window", "model.normaliser=entmax15", "model.attention_impl=memory_efficient"],
    "dropout-memory-efficient": ["normaliser=sparsemax", "model.attention_dropout=0.1", "model.attention_impl=memory_efficient"],
    # softmax trains through SDPA (with its dropout); the kernel only computes the analysis' weights.
    "softmax-dropout-triton": ["normaliser=softmax", "model.attention_dropout=0.1", "model.attention_impl=triton"],
    "learned-alpha-triton": ["normaliser=alpha_entmax", "model.attention_impl=triton"],
    # the Triton kernel draws attention dropout itself
    "dropout-triton": ["normaliser=entmax15", "model.attention_dropout=0.1", "model.attention_impl=triton"],
    "fixed-alpha-adasplash": ["normaliser=alpha_entmax", "++model.normaliser_options.alpha=1.5", "model.attention_impl=adasplash"],
    # Refused only where the class says its alpha (Normaliser.constant_alpha): here it is known at run time.
    "unsaid-alpha-adasplash": ["model.normaliser=own_alpha", "model.attention_impl=adasplash"],
}


@pytest.mark.parametrize("case", list(WORKS))
def test_what_works_is_accepted(case, plain):
    preflight(TINY + WORKS[case], multirun=False)


def test_a_decoder_reads_attention_impl_whatever_the_encoder_pattern():
    preflight(["experiment=mt_cpu", "pattern=hst", "model.attention_impl=memory_efficient"], multirun=False)


def test_auto_keeps_a_normaliser_without_threshold_form_on_the_explicit_path(plain):
    torch.manual_seed(0)
    x = torch.randn(2, 24, 16)
    auto = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="plain", memory_efficient_from=8))
    explicit = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="plain", impl="explicit"))
    explicit.load_state_dict(auto.state_dict())
    torch.testing.assert_close(auto(x), explicit(x), rtol=0, atol=0)
