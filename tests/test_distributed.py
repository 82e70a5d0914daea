"""torchrun on CPU (gloo): 2 processes train as 1 does, resume exactly after a rank is killed, and on
another number of processes.

trainer.batch_size is the global batch, split across the ranks: `torchrun --nproc_per_node=2 ... 
trainer.batch_size=2B` is 2 processes x B examples, the same data in the same order as 1 process x 2B.
Dropout is off here: with it, each rank draws its own masks, so the two can only agree in distribution.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY

DDP = TINY + [
    "trainer.max_steps=50",
    "trainer.eval_every=25",
    "trainer.batch_size=16",
    "trainer.log_every=10",  # checkpoints (every 25) fall inside a log window: a resume must carry it
    "trainer.analysis=false",
    "model.dropout=0.0",
]


def launch(args: list[str], cwd: Path, cache_dir: Path, nproc: int, **popen) -> subprocess.Popen:
    """`torchrun --standalone --nproc_per_node=N -m sparse_runner.cli ARGS` (1 process: without torchrun)."""
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    runner = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
    return subprocess.Popen([*runner, "-m", "sparse_runner.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = proc.communicate(timeout=timeout)
    return output


def run_dir(out: Path) -> Path:
    (directory,) = (out / "runs").iterdir()
    return directory


def metrics(directory: Path) -> dict:
    return json.loads((directory / "metrics.json").read_text())


def losses(directory: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (directory / "log.jsonl").read_text().splitlines()]
    return {line["step"]: line["train/loss"] for line in lines if "train/loss" in line}


def train(tmp_path: Path, cache_dir: Path, name: str, nproc: int, *extra: str) -> Path:
    out = tmp_path / name
    output = finish(launch([*DDP, *extra, f"paths.output_dir={out}"], tmp_path, cache_dir, nproc))
    directory = run_dir(out)
    assert metrics(directory)["status"] == "completed", output[-3000:]
    return directory


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, cache_dir) -> Path:
    return train(tmp_path_factory.mktemp("ddp"), cache_dir, "two", 2)


def test_two_processes_follow_the_one_process_loss_trajectory(two_processes, tmp_path, cache_dir):
    one = train(tmp_path, cache_dir, "one", 1)
    assert metrics(two_processes)["world_size"] == 2 and metrics(one)["world_size"] == 1
    two_losses, one_losses = losses(two_processes), losses(one)
    assert sorted(two_losses) == sorted(one_losses) == list(range(10, 51, 10))
    for step, loss in one_losses.items():
        assert two_losses[step] == pytest.approx(loss, rel=1e-4, abs=1e-5), step
    # The same tokens were seen, and both models end in the same place.
    assert metrics(two_processes)["tokens_seen"] == metrics(one)["tokens_seen"]
    for name, value in metrics(one)["metrics"].items():
        assert metrics(two_processes)["metrics"][name] == pytest.approx(value, rel=1e-3, abs=1e-4), name
    # Rank 0 alone writes: one log, one copy of Hydra's files, no per-rank leftovers.
    assert len((two_processes / "log.jsonl").read_text().splitlines()) == len((one / "log.jsonl").read_text().splitlines())


def _child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _rank_pid(torchrun_pid: int, rank: int) -> int | None:
    for pid in _child_pids(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    return None


def signal_rank_after_first_checkpoint(args, out: Path, tmp_path: Path, cache_dir: Path, sig: int) -> tuple[subprocess.Popen, str]:
    """Launch 2 processes, send `sig` to rank 1 once the first checkpoint exists; wait for the end."""
    proc = launch(args, tmp_path, cache_dir, 2)
    deadline = time.time() + 240
    while not list(out.glob("runs/*/checkpoints/last.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    victim = _rank_pid(proc.pid, 1)
    assert victim is not None and proc.poll() is None, "the run ended before the first checkpoint"
    os.kill(victim, sig)
    return proc, finish(proc)


def test_kill_9_of_one_rank_then_the_same_command_resumes_exactly(two_processes, tmp_path, cache_dir):
    out = tmp_path / "killed"
    args = [*DDP, f"paths.output_dir={out}"]
    proc, output = signal_rank_after_first_checkpoint(args, out, tmp_path, cache_dir, signal.SIGKILL)
    assert proc.returncode != 0, output[-3000:]
    directory = run_dir(out)
    assert metrics(directory)["status"] != "completed"
    again = finish(launch(args, tmp_path, cache_dir, 2))
    assert metrics(directory)["status"] == "completed", again[-3000:]
    assert "resuming" in again
    assert metrics(directory)["metrics"] == metrics(two_processes)["metrics"]
    # The step log goes on as if never stopped (the loss window in the checkpoint is that of all ranks).
    resumed, uninterrupted = losses(directory), losses(two_processes)
    assert resumed.keys() == uninterrupted.keys()
    assert all(resumed[step] == pytest.approx(loss, rel=1e-6) for step, loss in uninterrupted.items())


def test_sigterm_stops_every_rank_then_one_process_resumes(two_processes, tmp_path, cache_dir):
    """SIGTERM to one rank stops both at the same step with one checkpoint; a single process finishes it."""
    out = tmp_path / "stopped"
    args = [*DDP, f"paths.output_dir={out}"]
    proc, output = signal_rank_after_first_checkpoint(args, out, tmp_path, cache_dir, signal.SIGTERM)
    directory = run_dir(out)
    if metrics(directory)["status"] == "completed":
        pytest.skip("the run finished before SIGTERM arrived")
    assert proc.returncode == 0, output[-3000:]
    assert metrics(directory)["status"] == "preempted"
    assert "Traceback" not in output
    import torch

    saved = torch.load(directory / "checkpoints/last.pt", weights_only=True)
    assert saved["progress"]["step"] == metrics(directory)["step"]
    assert len(saved["rng_ranks"]) == 2
    again = finish(launch(args, tmp_path, cache_dir, 1))
    assert metrics(directory)["status"] == "completed", again[-3000:]
    assert "re-seeded" in again
    for name, value in metrics(two_processes)["metrics"].items():
        assert metrics(directory)["metrics"][name] == pytest.approx(value, rel=1e-3, abs=1e-4), name


@pytest.mark.slow  # about a minute or less, but the default suite must stay near 10 minutes on 2 cores
def test_a_token_level_loss_is_weighted_by_tokens_across_ranks(tmp_path, cache_dir):
    """Translation's loss is a mean over target tokens, and the ranks' halves of a batch hold different
    numbers of them: weighted by their token shares, 2 processes still compute the 1-process loss."""
    mt = ["experiment=mt_cpu", "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "model.num_layers=1", "model.dropout=0.0",
          "task.max_train_pairs=2000", "trainer.batch_tokens=1024", "trainer.max_steps=20", "trainer.eval_every=20", "trainer.log_every=5",
          "trainer.analysis=false", "trainer.eval_max_batches=2", "trainer.progress=false", "trainer.num_threads=1"]
    directories = {}
    for nproc in (1, 2):
        out = tmp_path / f"n{nproc}"
        output = finish(launch([*mt, f"paths.output_dir={out}"], tmp_path, cache_dir, nproc))
        directories[nproc] = run_dir(out)
        assert metrics(directories[nproc])["status"] == "completed", output[-3000:]
    one, two = losses(directories[1]), losses(directories[2])
    assert sorted(one) == sorted(two) == [5, 10, 15, 20]
    assert all(two[step] == pytest.approx(loss, rel=1e-5) for step, loss in one.items()), (one, two)


def test_threads_the_process_group_starts_never_take_a_stop_signal():
    """A stop signal landing on one of gloo's threads could end the rank with SIGABRT at exit; the threads that
    `init_process_group` starts block them, and the main thread still takes them."""
    import threading

    from sparse_runner.training.stopping import STOP_SIGNALS, blocked_in_new_threads

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen = {}
    with blocked_in_new_threads():
        worker = threading.Thread(target=lambda: seen.update(mask=signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        worker.start()
        worker.join()
    assert set(STOP_SIGNALS) <= seen["mask"]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert not set(STOP_SIGNALS) & before
