"""The low-rank study (task=lowrank, Bhojanapalli et al. 2020, Theorem 1): the config composes and is
checked, the heads compute what the theorem is about, a shrunk run through the real trainer shows the
bottleneck (KL ~0 from d_p = n on, a floor at d_p = 1), and an interrupted run resumes exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.models.lowrank import LowRankHeads
from sparse_runner.run import run
from sparse_runner.tasks.lowrank import LowRankTask, draw_problem, head_groups
from tests.conftest import compose_config, on_train_batch, simulated_crash

N = 6
# n = 6 keys, d = 12, d_p = 1 .. 12, and h = 1, 2, 4 heads (standard size 12, 6, 3 vs fixed size 6); a
# larger lr than the n = 32 recipe's so that 300 steps (under a second) fit d_p >= n to ~1e-7.
SMALL = ["experiment=bhojanapalli2020_lowrank", f"task.seq_len={N}", "task.d_model=12", "task.num_heads=[1,2,4]",
         "trainer.lr=3e-2", "trainer.max_steps=300", "trainer.eval_every=100", "trainer.log_every=50", "trainer.progress=false",
         "trainer.num_threads=1"]


def small_config(*overrides: str):
    return validate(compose_config([*SMALL, *overrides], tiny=False))


def read_metrics(run_dir) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted shrunk study."""
    run_dir = tmp_path_factory.mktemp("lowrank")
    run(small_config(), run_dir)
    return run_dir


def test_config_composes_and_validates():
    for overrides in (["task=lowrank"], ["experiment=bhojanapalli2020_lowrank"]):
        cfg = validate(compose_config(overrides, tiny=False))
        assert cfg.task.family == "lowrank" and cfg.task.seq_len == 32 and cfg.task.max_length == 32
        assert cfg.trainer.monitor == "val/loss" and cfg.trainer.monitor_mode == "min"
    cfg = small_config()
    assert [g.name for g in head_groups(cfg.task)][-6:] == ["standard_h1", "fixed_h1", "standard_h2", "fixed_h2", "standard_h4", "fixed_h4"]
    assert [g.head_size for g in head_groups(cfg.task)][:12] == list(range(1, 13))  # null sweep: 1 .. 2n


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task.num_heads=[5]"], r"^task.num_heads: 5 does not divide task.d_model=12"),
        (["task.head_sizes=[2,2]"], r"^task.head_sizes: lists a value twice"),
        (["task.head_sizes=[0]"], r"^task.head_sizes: must be > 0"),
        (["task.seq_len=1"], r"^task.seq_len: must be >= 2"),
        # The heads read no model key: a sparse normaliser would otherwise be silently ignored.
        (["model=sparsemax"], r"^model.normaliser: task family 'lowrank' does not use this key"),
    ],
)
def test_bad_settings_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        small_config(*overrides)
    assert "\n" not in str(info.value)


def test_heads_compute_the_theorem_scores_and_the_proof_fits_exactly():
    torch.manual_seed(0)
    cfg = small_config()
    x, targets = draw_problem(cfg.task, 1)  # X: (12, 6), P: (1, 6, 6)
    model = LowRankHeads([1, 3, 6, 5, 12], d_model=12)
    scores = model(x)
    for h, size in enumerate(model.head_sizes):
        w_q, w_k = model.head(h)
        assert w_q.shape == (size, 12)
        # Query-major: scores[h, i, j] = q_i . k_j / sqrt(d_p), a softmax over the keys j per query i.
        assert torch.allclose(scores[h], (w_q @ x).T @ (w_k @ x) / math.sqrt(size), atol=1e-5)
    # Theorem 1's proof for d_p = n: with the left inverse X+, W_q X = sqrt(n) I and W_k X = log P (query-
    # major) make the scores log P, so the head reproduces P exactly.
    pinv = torch.linalg.pinv(x.double())
    with torch.no_grad():
        w_q, w_k = model.head(2)
        w_q.copy_(math.sqrt(N) * pinv)
        w_k.copy_(targets[0].log() @ pinv)
    kl, _ = model.kl(x, targets.expand(5, N, N))
    assert kl[2] < 1e-9 and (kl[[0, 1]] > 1e-2).all()


def test_the_bottleneck_shows_in_a_shrunk_run(reference):
    m = read_metrics(reference)
    assert m["status"] == "completed" and m["task_family"] == "lowrank" and m["primary_metric"] == "test/loss"
    kl = {k: m["metrics"][f"test/kl/dp_{k}"] for k in range(1, 2 * N + 1)}
    full_rank = max(kl[k] for k in range(N, 2 * N + 1))
    assert full_rank < 1e-2, kl
    assert kl[1] > 10 * full_rank and kl[1] > 0.05, kl
    assert kl[1] > kl[2] > kl[3] > kl[4]  # each extra dimension lowers the floor below n - 1
    # h = 4 standard heads have size 12 / 4 = 3 < n; fixed heads keep size n.
    assert m["metrics"]["test/kl/standard_h4"] > 10 * max(m["metrics"]["test/kl/fixed_h4"], 1e-4)
    assert m["metrics"]["test/kl/standard_h1"] < 1e-2  # one head of size d = 12 >= n
    # The fit is the measurement: validation and test are the same problem, scored on the same checkpoint.
    assert m["metrics"]["test/loss"] == pytest.approx(m["selection"]["best_value"])


def test_crash_then_resume_matches_uninterrupted(reference, tmp_path, monkeypatch):
    cfg = small_config()
    with monkeypatch.context() as patch:
        on_train_batch(patch, LowRankTask, 170, simulated_crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(cfg, tmp_path)
    assert read_metrics(tmp_path)["status"] == "failed"
    run(cfg, tmp_path)  # resumes from the step-100 checkpoint
    resumed, full = read_metrics(tmp_path), read_metrics(reference)
    assert resumed["status"] == "completed"
    assert resumed["metrics"] == full["metrics"] and resumed["selection"] == full["selection"]
