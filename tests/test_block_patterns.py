"""Block-sparse patterns (local, BigBird, HST): every fast path equals masked dense attention under the
pattern's own dense mask (per head: BigBird's heads draw their own random blocks), for every normaliser,
with global tokens, padding and lengths that are not a multiple of the block size; their topology is what
the docs say; their cost grows linearly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparse_runner.analysis.attention_stats import AttentionStats
from sparse_runner.attention import build_normaliser, build_pattern
from sparse_runner.attention.block_patterns import BigBirdPattern
from sparse_runner.attention.block_sparse import count_scores

NORMALISERS = ["softmax", "sparsemax", "entmax15", "alpha_entmax"]
H = 2

# (pattern, options): small blocks so that short sequences have many of them.
VARIANTS = [
    ("local", {"block_size": 4}),
    ("local", {"block_size": 3, "neighbours": 1}),
    ("bigbird", {"block_size": 3, "random_blocks": 2}),
    ("bigbird", {"block_size": 2, "window": 1, "global_blocks": 1, "random_blocks": 1, "seed": 5}),
    ("bigbird", {"block_size": 2, "random_blocks": 1}),                            # the heads' blocks differ
    ("bigbird", {"block_size": 2, "random_blocks": 1, "random_per_head": False}),  # one draw for every head
    ("hst", {"block_size": 3, "stages": 1}),
    ("hst", {"block_size": 2, "stages": 1, "local": "window"}),
    ("hst", {"block_size": 2, "stages": 1, "local": "bigbird", "random_blocks": 1, "global_blocks": 1}),
]
VARIANT_IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in opts.items())}" for name, opts in VARIANTS]


def reference(q, k, v, normaliser, mask, pad):
    """Masked dense attention; mask (N, N), or (H, N, N) one per head. Returns (out, weights, allowed
    (B, 1 or H, N, N))."""
    mask = mask[None] if mask.dim() == 3 else mask[None, None]
    allowed = mask if pad is None else mask & pad[:, None, None, :]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = normaliser(scores.masked_fill(~allowed, float("-inf")))
    return weights @ v, weights, allowed.expand(q.shape[0], -1, -1, -1)


def dense_weights(groups, b, h, n):
    """Row groups scattered back to (B, H, N, N), and how many slots hold each (query, key) pair, (B, 1, N, N),
    or (B, H, N, N) when a group's valid mask is per head."""
    weights = torch.zeros(b, h, n, n, dtype=torch.float64)
    slots = torch.zeros(b, max(group.valid.shape[1] for group in groups), n, n, dtype=torch.int64)
    for group in groups:
        w, count = group.to_dense(n)
        weights[:, :, group.rows] += w
        slots[:, :, group.rows] += count
    return weights, slots


