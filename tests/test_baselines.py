"""The baselines as their papers define them: BigBird's random blocks drawn for every head on its own
(Zaheer et al. 2020), SAR's second pass moving the block boundaries and nothing else (Liu et al. 2022),
and R-Drop's objective holding both passes' task losses (Liang et al. 2021).

The fast paths of the per-head patterns are held to masked dense attention per head in
test_block_patterns.py; here: what the heads draw, what a shift keeps, what the analysis sees, and the
R-Drop loss and gradient against a hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparse_runner.analysis.attention_stats import AttentionStats
from sparse_runner.attention import build_normaliser, build_pattern, set_observer
from sparse_runner.attention.block_patterns import bigbird_global_blocks, bigbird_table
from sparse_runner.attention.block_sparse import count_scores
from sparse_runner.attention.layout import shifted_blocks
from sparse_runner.checks import ConfigError
from sparse_runner.models import build_classifier
from sparse_runner.models.config import default_model
from sparse_runner.tasks import build_task
from sparse_runner.training.regularisers import symmetric_kl
from sparse_runner.training.trainer import Trainer
from tests.test_block_patterns import dense_weights, reference

H = 3


def random_sets(mask: torch.Tensor, g: int, bs: int, blocks: int, window: int, globals_: list[int]) -> list[list[set[int] | None]]:
    """Per head and query block, the key blocks a (heads, n, n) mask gives it beyond its window and the
    global blocks (None for a global block's queries, which see everything)."""
    side = window // 2
    out = []
    for head in mask:
        rows = []
        for i in range(blocks):
            if i in globals_:
                rows.append(None)
                continue
            seen = {j for j in range(blocks) if head[g + i * bs, g + j * bs]}
            rows.append(seen - set(range(i - side, i + side + 1)) - set(globals_))
        out.append(rows)
    return out


# ----------------------------------------------------------------------------- BigBird: per-head random blocks
def test_every_head_draws_its_own_random_blocks_whatever_the_number_of_heads():
    args = (16, 1, 2, 3, 0, 4)  # blocks, side, global_blocks, random_blocks, seed, layer
    index, ok = bigbird_table(*args, heads=4)
    assert index.shape == ok.shape == (4, 16, 3 + 2 + 3)
    assert all(not np.array_equal(index[0], index[h]) for h in range(1, 4))
    few = bigbird_table(*args, heads=2)
    assert np.array_equal(few[0], index[:2]) and np.array_equal(few[1], ok[:2]), "head h's blocks do not depend on the head count"
    shared, _ = bigbird_table(*args, heads=4, per_head=False)
    assert all(np.array_equal(shared[0], shared[h]) for h in range(4))


def test_the_shared_draw_is_the_table_of_earlier_versions():
    """random_per_head=false reproduces the random blocks that every head shared before (seed 0, layer 1)."""
    pattern = build_pattern("bigbird", {"block_size": 4, "random_blocks": 2, "random_per_head": False}, layer=1)
    index, ok = pattern.key_blocks(8)
    rows = [index[i][ok[i]].tolist() for i in range(8)]
    assert rows == [
        [0, 1, 7, 3, 5], [0, 1, 2, 7, 4, 6], [1, 2, 3, 0, 7, 4, 6], [2, 3, 4, 0, 7, 1, 5],
        [3, 4, 5, 0, 7, 1, 2], [4, 5, 6, 0, 7, 1, 2], [5, 6, 7, 0, 2, 3], [6, 7, 0, 1, 3],
    ]


def test_the_test_variants_have_heads_that_differ():
    """test_block_patterns.py's per-head variant at the lengths it uses: the heads' masks differ there, so its
    fast-path check covers per-head gathering."""
    pattern = build_pattern("bigbird", {"block_size": 2, "random_blocks": 1}, layer=1)
    for n in (13, 16):
        for g in (0, 1):
            pattern.global_tokens = g
            masks = pattern.dense_mask(n, n, heads=2)
            assert not torch.equal(masks[0], masks[1]), (n, g)


def test_a_per_head_mask_needs_the_number_of_heads():
    pattern = build_pattern("bigbird", {"block_size": 2, "random_blocks": 2})
    with pytest.raises(ValueError, match="per head"):
        pattern.dense_mask(16, 16)
    assert pattern.dense_mask(4, 4).all()  # two blocks: nothing to draw, every head sees the same keys
    shared = build_pattern("bigbird", {"block_size": 2, "random_blocks": 2, "random_per_head": False})
    assert torch.equal(shared.dense_mask(16, 16, heads=2)[1], shared.dense_mask(16, 16))


def test_per_head_blocks_cost_what_shared_ones_cost():
    q = torch.randn(1, 4, 4097, 8)
    counts = {}
    for per_head in (True, False):
        pattern = build_pattern("bigbird", {"block_size": 32, "random_per_head": per_head}, global_tokens=1)
        with count_scores() as counted, torch.no_grad():
            pattern.attend(q, q, q, normaliser=build_normaliser("softmax", 4))
        counts[per_head] = counted[0]
    assert counts[True] == counts[False] < 0.1 * 4 * 4097**2


def test_per_head_row_groups_give_the_statistics_of_dense_weights():
    """The weights of heads that see different keys come back over the union of their keys (each head's
    own valid): a slot is one key in every head, as head diversity (JS) needs."""
    pattern = build_pattern("bigbird", {"block_size": 2, "random_blocks": 2}, global_tokens=1)
    n = 17
    q, k, v = (torch.randn(2, H, n, 4) for _ in range(3))
    pad = torch.arange(n)[None, :] < torch.tensor([n, 11])[:, None]
    normaliser = build_normaliser("entmax15", H)
    _, groups, _ = pattern.attend(q, k, v, normaliser=normaliser, key_padding_mask=pad, need_weights=True)
    assert any(group.valid.shape[1] == H for group in groups)
    weights, slots = dense_weights(groups, 2, H, n)
    _, expected, allowed = reference(q, k, v, normaliser, pattern.dense_mask(n, n, heads=H), pad)
    assert torch.equal(slots > 0, allowed) and slots.max() <= 1
    torch.testing.assert_close(weights.float(), expected)
    from_groups, from_dense = AttentionStats(), AttentionStats()
    from_groups.update(("encoder_self", 0), [(g.weights, g.valid) for g in groups], None)
    from_dense.update(("encoder_self", 0), weights.float(), slots > 0)
    a, b = from_groups.summary()["encoder_self"]["layers"][0], from_dense.summary()["encoder_self"]["layers"][0]
    for key in ("head_density", "js", "num_queries", "possible_pairs"):
        assert a[key] == pytest.approx(b[key]), key
    assert a["sentence_density_hist"] == b["sentence_density_hist"]


def tiny_classifier(dropout: float = 0.0, **options) -> torch.nn.Module:
    m = default_model(d_model=12, num_layers=2, num_heads=H, ffn_dim=24, dropout=dropout, pattern="bigbird", pattern_options=options)
    torch.manual_seed(0)
    return build_classifier(m, vocab_size=20, num_classes=3, max_length=40, pad_id=0)


def test_the_analysis_observes_a_per_head_model():
    model = tiny_classifier(block_size=2, random_blocks=2).eval()
    stats = AttentionStats()
    set_observer(model, stats.update)
    with torch.no_grad():
        model(torch.randint(1, 20, (2, 30)), torch.tensor([30, 19]))
    set_observer(model, None)
    layers = stats.summary()["encoder_self"]["layers"]
    # softmax: every possible pair has weight; the CLS token and the real tokens are the queries
    assert len(layers) == 2 and all(layer["mean_density"] == 1 and layer["num_queries"] == 31 + 20 for layer in layers)
    assert all(0 < layer["js"] < 1 for layer in layers)


# ----------------------------------------------------------------------------- SAR: the random blocks stay
SHIFT_CASES = [  # (tokens after the CLS, shift) with blocks of 4
    (32, 1),  # 8 blocks become 9: the last token is pushed into a new block
    (32, 3),
    (30, 1),  # 8 blocks stay 8
    (30, 3),  # 8 become 9
    (29, 3),  # 8 stay 8
    (33, 2),  # 9 stay 9
]


@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
@pytest.mark.parametrize("global_blocks", [0, 1, 2])
@pytest.mark.parametrize("body, shift", SHIFT_CASES)
def test_a_shift_keeps_every_block_s_random_blocks(per_head, global_blocks, body, shift):
    """Query block i's random key blocks under a shift are those of unshifted block i, per head, whether or
    not the number of blocks changes; a new last block continues the old last one (its random blocks, and
    its global status)."""
    g, bs, window = 1, 4, 3
    options = {"block_size": bs, "random_blocks": 2, "global_blocks": global_blocks, "random_per_head": per_head, "seed": 3}
    pattern = build_pattern("bigbird", options, global_tokens=g, layer=1)
    n = g + body
    unshifted = math.ceil(body / bs)
    before = random_sets(pattern.dense_mask(n, n, heads=H), g, bs, unshifted, window, bigbird_global_blocks(unshifted, global_blocks))
    pattern.block_shift = shift  # what layout.shifted_blocks sets; the layout puts `shift` masked positions in front
    blocks = math.ceil((body + shift) / bs)
    assert pattern.dense_blocks(blocks, unshifted) == bigbird_global_blocks(blocks, global_blocks, unshifted)
    globals_ = pattern.dense_blocks(blocks, unshifted)
    after = random_sets(pattern.dense_mask(n + shift, n + shift, heads=H), g, bs, blocks, window, globals_)
    for h in range(H):
        for i in range(unshifted):
            assert after[h][i] == before[h][i], (h, i)
        for i in range(unshifted, blocks):  # the new block(s) continue the last one
            assert after[h][i] == before[h][unshifted - 1], (h, i)
    if global_blocks == 2:
        assert globals_ == [0, *range(unshifted - 1, blocks)]  # the old last block stays global, the new one is too
    if blocks > unshifted and global_blocks < 2:
        assert any(after[h][blocks - 1] for h in range(H)), "the new block has random blocks to keep"


@pytest.mark.parametrize("body, shift", SHIFT_CASES)
def test_the_fast_path_under_a_shift_equals_masked_dense_attention_per_head(body, shift):
    g, bs = 1, 4
    pattern = build_pattern("bigbird", {"block_size": bs, "random_blocks": 2, "global_blocks": 1}, global_tokens=g, layer=2)
    pattern.block_shift = shift
    n = g + shift + body
    normaliser = build_normaliser("sparsemax", H).double()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, H, n, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(n)[None, :]
    pad = ((pos < g) | (pos >= g + shift)) & (pos < torch.tensor([n, n - 5])[:, None])  # as the layout pads
    expected, expected_weights, allowed = reference(q, k, v, normaliser, pattern.dense_mask(n, n, heads=H), pad)
    for need_weights in (False, True):
        out, groups, _ = pattern.attend(q, k, v, normaliser=normaliser, key_padding_mask=pad, need_weights=need_weights)
        torch.testing.assert_close(out, expected)
        if need_weights:
            weights, slots = dense_weights(groups, 2, H, n)
            assert torch.equal((slots > 0).expand_as(allowed), allowed)
            torch.testing.assert_close(weights, expected_weights)


def test_sar_s_second_pass_keeps_the_random_blocks_of_the_first():
    """Through the model: 32 tokens in blocks of 4 are 8 blocks, 9 under SAR's shift of 1; the shifted pass
    gathers the table drawn for the 8 unshifted blocks, and the shift is gone afterwards."""
    model = tiny_classifier(block_size=4, random_blocks=1).eval()
    tokens, lengths = torch.randint(1, 20, (2, 32), generator=torch.Generator().manual_seed(0)), torch.tensor([32, 27])
    pattern = model.encoder.layers[0].attn.pattern
    plain = model(tokens, lengths)
    with shifted_blocks(model, 1):
        assert pattern.block_shift == 1
        shifted = model(tokens, lengths)
    assert pattern.block_shift == 0
    drawn = {(key[1], key[2]) for key in pattern._tables if key[0] == "gather"}
    assert drawn == {(8, 8), (9, 8)}, drawn  # (blocks, unshifted blocks the random blocks were drawn for)
    assert not torch.allclose(plain, shifted)
    torch.testing.assert_close(model(tokens, lengths), plain)


# ----------------------------------------------------------------------------- R-Drop: both task losses
def rdrop_step(tiny_config, tmp_path, *overrides: str):
    """(trainer, task, model, batch): a float64 tiny ListOps model under R-Drop, and its first batch."""
    cfg = tiny_config("regulariser=rdrop", "model.regulariser_options.weight=0.5", *overrides)
    task = build_task(cfg)
    torch.manual_seed(0)
    model = task.build_model(cfg.model).double()
    trainer = Trainer(cfg, task, model, tmp_path, torch.device("cpu"), fingerprint={})
    plan = task.plan_epoch(seed=0, epoch=0, batch_size=8, bucket_size=1)
    return trainer, task, model, task.make_batch("train", plan[0], torch.device("cpu"))


def by_hand(task, model, batch, seed: int, task_loss: str):
    """R-Drop's loss and gradients computed here: two passes under the same dropout draws as the trainer's."""
    torch.manual_seed(seed)
    first, second = task.forward_loss(model, batch), task.forward_loss(model, batch)
    kl = symmetric_kl(first.logits, second.logits, first.mask)
    loss = (0.5 * (first.loss + second.loss) if task_loss == "both" else first.loss) + 0.5 * kl
    return loss, torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)


