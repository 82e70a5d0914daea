"""scripts/bench_report.py on a few generated runs: the runs it writes are read as the trainer's are (every
status it draws, seeds grouped), and it writes its JSON and markdown. No assertion on timings."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_report.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: nothing runs
    return module


def test_generated_runs_are_read_like_real_ones(tmp_path: Path) -> None:
    bench = load_script()
    bench.write_runs(tmp_path, 48)
    records = collect_runs([tmp_path])
    assert len(records) == 48
    assert {rec.status for rec in records} >= {"completed", "failed"}
    assert {rec.task for rec in records} == {"listops"} and all(rec.label for rec in records)
    finished = [rec for rec in records if rec.status == "completed"]
    assert all(len((rec.path / "log.jsonl").read_text().splitlines()) == 208 for rec in finished)


@pytest.mark.slow  # a new process composing the presets and drawing: tens of seconds on a busy machine
def test_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "24", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads((out / "report_scaling.json").read_text())
    assert result["runs"] == 24 and result["report_s"] > 0 and result["report_html_bytes"] > 10_000
    assert set(result["phases_s"]) == {"collect_runs", "paper_tables_and_figures", "runs_tables", "learning_curves"}
    assert "sparse-report over 24 generated runs" in (out / "report_scaling.md").read_text()
