"""The real command line: a run killed with -9 and started again, a multirun with a failing job, the report."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparse_runner.data import listops_files, listops_generator
from sparse_runner.reporting import main as report_main
from tests.conftest import TINY, sparse_run

LONGER = TINY + ["trainer.max_steps=120", "trainer.eval_every=10", "trainer.log_every=10"]


def metrics_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, cache_dir) -> Path:
    """An uninterrupted run of LONGER through the real command line."""
    root = tmp_path_factory.mktemp("reference")
    result = sparse_run(LONGER + [f"paths.output_dir={root / 'out'}"], cwd=root, cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (root / "out" / "runs").iterdir()
    return run_dir


def _start_and_interrupt(args: list[str], tmp_path: Path, cache_dir: Path, sig: signal.Signals) -> subprocess.Popen:
    """Start `sparse-run args`, wait for its first checkpoint, then a random moment, then send `sig`."""
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.time() + 120
    while not list(tmp_path.glob("out/runs/*/checkpoints/last.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 0.5))  # somewhere after the first checkpoint: mid-step, mid-write...
    proc.send_signal(sig)
    proc.wait(timeout=120)
    return proc


def test_kill_9_then_same_command_gives_identical_metrics(reference_run, tmp_path, cache_dir):
    args = LONGER + [f"paths.output_dir={tmp_path / 'out'}"]
    _start_and_interrupt(args, tmp_path, cache_dir, signal.SIGKILL)
    (run_dir,) = (tmp_path / "out" / "runs").iterdir()
    assert run_dir.name == reference_run.name  # the run directory is a function of the command

    again = sparse_run(args, cwd=tmp_path, cache_dir=cache_dir)
    assert again.returncode == 0, again.stderr
    assert metrics_of(run_dir)["metrics"] == metrics_of(reference_run)["metrics"]
    assert not list(run_dir.rglob("*.tmp")), "a temporary file was left behind"


def test_sigterm_checkpoints_exits_0_and_resumes(reference_run, tmp_path, cache_dir):
    args = LONGER + [f"paths.output_dir={tmp_path / 'out'}"]
    proc = _start_and_interrupt(args, tmp_path, cache_dir, signal.SIGTERM)
    output = proc.stdout.read()
    (run_dir,) = (tmp_path / "out" / "runs").iterdir()
    if proc.returncode == 0 and metrics_of(run_dir)["status"] == "completed":
        pytest.skip("the run finished before SIGTERM arrived")  # a very fast machine
    assert proc.returncode == 0, output
    assert "Traceback" not in output and "stopped by SIGTERM" in output
    assert metrics_of(run_dir)["status"] == "preempted"
    again = sparse_run(args, cwd=tmp_path, cache_dir=cache_dir)
    assert again.returncode == 0, again.stderr
    assert metrics_of(run_dir)["metrics"] == metrics_of(reference_run)["metrics"]


def _official_files(folder: Path, *, broken: bool = False) -> Path:
    folder.mkdir(parents=True)
    rows = listops_generator.generate_examples(200, min_length=5, max_length=40, max_depth=6, max_args=5, seed=3)
    for split, part in (("train", rows[:120]), ("val", rows[120:160]), ("test", rows[160:])):
        listops_files.write_tsv(folder / f"basic_{split}.tsv", part)
    if broken:
        with open(folder / "basic_train.tsv", "a") as handle:
            handle.write("this line has no label\n")
    return folder


def test_multirun_records_a_failed_job_and_goes_on(tmp_path, cache_dir):
    good = _official_files(tmp_path / "good")
    bad = _official_files(tmp_path / "bad", broken=True)
    result = sparse_run(
        ["-m", *TINY, "trainer.max_steps=10", f"task.data_dir={good},{bad}", "model.num_heads=2,4"],
        cwd=tmp_path, cache_dir=cache_dir,
    )
    assert result.returncode == 1, result.stderr
    assert "2 job(s) failed" in result.stderr
    runs = {p.parent.name: metrics_of(p.parent) for p in (tmp_path / "outputs" / "multirun").glob("*/metrics.json")}
    assert len(runs) == 4
    statuses = sorted(m["status"] for m in runs.values())
    assert statuses == ["completed", "completed", "failed", "failed"]
    failed = [m for m in runs.values() if m["status"] == "failed"]
    assert all("basic_train.tsv" in m["error"] and str(bad) in m["config"]["task"]["data_dir"] for m in failed)

    out = tmp_path / "report"
    assert report_main([str(tmp_path / "outputs"), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "model.num_heads" in text and "failed" in text and "36.37" in text


def test_default_command_fits_the_embedded_default(tmp_path, cache_dir):
    """`sparse-run --cfg job` shows the composed default without running anything."""
    result = sparse_run(["--cfg", "job"], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr
    assert "name: listops" in result.stdout and "normaliser: softmax" in result.stdout
    assert not (tmp_path / "outputs").exists()