def test_without_dropout_r_drop_is_the_task_loss(tiny_config, tmp_path):
    trainer, task, model, batch = rdrop_step(tiny_config, tmp_path, "model.dropout=0.0", "model.attention_dropout=0.0")
    assert trainer.regulariser.options.task_loss == "both"
    out = trainer.training_step(batch)
    assert float(out.stats["rdrop_kl"]) == pytest.approx(0.0, abs=1e-12)
    torch.testing.assert_close(out.loss, task.forward_loss(model, batch).loss)


@pytest.mark.parametrize("task_loss", ["both", "first"])
def test_r_drop_loss_and_gradient_are_the_papers(tiny_config, tmp_path, task_loss):
    trainer, task, model, batch = rdrop_step(tiny_config, tmp_path, "model.dropout=0.3", f"model.regulariser_options.task_loss={task_loss}")
    torch.manual_seed(7)
    out = trainer.training_step(batch)
    grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
    loss, expected = by_hand(task, model, batch, 7, task_loss)
    torch.testing.assert_close(out.loss, loss)
    for got, want in zip(grads, expected):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want)
    _, other = by_hand(task, model, batch, 7, "first" if task_loss == "both" else "both")
    assert any(g is not None and not torch.allclose(g, o) for g, o in zip(grads, other)), "the second pass's task loss counts or not"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["regulariser=rdrop", "model.regulariser_options.task_loss=second"], "model.regulariser_options.task_loss: unknown value 'second'; valid: both, first"),
        (["++model.regulariser_options.task_loss=first"], "model.regulariser_options.task_loss: regulariser 'none' takes no options"),
    ],
)
def test_a_bad_rdrop_task_loss_is_one_line(tiny_config, overrides, expected):
    with pytest.raises(ConfigError) as error:
        tiny_config(*overrides)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


