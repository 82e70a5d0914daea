"""scripts/bench_presets.py: which presets it measures, a tiny measured run on the CPU (seconds per step, hours of
the full preset), a pre-training stage added to the total, and presets it cannot measure here as rows that say why.

No assertion on timings (the machine is shared and noisy); only on the report's structure and its arithmetic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import load_bench_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_presets.py"
# lra_listops shrunk to seconds on the CPU: its model, its generated data and its batch.
TINY_LISTOPS = ["task.generator.num_train=64", "task.generator.num_val=16", "task.generator.num_test=16", "task.generator.min_length=10",
                "task.generator.max_length=40", "task.max_length=40", "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64",
                "trainer.batch_size=4"]


def load_script():
    return load_bench_script(SCRIPT)


def test_paper_presets_leave_out_cpu_presets_and_studies():
    presets = load_script().paper_presets()
    assert {"lra_listops", "lra_text", "liu2022_sotu_era", "correia2019_wmt14_en_de", "transformer_base"} <= set(presets)
    assert not [p for p in presets if p.endswith("_cpu") or "study" in p]


def test_tiny_run_measures_seconds_per_step_and_hours(tmp_path, cache_dir):
    bench = load_script()
    result = bench.main(["--presets", "lra_listops", "--steps", "2", "--warmup", "1", "--out", str(tmp_path), "--overrides", *TINY_LISTOPS])
    (listops,) = result["presets"]
    (stage,) = listops["stages"]
    assert stage["stage"] == "run" and stage["steps"] == 2 and stage["warmup"] == 1 and stage["max_steps"] == 5000
    assert stage["seconds_per_step"] > 0 and stage["gpu_hours"] == pytest.approx(5000 * stage["seconds_per_step"] / 3600)
    assert listops["gpu_hours"] == stage["gpu_hours"] and stage["data"].startswith("generated")
    assert json.loads((tmp_path / "presets_cpu.json").read_text())["presets"][0]["preset"] == "lra_listops"
    assert "| lra_listops | softmax | run | generated, 64 training examples | 4 | fp32 |" in (tmp_path / "presets_cpu.md").read_text()

    # Its AAN files are not on this machine (task.data_dir is unset): a row that says so, not the end of the run.
    (retrieval,) = bench.main(["--presets", "lra_retrieval", "--out", str(tmp_path)])["presets"]
    assert retrieval["preset"] == "lra_retrieval" and "task.data_dir" in retrieval["not_measured"]
    assert "| lra_retrieval | | | | | | not measured (ConfigError: task.data_dir" in (tmp_path / "presets_cpu.md").read_text()


def test_pretraining_stage_is_added_and_missing_data_is_named(monkeypatch):
    bench = load_script()
    measured = {"mlm_long_sotu": 2.0, "sotu_era": 0.5}

    def fake_stage(cfg, device, warmup, steps):
        seconds = measured.get(cfg.task.name)
        if seconds is None:
            return {"max_steps": cfg.trainer.max_steps, "not_measured": "needs sotu"}
        return {"max_steps": cfg.trainer.max_steps, "seconds_per_step": seconds, "gpu_hours": cfg.trainer.max_steps * seconds / 3600}

    monkeypatch.setattr(bench, "measure_stage", fake_stage)
    row = bench.measure_preset("liu2022_sotu_era", "cpu", 0, 1, [])
    assert [s["stage"] for s in row["stages"]] == ["pre-training", "run"]
    pre, run = row["stages"]
    assert pre["max_steps"] == 3000 and row["gpu_hours"] == pytest.approx(3000 * 2.0 / 3600 + run["max_steps"] * 0.5 / 3600)
    del measured["sotu_era"]
    assert bench.measure_preset("liu2022_sotu_era", "cpu", 0, 1, [])["gpu_hours"] is None  # a stage unmeasured: no total


def test_data_not_on_this_machine_is_a_row_not_a_crash(monkeypatch, cache_dir):
    import sparse_runner.tasks
    from sparse_runner.data.errors import DataUnavailable

    def unavailable(cfg):
        raise DataUnavailable("task lra_text: cannot download stanfordnlp/imdb from the Hugging Face hub (offline?)")

    monkeypatch.setattr(sparse_runner.tasks, "build_task", unavailable)
    bench = load_script()
    cfg = load_script_config(["experiment=lra_text"])
    stage = bench.measure_stage(cfg, "cpu", 0, 1)
    assert stage["not_measured"] == "needs stanfordnlp/imdb" and "offline?" in stage["reason"] and "gpu_hours" not in stage


def load_script_config(overrides):
    import benchmarking

    return benchmarking.compose_run_config(overrides)


@pytest.mark.parametrize("script, out_flag", [("bench_presets.py", "--out"), ("bench_training.py", "--out"),
                                              ("bench_long_attention.py", "--out-dir")])
def test_refuses_an_unavailable_device_in_one_line(tmp_path, script, out_flag):
    """Every GPU-capable bench script refuses a device this machine lacks in one line (benchmarking.require_device)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    path = SCRIPT.parent / script
    proc = subprocess.run([sys.executable, str(path), "--device", "cuda", out_flag, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=SCRIPT.parents[1])
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: --device cuda: torch ") and "valid here: --device cpu" in line

def test_unknown_preset_is_refused_with_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(["--presets", "lra_listopz"])
    err = capsys.readouterr().err
    assert "unknown presets ['lra_listopz']; paper presets: " in err and "lra_listops" in err
