"""Smoke tests of scripts/bench_long_attention.py: its --quick mode writes the JSON and the markdown, a memory
child that cannot allocate under its RLIMIT_AS records the failure, and the targets read the cells.

No assertion on timings (the machine is shared and noisy); only on the report's structure.
"""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import load_bench_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_long_attention.py"
ROWS = ["sdpa_softmax", "explicit_alpha_entmax", "memeff_alpha_entmax"]


def load_script():
    return load_bench_script(SCRIPT)


@pytest.mark.slow  # about a minute or less, but the default suite must stay near 10 minutes on 2 cores
def test_quick_run_writes_json_and_markdown(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--lengths", "128,256", "--rows", ",".join(ROWS),
           "--max-explicit-length", "128", "--out-dir", str(out), "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]

    result = json.loads((out / "long_attention.json").read_text())
    meta = result["meta"]
    assert result["benchmark"] == "long_attention"
    assert meta["lengths"] == [128, 256] and list(meta["rows"]) == ROWS and meta["baseline"] == "sdpa_softmax"
    assert meta["allocator"].startswith("glibc with MALLOC_MMAP_THRESHOLD_")  # the script re-executed itself
    assert meta["memory_limit_gib"] == 20.0 and meta["attempt_memory"] == ["explicit_alpha_entmax"]
    assert meta["git"]["head"] and "command" in meta and len(meta["loadavg"]) == 2
    for n in ("128", "256"):
        timings, memory = result["timings"][n], result["memory"][n]
        assert set(timings) == set(ROWS)
        for row in ("sdpa_softmax", "memeff_alpha_entmax"):
            assert timings[row]["fwd_bwd_ms"] > 0 and timings[row]["positions"] == int(n)
            assert "x_sdpa" in timings[row]
            assert memory[row]["peak_mib"] >= 0 and memory[row]["limit_gib"] == 20.0
        # The warm-up's forward counted key blocks on the memory-efficient path only.
        blocks = timings["memeff_alpha_entmax"]["key_blocks"]
        assert blocks["total"] > 0 and 0 <= blocks["fraction_skipped"] <= 1
        assert "key_blocks" not in timings["sdpa_softmax"]
    assert result["timings"]["128"]["explicit_alpha_entmax"]["fwd_bwd_ms"] > 0
    # Above --max-explicit-length: not timed, with the reason; its memory child is still attempted.
    assert "max-explicit-length" in result["timings"]["256"]["explicit_alpha_entmax"]["skipped"]
    assert result["memory"]["256"]["explicit_alpha_entmax"]["peak_mib"] >= 0
    names = [t["name"] for t in result["targets"]]
    assert len(names) == 9 and all(t["met"] is None for t in result["targets"])  # no 512+ lengths in a smoke run
    assert any("16384" in name and "explicit" in name for name in names)

    md = (out / "long_attention.md").read_text()
    assert "| row | 128 ms | x SDPA | MiB | 256 ms | x SDPA | MiB |" in md
    for heading in ("## Time, ratio to SDPA softmax, peak memory", "## Key blocks skipped", "## Targets", "## Meta"):
        assert heading in md
    assert "softmax, PyTorch SDPA (baseline)" in md and "skipped (" in md and "RLIMIT_AS 20 GiB" in md


def test_memory_child_records_allocation_failure():
    # A limit below the interpreter's own address space: the first tensor of the layer cannot be allocated.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}
    cmd = [sys.executable, str(SCRIPT), "--memory-child", "explicit_alpha_entmax", "128", "--threads", "1", "--memory-limit-gib", "0.01"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cell = json.loads(proc.stdout.strip().splitlines()[-1])
    assert cell["failed"].startswith("cannot allocate") and "peak_mib" not in cell
    assert cell["limit_gib"] == 0.01 and cell["vm_size_mib_at_start"] > 0


def test_targets_read_the_cells():
    bench = load_script()
    results = {str(n): {"sdpa_softmax": {"fwd_bwd_ms": 100.0}, "memeff_alpha_entmax": {"fwd_bwd_ms": t}}
               for n, t in ((4096, 150.0), (8192, 250.0))}
    memory = {
        "4096": {"sdpa_softmax": {"peak_mib": 40.0}, "memeff_alpha_entmax": {"peak_mib": 60.0}},
        "8192": {"sdpa_softmax": {"peak_mib": 80.0}, "memeff_alpha_entmax": {"peak_mib": 200.0}},
        "16384": {"memeff_alpha_entmax": {"peak_mib": 300.0},
                  "explicit_alpha_entmax": {"failed": "cannot allocate: you tried to allocate 8589934592 bytes"}},
    }
    results["512"] = {"sdpa_softmax": {"fwd_bwd_ms": 10.0}, "cpp_alpha_entmax": {"fwd_bwd_ms": 25.0}}
    results["4096"]["cpp_alpha_entmax"] = {"fwd_bwd_ms": 120.0}
    t = bench.targets(results, memory, 20.0)
    assert [e["met"] for e in t] == [True, True, False, False, True, True, False, None, True]
    assert t[6]["value"] == 2.5 and t[8]["value"] == 1.2 and "fused C++ alpha_entmax" in t[8]["name"]
    assert t[0]["value"] == 1.5 and t[3]["value"] == 2.5 and t[4]["value"] == 300.0
    assert "cannot allocate" in t[5]["detail"]

    memory["16384"]["explicit_alpha_entmax"] = {"peak_mib": 19000.0}  # it fit: the target is missed
    memory["16384"]["memeff_alpha_entmax"] = {"error": "timed out after 900 s"}
    t = bench.targets(results, memory, 20.0)
    assert t[4]["met"] is False and t[5]["met"] is False
    memory["16384"]["explicit_alpha_entmax"] = {"error": "timed out after 900 s"}  # undecided
    assert bench.targets(results, memory, 20.0)[5]["met"] is None

    md = "\n".join(bench.markdown(
        {"rounds": 1, "min_run_time": 0.1, "memory_limit_gib": 20.0, "cpu": "cpu", "threads": 2, "torch": "x",
         "entmax_backend": "cpp", "allocator": "glibc", "memory_allocator": {}, "loadavg": {}, "seconds": 0,
         "git": {"head": "", "attention_files_modified": []}, "command": "python"},
        results, memory, ["sdpa_softmax", "memeff_alpha_entmax"], [4096, 8192], t))
    assert "| time: memory-efficient alpha_entmax / SDPA softmax at 4096 (target <= 2) | 1.50 | yes |" in md
    assert "| peak memory: memory-efficient alpha_entmax / SDPA softmax at 8192 (target <= 2) | 2.50 | **NO** |" in md


def test_device_arguments():
    bench = load_script()
    args = bench.parse_args(["--device", "cuda"])
    assert args.shapes == [(1024, 16), (4096, 4), (16384, 1), (65536, 1)] and args.rows == list(bench.GPU_ROWS)
    assert args.max_explicit_length == 4096
    cpu = bench.parse_args([])
    assert cpu.device == "cpu" and cpu.rows == list(bench.ROWS) and cpu.max_explicit_length == 8192
    with pytest.raises(ValueError, match="expected comma-separated N:B"):
        bench.parse_shapes("1024")


def test_device_table_on_cpu_makes_every_failure_a_cell(tmp_path, monkeypatch):
    """The GPU table's code path at a tiny shape on the CPU: measured rows have a median and a ratio to SDPA;
    a missing peer, a row above its length cap and an out-of-memory error are cells "n/a (reason)"."""
    import torch

    bench = load_script()
    build = bench.build_device_case

    def build_or_oom(row, n, batch, device, seed=0):
        if row == "hst_softmax":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 136.00 GiB")
        return build(row, n, batch, device, seed)

    monkeypatch.setattr(bench, "build_device_case", build_or_oom)
    rows = "sdpa_softmax,triton_alpha_entmax,explicit_alpha_entmax,hst_softmax,bigbird_softmax,projections"
    args = bench.parse_args(["--device", "cuda", "--rows", rows, "--shapes", "64:2,128:1", "--max-explicit-length", "64",
                             "--repeats", "3", "--cell-seconds", "0.01", "--out-dir", str(tmp_path)])
    result = bench.device_table(args, torch.device("cpu"))
    small, large = result["cells"]["64x2"], result["cells"]["128x1"]
    assert small["sdpa_softmax"]["x_sdpa"] == 1.0 and len(small["sdpa_softmax"]["calls_ms"]) >= 3
    assert small["explicit_alpha_entmax"]["fwd_bwd_ms"] > 0 and small["explicit_alpha_entmax"]["peak_mib"] is None  # CUDA only
    assert small["bigbird_softmax"]["fwd_bwd_ms"] > 0 and "x_sdpa" in small["projections"]
    assert small["triton_alpha_entmax"] == {"na": "needs CUDA"}
    assert large["explicit_alpha_entmax"] == {"na": "N > --max-explicit-length 64"}
    assert small["hst_softmax"] == {"na": "out of memory"}
    md = (tmp_path / "long_attention_cpu.md").read_text()
    assert "| row | N=64, B=2 | memory | N=128, B=1 | memory |" in md
    assert "| Triton alpha-entmax, learned alpha | n/a (needs CUDA) | |" in md and "| HST softmax | n/a (out of memory) | |" in md
    assert json.loads((tmp_path / "long_attention_cpu.json").read_text())["meta"]["shapes"] == [[64, 2], [128, 1]]


def test_kernel_settings_rows_change_one_kernel_constant_for_their_calls_only():
    """Each lever row names a GPU row and a constant the Triton kernel reads at each call; inside the block it
    has the row's value, and the kernel's default is back after it (an error inside the block included)."""
    bench = load_script()
    from sparse_runner.attention.kernels import entmax_attention_triton as kernel

    for row, values in bench.KERNEL_SETTINGS.items():
        assert row in bench.GPU_ROWS and bench.GPU_ROWS[row][3] == "triton"
        for name, value in values.items():
            default = getattr(kernel, name)
            assert isinstance(default, bool) and value != default
            with pytest.raises(RuntimeError):
                with bench.kernel_settings({name: value}):
                    assert getattr(kernel, name) == value
                    raise RuntimeError("inside")
            assert getattr(kernel, name) == default
