"""scripts/bench_scaling.py: a short run at 1 and 2 processes (gloo, CPU) writes the JSON and the markdown
table, both process counts train on the same global batches; and its pieces (refusals, medians, speed-up).

No assertion on timings (the machine is shared and noisy); only on the report's structure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_scaling.py"
# The tiny model and data; the script sets steps, evaluation and threads itself.
OVERRIDES = [o for o in TINY if not o.startswith(("trainer.max_steps=", "trainer.eval_every=", "trainer.num_threads="))]


def load_script():
    spec = importlib.util.spec_from_file_location("bench_scaling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: nothing runs
    return module


@pytest.mark.slow  # about a minute or less, but the default suite must stay near 10 minutes on 2 cores
def test_one_and_two_processes_write_json_and_markdown(tmp_path, cache_dir):
    out = tmp_path / "bench"
    cmd = [sys.executable, str(SCRIPT), "--nprocs", "1,2", "--max-steps", "10", "--threads", "1", "--out", str(out),
           "--overrides", *OVERRIDES]
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    result = json.loads((out / "bench_scaling.json").read_text())
    assert result["benchmark"] == "scaling" and result["device"] == "cpu"
    assert result["nprocs"] == [1, 2] and result["max_steps"] == 10 and result["repeats"] == 1
    assert result["global_batch"] == "16 sequences" and result["overrides"] == OVERRIDES
    assert result["machine"]["cores"] >= 1 and isinstance(result["seconds"], float)
    points = {p["nprocs"]: p for p in result["points"]}
    assert set(points) == {1, 2}
    for n, point in points.items():
        assert point["threads"] == 1
        (run,) = point["runs"]
        assert run["status"] == "completed" and run["world_size"] == n and run["returncode"] == 0, run
        assert run["step"] == 10 and isinstance(run["tokens_per_second"], float) and isinstance(run["window_tokens_per_s"], float)
        assert run["device"] == "cpu" and len(run["loadavg"]) == 2
        assert ("torch.distributed.run" in run["command"]) == (n > 1)
        assert f"--nproc_per_node={n}" in run["command"] or n == 1
        assert (Path(run["run_dir"]) / "metrics.json").exists()
    # The same global batches: both process counts saw the same tokens.
    assert points[1]["runs"][0]["tokens_seen"] == points[2]["runs"][0]["tokens_seen"]
    summary = {row["nprocs"]: row for row in result["summary"]}
    assert summary[1]["speedup"] == 1.0 and summary[1]["efficiency"] == 1.0
    assert summary[2]["speedup"] > 0 and summary[2]["efficiency"] == pytest.approx(summary[2]["speedup"] / 2)
    assert summary[2]["median_tokens_per_s"] == points[2]["runs"][0]["tokens_per_second"]

    md = (out / "bench_scaling.md").read_text()
    assert md.startswith("| processes | threads/process | tokens/s (median) | log windows tokens/s (median) | speed-up vs 1 process | scaling efficiency | device | runs completed |")
    table = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[0] for line in table] == ["| 1", "| 2"]
    assert table[0].split(" | ")[4:6] == ["1.00", "1.00"] and "| cpu | 1/1 |" in table[1]
    assert "FAILED" not in md and "load average" in md
    assert md.strip() in proc.stdout  # the table is printed too


def test_refusals_are_one_line_with_status_2(tmp_path, capsys):
    bench = load_script()
    for argv, message in (
        (["--nprocs", "1,x"], "expected comma-separated process counts"),
        (["--nprocs", "0,2"], "must be >= 1"),
        (["--nprocs", "2,2"], "repeated"),
        (["--repeats", "0"], "must be >= 1"),
    ):
        assert bench.main([*argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("bench_scaling: ") and message in err and "\n" not in err, err
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert bench.main(["--device", "cuda", "--nprocs", f"{gpus + 1}", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    expected = f"{gpus + 1} processes need {gpus + 1} GPUs (one each), this machine has {gpus}" if gpus else "sees no CUDA device"
    assert expected in err and "\n" not in err, err
    assert not list(tmp_path.iterdir())  # refused before anything ran


def test_pieces_threads_windows_and_summary(tmp_path):
    bench = load_script()
    assert bench.parse_nprocs("2,1") == [1, 2]
    assert [bench.threads_per_process(n, 2, None) for n in (1, 2, 4)] == [2, 1, 1]
    assert bench.threads_per_process(2, 16, None) == 8 and bench.threads_per_process(2, 16, 3) == 3
    assert bench.launcher(1) == [sys.executable]
    assert bench.launcher(4)[-2:] == ["--standalone", "--nproc_per_node=4"]
    overrides = bench.run_overrides(["experiment=x"], "cuda", 100, 4, tmp_path, ["trainer.log_every=7"])
    assert overrides[0] == "experiment=x" and overrides[-1] == "trainer.log_every=7"  # the user's last: it wins
    assert {"trainer.max_steps=100", "trainer.eval_every=100", "trainer.device=cuda", "trainer.num_threads=4",
            "trainer.resume=false", "trainer.analysis=false", f"paths.output_dir={tmp_path}"} <= set(overrides)

    log = tmp_path / "log.jsonl"
    rows = [{"step": 5, "train/tokens_per_s": 10.0}, {"step": 5, "val/loss": 1.0}, {"step": 10, "train/tokens_per_s": 100.0},
            {"step": 15, "train/tokens_per_s": 300.0}, {"step": 20, "train/tokens_per_s": 200.0}]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert bench.window_median(log) == 200.0  # the first window (warm-up) left out
    log.write_text(json.dumps(rows[0]) + "\n")
    assert bench.window_median(log) == 10.0  # a single window is all there is
    assert bench.window_median(tmp_path / "missing.jsonl") is None
    assert bench.read_run(tmp_path / "nothing")["status"] == "missing"

    def run(tps, status="completed"):
        return {"status": status, "tokens_per_second": tps, "window_tokens_per_s": tps, "device": "cpu"}

    points = [{"nprocs": 2, "threads": 4, "runs": [run(100.0), run(300.0), run(200.0)]},
              {"nprocs": 4, "threads": 2, "runs": [run(300.0), run(None, "failed")]},
              {"nprocs": 8, "threads": 1, "runs": [run(None, "failed")]}]
    rows = bench.summarise(points)
    assert [r["median_tokens_per_s"] for r in rows] == [200.0, 300.0, None]
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] == 1.5 and rows[1]["efficiency"] == 0.75  # against 2 processes
    assert rows[1]["completed"] == 1 and rows[1]["runs"] == 2 and rows[2]["speedup"] is None
    result = {"summary": rows, "points": [{**p, "runs": [{**r, "loadavg": [1.0, 1.1]} for r in p["runs"]]} for p in points],
              "device": "cpu", "config": [], "max_steps": 5, "global_batch": None, "repeats": 3, "seconds": 1.0,
              "machine": {"cores": 16, "cpu": "x", "torch": "t"}}
    md = bench.markdown(result)
    assert "speed-up vs 2 processes" in md[0] and "| 4 | 2 | 300 | 300 | 1.50 | 0.75 | cpu | 1/2 |" in md
    assert "| 8 | 1 | — | — | — | — | cpu | 0/1 |" in md
    assert sum(line.startswith("FAILED: ") for line in md) == 2