@pytest.mark.parametrize("name", NORMALISERS)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("global_tokens", [0, 1])
@pytest.mark.parametrize("n", [13, 16])  # 13: no block size above divides it
def test_fast_path_equals_masked_dense_attention(variant, name, global_tokens, n):
    pattern = build_pattern(variant[0], variant[1], global_tokens=global_tokens, layer=1)
    torch.manual_seed(0)
    normaliser = build_normaliser(name, H).double()
    g = torch.Generator().manual_seed(1)
    q = (3 * torch.randn(2, H, n, 4, generator=g, dtype=torch.float64)).requires_grad_()
    k, v = (torch.randn(2, H, n, 4, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    pad = torch.arange(n)[None, :] < torch.tensor([n, n - 6])[:, None]  # the second has whole padded blocks
    upstream = torch.randn(2, H, n, 4, generator=g, dtype=torch.float64)
    leaves = [q, k, v, *normaliser.parameters()]
    mask = pattern.dense_mask(n, n, heads=H)
    expected, expected_weights, allowed = reference(q, k, v, normaliser, mask, pad)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), leaves)

    for need_weights in (False, True):
        out, groups, valid = pattern.attend(q, k, v, normaliser=normaliser, key_padding_mask=pad, need_weights=need_weights)
        # Softmax's explicit path runs in float32, SDPA in float64: compare at float32 precision there.
        tol = dict(atol=1e-5, rtol=1e-5) if name == "softmax" else {}
        torch.testing.assert_close(out, expected, **tol)
        grads = torch.autograd.grad((out * upstream).sum(), leaves)
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, **tol)
        if need_weights:
            weights, slots = dense_weights(groups, 2, H, n)
            assert slots.max() <= 1, "a key sits in two slots of one query: it would count twice"
            assert torch.equal((slots > 0).expand_as(allowed), allowed)
            torch.testing.assert_close(weights, expected_weights, **tol)
            assert valid is None
            covered = torch.cat([group.rows for group in groups]).sort().values
            assert torch.equal(covered, torch.arange(n)), "every query row is in exactly one group"


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_batch_without_padding_and_a_sequence_of_globals_only(variant):
    normaliser = build_normaliser("entmax15", H)
    for n, global_tokens in ((9, 0), (9, 1), (1, 1), (12, 0), (13, 1)):  # 12 and 13: whole blocks, no mask at all
        pattern = build_pattern(*variant, global_tokens=global_tokens)
        q, k, v = (torch.randn(1, H, n, 4) for _ in range(3))
        out, _, _ = pattern.attend(q, k, v, normaliser=normaliser)
        expected, _, _ = reference(q, k, v, normaliser, pattern.dense_mask(n, n, heads=H), None)
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("global_tokens", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bigbird_softmax_without_padding_equals_masked_dense_attention(global_tokens, dtype):
    """The path that training takes: softmax, no padding mask, per-head random blocks, a batch. Its tiles go
    through SDPA as one (batch x head x tile) entry each with the table's mask; its global blocks' rows
    through unmasked SDPA."""
    pattern = build_pattern("bigbird", {"block_size": 4, "random_blocks": 2}, global_tokens=global_tokens, layer=2)
    n = 8 * 4 + global_tokens
    assert pattern.heads_differ(8)
    normaliser = build_normaliser("softmax", 3)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    upstream = torch.randn(2, 3, n, 8, generator=g, dtype=dtype)
    expected, _, _ = reference(q, k, v, normaliser, pattern.dense_mask(n, n, heads=3), None)
    out, groups, _ = pattern.attend(q, k, v, normaliser=normaliser)
    assert groups is None
    tol = dict(atol=2e-6, rtol=2e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out, expected, **tol)
    for got, want in zip(torch.autograd.grad((out * upstream).sum(), (q, k, v)), torch.autograd.grad((expected * upstream).sum(), (q, k, v))):
        torch.testing.assert_close(got, want, **tol)


def test_block_patterns_are_for_self_attention_only():
    q, k = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4)
    for name in ("local", "bigbird", "hst"):
        with pytest.raises(ValueError, match="self-attention"):
            build_pattern(name).attend(q, k, k, normaliser=build_normaliser("softmax", 1))


# ----------------------------------------------------------------------------- the topologies
def test_local_mask_is_blocks_plus_neighbours_plus_globals():
    mask = build_pattern("local", {"block_size": 2, "neighbours": 1}, global_tokens=1).dense_mask(8, 8).numpy()
    assert mask[0].all() and mask[:, 0].all()             # the global token sees and is seen by all
    # positions 1..7 are blocks {1,2} {3,4} {5,6} {7}: position 1 sees blocks 0 and 1, not block 2
    assert mask[1, 1:5].all() and not mask[1, 5:].any()
    assert mask[7, 5:].all() and not mask[7, 1:5].any()