def test_rdrop_task_loss_is_a_result_key(tiny_config):
    from sparse_runner.identity import result_keys
    from sparse_runner.run_metrics import NON_RESULT_KEYS

    assert "model.regulariser_options.task_loss" not in NON_RESULT_KEYS
    cfg = tiny_config("regulariser=rdrop", "model.regulariser_options.task_loss=first")
    assert cfg.model.regulariser_options.task_loss == "first"
    from omegaconf import OmegaConf

    assert result_keys(OmegaConf.to_container(cfg))["model.regulariser_options.task_loss"] == "first"


# ----------------------------------------------------------------------------- configs without rdrop_task_loss
def test_a_checkpoint_without_a_key_resumes_as_the_keys_default():
    from sparse_runner.training.trainer import fingerprint_difference

    defaults = {"model.regulariser_options.task_loss": "both"}
    saved = {"model.regulariser": "rdrop"}
    assert fingerprint_difference(saved, {**saved, "model.regulariser_options.task_loss": "both"}, defaults) == ""
    assert "task_loss" in fingerprint_difference(saved, {**saved, "model.regulariser_options.task_loss": "first"}, defaults)


def test_the_report_files_a_run_without_rdrop_task_loss_as_first_pass_r_drop():
    from sparse_runner.reporting.presets import Keys, differences
    from sparse_runner.reporting.runs import current_keys

    model = {"normaliser": "softmax", "alpha": None, "alpha_init": "random", "sar": {"weight": 0.0, "shift": 1, "random_shift": False}}
    preset = Keys.of({"model": {"normaliser": "softmax", "normaliser_options": {}, "regulariser": "rdrop",
                                "regulariser_options": {"weight": 1.0, "task_loss": "both"}}})
    old = Keys.of(current_keys({"model": model, "trainer": {"regulariser": "rdrop", "regulariser_weight": 1.0}}))
    assert differences(old, preset) == {"model.regulariser_options.task_loss": "first"}
    both = Keys.of(current_keys({"model": model, "trainer": {"regulariser": "rdrop", "regulariser_weight": 1.0, "rdrop_task_loss": "both"}}))
    assert differences(both, preset) == {}
