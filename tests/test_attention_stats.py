"""AttentionStats (density, JS head diversity, per-sentence histogram), alpha_summary, and the figures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from sparse_runner.analysis import AttentionStats, alpha_summary
from sparse_runner.analysis import figures

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _layer(summary: dict, attn_type: str = "encoder_self", layer: int = 0) -> dict:
    [entry] = [l for l in summary[attn_type]["layers"] if l["layer"] == layer]
    return entry


def _masked_softmax(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    w = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
    return torch.nan_to_num(w, nan=0.0)  # fully masked (padded) query rows


def test_dense_uniform_vs_one_hot_js_by_hand():
    # One query, 2 keys. Head 1 uniform (0.5, 0.5), head 2 one-hot (1, 0).
    # mean = (0.75, 0.25); H(mean) = -(0.75 ln 0.75 + 0.25 ln 0.25); mean H = (ln 2 + 0) / 2.
    w = torch.tensor([[[[0.5, 0.5]], [[1.0, 0.0]]]])  # (1, 2, 1, 2)
    stats = AttentionStats()
    stats.update(("encoder_self", 0), w, None)
    entry = _layer(stats.summary())
    expected = (-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - math.log(2) / 2) / math.log(2)
    assert entry["js"] == pytest.approx(expected, abs=1e-6)
    assert entry["head_density"] == [1.0, 0.5]
    assert entry["mean_density"] == pytest.approx(0.75)
    assert entry["num_queries"] == 1


def test_softmax_weights_have_density_one():
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(3, 4, 5, 5), dim=-1)
    stats = AttentionStats()
    stats.update(("encoder_self", 0), w, None)
    entry = _layer(stats.summary())
    assert entry["head_density"] == [1.0] * 4
    assert entry["mean_density"] == 1.0
    assert 0.0 < entry["js"] < 1.0
    assert stats.summary()["encoder_self"]["sentence_density_hist"]["counts"][-1] == 3 * 4


def test_identical_heads_js_zero_and_single_head():
    w = torch.zeros(2, 3, 4, 4)
    w[..., 1] = 1.0  # every head one-hot on key 1
    stats = AttentionStats()
    stats.update(("encoder_self", 0), w, None)
    stats.update(("encoder_self", 1), w[:, :1], None)  # one head: JS defined as 0
    summary = stats.summary()
    assert _layer(summary, layer=0)["js"] == 0.0
    assert _layer(summary, layer=1)["js"] == 0.0
    assert _layer(summary, layer=0)["head_density"] == [0.25] * 3


def test_maximally_different_one_hot_heads_js_one():
    w = torch.eye(4).reshape(1, 4, 1, 4)  # 4 heads, each one-hot on a different key -> JS = ln4 / ln4
    stats = AttentionStats()
    stats.update(("context", 2), w, None)
    assert _layer(stats.summary(), "context", 2)["js"] == pytest.approx(1.0, abs=1e-6)


def test_density_with_padding_counts_only_valid_pairs():
    # B=2, src lengths 3 and 2 (Nk = Nq = 3). Possible pairs: 9 + 4 = 13.
    lengths = torch.tensor([3, 2])
    key_ok = torch.arange(3)[None, :] < lengths[:, None]                    # (B, Nk)
    valid = (key_ok[:, None, :, None] & key_ok[:, None, None, :])           # (B, 1, Nq, Nk)
    w = torch.zeros(2, 1, 3, 3)
    w[0, 0, :, 0] = 1.0                      # sentence 0: one non-zero per row -> 3 of 9
    w[1, 0, 0, :2] = 0.5                     # sentence 1: row 0 dense (2), row 1 one-hot (1) -> 3 of 4
    w[1, 0, 1, 1] = 1.0
    w[1, 0, 2, :] = 1.0 / 3                  # padded query row: garbage that must be ignored
    w[1, 0, :2, 2] = 0.0
    stats = AttentionStats()
    stats.update(("encoder_self", 0), w, valid)
    entry = _layer(stats.summary())
    assert entry["possible_pairs"] == 13
    assert entry["head_density"] == [pytest.approx(6 / 13)]
    assert entry["num_queries"] == 5
    hist = stats.summary()["encoder_self"]["sentence_density_hist"]
    expected, _ = np.histogram([3 / 9, 3 / 4], bins=15, range=(0, 1))
    assert hist["counts"] == expected.tolist() and hist["count"] == 2


def test_causal_valid_pairs_denominator():
    tgt = 5
    causal = torch.tril(torch.ones(tgt, tgt, dtype=torch.bool))
    valid = causal.expand(2, 1, tgt, tgt)
    w = _masked_softmax(torch.randn(2, 2, tgt, tgt), valid)
    stats = AttentionStats()
    stats.update(("decoder_self", 0), w, valid)
    entry = _layer(stats.summary(), "decoder_self")
    assert entry["possible_pairs"] == 2 * 2 * tgt * (tgt + 1) // 2  # B * H * tgt(tgt+1)/2
    assert entry["head_density"] == [1.0, 1.0]  # dense softmax over the allowed keys only


def test_padded_query_rows_ignored_even_if_nan():
    valid = torch.ones(1, 1, 3, 2, dtype=torch.bool)
    valid[0, 0, 2] = False                  # query 2 is padding
    w = torch.tensor([[0.5, 0.5], [1.0, 0.0], [float("nan"), float("nan")]])
    w = torch.stack([w, torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.3, 0.7]])]).unsqueeze(0)  # (1, 2, 3, 2)
    stats = AttentionStats()
    stats.update(("encoder_self", 0), w, valid)
    entry = _layer(stats.summary())
    assert entry["num_queries"] == 2
    assert entry["head_density"] == [pytest.approx(3 / 4), pytest.approx(2 / 4)]
    # query 0: uniform vs one-hot (hand value above); query 1: identical one-hot heads -> 0.
    q0 = (-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - math.log(2) / 2) / math.log(2)
    assert entry["js"] == pytest.approx(q0 / 2, abs=1e-6)
    assert not math.isnan(entry["js"])


def test_two_batches_equal_one_concatenated_batch():
    torch.manual_seed(1)
    lengths = torch.tensor([6, 4, 2, 5, 1])
    key_ok = torch.arange(6)[None, :] < lengths[:, None]
    valid = key_ok[:, None, :, None] & key_ok[:, None, None, :]
    scores = torch.randn(5, 3, 6, 6)
    # Sparse-ish weights: zero out the weaker half of each row, renormalise.
    w = _masked_softmax(scores, valid & (scores > 0))
    split, whole = AttentionStats(), AttentionStats()
    split.update(("context", 1), w[:2], valid[:2])
    split.update(("context", 1), w[2:], valid[2:])
    whole.update(("context", 1), w, valid)
    a, b = split.summary(), whole.summary()
    la, lb = _layer(a, "context", 1), _layer(b, "context", 1)
    assert la["head_density"] == pytest.approx(lb["head_density"], abs=1e-12)
    assert la["js"] == pytest.approx(lb["js"], abs=1e-9)
    assert la["num_queries"] == lb["num_queries"] == int(lengths.sum())
    assert a["context"]["sentence_density_hist"] == b["context"]["sentence_density_hist"]
    assert 0 < min(la["head_density"]) < 1
    json.dumps(a)  # JSON-serialisable


def test_summary_order_and_head_count_check():
    stats = AttentionStats()
    w = torch.softmax(torch.randn(1, 2, 3, 3), dim=-1)
    stats.update(("decoder_self", 1), w, None)
    stats.update(("encoder_self", 0), w, None)
    stats.update(("decoder_self", 0), w, None)
    summary = stats.summary()
    assert list(summary) == ["encoder_self", "decoder_self"]
    assert [l["layer"] for l in summary["decoder_self"]["layers"]] == [0, 1]
    with pytest.raises(ValueError):
        stats.update(("decoder_self", 0), torch.softmax(torch.randn(1, 3, 3, 3), dim=-1), None)


def test_alpha_histogram_matches_numpy():
    rng = np.random.default_rng(0)
    alphas = {("encoder_self", l): (1 + rng.random(8)).tolist() for l in range(6)}
    alphas[("encoder_self", 0)][:3] = [1.0, 2.0, 1 + 5 / 15]  # edges: first, last (closed), interior
    alphas[("context", 0)] = [1.2, 1.25]
    out = alpha_summary(alphas)
    assert list(out) == ["encoder_self", "context"]
    flat = [a for l in range(6) for a in alphas[("encoder_self", l)]]
    counts, edges = np.histogram(flat, bins=15, range=(1, 2))
    assert out["encoder_self"]["counts"] == counts.tolist()
    assert out["encoder_self"]["edges"] == pytest.approx(edges.tolist())
    assert out["encoder_self"]["alphas"] == flat and out["encoder_self"]["count"] == 48
    assert out["encoder_self"]["out_of_range"] == 0
    json.dumps(out)


def _fake_summary(seed: int) -> dict:
    torch.manual_seed(seed)
    stats = AttentionStats()
    for attn_type in ("encoder_self", "context", "decoder_self"):
        for layer in range(3):
            scores = torch.randn(4, 4, 7, 7)
            w = _masked_softmax(scores, scores > 0.3 * layer)
            stats.update((attn_type, layer), w, None)
    return stats.summary()


def _assert_png(path, tmp_path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_figures_are_written_as_png(tmp_path):
    summary = _fake_summary(0)
    alphas = alpha_summary({(t, l): [1.1, 1.4, 1.9, 1.6] for t in ("encoder_self", "context") for l in range(3)})
    trajectory = {
        f"{t}/{l}": [(step, [1.5 + 0.1 * h * math.sin(step / 100) for h in range(4)]) for step in range(0, 1000, 100)]
        for t in ("encoder_self", "decoder_self") for l in range(2)
    }
    written = [
        figures.plot_alpha_histograms(alphas, tmp_path / "alpha_hist.png"),
        figures.plot_density_histograms(summary, tmp_path / "density_hist.png"),
        figures.plot_js_per_layer(summary, tmp_path / "js.png"),
        figures.plot_js_per_layer({"a": summary, "b": _fake_summary(1)}, tmp_path / "js_models.png"),
        figures.plot_head_density_per_layer(summary, tmp_path / "head_density.png"),
        figures.plot_alpha_trajectories(trajectory, tmp_path / "alpha_traj.png"),
    ]
    for path in written:
        _assert_png(path, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)