@pytest.mark.parametrize("per_head", [True, False])
def test_bigbird_random_blocks_avoid_window_and_globals_and_depend_on_layer_and_head(per_head):
    blocks, heads = 12, 4
    p0 = build_pattern("bigbird", {"block_size": 4, "random_blocks": 3, "random_per_head": per_head}, layer=0)
    p1 = build_pattern("bigbird", {"block_size": 4, "random_blocks": 3, "random_per_head": per_head}, layer=1)
    index, ok = p0.key_blocks(blocks, heads=heads)
    assert index.shape[0] == heads and p0.dense_blocks(blocks) == [0, blocks - 1]
    for h in range(heads):
        for i in range(blocks):
            row = index[h, i][ok[h, i]].tolist()
            assert len(row) == len(set(row)), "no key block twice"
            window = {j for j in (i - 1, i, i + 1) if 0 <= j < blocks}
            assert window | {0, blocks - 1} <= set(row)
            assert len(set(row) - window - {0, blocks - 1}) == 3
    assert np.array_equal(index, p0.key_blocks(blocks, heads=heads)[0]), "fixed for a given layer"
    assert not np.array_equal(index, p1.key_blocks(blocks, heads=heads)[0]), "another layer draws other random blocks"
    differ = [not np.array_equal(index[0], index[h]) for h in range(1, heads)]
    assert all(differ) if per_head else not any(differ), "every head draws its own blocks (random_per_head)"
    # a global block's queries see every key, in every head
    mask = p0.dense_mask(48, 48, heads=heads).numpy()
    assert mask.shape == (heads, 48, 48)
    assert mask[:, :4].all() and mask[:, -4:].all() and mask[:, :, :4].all()


# ----------------------------------------------------------------------------- cost
def scores_at(pattern, n, normaliser="softmax"):
    q = torch.randn(1, 1, n, 4)
    with count_scores() as counted, torch.no_grad():
        pattern.attend(q, q, q, normaliser=build_normaliser(normaliser, 1))
    return counted[0]


@pytest.mark.parametrize("name", ["local", "bigbird"])  # HST: test_hst.py
def test_cost_grows_linearly_while_dense_grows_quadratically(name):
    pattern = build_pattern(name, {"block_size": 32}, global_tokens=1)
    lengths = [1024, 2048, 4096]
    counts = [scores_at(pattern, n + 1) for n in lengths]
    ratios = [b / a for a, b in zip(counts, counts[1:])]
    assert all(r < 2.3 for r in ratios), ratios   # linear: x2 per doubling
    assert counts[-1] < 0.1 * 4097 ** 2  # BigBird: 8 of 128 blocks, plus two global blocks' rows
    dense = [scores_at(build_pattern("dense"), n) for n in (256, 512)]
    assert dense[1] / dense[0] == 4
    assert scores_at(pattern, 4097, "alpha_entmax") == counts[-1]  # same topology, any normaliser


# ----------------------------------------------------------------------------- analysis
def test_row_groups_give_the_same_statistics_as_dense_weights():
    pattern = build_pattern("hst", {"block_size": 3, "stages": 1}, global_tokens=1)
    n = 14
    q, k, v = (torch.randn(2, 3, n, 4) for _ in range(3))
    pad = torch.arange(n)[None, :] < torch.tensor([n, 9])[:, None]
    normaliser = build_normaliser("entmax15", 3)
    _, groups, _ = pattern.attend(q, k, v, normaliser=normaliser, key_padding_mask=pad, need_weights=True)
    weights, slots = dense_weights(groups, 2, 3, n)
    from_groups, from_dense = AttentionStats(), AttentionStats()
    from_groups.update(("encoder_self", 0), [(g.weights, g.valid) for g in groups], None)
    from_dense.update(("encoder_self", 0), weights.float(), slots > 0)
    a, b = from_groups.summary()["encoder_self"]["layers"][0], from_dense.summary()["encoder_self"]["layers"][0]
    for key in ("head_density", "js", "num_queries", "possible_pairs"):
        assert a[key] == pytest.approx(b[key]), key
    assert a["sentence_density_hist"] == b["sentence_density_hist"]


def test_bigbird_pattern_is_registered_with_its_options():
    pattern = build_pattern("bigbird", {"window": 5})
    assert isinstance(pattern, BigBirdPattern) and pattern.options.window == 5 and pattern.options.block_size == 64
