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
    assert lines[-1].endswith("ETA 0m00s")


def test_progress_lines_are_rate_limited():
    shown = []
    lines = ProgressLines(every_s=3600, max_steps=100, first_step=0)
    lines._log = type("L", (), {"info": lambda self, *args: shown.append(args)})()
    values = {"train/loss": 1.0, "train/lr": 1e-3, "train/tokens_per_s": 10.0}
    for step in range(10, 101, 10):
        lines.maybe_show(step, values)
    assert [args[1] for args in shown] == [100]  # within the hour only the last step, which always shows


def test_the_step_log_is_on_disk_before_the_first_evaluation(tiny_config, tmp_path):
    seen = {}

    def look():
        path = Path(tmp_path) / "log.jsonl"
        seen["steps"] = [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []

    with pytest.MonkeyPatch.context() as patch:
        on_train_batch(patch, ListOpsTask, 23, look)  # before step 23; the first evaluation is at step 30
        run(tiny_config("trainer.eval_every=30"), tmp_path)
    assert seen["steps"] == [5, 10, 15, 20]
