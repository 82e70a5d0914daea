"""ERNIE-Sparse's HST pattern: two-stage attention equals masked dense attention step by step (every
normaliser, every local topology, global tokens, padding, lengths that are no multiple of the block);
its masks are the documented topology; its cost grows linearly; representatives carry the input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparse_runner.attention import AttentionSpec, MultiHeadAttention, build_normaliser, build_pattern
from sparse_runner.attention.block_sparse import count_scores
from sparse_runner.attention.multihead import _LayerProjections
from sparse_runner.models import build_classifier
from sparse_runner.models.config import default_model
from tests.test_block_patterns import dense_weights

NORMALISERS = ["softmax", "sparsemax", "entmax15", "alpha_entmax"]
H, D_MODEL = 2, 8
TOPOLOGIES = {
    "block": {"block_size": 3},
    "window": {"block_size": 2, "local": "window", "neighbours": 1},
    "bigbird": {"block_size": 2, "local": "bigbird", "neighbours": 1, "random_blocks": 1, "global_blocks": 2, "seed": 3},
    # no window, no global blocks: the heads' random blocks differ (per-head gather, masks per head)
    "random_per_head": {"block_size": 2, "local": "bigbird", "neighbours": 0, "random_blocks": 1, "global_blocks": 0, "seed": 1},
}


def masked(q, k, v, normaliser, allowed):
    """Dense attention under `allowed` (B, 1, N, N); a row without keys gives zeros."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = normaliser(scores.masked_fill(~allowed, float("-inf")))
    return weights @ v, weights


def reference(layer: MultiHeadAttention, x: torch.Tensor, pad: torch.Tensor):
    """The module docstring's steps a, b, c, each as masked dense attention over the whole sequence.
    Returns (layer output (B, N, d), per-query weights of its last step (B, H, N, N))."""
    pattern, n = layer.pattern, x.shape[1]
    masks = {name: torch.as_tensor(m) for name, m in pattern.stage_masks(n, heads=H).items()}  # tokens: (H, N, N)
    keys = pad[:, None, None, :]
    rep = masks["representatives"].any(1)[None, :, None]  # (1, N, 1): representative rows
    tok = masks["tokens"].any(-1).any(0)[None, None, :, None]

    def project(states):
        b = states.shape[0]
        q = layer.q_proj(states).view(b, n, H, -1).transpose(1, 2)
        k, v = layer.kv_proj(states).view(b, n, 2, H, -1).permute(2, 0, 3, 1, 4)
        return q, k, v

    def out(heads):
        return layer.out_proj(heads.transpose(1, 2).reshape(x.shape[0], n, -1))

    q, k, v = project(x)
    o_a, _ = masked(q, k, v, layer.normaliser, masks["representatives"] & keys)
    q1, k1, v1 = project(x + rep * out(o_a))
    o_b, w_b = masked(q1, k1, v1, layer.normaliser, masks["global"] & keys)
    _, k2, v2 = project(x + rep * out(o_a + o_b))
    o_c, w_c = masked(q, k2, v2, layer.normaliser, masks["tokens"] & keys)
    heads = torch.where(tok, o_c, torch.where(rep[:, None], o_a + o_b, o_b))
    return out(heads), torch.where(tok, w_c, w_b)


def hst_layer(name: str, options: dict, global_tokens: int) -> MultiHeadAttention:
    torch.manual_seed(0)
    spec = AttentionSpec(num_heads=H, normaliser=name, pattern="hst", pattern_options={**options, "stages": 2})
    return MultiHeadAttention(D_MODEL, spec, key=("encoder_self", 1), global_tokens=global_tokens).double()


