"""Patterns and the attention spec: every pattern equals masked dense attention under every normaliser,
a new pattern plugs in by registering alone, pattern options are checked in one line, and models take
one AttentionSpec (and nothing they would ignore)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import pytest
import torch

from sparse_runner.attention import (
    PATTERNS,
    AttentionSpec,
    MultiHeadAttention,
    Pattern,
    build_normaliser,
    build_pattern,
    check_attention_config,
    register_pattern,
)
from sparse_runner.checks import ConfigError
from sparse_runner.models import CLASSIFIER_KEYS, SEQ2SEQ_KEYS, build_classifier, build_seq2seq
from sparse_runner.models.config import EVERY_FAMILY, MODEL_KEYS, default_model
from sparse_runner.models.encoder import EncoderClassifier, TransformerEncoder
from sparse_runner.models.seq2seq import TransformerSeq2Seq
from tests.test_block_patterns import dense_weights

NORMALISERS = ["softmax", "sparsemax", "entmax15", "alpha_entmax"]
H = 3


# ----------------------------------------------------------------------------- a toy pattern
@dataclass(frozen=True)
class BandOptions:
    width: int = field(default=1, metadata={"valid": lambda w: w >= 0, "help": "an int >= 0"})
    side: Literal["both", "left"] = "both"


class BandPattern(Pattern):
    """Query i sees keys i - width .. i + width (or .. i with side=left). Only `dense_mask` is its own."""

    def dense_mask(self, n_queries, n_keys, device="cpu"):
        i = torch.arange(n_queries, device=device)[:, None]
        j = torch.arange(n_keys, device=device)[None, :]
        ahead = 0 if self.options.side == "left" else self.options.width
        return (j >= i - self.options.width) & (j <= i + ahead)


@pytest.fixture
def band(monkeypatch):
    """Registers BandPattern as "band" for one test."""
    monkeypatch.setattr(PATTERNS, "_items", dict(PATTERNS.load()))  # the band leaves with the test
    register_pattern("band", options=BandOptions)(BandPattern)
    yield BandPattern


# ----------------------------------------------------------------------------- masked dense reference
def reference(q, k, v, normaliser, pattern, pad):
    """Explicit scores, masked with the pattern's dense mask and the padding, then the normaliser."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool)
    mask = pattern.dense_mask(n_q, n_k)
    if mask is not None:
        allowed = allowed & mask
    if pad is not None:
        allowed = allowed & pad[:, None, None, :]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = normaliser(scores.masked_fill(~allowed, float("-inf")))
    return weights @ v, weights, allowed.expand(q.shape[0], 1, n_q, n_k)


# (n_queries, n_keys, key padding): self-attention with and without padding, cross-attention, one decoding step.
CASES = {
    "self": (7, 7, None),
    "self-padded": (7, 7, [7, 5]),
    "cross-padded": (3, 7, [7, 5]),
    "one-query": (1, 7, [7, 5]),
}


def check_against_reference(pattern: Pattern, name: str, case: str, need_weights: bool) -> None:
    n_q, n_k, lengths = CASES[case]
    torch.manual_seed(0)
    normaliser = build_normaliser(name, H).double()  # alpha_entmax: a different learned alpha per head
    g = torch.Generator().manual_seed(1)
    q = (3 * torch.randn(2, H, n_q, 4, generator=g, dtype=torch.float64)).requires_grad_()  # peaked: sparse weights
    k, v = (torch.randn(2, H, n_k, 4, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    pad = None if lengths is None else torch.arange(n_k)[None, :] < torch.tensor(lengths)[:, None]
    upstream = torch.randn(2, H, n_q, 4, generator=g, dtype=torch.float64)
    leaves = [q, k, v, *normaliser.parameters()]

    out, weights, valid = pattern.attend(q, k, v, normaliser=normaliser, key_padding_mask=pad, need_weights=need_weights)
    expected, expected_weights, expected_valid = reference(q, k, v, normaliser, pattern, pad)
    if isinstance(weights, list):  # a block-sparse pattern's row groups (test_block_patterns.py checks them)
        weights, slots = dense_weights(weights, 2, H, n_q)
        valid = slots > 0
    # Softmax's explicit path computes in float32 (so the order of the float64 score sums may round it
    # differently), the fused SDPA path in float64: compare softmax at float32 precision.
    tol = dict(atol=1e-5, rtol=1e-5) if weights is None or name == "softmax" else {}
    torch.testing.assert_close(out, expected, **tol)
    grads = torch.autograd.grad((out * upstream).sum(), leaves)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), leaves)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, **tol)
    if need_weights:
        assert weights is not None
    if weights is not None:
        torch.testing.assert_close(weights, expected_weights)
        full = torch.ones_like(expected_valid) if valid is None else valid.expand_as(expected_valid)
        assert torch.equal(full, expected_valid)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fast", "weights"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", NORMALISERS)
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_every_pattern_equals_masked_dense_attention(pattern, name, case, need_weights):
    built = build_pattern(pattern)
    if built.reads_layer:
        pytest.skip("projects states again between its steps: held to dense attention per step through its layer (test_hst.py)")
    if built.self_attention_only and CASES[case][0] != CASES[case][1]:
        pytest.skip("a self-attention pattern")
    check_against_reference(built, name, case, need_weights)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", NORMALISERS)
