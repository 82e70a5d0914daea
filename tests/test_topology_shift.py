"""Moving every block boundary (SAR's second pass, `trainer.test_topology_shift`) on ListOps-shaped padded
batches: what the shift changes and what it leaves alone.

Why these tests exist: in docs/evidence/ernie_sparse_listops_cpu every HST run with block_size 8 scores
higher on the test set shifted by 3 than unshifted (+0.1 to +5.6 points), while local and BigBird move by
0.4 or less. The shifted pass is the unshifted one with the boundaries elsewhere, nothing more: a shift
by a whole block gives the unshifted outputs, and a query away from the sequence's ends has as many keys
in either layout. What the shift does change is what HST's classifier reads: its CLS token attends to the
representatives and the global tokens only, never to a token, so every block's summary (and the first
block's, which holds the root operator in ListOps, shrinks to block_size - shift tokens) reaches the
prediction; local's and BigBird's CLS attend to every token, so in one layer their prediction does not
depend on where the boundaries are at all.

`trainer.test_topology_shift` takes one shift or a list (the tests at the end): one shift is a noisy probe
(the paragraph above), so a list tests every one and records their mean and the worst.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sparse_runner.attention.layout import SequenceLayout, layouts, shifted_blocks
from sparse_runner.checks import ConfigError
from sparse_runner.data.listops_files import tokenize
from sparse_runner.data.listops_generator import generate_examples
from sparse_runner.models import build_classifier
from sparse_runner.models.config import default_model
from sparse_runner.run import run
from sparse_runner.tasks.batching import pad_sequences

BLOCK = 8
SHIFT = 3


def listops_batch(count: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B, N), lengths (B,)): ListOps expressions of the CPU preset's lengths (10 < length < 100),
    padded as the task pads them (to a multiple of 8)."""
    examples = generate_examples(count, min_length=10, max_length=100, max_depth=10, max_args=10, seed=seed)
    return pad_sequences([np.array(tokenize(source)) for source, _ in examples], pad_id=0)


def classifier(pattern: str, num_layers: int = 2, **options) -> torch.nn.Module:
    """A small CLS-pooling classifier over ListOps' vocabulary, in eval mode (as the test set is measured)."""
    m = default_model(d_model=16, num_layers=num_layers, num_heads=2, ffn_dim=32, dropout=0.0, pattern=pattern,
                      pattern_options={"block_size": BLOCK, **options})
    torch.manual_seed(0)
    return build_classifier(m, vocab_size=16, num_classes=10, max_length=100, pad_id=0).eval()


TOPOLOGIES = [
    ("hst", {"stages": 1}),
    ("hst", {"stages": 2}),
    ("hst", {"stages": 2, "local": "window"}),
    ("local", {}),
    ("local", {"neighbours": 1}),
]


@pytest.mark.parametrize("pattern, options", TOPOLOGIES)
def test_a_shift_by_a_whole_block_gives_the_unshifted_outputs(pattern, options):
    # The same partition with one empty block in front: if padding, masks, the extra block or the
    # representatives of empty blocks were handled differently under a shift, the outputs would move.
    # (BigBird is left out: its random and global blocks belong to a block's index, by design.)
    tokens, lengths = listops_batch()
    model = classifier(pattern, **options)
    with torch.no_grad():
        plain = model(tokens, lengths)
        with shifted_blocks(model, BLOCK):
            whole_block = model(tokens, lengths)
        with shifted_blocks(model, SHIFT):
            shifted = model(tokens, lengths)
    torch.testing.assert_close(whole_block, plain)
    assert not torch.allclose(shifted, plain)


