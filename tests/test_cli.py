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

from sparse_runner.reporting import main as report_main
from sparse_runner.tasks import listops_data
from tests.conftest import TINY, sparse_run

LONGER = TINY + ["trainer.max_steps=120", "trainer.eval_every=10", "trainer.log_every=10"]


def metrics_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def test_kill_9_then_same_command_gives_identical_metrics(tmp_path, cache_dir):
    reference = sparse_run(LONGER + [f"paths.output_dir={tmp_path / 'a'}"], cwd=tmp_path, cache_dir=cache_dir)
    assert reference.returncode == 0, reference.stderr
    (ref_dir,) = (tmp_path / "a" / "runs").iterdir()

    args = LONGER + [f"paths.output_dir={tmp_path / 'b'}"]
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", *args],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not list((tmp_path / "b").glob("runs/*/checkpoints/last.pt")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 0.5))  # somewhere after the first checkpoint: mid-step, mid-write...
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run_dir,) = (tmp_path / "b" / "runs").iterdir()
    assert ref_dir.name == run_dir.name  # the run directory is a function of the command

    again = sparse_run(args, cwd=tmp_path, cache_dir=cache_dir)
    assert again.returncode == 0, again.stderr
    assert metrics_of(run_dir)["metrics"] == metrics_of(ref_dir)["metrics"]
    assert not list(run_dir.rglob("*.tmp")), "a temporary file was left behind"


def _official_files(folder: Path, *, broken: bool = False) -> Path:
    folder.mkdir(parents=True)
    rows = listops_data.generate_examples(200, min_length=5, max_length=40, max_depth=6, max_args=5, seed=3)
    for split, part in (("train", rows[:120]), ("val", rows[120:160]), ("test", rows[160:])):
        listops_data.write_tsv(folder / f"basic_{split}.tsv", part)
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
