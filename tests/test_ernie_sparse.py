"""ERNIE-Sparse's pieces beyond the patterns: the encoder's sequence layout (HST representatives, shifted
block boundaries), SAR (zero when nothing changes, positive when the topology does), the presets composing
with every normaliser and head geometry, one-line config errors, and a whole run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from sparse_runner.attention.layout import SequenceLayout, layouts, shifted_blocks
from sparse_runner.checks import ConfigError
from sparse_runner.models import build_classifier
from sparse_runner.models.config import default_model
from sparse_runner.run import run
from sparse_runner.tasks.base import StepOutput
from sparse_runner.training.regularisers import build_regulariser


# ----------------------------------------------------------------------------- layout
@pytest.mark.parametrize("representatives", [None, "learned", "pooled"])
@pytest.mark.parametrize("shift", [0, 1, 2])
def test_layout_round_trip_keeps_every_token(representatives, shift):
    layout = SequenceLayout(block_size=3, global_tokens=1, d_model=4, representatives=representatives)
    layout.shift = shift
    x = torch.randn(2, 9, 4)                                   # 1 global + 8 tokens
    valid = torch.arange(9)[None, :] < torch.tensor([9, 4])[:, None]
    inner, inner_valid, n = layout.enter(x, valid)
    torch.testing.assert_close(layout.leave(inner, n), x)
    assert inner_valid[:, 0].all() and torch.equal(inner[:, 0], x[:, 0])   # the global token stays in front
    body, body_valid = inner[:, 1:], inner_valid[:, 1:]
    tile = 4 if representatives else 3
    assert not body_valid[:, :shift].any() if not representatives else not body_valid[:, 1 : 1 + shift].any()
    if representatives:
        assert body.shape[1] % tile == 0
        reps = body[:, ::tile]
        tokens_ok = body_valid.view(2, -1, tile)[:, :, 1:]
        # the second sequence's last block holds only padding: its representative is masked too
        assert torch.equal(body_valid[:, ::tile], tokens_ok.any(-1))
        if representatives == "pooled":
            tiles = body.view(2, -1, tile, 4)[:, :, 1:]
            w = tokens_ok[..., None].float()
            torch.testing.assert_close(reps, (tiles * w).sum(2) / w.sum(2).clamp_min(1))
        else:
            assert torch.equal(reps, layout.representative.expand_as(reps))


def tiny_classifier(pattern: str, dropout: float = 0.0, **options) -> torch.nn.Module:
    m = default_model(d_model=16, num_layers=2, num_heads=2, ffn_dim=32, dropout=dropout, pattern=pattern, pattern_options=options)
    torch.manual_seed(0)
    return build_classifier(m, vocab_size=20, num_classes=3, max_length=40, pad_id=0)


def test_shifting_the_blocks_changes_a_block_pattern_and_nothing_else():
    tokens = torch.randint(1, 20, (3, 23))
    lengths = torch.tensor([23, 17, 5])
    for pattern, options in (("hst", {"block_size": 4}), ("local", {"block_size": 4}), ("bigbird", {"block_size": 2, "random_blocks": 1})):
        model = tiny_classifier(pattern, **options).eval()
        assert len(layouts(model)) == 1
        plain = model(tokens, lengths)
        with shifted_blocks(model, 1):
            shifted = model(tokens, lengths)
        assert not torch.allclose(plain, shifted), pattern
        torch.testing.assert_close(model(tokens, lengths), plain)   # restored afterwards
    dense = tiny_classifier("dense").eval()
    assert layouts(dense) == []
    with shifted_blocks(dense, 1):
        torch.testing.assert_close(dense(tokens, lengths), tiny_classifier("dense").eval()(tokens, lengths))


def test_whole_blocks_without_padding_need_no_mask():
    model = tiny_classifier("hst", block_size=4).eval()
    tokens = torch.randint(1, 20, (2, 16))   # the CLS token is global; 16 tokens = 4 whole blocks
    torch.testing.assert_close(model(tokens, None), model(tokens, torch.tensor([16, 16])))


def test_padding_does_not_change_a_sequence_s_output():
    """Extra padding adds blocks of nothing: the real sequence's result must not move."""
    model = tiny_classifier("hst", block_size=4, representatives="pooled").eval()
    tokens = torch.randint(1, 20, (1, 10))
    alone = model(tokens, torch.tensor([10]))
    padded = model(torch.cat([tokens, torch.zeros(1, 13, dtype=torch.long)], dim=1), torch.tensor([10]))
    torch.testing.assert_close(alone, padded)


# ----------------------------------------------------------------------------- SAR
class ClassifierTask:
    """The least of a task that SAR needs: forward_loss over a batch of tokens."""

    def forward_loss(self, model, batch):
        logits = model(batch["tokens"], batch["lengths"])
        loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
        return StepOutput(loss=loss, logits=logits, tokens=int(batch["lengths"].sum()))


