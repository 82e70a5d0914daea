"""Smoke test of scripts/bench_block_sparse.py: its --quick mode writes the JSON and the markdown.

No assertion on timings (the machine is shared and noisy); only on the report's structure.
"""

from __future__ import annotations

import pytest

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_block_sparse.py"
ROWS = ["dense_sdpa", "hf_bigbird", "hst_softmax", "hst_alpha_entmax"]


@pytest.mark.slow  # about a minute or less, but the default suite must stay near 10 minutes on 2 cores
def test_quick_run_writes_json_and_markdown(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--lengths", "128,256", "--rows", ",".join(ROWS),
           "--max-dense-length", "128", "--out-dir", str(out), "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]

    result = json.loads((out / "block_sparse.json").read_text())
    assert result["meta"]["lengths"] == [128, 256]
    assert list(result["meta"]["rows"]) == ROWS
    assert result["meta"]["allocator"].startswith("glibc with MALLOC_MMAP_THRESHOLD_")  # the script re-executed itself
    for n in ("128", "256"):
        timings = result["timings"][n]
        assert set(timings) == set(ROWS)
        # HF BigBird is skipped at these lengths (it needs N > 704), with or without transformers; so is
        # dense above --max-dense-length; every skipped cell says why.
        assert "skipped" in timings["hf_bigbird"] and timings["hf_bigbird"]["skipped"]
        for row in ("hst_softmax", "hst_alpha_entmax"):
            assert timings[row]["fwd_bwd_ms"] > 0
            assert timings[row]["positions"] == int(n) + int(n) // 64  # one representative per block
            assert result["memory"][n][row]["peak_mib"] >= 0
    assert result["timings"]["128"]["dense_sdpa"]["positions"] == 128
    assert "max-dense-length" in result["timings"]["256"]["dense_sdpa"]["skipped"]
    assert "x_dense_sdpa" in result["timings"]["128"]["hst_softmax"]
    assert "x_dense_sdpa" not in result["timings"]["256"]["hst_softmax"]  # no dense baseline at 256
    assert {t["name"].split(" (")[0] for t in result["targets"]} >= {"dense SDPA / HST softmax at 4096"}

    md = (out / "block_sparse.md").read_text()
    assert "| row | 128 ms | x dense | MiB | 256 ms | x dense | MiB |" in md
    assert "ours hst softmax" in md and "skipped (" in md and "## Targets" in md


def test_device_arguments():
    from tests.conftest import load_bench_script

    bench = load_bench_script(SCRIPT)
    args = bench.parse_args(["--device", "cuda"])
    assert args.lengths == [4096, 16384, 65536] and args.rows == list(bench.DEVICE_ROWS)
    assert {"bigbird_softmax_flex", "hst_softmax_flex", "local_softmax_flex"} <= set(args.rows)
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cuda", "--rows", "hst_alpha_entmax"])  # a CPU row: refused, naming the valid ones


def test_device_table_on_cpu_puts_the_engines_side_by_side(tmp_path):
    """The GPU table's code path at a small length on the CPU: the tile rows measured with their ratio to dense
    SDPA, the flex rows n/a (no backward on CPU), the targets read from the cells, JSON and markdown written."""
    import torch

    from tests.conftest import load_bench_script

    bench = load_bench_script(SCRIPT)
    args = bench.parse_args(["--device", "cuda", "--lengths", "256", "--rows", "dense_sdpa,bigbird_softmax,bigbird_softmax_flex,hst_softmax,hst_softmax_block63",
                             "--repeats", "3", "--cell-seconds", "0.01", "--out-dir", str(tmp_path)])
    result = bench.device_table(args, torch.device("cpu"))
    cells = result["cells"]["256"]
    assert cells["hst_softmax_block63"]["positions"] == 5 * 64  # the probe: 5 blocks of 63 tokens, tiles of 64
    assert cells["dense_sdpa"]["x_dense_sdpa"] == 1.0 and len(cells["dense_sdpa"]["calls_ms"]) >= 3
    assert cells["bigbird_softmax"]["fwd_bwd_ms"] > 0 and cells["hst_softmax"]["positions"] == 256 + 256 // 64
    assert cells["bigbird_softmax_flex"] == {"na": "FlexAttention has no backward on CPU"}
    engines = [r for r in bench.DEVICE_ROWS if r.startswith(("bigbird_", "hst_")) and r not in bench.PROBE_ROWS]  # tiles, flex, compiled ...
    assert [t["value"] for t in result["targets"]] == [None] * 3 * len(engines)  # no target length measured
    md = (tmp_path / "block_sparse_cpu.md").read_text()
    assert "| row | N=256 | first call | memory |" in md and "| BigBird softmax, FlexAttention | n/a (FlexAttention has no backward on CPU) | | |" in md
    assert "| BigBird softmax, FlexAttention / dense SDPA at 65536 (target <= 0.1) | n/a | n/a |" in md
    assert json.loads((tmp_path / "block_sparse_cpu.json").read_text())["meta"]["lengths"] == [256]


@pytest.mark.slow  # torch.compile's first call on the CPU: ~15 s
def test_device_table_compiled_rows_run_the_layer_through_torch_compile(tmp_path):
    import torch

    from tests.conftest import load_bench_script

    bench = load_bench_script(SCRIPT)
    args = bench.parse_args(["--device", "cuda", "--lengths", "128", "--rows", "hst_softmax,hst_softmax_compiled",
                             "--repeats", "3", "--cell-seconds", "0.01", "--out-dir", str(tmp_path)])
    cells = bench.device_table(args, torch.device("cpu"))["cells"]["128"]
    assert cells["hst_softmax_compiled"]["fwd_bwd_ms"] > 0 and cells["hst_softmax_compiled"]["positions"] == cells["hst_softmax"]["positions"]
    assert cells["hst_softmax_compiled"]["warmup_s"] > cells["hst_softmax"]["warmup_s"]  # the compilation
