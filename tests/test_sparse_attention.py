"""The sparse normalisers inside the runner's attention module, the learned alpha, and the analysis."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sparse_runner.attention import AttentionSpec, MultiHeadAttention, attend, build_normaliser
from sparse_runner.attention.normalisers import AlphaEntmax, AlphaEntmaxOptions
from sparse_runner.attention.patterns import CausalPattern
from sparse_runner.run import run

NORMALISERS = ["softmax", "sparsemax", "entmax15", "alpha_entmax"]


def _qkv(b=2, h=3, n=7, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def test_sdpa_path_equals_explicit_softmax_with_padding_and_causal():
    q, k, v = _qkv()
    pad = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    for pattern in (None, CausalPattern()):
        fused, _, _ = attend(q, k, v, pattern=pattern, key_padding_mask=pad)
        explicit, weights, _ = attend(q, k, v, pattern=pattern, key_padding_mask=pad, need_weights=True)
        torch.testing.assert_close(fused, explicit)
        assert torch.all(weights[1, :, :, 4:] == 0)


@pytest.mark.parametrize("name", NORMALISERS)
def test_masked_keys_get_exactly_zero_weight(name):
    q, k, v = _qkv()
    q = q * 3  # peaked enough that the sparse normalisers are sparse
    pad = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    norm = build_normaliser(name, 3, {"alpha_init": 1.3} if name == "alpha_entmax" else None).double()
    _, weights, _ = attend(q, k, v, normaliser=norm, pattern=CausalPattern(), key_padding_mask=pad, need_weights=True)
    assert torch.all(weights[1, :, :, 4:] == 0)
    assert torch.all(weights.triu(1) == 0)  # causal: no weight on the future
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "alpha_entmax"])
def test_sparse_normalisers_are_sparse_and_exact_against_masked_dense(name):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, AttentionSpec(num_heads=4, head_size=8, normaliser=name, normaliser_options={"alpha_init": 1.7} if name == "alpha_entmax" else {}))
    x = torch.randn(2, 9, 16) * 4
    seen = {}
    layer.eval()
    layer.observer = lambda key, w, valid: seen.update(w=w)
    y = layer(x)
    assert (seen["w"] == 0).float().mean() > 0.1  # some exact zeros
    layer.observer = None
    torch.testing.assert_close(layer(x), y)  # observing does not change the output


def test_learned_alpha_per_head_gets_gradients_and_stays_in_range():
    torch.manual_seed(0)
    norm = AlphaEntmax(num_heads=4)
    alphas = norm.alphas()
    assert alphas.shape == (4,) and torch.all((alphas > 1) & (alphas < 2))
    assert len(set(alphas.tolist())) == 4  # a ~ N(0, 1): heads start apart
    scores = torch.randn(2, 4, 5, 6, requires_grad=True)
    (norm(scores) * torch.randn(2, 4, 5, 6)).sum().backward()
    assert norm.alpha_logit.grad is not None and torch.all(norm.alpha_logit.grad != 0)
    fixed = AlphaEntmax(num_heads=4, options=AlphaEntmaxOptions(alpha_init=1.5))
    torch.testing.assert_close(fixed.alphas(), torch.full((4,), 1.5))
    frozen = AlphaEntmax(num_heads=4, options=AlphaEntmaxOptions(alpha=1.25))
    assert not list(frozen.parameters()) and torch.all(frozen.alphas() == 1.25)


def test_per_head_alpha_matches_separate_calls():
    from sparse_runner.attention import entmax

    torch.manual_seed(0)
    norm = AlphaEntmax(num_heads=3).double()
    scores = torch.randn(2, 3, 4, 5, dtype=torch.float64) * 3
    out = norm(scores)
    for h, alpha in enumerate(norm.alphas().tolist()):
        torch.testing.assert_close(out[:, h], entmax.alpha_entmax(scores[:, h], alpha))


@pytest.mark.parametrize("model", ["entmax", "entmax15", "sparsemax"])
def test_model_variants_train_and_are_analysed(model, tiny_config, tmp_path):
    run(tiny_config(f"model={model}", "model.num_heads=4"), tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "completed" and m["model"] == model
    assert model.replace("entmax", "alpha_entmax" if model == "entmax" else "entmax") in m["attention_backend"]
    analysis = m["analysis"]
    layers = analysis["attention"]["encoder_self"]["layers"]
    assert len(layers) == 2
    for layer in layers:
        assert 0.0 < layer["mean_density"] < 1.0  # sparse attention: fewer weights than pairs
        assert 0.0 <= layer["js"] <= 1.0 + 1e-9
        assert len(layer["head_density"]) == 4
    figures = {p.rsplit("/", 1)[-1] for p in m["figures"]}
    assert {"density_histogram.png", "js_per_layer.png"} <= figures
    if model == "entmax":
        assert "alpha_trajectories.png" in figures
        rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
        trajectory = [row["alpha/encoder_self/0"] for row in rows if "alpha/encoder_self/0" in row]
        assert len(trajectory) == 6 and trajectory[0] != trajectory[-1]  # alpha is learned
        alphas = analysis["alpha"]["encoder_self"]["alphas"]
        assert len(alphas) == 2 * 4 and all(1.0 < a < 2.0 for a in alphas)  # 2 layers x 4 heads


def test_softmax_model_is_dense_in_the_analysis(tiny_config, tmp_path):
    run(tiny_config(), tmp_path)
    layers = json.loads((tmp_path / "metrics.json").read_text())["analysis"]["attention"]["encoder_self"]["layers"]
    assert all(math.isclose(layer["mean_density"], 1.0) for layer in layers)


def test_alpha_lr_scale_zero_freezes_the_alphas(tiny_config, tmp_path):
    run(tiny_config("model=entmax", "trainer.alpha_lr_scale=0.0", "trainer.max_steps=10"), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    trajectory = [row["alpha/encoder_self/0"] for row in rows if "alpha/encoder_self/0" in row]
    assert len(trajectory) == 2 and trajectory[0] == trajectory[-1]