def test_a_pattern_that_only_defines_its_mask_gets_attend_for_free(band, name, case):
    for options in ({"width": 1}, {"width": 2, "side": "left"}):
        check_against_reference(build_pattern("band", options), name, case, need_weights=True)


# ----------------------------------------------------------------------------- a new pattern plugs in
def test_registered_pattern_works_through_multihead_attention_and_models(band):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="entmax15", pattern="band", pattern_options={"width": 1}))
    assert isinstance(layer.pattern, BandPattern) and layer.pattern.options == BandOptions(width=1)
    x = torch.randn(2, 6, 16)
    pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    seen = {}
    layer.eval()
    layer.observer = lambda key, w, valid: seen.update(w=w, valid=valid)
    y = layer(x, key_padding_mask=pad)

    # The same layer by hand: projections, masked dense reference, output projection.
    q = layer.q_proj(x).view(2, 6, 2, 8).transpose(1, 2)
    k, v = layer.kv_proj(x).view(2, 6, 2, 2, 8).permute(2, 0, 3, 1, 4)
    out, weights, allowed = reference(q, k, v, layer.normaliser, layer.pattern, pad)
    torch.testing.assert_close(y, layer.out_proj(out.transpose(1, 2).reshape(2, 6, 16)))
    torch.testing.assert_close(seen["w"], weights)
    band_pairs = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).abs() <= 1
    assert torch.all(seen["w"][..., ~band_pairs] == 0)
    assert torch.equal(seen["valid"], allowed & pad[:, None, :, None])  # padded queries count no pairs

    m = default_model(d_model=16, num_layers=1, num_heads=2, ffn_dim=32, pattern="band", pattern_options={"width": 2, "side": "left"})
    check_attention_config(m)
    model = build_classifier(m, vocab_size=10, num_classes=3, max_length=8, pad_id=0)
    assert model.encoder.layers[0].attn.pattern.options == BandOptions(width=2, side="left")
    assert model(torch.randint(1, 10, (2, 8)), torch.tensor([8, 5])).shape == (2, 3)


def test_seq2seq_encoder_takes_the_configured_pattern_decoder_causal_context_dense(band):
    m = default_model(d_model=16, num_layers=1, num_heads=2, ffn_dim=32, pooling="cls", pattern="band", pattern_options={"width": 3})
    model = build_seq2seq(m, vocab_size=20, max_positions=16, pad_id=0)
    patterns = {layer.key: layer.pattern for layer in model.modules() if isinstance(layer, MultiHeadAttention)}
    assert type(patterns[("encoder_self", 0)]) is BandPattern and patterns[("encoder_self", 0)].options.width == 3
    assert patterns[("decoder_self", 0)].name == "causal" and patterns[("context", 0)].name == "dense"


def test_registering_a_taken_name_or_building_an_unknown_one_fails():
    with pytest.raises(ValueError, match="pattern 'dense' is registered twice"):
        register_pattern("dense")(BandPattern)
    with pytest.raises(ValueError, match="valid: bigbird, causal, dense, hst, local"):
        build_pattern("diagonal")
    assert AttentionSpec(2, pattern="x", pattern_options={"a": 1}).with_pattern("causal").pattern_options == {}


