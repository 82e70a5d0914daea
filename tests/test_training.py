"""End-to-end training on CPU, and the resume guarantees: a run interrupted at any step and resumed
ends with exactly the metrics of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from sparse_runner import example_scores
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
    # what test/accuracy is made of, per example: it gives the metric back
    assert m["test_examples"] == {"file": "test_examples.npz", "metric": "test/accuracy", "reducer": "mean",
                                  "examples": 64, "columns": ["score"]}
    record = example_scores.read(open(reference / "test_examples.npz", "rb"))
    assert record.index.tolist() == list(range(64)) and record.value() == m["metrics"]["test/accuracy"]
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


def _commit_is(monkeypatch, commit: str, dirty: bool) -> None:
    """Make the runner read `commit` (and `dirty`) as the code it runs, as a checkout at that commit would."""
    from sparse_runner import run_metrics

    monkeypatch.setattr(run_metrics, "git_commit", lambda: commit)
    monkeypatch.setattr(run_metrics, "git_dirty", lambda: dirty)


def test_a_resumed_run_records_every_commit_it_ran_under(tiny_config, tmp_path, monkeypatch):
    """A run that crashes under one commit and is resumed under another records both, in order, each with the step
    its process began at; the checkpoint carries the record from one process to the next."""
    from sparse_runner import __version__

    first, second = "a" * 40, "b" * 40
    cfg = tiny_config()
    with monkeypatch.context() as patch:
        _commit_is(patch, first, dirty=False)
        _crash_on_call(patch, 26, simulated_crash)   # checkpoints at steps 10 and 20
        with pytest.raises(RuntimeError):
            run(cfg, tmp_path)
    assert read_metrics(tmp_path)["provenance"] == [{"commit": first, "dirty": False, "version": __version__, "from_step": 0}]
    _commit_is(monkeypatch, second, dirty=True)
    run(cfg, tmp_path)
    m = read_metrics(tmp_path)
    assert m["status"] == "completed" and m["git_commit"] == second
    assert m["provenance"] == [{"commit": first, "dirty": False, "version": __version__, "from_step": 0},
                               {"commit": second, "dirty": True, "version": __version__, "from_step": 20}]
    saved = torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)
    assert saved["provenance"] == m["provenance"]


def test_a_checkpoint_without_a_record_of_its_code_resumes_with_an_unknown_first_entry(tiny_config, tmp_path, monkeypatch):
    """A checkpoint written by a runner that kept no `provenance` resumes; the processes before it read as unknown
    code (every field null), never as the commit that resumes it."""
    cfg = tiny_config()
    with monkeypatch.context() as patch:
        _crash_on_call(patch, 26, simulated_crash)
        with pytest.raises(RuntimeError):
            run(cfg, tmp_path)
    last = tmp_path / "checkpoints/last.pt"
    state = torch.load(last, weights_only=True)
    del state["provenance"]
    torch.save(state, last)
    _commit_is(monkeypatch, "c" * 40, dirty=False)
    run(cfg, tmp_path)
    unknown, resumed = read_metrics(tmp_path)["provenance"]
    assert unknown == {"commit": None, "dirty": None, "version": None, "from_step": 0}
    assert resumed["commit"] == "c" * 40 and resumed["from_step"] == 20


def test_a_run_outside_a_git_checkout_records_a_null_commit_and_its_version(tiny_config, tmp_path, monkeypatch):
    """An installed package (no git checkout around it) runs and records commit null beside its version."""
    from sparse_runner import __version__, run_metrics

    outside = tmp_path / "site-packages" / "sparse_runner"
    outside.mkdir(parents=True)
    monkeypatch.setattr(run_metrics, "__file__", str(outside / "run_metrics.py"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))   # a checkout above tmp_path must not count
    run(tiny_config(), tmp_path / "run")
    m = read_metrics(tmp_path / "run")
    assert m["status"] == "completed" and m["git_commit"] is None
    assert m["provenance"] == [{"commit": None, "dirty": None, "version": __version__, "from_step": 0}]


def test_a_package_that_a_checkout_holds_untracked_has_no_commit(tmp_path, monkeypatch):
    """A package installed into a virtualenv inside some project's checkout is not that checkout's code: its
    commit is null. A checkout with no commit yet gives null too, never the text `HEAD`."""
    import subprocess

    from sparse_runner import run_metrics

    project = tmp_path / "project"
    package = project / ".venv" / "sparse_runner"
    package.mkdir(parents=True)
    (package / "run_metrics.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(project)]
    subprocess.run([*git, "init", "-q"], check=True)
    monkeypatch.setattr(run_metrics, "__file__", str(package / "run_metrics.py"))
    assert run_metrics.git_commit() is None                         # no commit yet
    (project / "README").write_text("a project\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a project"], check=True)
    assert run_metrics.git_commit() is None                         # a commit, but the package is not in it
    subprocess.run([*git, "add", "-f", ".venv/sparse_runner/run_metrics.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the package"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert run_metrics.code_version()["commit"] == head and run_metrics.git_dirty() is False
    (package / "run_metrics.py").write_text("# changed\n")
    assert run_metrics.git_dirty() is True


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