@pytest.mark.parametrize("name", NORMALISERS)
@pytest.mark.parametrize("topology", list(TOPOLOGIES))
@pytest.mark.parametrize("global_tokens", [0, 1])
@pytest.mark.parametrize("n", [13, 16])
def test_two_stages_equal_masked_dense_attention_step_by_step(name, topology, global_tokens, n):
    layer = hst_layer(name, TOPOLOGIES[topology], global_tokens)
    g = torch.Generator().manual_seed(1)
    x = (2 * torch.randn(2, n, D_MODEL, generator=g, dtype=torch.float64)).requires_grad_()
    pad = torch.arange(n)[None, :] < torch.tensor([n, n - 6])[:, None]  # the second has whole padded tiles
    upstream = torch.randn(2, n, D_MODEL, generator=g, dtype=torch.float64)
    leaves = [x, *layer.parameters()]
    expected, expected_weights = reference(layer, x, pad)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), leaves)
    tol = dict(atol=1e-6, rtol=1e-6) if name == "softmax" else {}  # SDPA vs explicit float64 sums

    got = layer(x, key_padding_mask=pad)
    torch.testing.assert_close(got, expected, **tol)
    for a, b in zip(torch.autograd.grad((got * upstream).sum(), leaves), expected_grads):
        torch.testing.assert_close(a, b, **tol)

    # The analysis sees each query once, with the weights of its last step.
    q, (k, v) = layer._project_q(x.detach()), layer._project_kv(x.detach())
    _, groups, _ = layer.pattern.attend(q, k, v, normaliser=layer.normaliser, key_padding_mask=pad, need_weights=True, layer=_LayerProjections(layer))
    weights, slots = dense_weights(groups, 2, H, n)
    assert slots.max() <= 1
    covered = torch.cat([group.rows for group in groups]).sort().values
    assert torch.equal(covered, torch.arange(n)), "every query row is in exactly one group"
    torch.testing.assert_close(weights, expected_weights.detach(), **tol)
    seen = []   # ... and the layer hands them to its observer
    layer.eval().observer = lambda key, groups, valid: seen.extend(groups)
    layer(x.detach(), key_padding_mask=pad)
    assert len(seen) == len(groups)


def test_two_stages_need_their_layer():
    pattern = build_pattern("hst", {"block_size": 2}, global_tokens=1)
    q = torch.randn(1, 1, 7, 4)
    with pytest.raises(ValueError, match="through MultiHeadAttention"):
        pattern.attend(q, q, q, normaliser=build_normaliser("softmax", 1))


# ----------------------------------------------------------------------------- topology
def test_stage_masks_follow_the_documented_steps():
    # global token 0, then tiles [rep, t, t] at 1..3, 4..6, 7..9
    masks = build_pattern("hst", {"block_size": 2}, global_tokens=1).stage_masks(10)
    reps = [1, 4, 7]
    assert masks["representatives"][4].nonzero()[0].tolist() == [4, 5, 6]   # a: own tile
    assert masks["global"][4].nonzero()[0].tolist() == [0, *reps]            # b: globals and every rep
    assert masks["global"][0].nonzero()[0].tolist() == [0, *reps]
    assert masks["tokens"][5].nonzero()[0].tolist() == [4, 5, 6]             # c: own block and own rep
    assert not masks["tokens"][:, 0].any() and not masks["tokens"][reps].any()
    window = build_pattern("hst", {"block_size": 2, "local": "window"}).stage_masks(9)
    assert window["tokens"][1].nonzero()[0].tolist() == [0, 1, 2, 4, 5]     # rep 0, blocks 0-1, not rep 3
    bigbird = build_pattern("hst", {"block_size": 2, "local": "bigbird", "random_blocks": 0}).stage_masks(15)
    tokens_of = lambda block: [3 * block + 1, 3 * block + 2]  # noqa: E731
    assert bigbird["tokens"][1].nonzero()[0].tolist() == [0, *[t for b in range(5) for t in tokens_of(b)]]  # global block: all
    assert bigbird["tokens"][7].nonzero()[0].tolist() == [1, 2, 4, 5, 6, 7, 8, 10, 11, 13, 14]  # window, global blocks, own rep


