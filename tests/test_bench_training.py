"""scripts/bench_training.py: a short run of softmax against alpha-entmax on the tiny model writes the JSON and the
markdown table, with one ratio per model and the target verdict where the preset has one.

No assertion on timings (the machine is shared and noisy); only on the report's structure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import TINY, load_bench_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_training.py"
OVERRIDES = [o for o in TINY if not o.startswith(("trainer.max_steps=", "trainer.eval_every=", "trainer.num_threads="))]


def test_writes_ratios_to_softmax_per_experiment(tmp_path, cache_dir):
    out = tmp_path / "bench"
    cmd = [sys.executable, str(SCRIPT), "--experiments", "lra_listops_cpu", "--models", "entmax", "--steps", "2",
           "--rounds", "2", "--threads", "1", "--out", str(out), "--overrides", *OVERRIDES]
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    result = json.loads((out / "training.json").read_text())
    assert result["steps"] == 2 and result["rounds"] == 2 and result["overrides"] == OVERRIDES
    (experiment,) = result["experiments"]
    assert experiment["experiment"] == "lra_listops_cpu" and experiment["target_x_softmax"] is None
    rows = {row["model"]: row for row in experiment["rows"]}
    assert list(rows) == ["softmax", "entmax"]
    for row in rows.values():
        assert len(row["rounds"]) == 2 and all(tps > 0 for tps in row["rounds"])
        assert abs(row["x_softmax"] - row["tokens_per_s"] / rows["softmax"]["tokens_per_s"]) < 1e-9
    assert rows["softmax"]["x_softmax"] == 1.0

    table = (out / "training.md").read_text()
    assert "| lra_listops_cpu | entmax |" in table


def load_script():
    return load_bench_script(SCRIPT)


def test_device_defaults_are_the_gpu_table():
    bench = load_script()
    gpu = bench.parse_args(["--device", "cuda"])
    assert (gpu.experiments, gpu.steps, gpu.overrides) == ("lra_listops", 20, bench.GPU_OVERRIDES)
    assert gpu.models.split(",") == ["softmax", "bigbird", "ernie_sparse", "entmax15", "entmax", "ernie_sparse+trainer.compile=true",
                                      "entmax+trainer.compile=true"]
    cpu = bench.parse_args([])
    assert (cpu.device, cpu.experiments, cpu.models, cpu.steps, cpu.overrides) == ("cpu", "lra_text_4k_cpu,lra_text_cpu,mt_cpu", "entmax", 10, [])


def test_device_table_runs_on_cpu_with_peak_memory_and_failed_cells(tmp_path, cache_dir, monkeypatch):
    """The GPU table's code path at a tiny size on the CPU: rows per model, ratios to softmax, and a model that
    runs out of memory is a cell, not the end of the run."""
    import torch

    bench = load_script()
    import benchmarking

    measure = benchmarking.measure_training

    def measure_or_oom(cfg, task, device, warmup, steps):
        if cfg.model.normaliser == "sparsemax":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 GiB")
        return measure(cfg, task, device, warmup, steps)

    monkeypatch.setattr(benchmarking, "measure_training", measure_or_oom)
    args = bench.parse_args(["--experiments", "lra_listops_cpu", "--steps", "2", "--warmup", "1", "--out", str(tmp_path), "--overrides", *OVERRIDES])
    result = bench.device_table(args, ["softmax", "entmax", "sparsemax"], torch.device("cpu"))
    rows = {row["model"]: row for row in result["experiments"][0]["rows"]}
    assert rows["softmax"]["x_first"] == 1.0 and rows["entmax"]["tokens_per_s"] > 0 and rows["entmax"]["seconds_per_step"] > 0
    assert rows["entmax"]["steps"] == 2 and rows["entmax"]["warmup"] == 1 and rows["entmax"]["peak_mib"] is None  # measured on CUDA only
    assert rows["sparsemax"] == {"model": "sparsemax", "failed": "n/a (out of memory)"}
    assert json.loads((tmp_path / "training_cpu.json").read_text())["meta"]["device"] == "cpu"
    table = (tmp_path / "training_cpu.md").read_text()
    assert "| lra_listops_cpu | sparsemax | n/a (out of memory) |" in table and "| lra_listops_cpu | entmax |" in table


def test_a_model_row_takes_overrides_after_a_plus(cache_dir):
    """"ernie_sparse+trainer.compile=true" is ERNIE-Sparse run through torch.compile, as the trainer runs it."""
    from sparse_runner.tasks import build_task

    load_script()  # puts scripts/ on sys.path, where benchmarking.py is
    import benchmarking

    assert benchmarking.model_overrides("entmax") == ["model=entmax"]
    assert benchmarking.model_overrides("ernie_sparse+trainer.compile=true+trainer.lr=0.01") == [
        "model=ernie_sparse", "trainer.compile=true", "trainer.lr=0.01"]
    cfg = benchmarking.compose_run_config(["experiment=lra_listops_cpu", *benchmarking.model_overrides("hst+trainer.compile=true"), *OVERRIDES])
    loop = benchmarking.MinimalTraining(cfg, build_task(cfg))
    assert loop.step_model.model is loop.model and loop.step_model.compiled._orig_mod is loop.model  # torch.compile's wrapper


def test_trainer_compile_takes_true_or_a_mode_of_torch_compile(monkeypatch):
    """trainer.compile: false (the model itself), true (torch.compile's default mode) or a mode by name, e.g.
    reduce-overhead (CUDA graphs), which preflight accepts."""
    import torch

    from sparse_runner.cli import preflight
    from sparse_runner.training.trainer import compile_step

    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or "compiled")
    model = torch.nn.Linear(2, 2)
    assert compile_step(model, False) is model
    assert compile_step(model, True).compiled == "compiled" and compile_step(model, "reduce-overhead").compiled == "compiled"
    assert modes == [None, "reduce-overhead"]
    preflight(["experiment=lra_listops_cpu", "trainer.compile=reduce-overhead", *OVERRIDES], multirun=False)


def test_a_compiled_cpu_row_keeps_one_loop_across_rounds(monkeypatch, cache_dir):
    """A fresh torch.compile every round would compile inside the timing: a compiled row builds one loop, trains
    once untimed over the round's batches, then replays those same batches every round."""
    import torch

    load_script()
    import benchmarking

    monkeypatch.setattr(torch, "compile", lambda model, mode=None: model)  # the bookkeeping, not Inductor, is tested
    built, batches = [], []
    original_init, original_step = benchmarking.MinimalTraining.__init__, benchmarking.MinimalTraining.step

    def init(self, cfg, task, device="cpu"):
        built.append(cfg.trainer.compile)
        original_init(self, cfg, task, device)

    def step(self):
        if self.trainer.compile:
            batches.append((self.epoch, self.index))
        return original_step(self)

    monkeypatch.setattr(benchmarking.MinimalTraining, "__init__", init)
    monkeypatch.setattr(benchmarking.MinimalTraining, "step", step)
    rows = benchmarking.training_throughput(["softmax", "entmax+trainer.compile=true"], 2, 3, ["experiment=lra_listops_cpu", *OVERRIDES])
    assert built.count(True) == 1 and built.count(False) == 1 + 3  # the warm-up, then softmax every round
    assert batches == [(0, 0), (0, 1)] * 4  # untimed once, then each of the 3 rounds on the same two batches
    assert len(rows[1]["rounds"]) == 3
