"""sparse-report reads a run's metrics.json, .hydra/ configs and log.jsonl only as regular files inside the run
folder, under a size limit (reporting/run_files.py): a link to a private file, a FIFO or /dev/zero is named
unreadable, never read, and never stops the report. Figures are tested in test_report_output.py."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main, run_files
from sparse_runner.reporting.curves import read_log
from test_report import write_run

SECRET = "TOP-SECRET-42"


def _no_hang(call, timeout_s: float = 30.0):
    """`call()`'s result; fails (instead of hanging the suite) when it has not returned in `timeout_s`."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(timeout_s)
    assert not worker.is_alive(), "the report waited on a file that never ends"
    return result[0]


def _secret_json(tmp_path: Path) -> Path:
    secret = tmp_path / "private.json"
    secret.write_text(json.dumps({"status": "completed", "task": SECRET, "token": SECRET}))
    return secret


def test_a_metrics_json_linked_out_of_the_run_is_not_read(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "outputs" / "runs" / "linked")
    (run / "metrics.json").unlink()
    (run / "metrics.json").symlink_to(_secret_json(tmp_path))
    (record,) = collect_runs([tmp_path / "outputs"])
    assert record.status == "unreadable" and record.data == {}
    assert "outside the run folder" in capsys.readouterr().err
    assert main([str(tmp_path / "outputs"), "--print", "none"]) == 0
    report = tmp_path / "outputs" / "report"
    assert all(SECRET not in path.read_text(errors="replace") for path in report.rglob("*") if path.is_file())


@pytest.mark.parametrize("name", ["metrics.json", ".hydra/config.yaml", "log.jsonl"])
def test_a_fifo_in_place_of_a_run_file_never_stops_the_report(tmp_path: Path, name: str, capsys) -> None:
    run = write_run(tmp_path / "outputs" / "runs" / "fifo")
    target = run / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    assert _no_hang(lambda: main([str(tmp_path / "outputs"), "--print", "none"])) == 0
    assert "FIFO" in capsys.readouterr().err


def test_a_hydra_config_linked_to_dev_zero_is_named_not_read(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "outputs" / "runs" / "zero")
    (run / "metrics.json").unlink()
    (run / ".hydra" / "config.yaml").symlink_to("/dev/zero")
    (record,) = _no_hang(lambda: collect_runs([tmp_path / "outputs"]))
    assert record.status == "not started"
    assert "config.yaml: cannot read (a link to a file outside the run folder)" in capsys.readouterr().err


def test_a_log_linked_out_of_the_run_draws_no_curve(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "outputs" / "runs" / "log")
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps({"step": 1, "train/loss": 1.0}) + "\n")
    (run / "log.jsonl").symlink_to(outside)
    assert read_log(run / "log.jsonl", ("train/loss",)) == {"train/loss": {}}
    assert "outside the run folder" in capsys.readouterr().err


def test_read_bytes_refuses_a_file_over_its_limit_and_reads_a_link_inside_the_folder(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(run_files.NotShown, match="over the limit"):
        run_files.read_bytes(tmp_path / "big", tmp_path, limit=100)
    (tmp_path / "alias").symlink_to(tmp_path / "big")
    assert run_files.read_bytes(tmp_path / "alias", tmp_path, limit=200) == b"x" * 101