def test_local_bigbird_draws_random_blocks_per_head_like_pattern_bigbird():
    options = {"block_size": 2, "local": "bigbird", "neighbours": 0, "random_blocks": 1, "global_blocks": 0, "seed": 1}
    pattern = build_pattern("hst", options, layer=2)
    tokens = pattern.stage_masks(18, heads=4)["tokens"]
    assert len({m.tobytes() for m in tokens}) > 1, "the heads see different random blocks"
    index, ok = pattern.key_blocks(6, heads=4)
    expected = build_pattern("bigbird", {"block_size": 2, "window": 1, "random_blocks": 1, "global_blocks": 0, "seed": 1}, layer=2).key_blocks(6, heads=4)
    assert np.array_equal(index, expected[0]) and np.array_equal(ok, expected[1])
    with pytest.raises(ValueError, match="per head"):
        pattern.dense_mask(18, 18)
    shared = build_pattern("hst", {**options, "random_per_head": False}, layer=2).stage_masks(18, heads=4)["tokens"]
    assert len({m.tobytes() for m in shared}) == 1


def test_one_stage_mask_is_the_union_of_the_steps():
    pattern = build_pattern("hst", {"block_size": 2, "stages": 1}, global_tokens=1)
    masks = pattern.stage_masks(10)
    union = masks["representatives"] | masks["global"] | masks["tokens"]
    assert np.array_equal(pattern.dense_mask(10, 10).numpy(), union)
    assert pattern.dense_mask(10, 10)[4].nonzero()[:, 0].tolist() == [0, 1, 4, 5, 6, 7]  # rep: globals, reps, own block


# ----------------------------------------------------------------------------- cost
@pytest.mark.parametrize("options", [{"local": "block"}, {"local": "bigbird"}, {"stages": 1}], ids=["block", "bigbird", "one-stage"])
def test_cost_grows_linearly(options):
    torch.manual_seed(0)
    spec = AttentionSpec(num_heads=1, pattern="hst", pattern_options={"block_size": 32, **options})
    layer = MultiHeadAttention(8, spec, global_tokens=1)
    counts = []
    for n in (1024, 2048, 4096):
        x = torch.randn(1, 1 + n + n // 32, 8)
        with count_scores() as counted, torch.no_grad():
            layer(x)
        counts.append(counted[0])
    ratios = [b / a for a, b in zip(counts, counts[1:])]
    assert all(r < 2.3 for r in ratios), ratios   # x2 per doubling, + the (n/b)^2 global step
    assert counts[-1] < 0.15 * 4097 ** 2


# ----------------------------------------------------------------------------- representatives
def one_layer_classifier(**options) -> torch.nn.Module:
    m = default_model(d_model=16, num_layers=1, num_heads=2, ffn_dim=32, dropout=0.0, pattern="hst", pattern_options={"block_size": 4, **options})
    torch.manual_seed(0)
    return build_classifier(m, vocab_size=20, num_classes=3, max_length=40, pad_id=0).eval()


@pytest.mark.parametrize("representatives", ["learned", "pooled", "both"])
def test_a_one_layer_two_stage_classifier_depends_on_its_input(representatives):
    """CLS reads only representatives: in one layer they must already carry the input (step a)."""
    model = one_layer_classifier(representatives=representatives)
    a, b = torch.randint(1, 20, (2, 1, 16)).unbind(0)
    assert not torch.allclose(model(a, None), model(b, None))


def test_one_stage_learned_representatives_leave_a_one_layer_classifier_blind():
    """The reason for two stages and input-carrying representatives: with one attention and learned
    representatives, what CLS reads in layer 1 is the same for every input."""
    blind = one_layer_classifier(stages=1, representatives="learned")
    a, b = torch.randint(1, 20, (2, 1, 16)).unbind(0)
    torch.testing.assert_close(blind(a, None), blind(b, None))
    assert not torch.allclose(*(one_layer_classifier(stages=1, representatives="pooled")(t, None) for t in (a, b)))


def test_learned_representatives_carry_their_block_s_position():
    model = one_layer_classifier(representatives="learned")
    layout = model.encoder.layout
    x = torch.zeros(1, 13, 16)
    positions = torch.randn(13, 16)
    inner, _, _ = layout.enter(x, None, positions)
    reps = inner[:, 1::5]   # 1 global, then tiles of 5
    torch.testing.assert_close(reps[0, 1], layout.representative + positions[5:9].mean(0))