def layer_pairs(model: torch.nn.Module, tokens: torch.Tensor, lengths: torch.Tensor, shift: int) -> tuple[np.ndarray, ...]:
    """What the first layer lets each real token see, under `shift`: (query, token keys, representative keys,
    global keys), four (B, N) arrays over the original positions (query = the token's block fill: how
    many real tokens its block holds)."""
    g = 1  # the CLS vector
    b, n = tokens.shape
    pattern = model.encoder.layers[0].attn.pattern
    # The pattern's layout, its representatives made a learned 0 (every kind sits in the same places):
    # representatives carry 0, tokens their position + 1.
    layout = SequenceLayout(BLOCK, g, 1, pattern.representatives and "learned")
    if pattern.representatives:
        layout.representative.data.zero_()
    layout.shift = shift
    marks = torch.cat([torch.zeros(b, g), torch.arange(1, n + 1, dtype=torch.float32).expand(b, n)], dim=1)[..., None]
    valid = torch.cat([torch.ones(b, g, dtype=torch.bool), torch.arange(n)[None] < lengths[:, None]], dim=1)
    x, ok, _ = layout.enter(marks, valid)
    mark, ok = x[..., 0].long().numpy(), ok.numpy()
    seen = pattern.dense_mask(x.shape[1], x.shape[1]).numpy()[None] & ok[:, None, :] & ok[:, :, None]
    is_token, is_global = mark > 0, np.arange(x.shape[1])[None].repeat(b, 0) < g
    is_rep = ~is_token & ~is_global
    fill, token_keys, rep_keys, global_keys = (np.zeros((b, n), dtype=int) for _ in range(4))
    for i in range(b):
        for q in np.flatnonzero(is_token[i] & ok[i]):
            t = mark[i, q] - 1
            token_keys[i, t] = (seen[i, q] & is_token[i]).sum()
            rep_keys[i, t] = (seen[i, q] & is_rep[i]).sum()
            global_keys[i, t] = (seen[i, q] & is_global[i]).sum()
        real = np.arange(n) < lengths[i].item()
        block = (np.arange(n) + shift) // BLOCK
        fill[i] = np.bincount(block[real], minlength=block.max() + 1)[block] * real
    return fill, token_keys, rep_keys, global_keys


@pytest.mark.parametrize("pattern, options", [("hst", {"stages": 1}), ("hst", {"stages": 2, "local": "window", "neighbours": 0}), ("local", {})])
def test_away_from_the_ends_a_query_sees_as_many_keys_in_either_layout(pattern, options):
    tokens, lengths = listops_batch()
    model = classifier(pattern, **options)
    fill0, *keys0 = layer_pairs(model, tokens, lengths, 0)
    fill_s, *keys_s = layer_pairs(model, tokens, lengths, SHIFT)
    full = (fill0 == BLOCK) & (fill_s == BLOCK)   # a whole block of real tokens in both layouts
    assert full.sum() > 50
    for unshifted, shifted in zip(keys0, keys_s):
        assert np.array_equal(unshifted[full], shifted[full])
    token_keys, rep_keys, global_keys = keys0
    assert (token_keys[full] == BLOCK).all()
    # HST's tokens read their own representative and no global token; local's tokens read the CLS vector.
    assert (rep_keys[full] == (1 if pattern == "hst" else 0)).all()
    assert (global_keys[full] == (0 if pattern == "hst" else 1)).all()


def test_hst_s_classifier_reads_the_tokens_only_through_the_representatives():
    model = classifier("hst", stages=1)
    pattern = model.encoder.layers[0].attn.pattern
    n = 1 + 4 * (BLOCK + 1)
    cls_row = pattern.dense_mask(n, n)[0].numpy()
    is_rep = (np.arange(n) - 1) % (BLOCK + 1) == 0
    is_rep[0] = False
    assert cls_row[0] and np.array_equal(cls_row[1:], is_rep[1:])
    for other in ("local", "bigbird"):
        assert classifier(other).encoder.layers[0].attn.pattern.dense_mask(n, n)[0].all()


def test_the_shift_shrinks_the_first_block_to_block_size_minus_the_shift():
    # In ListOps the first token is the root operator: under the shift it shares its block's
    # representative with block_size - shift - 1 tokens instead of block_size - 1.
    tokens, lengths = listops_batch()
    layout = layouts(classifier("hst", stages=1))[0]
    x = torch.zeros(*tokens.shape, 16)
    x = torch.cat([x[:, :1], x], dim=1)
    valid = torch.cat([torch.ones(len(lengths), 1, dtype=torch.bool), torch.arange(tokens.shape[1])[None] < lengths[:, None]], dim=1)
    for shift in (0, SHIFT):
        layout.shift = shift
        _, ok, _ = layout.enter(x, valid)
        first_tile = ok[:, 2 : 2 + BLOCK]   # after the CLS vector and the first representative
        assert (first_tile.sum(1) == BLOCK - shift).all() and not first_tile[:, :shift].any()
    layout.shift = 0