# ----------------------------------------------------------------------------- one-line option errors
BAD_OPTIONS = {
    "dense-any": ("dense", {"block_size": 4}, ["model.pattern_options.block_size:", "pattern 'dense' takes no options"]),
    "causal-any": ("causal", {"window": 2}, ["model.pattern_options.window:", "pattern 'causal' takes no options"]),
    "unknown-key": ("band", {"widht": 2}, ["model.pattern_options.widht:", "unknown option of pattern 'band'", "valid: side, width"]),
    "bad-range": ("band", {"width": -1}, ["model.pattern_options.width:", "bad value -1", "an int >= 0"]),
    "bad-type": ("band", {"width": "2"}, ["model.pattern_options.width:", "bad value '2'"]),
    "bool-is-no-int": ("band", {"width": True}, ["model.pattern_options.width:", "bad value True"]),
    "bad-choice": ("band", {"side": "right"}, ["model.pattern_options.side:", "valid: both, left"]),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_bad_pattern_options_are_one_clear_line(band, case):
    pattern, options, parts = BAD_OPTIONS[case]
    with pytest.raises(ConfigError) as info:
        check_attention_config(default_model(pattern=pattern, pattern_options=options))
    message = str(info.value)
    assert "\n" not in message and message.startswith(parts[0])
    for part in parts:
        assert part in message, message


def test_good_pattern_options_pass(band):
    for pattern, options in [("dense", {}), ("band", {}), ("band", {"width": 0, "side": "left"})]:
        check_attention_config(default_model(pattern=pattern, pattern_options=options))


def test_a_bad_pattern_option_on_the_command_line_is_one_line():
    from sparse_runner.cli import preflight
    from tests.conftest import TINY

    with pytest.raises(ConfigError) as info:
        preflight(TINY + ["+model.pattern_options.block_size=4"], multirun=False)
    assert str(info.value) == "model.pattern_options.block_size: pattern 'dense' takes no options"


# ----------------------------------------------------------------------------- models take one spec
def test_models_refuse_a_keyword_they_do_not_use():
    spec = AttentionSpec(num_heads=2)
    encoder = dict(attention=spec, d_model=16, num_layers=1, ffn_dim=32, dropout=0.0, positions="sinusoidal", norm_first=True)
    with pytest.raises(TypeError, match="normaliser"):
        TransformerEncoder(10, 8, normaliser="softmax", **encoder)
    with pytest.raises(TypeError, match="decoder_layers"):
        EncoderClassifier(10, 3, 8, pooling="cls", decoder_layers=2, **encoder)
    with pytest.raises(TypeError, match="pattern"):
        TransformerSeq2Seq(10, attention=spec, d_model=16, num_layers=1, ffn_dim=32, dropout=0.0, norm_first=True, pattern="dense")
    with pytest.raises(TypeError, match="num_heads"):
        MultiHeadAttention(16, spec, num_heads=2)


class Reads:
    """A `model` node that records which keys are read."""

    def __init__(self, m):
        self.m, self.keys = m, set()

    def __getattr__(self, key):
        self.keys.add(key)
        return getattr(self.m, key)


def test_builders_read_exactly_their_declared_keys():
    m = Reads(default_model(d_model=16, num_layers=1, num_heads=2, ffn_dim=32))
    build_classifier(m, vocab_size=10, num_classes=3, max_length=8, pad_id=0)
    assert m.keys == CLASSIFIER_KEYS
    m = Reads(default_model(d_model=16, num_layers=1, num_heads=2, ffn_dim=32))
    build_seq2seq(m, vocab_size=10, max_positions=16, pad_id=0)
    assert m.keys == SEQ2SEQ_KEYS
    from sparse_runner.models import BERT_KEYS
    from sparse_runner.models.bert import build_masked_lm, build_pair_classifier, build_span_extractor

    for build, extra in ((build_masked_lm, {}), (build_span_extractor, {}), (build_pair_classifier, {"num_classes": 3})):
        m = Reads(default_model(d_model=16, num_layers=1, num_heads=2, ffn_dim=32))
        build(m, vocab_size=10, max_length=8, pad_id=0, **extra)
        assert m.keys == BERT_KEYS - {"init_from"}  # init_from: the task reads it (tasks/bert_text.py)
    # every key is read by some model, but those every family takes: a label, and the regulariser the trainer runs
    assert CLASSIFIER_KEYS | SEQ2SEQ_KEYS | BERT_KEYS == set(MODEL_KEYS) - set(EVERY_FAMILY)
