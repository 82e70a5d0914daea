"""Progress when nobody watches a terminal: plain progress lines, and a step log that `tail -f` follows."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from sparse_runner.run import run
from sparse_runner.tasks.listops import ListOpsTask
from sparse_runner.training.run_log import ProgressLines
from tests.conftest import on_train_batch


def test_without_a_bar_a_progress_line_reports_step_loss_throughput_and_eta(tiny_config, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="sparse_runner.progress"):
        run(tiny_config("trainer.progress=false", "trainer.progress_every_s=null"), tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "sparse_runner.progress"]
    assert [int(re.match(r"step (\d+)/30", line).group(1)) for line in lines] == [5, 10, 15, 20, 25, 30]
    assert all(re.search(r"\| loss \d+\.\d{4} \| lr [\d.e+-]+ \| \d+ tokens/s \| ETA \d+m\d\ds$", line) for line in lines), lines


def test_progress_lines_are_rate_limited_and_estimate_the_rest(caplog):
    """A made-up clock: 10 s per step, a line at most every 60 s."""
    now = {"t": 0.0}
    lines = ProgressLines(every_s=60, max_steps=100, first_step=0, clock=lambda: now["t"])
    values = {"train/loss": 1.0, "train/lr": 1e-3, "train/tokens_per_s": 10.0}
    with caplog.at_level(logging.INFO, logger="sparse_runner.progress"):
        for step in range(2, 101, 2):
            now["t"] = 10.0 * step
            lines.maybe_show(step, values)
    shown = [r.getMessage() for r in caplog.records if r.name == "sparse_runner.progress"]
    assert [int(re.match(r"step (\d+)/", m).group(1)) for m in shown] == [6, 12, 18, 24, 30, 36, 42, 48, 54, 60, 66, 72, 78, 84, 90, 96, 100]
    assert shown[0].endswith("ETA 15m40s")  # 94 steps left at 10 s each
    assert shown[-1].endswith("ETA 0m00s")


def test_the_step_log_is_on_disk_before_the_first_evaluation(tiny_config, tmp_path):
    seen = {}

    def look():
        path = Path(tmp_path) / "log.jsonl"
        seen["steps"] = [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []

    with pytest.MonkeyPatch.context() as patch:
        on_train_batch(patch, ListOpsTask, 23, look)  # before step 23; the first evaluation is at step 30
        run(tiny_config("trainer.eval_every=30"), tmp_path)
    assert seen["steps"] == [5, 10, 15, 20]