@pytest.mark.parametrize("pattern, options", [("local", {}), ("local", {"neighbours": 1}), ("bigbird", {"random_blocks": 1})])
def test_in_one_layer_the_shift_changes_no_prediction_of_a_classifier_whose_cls_reads_every_token(pattern, options):
    tokens, lengths = listops_batch()
    model = classifier(pattern, num_layers=1, **options)
    with torch.no_grad():
        plain = model(tokens, lengths)
        with shifted_blocks(model, SHIFT):
            torch.testing.assert_close(model(tokens, lengths), plain)


@pytest.mark.parametrize("stages", [1, 2])
def test_in_one_layer_the_shift_changes_hst_s_predictions(stages):
    tokens, lengths = listops_batch()
    model = classifier("hst", num_layers=1, stages=stages)
    with torch.no_grad():
        plain = model(tokens, lengths)
        with shifted_blocks(model, SHIFT):
            shifted = model(tokens, lengths)
    assert not torch.allclose(shifted, plain, atol=1e-4)


# ----------------------------------------------------------------------------- trainer.test_topology_shift
def shifted_metrics(tiny_config, tmp_path, shift: str) -> dict[str, float]:
    """The final metrics of a tiny ListOps run of one-stage HST (blocks of 8) tested under `shift`."""
    cfg = tiny_config("model=hst", f"model.pattern_options.block_size={BLOCK}", "model.pattern_options.stages=1",
                      "model.num_layers=1", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.analysis=false",
                      f"trainer.test_topology_shift={shift}")
    run(cfg, tmp_path)
    return json.loads((tmp_path / "metrics.json").read_text())["metrics"]


def test_a_list_of_shifts_records_each_shift_their_mean_and_the_worst(tiny_config, tmp_path):
    metrics = shifted_metrics(tiny_config, tmp_path, "[1,3,7]")
    for name, worst in (("accuracy", min), ("loss", max)):   # the worst loss is the highest
        each = [metrics[f"test_shifted@{k}/{name}"] for k in (1, 3, 7)]
        assert metrics[f"test_shifted/{name}"] == pytest.approx(sum(each) / 3)
        assert metrics[f"test_shifted_worst/{name}"] == worst(each)
    assert len({metrics[f"test_shifted@{k}/loss"] for k in (1, 3, 7)}) == 3   # HST's CLS reads where blocks fall


def test_one_shift_records_the_shifted_test_as_it_always_did(tiny_config, tmp_path):
    metrics = shifted_metrics(tiny_config, tmp_path, "3")
    shifted = sorted(name for name in metrics if name.startswith("test_shifted"))
    assert shifted == ["test_shifted/accuracy", "test_shifted/loss", "test_shifted/majority_accuracy"]


@pytest.mark.parametrize("shifts, problem", [
    ("[0,1]", "shift 0 is out of range; valid: distinct ints in 1 .. block_size - 1 = 7"),
    ("[-2]", "shift -2 is out of range"),
    ("[1,3,1]", "[1, 3, 1] repeats a shift"),
    ("[1,8]", "shift 8 is out of range; valid: distinct ints in 1 .. block_size - 1 = 7"),
    ("[1,x]", "must be an int or a non-empty list of ints, got [1, 'x']"),
    ("three", "must be an int or a non-empty list of ints, got 'three'"),
    ("[]", "must be an int or a non-empty list of ints, got []"),
])
def test_a_bad_list_of_shifts_is_refused_in_one_line(tiny_config, shifts, problem):
    with pytest.raises(ConfigError) as error:
        tiny_config("model=hst", f"model.pattern_options.block_size={BLOCK}", f"trainer.test_topology_shift={shifts}")
    assert str(error.value).startswith("trainer.test_topology_shift: ") and problem in str(error.value)
    assert "\n" not in str(error.value)


def test_a_list_of_shifts_needs_a_block_pattern(tiny_config):
    with pytest.raises(ConfigError, match="trainer.test_topology_shift: pattern 'dense' has no block boundaries"):
        tiny_config("model=softmax", "trainer.test_topology_shift=[1,2]")
