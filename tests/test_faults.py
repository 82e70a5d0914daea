"""The runner under faults, as a careful user meets them: each case ends in one clear line, and nothing
that was there before is lost (docs/guide.md, "When something goes wrong")."""

from __future__ import annotations

import gzip
import json
import math
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sparse_runner import checkpoint as ckpt
from sparse_runner.checks import ConfigError, DataError
from sparse_runner.cli import preflight
from sparse_runner.config import validate
from sparse_runner.run import DirectoryInUse, directory_lock, run
from sparse_runner.tasks.listops import ListOpsTask
from sparse_runner.training.stopping import Preempted
from sparse_runner.training.trainer import Diverged, Trainer
from tests.conftest import TINY, compose_config, on_train_batch, sparse_run


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def step_log(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "per_s" not in k and "data_wait" not in k} for row in rows]


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    errors = [line for line in lines if line.startswith("sparse-run: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
    from sparse_runner.config import validate
    from tests.conftest import compose_config

    run_dir = tmp_path_factory.mktemp("reference")
    run(validate(compose_config([], cache_dir=cache_dir)), run_dir)
    return run_dir


# ------------------------------------------------------------------------------------ the run directory
def _hold_lock(run_dir: Path) -> subprocess.Popen:
    """Another process that holds run_dir the way a running sparse-run does."""
    code = (
        "import sys, time; from pathlib import Path; from sparse_runner.run import directory_lock\n"
        f"with directory_lock(Path({str(run_dir)!r})):\n    print('held', flush=True); time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_command_on_a_busy_run_directory_is_refused_and_kill_9_frees_it(tmp_path, cache_dir):
    run_dir = tmp_path / "outputs" / "runs" / "default"
    run_dir.mkdir(parents=True)
    holder = _hold_lock(run_dir)
    try:
        result = sparse_run([*TINY, "trainer.max_steps=5", f"hydra.run.dir={run_dir}"], cwd=tmp_path, cache_dir=cache_dir)
        assert result.returncode == 2
        line = one_error_line(result)
        assert "in use by another sparse-run" in line and f"pid {holder.pid}" in line
        assert not (run_dir / "metrics.json").exists()
        assert (run_dir / ".lock").exists()  # the holder's directory is left as it was
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs
        holder.wait()
    with directory_lock(run_dir):  # not stale
        pass


def test_two_identical_commands_started_together_one_trains(tmp_path, cache_dir):
    args = [*TINY, "trainer.max_steps=30"]
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir)}
    procs = [subprocess.Popen([sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", *args],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    if codes == [0, 0]:  # the second started only after the first had finished: it found the run complete
        assert any("already complete" in out + err for out, err in outputs)
    else:
        assert codes == [0, 2], outputs
        assert any("in use by another sparse-run" in err for _, err in outputs)
    assert read_metrics(run_dir)["status"] == "completed"
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    logged = [row["step"] for row in rows if "train/loss" in row]
    assert logged == list(range(5, 31, 5))  # one writer: each step-log line once


# ------------------------------------------------------------------------------------------ checkpoints
def test_a_full_disk_while_checkpointing_is_one_line_and_the_resume_is_exact(reference, tiny_config, tmp_path, monkeypatch):
    cfg = tiny_config()
    real_save, calls = torch.save, {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the third checkpoint write: an earlier last.pt exists
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 1664 vs 1560")
        return real_save(obj, f, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(ckpt.torch, "save", save)
        patch.setattr(ckpt.shutil, "disk_usage", lambda _: SimpleNamespace(free=0))
        with pytest.raises(ckpt.CheckpointWriteError) as info:
            run(cfg, tmp_path)
    message = str(info.value)
    # The failed write is best.pt at step 20: what is kept is the checkpoint of step 10.
    assert "\n" not in message and "no space left on device" in message and "the previous checkpoint (step 10) is kept" in message
    assert read_metrics(tmp_path)["status"] == "failed"
    kept = torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)
    assert kept["progress"]["step"] > 0
    assert not list(tmp_path.rglob("*.tmp"))
    run(cfg, tmp_path)  # space freed: the same command resumes
    assert read_metrics(tmp_path)["metrics"] == read_metrics(reference)["metrics"]


def test_a_full_disk_at_the_first_checkpoint_says_that_nothing_is_kept(tiny_config, tmp_path, monkeypatch):
    def save(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 1664 vs 1560")

    monkeypatch.setattr(ckpt.torch, "save", save)
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda _: SimpleNamespace(free=0))
    with pytest.raises(ckpt.CheckpointWriteError) as info:
        run(tiny_config(), tmp_path)
    message = str(info.value)
    assert "\n" not in message and "no space left on device" in message, message
    assert "previous checkpoint" not in message and "nothing is kept yet" in message and "start it over" in message, message
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_when_no_checkpoint_is_readable_the_run_refuses_instead_of_starting_over(reference, tiny_config, tmp_path):
    cfg = tiny_config()
    with pytest.raises(RuntimeError):
        with pytest.MonkeyPatch.context() as patch:
            on_train_batch(patch, ListOpsTask, 25, lambda: (_ for _ in ()).throw(RuntimeError("crash")))
            run(cfg, tmp_path)
    for name in ("last.pt", "last.prev.pt", "best.pt"):
        (tmp_path / "checkpoints" / name).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="no checkpoint to resume from is readable.*trainer.resume=false"):
        run(cfg, tmp_path)
    run(tiny_config("trainer.resume=false"), tmp_path)
    assert read_metrics(tmp_path)["metrics"] == read_metrics(reference)["metrics"]


def test_a_diverging_run_keeps_no_non_finite_checkpoint_and_says_so_in_one_line(tmp_path, cache_dir):
    args = [*TINY, "trainer.lr=1e6", "trainer.eval_every=10", "trainer.log_every=20", "trainer.max_steps=40"]
    result = sparse_run(args, cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 1
    line = one_error_line(result)
    assert "diverged" in line and "trainer.lr" in line
    assert "clip_grad_norm" not in line  # clipping is on (1.0): do not suggest it
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    m = read_metrics(run_dir)
    assert m["status"] == "diverged" and "\n" not in m["error"]
    for name in ("last.pt", "last.prev.pt", "best.pt"):
        path = run_dir / "checkpoints" / name
        if path.exists():
            state = torch.load(path, weights_only=True)
            assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point()), name
            if "progress" in state:
                assert math.isfinite(state["progress"]["window_loss"])


def test_a_non_finite_validation_loss_is_a_divergence_and_nothing_of_it_is_kept(tmp_path, cache_dir):
    """trainer.lr=1e9: val/loss is NaN at step 1 while the monitored val/accuracy and the weights are finite."""
    args = [*TINY, "trainer.lr=1e9", "trainer.eval_every=1", "trainer.max_steps=4"]
    result = sparse_run(args, cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)
    assert "diverged at step 1: val/loss is nan" in line and "no checkpoint was saved" in line, line
    assert "the same command would diverge again" in line and "trainer.lr (now 1e+09)" in line, line
    # Said once on the terminal (not again by a log handler), after the accepted run's start-up; the log file keeps it.
    terminal = [t for t in (result.stdout + result.stderr).splitlines() if t.strip()]
    assert [t for t in terminal if "diverged at step 1" in t] == [line] and line.startswith("sparse-run: error: run failed: "), terminal
    assert any("CPU block cache" in t for t in terminal), terminal
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    assert "diverged at step 1" in (run_dir / "sparse_run.log").read_text()
    m = read_metrics(run_dir)
    assert m["status"] == "diverged" and "val/loss is nan" in m["error"]
    assert not list((run_dir / "checkpoints").glob("*.pt"))
    again = sparse_run(args, cwd=tmp_path, cache_dir=cache_dir)  # nothing to resume from: the same line again
    assert again.returncode == 1 and one_error_line(again) == line


# -------------------------------------------------------------------------------------------- signals
def test_sigint_is_a_stop_like_sigterm(tiny_config, reference, tmp_path):
    cfg = tiny_config()
    with pytest.MonkeyPatch.context() as patch:
        on_train_batch(patch, ListOpsTask, 14, lambda: os.kill(os.getpid(), signal.SIGINT))
        with pytest.raises(Preempted) as info:
            run(cfg, tmp_path)
    assert info.value.signum == signal.SIGINT and info.value.step == 14
    assert read_metrics(tmp_path)["status"] == "preempted"
    run(cfg, tmp_path)
    assert read_metrics(tmp_path)["metrics"] == read_metrics(reference)["metrics"]
    # The step log continues as if never stopped, to the last digit (the loss window is carried exactly).
    assert step_log(tmp_path) == step_log(reference)


def test_sigterm_during_start_up_records_preempted(tiny_config, tmp_path, monkeypatch):
    import sparse_runner.run as run_module

    real_build = run_module.build_task

    def build(cfg):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_build(cfg)

    monkeypatch.setattr(run_module, "build_task", build)
    with pytest.raises(Preempted) as info:
        run(tiny_config(), tmp_path)
    assert info.value.step is None
    m = read_metrics(tmp_path)
    assert m["status"] == "preempted" and "SIGTERM" in m["error"]


def test_sigterm_after_the_last_evaluation_then_resume_completes(tiny_config, reference, tmp_path, monkeypatch):
    real_final = Trainer._final_test

    def final_test(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_final(self)

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "_final_test", final_test)
        with pytest.raises(Preempted):
            run(tiny_config(), tmp_path)
    assert read_metrics(tmp_path)["status"] == "preempted"
    run(tiny_config(), tmp_path)
    assert read_metrics(tmp_path)["status"] == "completed"
    assert read_metrics(tmp_path)["metrics"] == read_metrics(reference)["metrics"]


def test_a_signal_while_recording_the_end_still_completes(tiny_config, tmp_path, monkeypatch):
    import sparse_runner.run as run_module

    real_figures = run_module._figures

    def figures(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_figures(*args)

    monkeypatch.setattr(run_module, "_figures", figures)
    run(tiny_config(), tmp_path)
    assert read_metrics(tmp_path)["status"] == "completed"


def test_sigint_through_the_cli_checkpoints_without_a_traceback(tmp_path, cache_dir):
    args = [*TINY, "trainer.max_steps=400", "trainer.eval_every=10"]
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", *args],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob("outputs/runs/*/checkpoints/last.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    if read_metrics(run_dir)["status"] == "completed":
        pytest.skip("the run finished before SIGINT arrived")
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output and "stopped by SIGINT" in output
    assert read_metrics(run_dir)["status"] == "preempted"


# ------------------------------------------------------------------------------- refused before writing
@pytest.mark.parametrize("override, expected", [
    ("seed=-1", "seed: must be an integer in [0, 4294967295], got -1"),
    ("seed=99999999999", "seed: must be an integer in [0, 4294967295]"),
    ("trainer.device=cuda", "CUDA is not available"),
])
def test_refused_before_anything_is_written(tmp_path, cache_dir, override, expected):
    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if override == "seed=99999999999":  # the other end of seed=-1's check: from preflight, which the command line runs first
        with pytest.raises(ConfigError) as info:
            preflight([*TINY, override], multirun=False)
        assert expected in str(info.value) and "\n" not in str(info.value)
        return
    result = sparse_run([*TINY, override], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2
    assert expected in one_error_line(result)
    assert not (tmp_path / "outputs").exists()


def test_a_same_language_pair_is_refused_before_anything_is_written(tmp_path, cache_dir):
    result = sparse_run(["task=bible_es_en", "task.tgt_lang=es"], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2
    assert "src_lang and tgt_lang are both 'es'" in one_error_line(result)
    assert not (tmp_path / "outputs").exists()


def test_cfg_job_with_a_bad_option_is_one_line(tmp_path, cache_dir):
    result = sparse_run(["--cfg", "job", "model=nope"], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2
    assert "model=nope: no such model option; valid:" in one_error_line(result)


def test_unusable_directories_are_refused_in_one_line(tmp_path, cache_dir):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        ([f"paths.cache_dir={a_file}/cache"], "paths.cache_dir", "lies under"),
        ([f"hydra.run.dir={a_file}"], "hydra.run.dir", "is a file"),
        ([f"paths.output_dir={a_file}"], "paths.output_dir", "is a file"),
    ]
    # The first through the real command line; the others from `preflight`, the check that the command line
    # runs first and prints as its one line (exit status 2), in this process.
    for i, (overrides, key, problem) in enumerate(cases):
        if i == 0:
            result = sparse_run([*TINY, *overrides], cwd=tmp_path, cache_dir=cache_dir)
            assert result.returncode == 2, result.stderr
            line = one_error_line(result)
        else:
            with pytest.raises(ConfigError) as info:
                preflight([*TINY, *overrides], multirun=False)
            line = str(info.value)
            assert "\n" not in line, line
        assert key in line and problem in line, line
    assert a_file.read_text() == "x"


def test_a_read_only_cache_directory_is_named(tmp_path, monkeypatch):
    """A read-only file system (simulated: root may write anywhere else)."""
    import tempfile as tempfile_module

    from sparse_runner.cli import unusable_directory

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile_module, "TemporaryFile", read_only)
    assert unusable_directory(tmp_path / "cache") == f"cannot be created: {tmp_path} is not writable (Read-only file system)"


# --------------------------------------------------------------------------------- a read-only cache
# A shared cache mounted read-only: a run that finds its data there runs; one that must add to it stops
# at that write, in one line naming the file and the fix. Root writes anywhere whatever the file modes
# (chmod -R a-w denies it nothing), so the cache is made read-only by a read-only bind mount in a private
# mount namespace (unshare -m), where this machine allows it; test_a_cache_write_failure_* below
# simulates the same failure in-process everywhere.
READ_ONLY_CACHE = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
SMALL_DATA = ["task.generator.num_train=64", "task.generator.num_val=16", "task.generator.num_test=16", "trainer.max_steps=4",
              "trainer.eval_every=2", "trainer.analysis=false"]


def _read_only_mounts(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        result = subprocess.run(["unshare", "-m", "sh", "-c", READ_ONLY_CACHE, "sh", str(probe), "sh", "-c", f"! touch {probe}/x"],
                                capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and not (probe / "x").exists()


def sparse_run_read_only_cache(args: list[str], cwd: Path, cache_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    command = ["unshare", "-m", "sh", "-c", READ_ONLY_CACHE, "sh", str(cache_dir),
               sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_read_only_cache_serves_the_runs_it_holds_and_names_the_file_another_needs(tmp_path):
    if not _read_only_mounts(tmp_path):
        pytest.skip("no read-only bind mounts here (unshare -m / mount not permitted)")
    cache = tmp_path / "cache"
    run(validate(compose_config(SMALL_DATA, cache_dir=cache)), tmp_path / "filled")  # the cache filled once, writable (in-process)
    before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    assert before

    work = tmp_path / "work"
    work.mkdir()
    held = sparse_run_read_only_cache([*TINY, *SMALL_DATA, "seed=1"], cwd=work, cache_dir=cache)  # the same data
    assert held.returncode == 0, held.stderr
    (run_dir,) = (work / "outputs" / "runs").iterdir()
    assert read_metrics(run_dir)["status"] == "completed"

    other = tmp_path / "other"
    other.mkdir()
    result = sparse_run_read_only_cache([*TINY, *SMALL_DATA, "task.generator.num_train=65"], cwd=other, cache_dir=cache)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert f"paths.cache_dir: this run must write {cache}/listops/generated-" in line, line
    assert "Read-only file system" in line and "set SPARSE_RUNNER_CACHE or paths.cache_dir to a writable directory" in line, line
    runs = other / "outputs" / "runs"
    assert not list(other.rglob("metrics.json")) and not (runs.exists() and list(runs.iterdir()))
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == before


def test_a_cache_write_failure_is_named_and_leaves_nothing(tiny_config, tmp_path, monkeypatch):
    """The read-only cache simulated in-process: making a directory or a temporary file in it fails as on
    a read-only file system."""
    import tempfile as tempfile_module

    from sparse_runner.run import CacheNotWritable

    cache = tmp_path / "cache"
    cfg = tiny_config(*SMALL_DATA, f"paths.cache_dir={cache}")
    run(cfg, tmp_path / "filled")

    def refuse(real):
        def call(*args, **kwargs):
            where = Path(kwargs.get("dir") or args[0])
            if where == cache or cache in where.parents:
                raise OSError(30, "Read-only file system", str(where))
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(os, "mkdir", refuse(os.mkdir))
    monkeypatch.setattr(tempfile_module, "mkdtemp", refuse(tempfile_module.mkdtemp))
    monkeypatch.setattr(tempfile_module, "mkstemp", refuse(tempfile_module.mkstemp))
    run(tiny_config(*SMALL_DATA, f"paths.cache_dir={cache}", "seed=1"), tmp_path / "held")  # everything is there
    assert read_metrics(tmp_path / "held")["status"] == "completed"
    with pytest.raises(CacheNotWritable) as info:
        run(tiny_config(*SMALL_DATA, f"paths.cache_dir={cache}", "task.generator.num_train=65"), tmp_path / "needs")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"paths.cache_dir: this run must write {cache}/listops/generated-"), message
    assert not message.split("generated-")[1].split(",")[0].endswith(".tmp"), message  # the entry, not the temporary file
    assert not (tmp_path / "needs" / "metrics.json").exists()


def test_cache_write_errors_name_the_file_not_the_temporary_one(tmp_path):
    from sparse_runner.run import cache_not_writable

    cache = tmp_path / "cache"
    cases = {
        str(cache / "tokenizers" / ".0123abcd.k2j_x9q1.tmp"): f"must write {cache / 'tokenizers' / '0123abcd'},",
        str(cache / "debian" / ".download-ab12_x"): f"must write {cache / 'debian'},",
        str(cache / "listops"): f"must write {cache / 'listops'},",
    }
    for filename, expected in cases.items():
        assert expected in str(cache_not_writable(OSError(30, "Read-only file system", filename), str(cache)))
    assert cache_not_writable(OSError(30, "Read-only file system", str(tmp_path / "elsewhere")), str(cache)) is None
    assert cache_not_writable(OSError(28, "No space left on device", str(cache / "listops")), str(cache)) is None


# ----------------------------------------------------------------------------------------- empty splits
def test_an_empty_split_is_refused_for_every_task(tiny_config, tmp_path, monkeypatch):
    real_sizes = ListOpsTask.sizes
    monkeypatch.setattr(ListOpsTask, "sizes", lambda self: {**real_sizes(self), "test": 0})
    with pytest.raises(DataError, match="the test split is empty"):
        run(tiny_config(), tmp_path)
    assert not (tmp_path / "metrics.json").exists()


# ------------------------------------------------------------------------------------------- multirun
def test_jobs_differing_only_in_a_name_excluded_key_get_their_own_directories(tmp_path, cache_dir):
    result = sparse_run(["-m", *TINY, "trainer.max_steps=5", "trainer.eval_every=5", "trainer.log_every=5,3"], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr
    runs = [json.loads(p.read_text()) for p in (tmp_path / "outputs" / "multirun").glob("*/metrics.json")]
    assert sorted(m["config"]["trainer"]["log_every"] for m in runs) == [3, 5]
    assert all(m["status"] == "completed" for m in runs)


def test_a_multirun_job_refused_at_run_time_records_failed(tmp_path, cache_dir):
    header_only = tmp_path / "lra"
    header_only.mkdir()
    for split in ("basic_train", "basic_val", "basic_test"):
        rows = "" if split == "basic_test" else "".join(f"( [MAX 1 {i % 10} ] )\t{i % 10}\n" for i in range(40))
        (header_only / f"{split}.tsv").write_text("Source\tTarget\n" + rows)
    result = sparse_run(["-m", *TINY, "task=listops_lra", f"task.data_dir={header_only}", "trainer.max_steps=5", "seed=0,1"],
                        cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 1
    runs = [json.loads(p.read_text()) for p in (tmp_path / "outputs" / "multirun").glob("*/metrics.json")]
    assert len(runs) == 2 and all(m["status"] == "failed" and "basic_test" in m["error"] for m in runs), runs


# ------------------------------------------------------------------------------------- bad data files
# Every data file a run cannot use is refused like a bad option: one line naming the file, exit status 2,
# no run directory and no metrics.json left behind, whichever task reads it. The files are tiny and each
# run stops while its data load, before a model exists.
SMALL = [
    "model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.ffn_dim=64", "trainer.max_steps=4",
    "trainer.eval_every=2", "trainer.batch_size=4", "trainer.warmup_steps=1", "trainer.analysis=false",
    "trainer.progress=false", "trainer.num_threads=1",
]


def refused_for_its_data(tmp_path: Path, cache_dir: Path, *args: str) -> str:
    """Run `sparse-run args SMALL` in tmp_path/work; assert a one-line refusal that leaves nothing behind."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    result = sparse_run([*args, *SMALL], cwd=cwd, cache_dir=cache_dir)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert "run failed" not in line and "traceback in" not in line, line
    runs = cwd / "outputs" / "runs"
    assert not runs.exists() or not list(runs.iterdir()), list(runs.iterdir())
    assert not list(cwd.rglob("metrics.json"))
    return line


def refused_in_process(tmp_path: Path, cache_dir: Path, monkeypatch, *args: str) -> str:
    """The refusal of `refused_for_its_data` from `run` in this process, in tmp_path/work: a ConfigError (the
    DataError that the command line prints as its one line, exit status 2) in one line, and nothing of a run
    written. The command line's own part (that line, the status, no run directory kept) is the same for every
    file a task refuses; the first fault of each kind below (FAULTS_THROUGH_THE_CLI) checks it there."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cfg = validate(compose_config([*args, *SMALL], cache_dir=cache_dir, tiny=False))
    with pytest.raises(ConfigError) as info:
        run(cfg, cwd / "run")
    line = str(info.value)
    assert "\n" not in line and not isinstance(info.value, DirectoryInUse), line
    assert {p.name for p in (cwd / "run").iterdir()} <= {".lock"}, list((cwd / "run").iterdir())
    assert not list(cwd.rglob("metrics.json"))
    return line


# One fault of each kind runs through the real command line; the others, which differ only in what the task's
# reader finds wrong, run in-process (refused_in_process).
FAULTS_THROUGH_THE_CLI = {"cifar_runs_code", "label_2", "directory_named_txt", "latin1_line", "label_not_a_number"}


def refused(tmp_path: Path, cache_dir: Path, monkeypatch, fault: str, *args: str) -> str:
    if fault in FAULTS_THROUGH_THE_CLI:
        return refused_for_its_data(tmp_path, cache_dir, *args)
    return refused_in_process(tmp_path, cache_dir, monkeypatch, *args)


def idx_file(path: Path, array: np.ndarray, *, magic: int | None = None, gz: bool = True) -> None:
    data = struct.pack(f">I{array.ndim}I", 0x0800 | array.ndim if magic is None else magic, *array.shape) + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)


def idx_dataset(root: Path, n_train: int = 10, n_test: int = 4) -> Path:
    """MNIST's layout: {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz."""
    root.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        idx_file(root / f"{prefix}-images-idx3-ubyte.gz", np.full((n, 28, 28), 7))
        idx_file(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


def cifar_batches(root: Path, per_batch: int = 4) -> Path:
    """CIFAR-10's python version: data_batch_1..5 and test_batch, pickled dicts of b"data" and b"labels"."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), b"labels": rng.integers(0, 10, per_batch).tolist()}
        (root / name).write_bytes(pickle.dumps(batch, protocol=2))
    return root


class _RunsCode:
    """What a crafted batch holds instead of pixels: unpickling it calls os.system."""

    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def _truncate(path: Path, keep: int) -> None:
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:keep], mtime=0))


def _damage_gzip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[12:40] = b"\xff" * 28  # inside the deflate stream: zlib's "Error -3 while decompressing data"
    path.write_bytes(bytes(raw))


IMAGE_FAULTS = {
    # name: (format, how the files are spoiled, what the line must say)
    "idx_truncated": ("idx", lambda d: _truncate(d / "train-images-idx3-ubyte.gz", 16 + 5 * 784 + 3), "train-images-idx3-ubyte.gz: 3923 data bytes for shape (10, 28, 28)"),
    "idx_wrong_magic": ("idx", lambda d: idx_file(d / "t10k-labels-idx1-ubyte.gz", np.zeros((4, 28, 28))), "t10k-labels-idx1-ubyte.gz: not an IDX labels file (magic 0x00000803"),
    "idx_count_mismatch": ("idx", lambda d: idx_file(d / "t10k-labels-idx1-ubyte.gz", np.arange(3)), "4 test images but 3 labels"),
    "idx_empty": ("idx", lambda d: (d / "train-labels-idx1-ubyte.gz").write_bytes(b""), "train-labels-idx1-ubyte.gz: the file is empty"),
    "idx_damaged_gzip": ("idx", lambda d: _damage_gzip(d / "train-images-idx3-ubyte.gz"), "train-images-idx3-ubyte.gz: cannot read (Error -3 while decompressing data"),
    "idx_missing": ("idx", lambda d: (d / "t10k-images-idx3-ubyte.gz").unlink(), "no t10k-images-idx3-ubyte[.gz] in"),
    "cifar_garbage": ("cifar10", lambda d: (d / "data_batch_3").write_bytes(b"not a pickle"), "data_batch_3: not a CIFAR-10 batch (UnpicklingError"),
    "cifar_missing_test_batch": ("cifar10", lambda d: (d / "test_batch").unlink(), "missing test_batch (expected the CIFAR-10 python version"),
    "cifar_runs_code": ("cifar10", lambda d: (d / "data_batch_2").write_bytes(pickle.dumps({b"data": _RunsCode(), b"labels": [1]})),
                        "data_batch_2: not a CIFAR-10 batch (UnpicklingError: it refers to posix.system"),
}


@pytest.mark.parametrize("fault", list(IMAGE_FAULTS))
def test_a_bad_image_file_is_refused_in_one_line(tmp_path, cache_dir, monkeypatch, fault):
    file_format, spoil, expected = IMAGE_FAULTS[fault]
    data = idx_dataset(tmp_path / "data") if file_format == "idx" else cifar_batches(tmp_path / "data")
    spoil(data)
    line = refused(tmp_path, cache_dir, monkeypatch, fault, "task=lra_image", "task.source=files", f"task.file_format={file_format}", f"task.data_dir={data}")
    assert expected in line, line
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()  # nothing of the crafted batch ran


def pathfinder_release(root: Path, n: int = 6) -> Path:
    """LRA's Pathfinder layout: curv_contour_length_14/metadata/0.npy (text lines) and imgs/0/sample_<i>.png."""
    from PIL import Image

    base = root / "curv_contour_length_14"
    (base / "imgs" / "0").mkdir(parents=True)
    (base / "metadata").mkdir()
    rows = []
    for i in range(n):
        Image.fromarray(np.full((32, 32), 40 * i, np.uint8)).save(base / "imgs" / "0" / f"sample_{i}.png")
        rows.append(f"imgs/0 sample_{i}.png {i} {i % 2} 1.0 14 4 2 0.5 1 1\n")
    (base / "metadata" / "0.npy").write_text("".join(rows))
    return root


def _edit_line(path: Path, number: int, old: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[number - 1] = lines[number - 1].replace(old, new)
    path.write_text("".join(lines))


def _small_png(path: Path) -> None:
    from PIL import Image

    Image.fromarray(np.zeros((16, 16), np.uint8)).save(path)


PATHFINDER_FAULTS = {
    "label_2": (lambda b: _edit_line(b / "metadata" / "0.npy", 3, " 2 0 ", " 2 2 "), "metadata/0.npy:3: expected '<subfolder> <file> <index> <label 0/1> ...'"),
    "too_few_fields": (lambda b: _edit_line(b / "metadata" / "0.npy", 2, " 1 1.0 14 4 2 0.5 1 1", ""), "metadata/0.npy:2: expected '<subfolder> <file> <index> <label 0/1> ...'"),
    "missing_image": (lambda b: (b / "imgs" / "0" / "sample_4.png").unlink(), "metadata/0.npy:5: cannot read image"),
    "not_an_image": (lambda b: (b / "imgs" / "0" / "sample_1.png").write_text("not a png"), "metadata/0.npy:2: cannot read image"),
    "16x16_image": (lambda b: _small_png(b / "imgs" / "0" / "sample_0.png"), "sample_0.png: 16x16 image, expected 32x32"),
    "binary_metadata": (lambda b: (b / "metadata" / "0.npy").write_bytes(b"\xff\xfe\x00\x01" * 8), "metadata/0.npy: neither a text metadata file nor a .npy array"),
    "no_metadata": (lambda b: (b / "metadata" / "0.npy").unlink(), "no metadata/*.npy found"),
}


@pytest.mark.parametrize("fault", list(PATHFINDER_FAULTS))
def test_a_bad_pathfinder_release_is_refused_in_one_line(tmp_path, cache_dir, monkeypatch, fault):
    spoil, expected = PATHFINDER_FAULTS[fault]
    root = pathfinder_release(tmp_path / "pathfinder32")
    spoil(root / "curv_contour_length_14")
    line = refused(tmp_path, cache_dir, monkeypatch, fault, "task=pathfinder", f"task.data_dir={root}")
    assert expected in line, line


def class_folders(root: Path) -> Path:
    """aclImdb's layout: {train,test}/{neg,pos}/*.txt."""
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            (root / split / label).mkdir(parents=True)
            for i in range(3):
                (root / split / label / f"{i}_1.txt").write_text(f"a {label} review {i}")
    return root


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


TEXT_FAULTS = {
    "directory_named_txt": (lambda r: (r / "train" / "pos" / "x.txt").mkdir(), "train/pos/x.txt is a directory, not a text file"),
    "no_train_folder": (lambda r: _rmtree(r / "train"), "has no train/ folder"),
}


@pytest.mark.parametrize("fault", list(TEXT_FAULTS))
def test_bad_lra_text_files_are_refused_in_one_line(tmp_path, cache_dir, monkeypatch, fault):
    spoil, expected = TEXT_FAULTS[fault]
    root = class_folders(tmp_path / "imdb")
    spoil(root)
    line = refused(tmp_path, cache_dir, monkeypatch, fault, "task=lra_text", "task.source=files", f"task.data_dir={root}", "task.max_length=64")
    assert expected in line, line


LM_FAULTS = {
    "latin1_line": (lambda r: (r / "valid.txt").write_bytes("one line\ntwo lines\nun caf\u00e9 noir\n".encode("latin-1")),
                    "valid.txt:3: not valid UTF-8 (invalid continuation byte at byte 6)"),
    "binary_file": (lambda r: (r / "train.txt").write_bytes(gzip.compress(b"some text\n" * 50, mtime=0)), "train.txt:1: not valid UTF-8"),
    "nul_bytes": (lambda r: (r / "test.txt").write_bytes(b"text\n\x00\x00\x00\x00\n"), "test.txt:2: holds NUL bytes: a binary file, not text"),
    "empty_train": (lambda r: (r / "train.txt").write_text("\n  \n"), "train.txt holds no text (no non-empty line)"),
}


@pytest.mark.parametrize("fault", list(LM_FAULTS))
def test_bad_lm_text_files_are_refused_in_one_line(tmp_path, cache_dir, monkeypatch, fault):
    spoil, expected = LM_FAULTS[fault]
    root = tmp_path / "corpus"
    root.mkdir()
    for name in ("train", "valid", "test"):
        (root / f"{name}.txt").write_text("".join(f"line {i} of the {name} text\n" for i in range(5)))
    spoil(root)
    line = refused(tmp_path, cache_dir, monkeypatch, fault, "task=lm_files", f"task.data_dir={root}", "task.block_size=16")
    assert expected in line and "task.vocab_size" not in line, line


def aan_files(root: Path) -> Path:
    """LRA Retrieval's release: new_aan_pairs.{train,eval,test}.tsv, label, id1, id2, text1, text2 per line."""
    root.mkdir()
    for name in ("train", "eval", "test"):
        (root / f"new_aan_pairs.{name}.tsv").write_text("".join(f"{i % 2}.0\tP{i}a\tP{i}b\tpaper {i}\tcited {i}\n" for i in range(6)))
    return root


AAN_FAULTS = {
    "label_not_a_number": (lambda r: (r / "new_aan_pairs.eval.tsv").open("a").write("one\tPa\tPb\tx\ty\n"), "new_aan_pairs.eval.tsv:7: label 'one' is not a number"),
    "not_utf8": (lambda r: (r / "new_aan_pairs.test.tsv").write_bytes(b"1\ta\tb\tcaf\xe9\tx\n"), "new_aan_pairs.test.tsv:1: not valid UTF-8"),
}


@pytest.mark.parametrize("fault", list(AAN_FAULTS))
def test_bad_lra_retrieval_files_are_refused_in_one_line(tmp_path, cache_dir, monkeypatch, fault):
    spoil, expected = AAN_FAULTS[fault]
    root = aan_files(tmp_path / "aan")
    spoil(root)
    line = refused(tmp_path, cache_dir, monkeypatch, fault, "task=lra_retrieval", "task.source=files", f"task.data_dir={root}", "task.max_length=32")
    assert expected in line, line


def test_each_kind_of_bad_file_has_one_fault_through_the_cli():
    kinds = (IMAGE_FAULTS, PATHFINDER_FAULTS, TEXT_FAULTS, LM_FAULTS, AAN_FAULTS)
    assert [len(FAULTS_THROUGH_THE_CLI & set(kind)) for kind in kinds] == [1] * len(kinds)
