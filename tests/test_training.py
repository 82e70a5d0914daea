"""End-to-end training on CPU, and the resume guarantees: a run interrupted at any step and resumed
ends with exactly the metrics of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from sparse_runner.config import ConfigError
from sparse_runner.run import run
from sparse_runner.run_metrics import SCHEMA, SCHEMA_VERSION
from sparse_runner.tasks.listops import ListOpsTask
from sparse_runner.training.trainer import Preempted
from tests.conftest import on_train_batch, simulated_crash


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def step_log(run_dir: Path) -> list[dict]:
    """log.jsonl without the wall-clock fields (throughput, data wait), which legitimately differ between runs."""
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "per_s" not in k and "data_wait" not in k} for row in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
    """One uninterrupted tiny run that the interrupted ones are compared with."""
    from tests.conftest import compose_config
    from sparse_runner.config import validate

    run_dir = tmp_path_factory.mktemp("reference")
    run(validate(compose_config([], cache_dir=cache_dir)), run_dir)
    return run_dir


def test_end_to_end_run_writes_everything(reference):
    m = read_metrics(reference)
    assert m["status"] == "completed"
    assert set(m) <= set(SCHEMA), set(m) - set(SCHEMA)  # the writer keeps to the schema the report reads
    assert m["schema"] == SCHEMA_VERSION and m["primary_metric"] == "test/accuracy"
    for key in ("test/accuracy", "test/loss", "val/accuracy", "test/majority_accuracy"):
        assert 0.0 <= m["metrics"][key] < 100.0
    assert m["step"] == 30 and m["num_parameters"] > 0 and m["tokens_per_second"] > 0
    assert m["attention_backend"] == "sdpa" and m["device"] == "cpu"
    assert m["selection"]["metric"] == "val/accuracy" and m["selection"]["best_step"] in (10, 20, 30)
    assert {"torch", "python", "sparse_runner"} <= set(m["versions"])
    assert m["config"]["model"]["d_model"] == 32 and m["seed"] == 0
    for path in ("config.yaml", "log.jsonl", "checkpoints/last.pt", "checkpoints/best.pt"):
        assert (reference / path).exists(), path
    assert list((reference / "tb").glob("events.out.tfevents.*"))
    steps = [row["step"] for row in step_log(reference) if "train/loss" in row]
    assert steps == [5, 10, 15, 20, 25, 30]


def test_training_reduces_the_loss(tiny_config, tmp_path):
    # 120 steps on 256 examples: the model must fit its training data better than at the start.
    run(tiny_config("trainer.max_steps=120", "trainer.eval_every=60", "trainer.log_every=10"), tmp_path)
    losses = [row["train/loss"] for row in step_log(tmp_path) if "train/loss" in row]
    assert losses[-1] < losses[0] - 0.1, losses


def _crash_on_call(monkeypatch, n: int, action) -> None:
    """Make the n-th training batch call `action()` (a crash or a signal)."""
    on_train_batch(monkeypatch, ListOpsTask, n, action)


@pytest.mark.parametrize("crash_at", [7, 20, 26])
def test_crash_then_resume_matches_uninterrupted(reference, tiny_config, tmp_path, monkeypatch, crash_at):
    cfg = tiny_config()

    def crash():
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as patch:
        _crash_on_call(patch, crash_at, crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(cfg, tmp_path)
    assert read_metrics(tmp_path)["status"] == "failed"
    run(cfg, tmp_path)  # the same command again: resumes from the last checkpoint
    resumed, full = read_metrics(tmp_path), read_metrics(reference)
    assert resumed["status"] == "completed"
    assert resumed["metrics"] == full["metrics"]
    assert resumed["selection"] == full["selection"]
    assert step_log(tmp_path) == step_log(reference)


def test_sigusr1_saves_and_stops_then_resumes_exactly(reference, tiny_config, tmp_path, monkeypatch):
    cfg = tiny_config()
    with monkeypatch.context() as patch:
        _crash_on_call(patch, 14, lambda: os.kill(os.getpid(), signal.SIGUSR1))
        with pytest.raises(Preempted):
            run(cfg, tmp_path)
    m = read_metrics(tmp_path)
    assert m["status"] == "preempted" and m["step"] == 14
    assert torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)["progress"]["step"] == 14
    run(cfg, tmp_path)
    assert read_metrics(tmp_path)["metrics"] == read_metrics(reference)["metrics"]


def test_a_resumed_run_counts_the_time_of_its_earlier_processes(tiny_config, tmp_path, monkeypatch):
    """cpu_time_s and wall_time_s of a resumed run include what its first process spent up to the checkpoint
    it resumed from. CPU time comes from a fake clock that each training batch moves by 1 s, so a run of 30
    steps costs exactly 30 s however it was interrupted."""
    import time
    from types import SimpleNamespace

    import sparse_runner.run as run_module
    import sparse_runner.training.trainer as trainer_module

    clock = {"cpu": 0.0}
    fake_time = SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    fake_time.process_time = lambda: clock["cpu"]
    for module in (run_module, trainer_module):
        monkeypatch.setattr(module, "time", fake_time)
    original = ListOpsTask.make_batch

    def make_batch(self, split, indices, device):
        clock["cpu"] += 1.0 if split == "train" else 0.0
        return original(self, split, indices, device)

    monkeypatch.setattr(ListOpsTask, "make_batch", make_batch)
    cfg = tiny_config()
    uninterrupted = tmp_path / "uninterrupted"
    run(cfg, uninterrupted)
    assert read_metrics(uninterrupted)["cpu_time_s"] == 30.0

    interrupted = tmp_path / "interrupted"
    with monkeypatch.context() as patch:
        _crash_on_call(patch, 26, simulated_crash)   # before the 26th batch is made; checkpoints at steps 10 and 20
        with pytest.raises(RuntimeError):
            run(cfg, interrupted)
    failed = read_metrics(interrupted)
    saved = torch.load(interrupted / "checkpoints/last.pt", weights_only=True)["progress"]
    assert failed["cpu_time_s"] == 25.0 and saved["step"] == 20 and saved["cpu_time_s"] == 20.0
    run(cfg, interrupted)   # resumes at step 20: 10 more batches
    resumed = read_metrics(interrupted)
    assert resumed["status"] == "completed" and resumed["cpu_time_s"] == 30.0
    assert resumed["wall_time_s"] > saved["wall_time_s"] > 0


def test_corrupt_last_checkpoint_falls_back_to_previous(reference, tiny_config, tmp_path, monkeypatch, caplog):
    cfg = tiny_config()

    def crash():
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as patch:
        _crash_on_call(patch, 26, crash)  # checkpoints at steps 10 and 20 exist
        with pytest.raises(RuntimeError):
            run(cfg, tmp_path)
    last = tmp_path / "checkpoints/last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # truncated
    with caplog.at_level("WARNING"):
        run(cfg, tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert read_metrics(tmp_path)["metrics"] == read_metrics(reference)["metrics"]


def test_completed_run_is_not_trained_again(reference, tiny_config, tmp_path, monkeypatch):
    cfg = tiny_config()
    run(cfg, tmp_path)
    before = (tmp_path / "metrics.json").read_text()

    def no_training(*args, **kwargs):
        raise AssertionError("a completed run was trained again")

    monkeypatch.setattr(ListOpsTask, "make_batch", no_training)
    run(cfg, tmp_path)
    assert (tmp_path / "metrics.json").read_text() == before


def test_resume_false_starts_over(tiny_config, tmp_path):
    run(tiny_config("trainer.max_steps=10"), tmp_path)
    run(tiny_config("trainer.max_steps=10", "trainer.resume=false", "model.num_heads=4"), tmp_path)
    assert read_metrics(tmp_path)["config"]["model"]["num_heads"] == 4


def test_changed_config_in_same_directory_is_refused(tiny_config, tmp_path):
    run(tiny_config("trainer.max_steps=10"), tmp_path)
    before = (tmp_path / "metrics.json").read_text()
    with pytest.raises(ConfigError, match="different config.*model.num_heads") as info:
        run(tiny_config("trainer.max_steps=10", "model.num_heads=4"), tmp_path)
    assert "\n" not in str(info.value)
    assert (tmp_path / "metrics.json").read_text() == before  # nothing lost


def test_early_stopping_and_accumulation(tiny_config, tmp_path):
    cfg = tiny_config("trainer.max_steps=200", "trainer.eval_every=2", "trainer.patience=2", "trainer.accumulate=2", "trainer.lr=1e-6")
    run(cfg, tmp_path)
    m = read_metrics(tmp_path)
    assert m["stopped_early"] is True and m["step"] < 200