def sar_loss(model, shift, random_shift=False):
    g = torch.Generator().manual_seed(1)
    batch = {"tokens": torch.randint(1, 20, (4, 30), generator=g), "lengths": torch.tensor([30, 21, 9, 14]), "labels": torch.tensor([0, 1, 2, 0])}
    task = ClassifierTask()
    first = task.forward_loss(model, batch)
    result = build_regulariser("sar", {"weight": 1.0, "shift": shift, "random_shift": random_shift})(task, model, batch, first)
    return result.loss, result.stats


def test_sar_is_zero_without_a_shift_and_without_dropout():
    model = tiny_classifier("hst", block_size=4).train()
    kl, stats = sar_loss(model, 0)
    assert kl.item() == pytest.approx(0.0, abs=1e-12) and "sar_kl" in stats


def test_sar_is_positive_when_the_topology_moves_and_trains_both_passes():
    model = tiny_classifier("hst", block_size=4).train()
    kl, _ = sar_loss(model, 1)
    assert kl.item() > 1e-6
    kl.backward()
    assert model.encoder.layers[0].attn.q_proj.weight.grad.abs().sum() > 0
    assert layouts(model)[0].shift == 0   # the second pass leaves the model as it found it


def test_sar_random_shift_draws_within_the_block(monkeypatch):
    model = tiny_classifier("local", block_size=4).train()
    seen = []
    original = SequenceLayout.enter

    def spy(self, *args):
        seen.append(self.shift)
        return original(self, *args)

    monkeypatch.setattr(SequenceLayout, "enter", spy)
    for _ in range(12):
        sar_loss(model, 0, random_shift=True)
    shifts = seen[1::2]   # every second call is SAR's pass
    assert set(shifts) <= {1, 2, 3} and len(set(shifts)) > 1


# ----------------------------------------------------------------------------- presets and config
@pytest.mark.parametrize("preset", ["local", "bigbird", "hst", "ernie_sparse", "bigbird_sar"])
@pytest.mark.parametrize("normaliser", ["softmax", "sparsemax", "entmax15", "alpha_entmax"])
def test_presets_compose_with_every_normaliser_and_a_free_head_size(tiny_config, preset, normaliser):
    cfg = tiny_config(f"model={preset}", f"normaliser={normaliser}", "model.head_size=8", "model.pattern_options.block_size=8")
    from sparse_runner.tasks import build_task

    task = build_task(cfg)
    model = task.build_model(cfg.model)
    assert model.encoder.layers[0].attn.pattern.name == cfg.model.pattern
    assert model.encoder.layers[0].attn.head_size == 8
    tokens = torch.randint(1, 10, (2, 37))
    logits = model(tokens, torch.tensor([37, 20]))
    logits.sum().backward()
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model=softmax", "regulariser=sar"], "model.regulariser: SAR shifts block boundaries, and pattern 'dense' has none"),
        (["model=ernie_sparse", "model.regulariser_options.shift=64"], "model.regulariser_options.shift: must be in 0 .. block_size - 1 = 63"),
        (["model=ernie_sparse", "model.regulariser_options.weight=-1"], "model.regulariser_options.weight"),
        (["model=softmax", "trainer.test_topology_shift=2"], "trainer.test_topology_shift: pattern 'dense' has no block boundaries"),
        (["model=hst", "model.pattern_options.representatives=mean"], "model.pattern_options.representatives"),
        (["model=bigbird", "model.pattern_options.window=2"], "model.pattern_options.window: bad value 2; valid: an odd int > 0"),
        (["model=hst", "model.pattern=bigbird"], "unknown option of pattern 'bigbird'"),
    ],
)
def test_bad_settings_are_refused_in_one_line(tiny_config, overrides, expected):
    with pytest.raises(ConfigError) as error:
        tiny_config(*overrides)
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_a_language_model_refuses_sar(cache_dir):
    from sparse_runner.config import validate
    from tests.conftest import compose_config

    # A language model is causal whatever model.pattern says: the first key it refuses is the pattern.
    with pytest.raises(ConfigError, match=r"model.pattern: task family '\w+' does not use this key"):
        validate(compose_config(["task=sotu_en", "model=ernie_sparse"], cache_dir=cache_dir, tiny=False))


# ----------------------------------------------------------------------------- a whole run
def test_ernie_sparse_run_logs_sar_measures_the_shifted_test_and_analyses_row_groups(tiny_config, tmp_path):
    cfg = tiny_config("model=ernie_sparse", "model.normaliser=entmax15", "model.pattern_options.block_size=8", "trainer.max_steps=10",
                      "trainer.test_topology_shift=3")
    run(cfg, tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    assert 0 <= metrics["metrics"]["test_shifted/accuracy"] <= 1
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    kls = [row["train/sar_kl"] for row in rows if "train/sar_kl" in row]
    assert kls and all(math.isfinite(k) and k > 0 for k in kls)
    layers = metrics["analysis"]["attention"]["encoder_self"]["layers"]
    assert all(0 < layer["mean_density"] < 1 for layer in layers)   # entmax15 over the HST pattern
