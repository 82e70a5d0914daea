"""The LRA Image and Pathfinder presets are google-research/long-range-arena's released configs at its head
(cd31e5c; sizes set by ee6649e in image/configs/{cifar10,pathfinder32}/transformer_base.py), the sizes of
its first release (up to ee6649e) are experiment=lra_*_v0, LRA's qkv_dim (total q/k/v width over all heads)
maps onto num_heads * head_size, and the report files runs of the presets in the Transformer's row."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs
from sparse_runner.reporting.papers import lra
from sparse_runner.reporting.presets import Preset
from test_report_lra import write_lra_run

# (emb_dim, num_layers, num_heads, qkv_dim, mlp_dim, dropout, attention dropout, pooling, positions,
#  batch, lr, warm-up, steps) as LRA's config files give them.
RELEASED = {
    # cifar10/transformer_base.py at ee6649e over base_cifar10_config.py
    "lra_image": (128, 1, 8, 64, 128, 0.3, 0.2, "cls", "learned", 256, 5e-4, 175, 35000),
    # cifar10 before ee6649e (e.g. 4954d9f): base_cifar10_config.py alone
    "lra_image_v0": (32, 1, 1, 32, 64, 0.3, 0.2, "cls", "learned", 256, 5e-4, 175, 35000),
    # pathfinder32/transformer_base.py at ee6649e over base_pathfinder32_config.py
    "lra_pathfinder": (32, 4, 4, 16, 32, 0.2, 0.1, "mean", "sinusoidal", 512, 1e-3, 312, 62400),
    # pathfinder32/transformer_base.py before ee6649e: emb 128, qkv = emb // 2, mlp = qkv * 2
    "lra_pathfinder_v0": (128, 1, 4, 64, 128, 0.2, 0.1, "mean", "sinusoidal", 512, 1e-3, 312, 62400),
}


@pytest.mark.parametrize("experiment", list(RELEASED))
def test_preset_is_the_released_config(experiment: str) -> None:
    emb, layers, heads, qkv, mlp, dropout, attn, pooling, positions, batch, lr, warmup, steps = RELEASED[experiment]
    v = Preset((f"experiment={experiment}",)).keys.values
    assert v["model.head_size"] is None  # standard heads: a model preset's fixed head size still applies
    head_size = (v["model.qkv_dim"] or v["model.d_model"]) // v["model.num_heads"]
    assert (v["model.d_model"], v["model.num_layers"], v["model.num_heads"], v["model.ffn_dim"]) == (emb, layers, heads, mlp)
    # LRA's qkv_dim is the width of the query/key/value projections over all heads: num_heads * head_size.
    assert heads * head_size == qkv
    assert (v["model.dropout"], v["model.attention_dropout"], v["model.pooling"], v["model.positions"]) == (
        dropout, attn, pooling, positions)
    assert (v["trainer.batch_size"], v["trainer.lr"], v["trainer.warmup_steps"], v["trainer.max_steps"],
            v["trainer.eval_every"], v["trainer.schedule"], v["trainer.weight_decay"], v["trainer.clip_grad_norm"]) == (
        batch, lr, warmup, steps, warmup, "cosine", 0.0, None)
    assert v["task.name"] == ("lra_image" if "image" in experiment else "pathfinder")


def test_runs_of_the_presets_fill_the_transformer_row(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "image", "lra_image", experiment="lra_image", test_acc=0.42)
    write_lra_run(tmp_path / "path", "pathfinder", experiment="lra_pathfinder", test_acc=0.71)
    write_lra_run(tmp_path / "bigbird", "lra_image", experiment="lra_image", model="bigbird", test_acc=0.41)
    write_lra_run(tmp_path / "v0", "lra_image", experiment="lra_image_v0", test_acc=0.40)
    table = lra.tables(collect_runs([tmp_path]))[0]
    rows = {(r[0], r[1]): dict(zip(table.headers, r)) for r in table.rows}
    paper = rows[("Transformer (softmax)", "ours: paper presets")]
    assert (paper["Image"], paper["Pathfinder"]) == ("42.00", "71.00")
    assert rows[("BigBird (bigbird)", "ours: paper presets")]["Image"] == "41.00"
    assert not [key for key in rows if key[0] == "fixed_head"]       # not taken for a fixed-head model's runs
    # The first release's sizes are no cell of Table 1: a run of them sits beside the paper preset, with what differs.
    other = [key for key in rows if key[1].startswith("ours: other runs (nearest: paper presets; model.d_model=32")]
    assert len(other) == 1 and rows[other[0]]["Image"] == "40.00"
