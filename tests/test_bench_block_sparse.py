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
