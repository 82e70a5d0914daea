"""scripts/bench_kernel_passes.py: it counts the Triton kernel's passes, tile reads and visited tiles under the
interpreter.

The counts are deterministic (no timing), so they can be held to what the solver and the tile skipping promise:
Halley's steps (1.5-entmax's own formulas) take fewer passes than Newton's on the same rows, and on local scores
the forward's later passes and the backward visit only the diagonal band of tiles.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import importlib.util

import pytest

# Not imported here: test_triton_attention.py must be the first to import triton (with TRITON_INTERPRET=1).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_kernel_passes.py"


def test_counts_passes_and_visited_tiles(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--lengths", "128", "--spreads", "1", "--rows", "entmax15,entmax15_general",
           "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = json.loads((tmp_path / "kernel_passes.json").read_text())["cells"]
    random, local = "random x1 N=128", "local x1 N=128"
    halley, newton = cells["entmax15"], cells["entmax15_general"]
    for case in (random, local):
        assert 3 <= halley[case]["passes"] < newton[case]["passes"] <= 2 + 40
    assert halley[random]["tiles_visited"] == newton[random]["tiles_visited"] == 1.0
    assert halley[random]["reads"] == halley[random]["passes"]  # every tile holds weight: none skipped
    # local scores: bands of 32 positions, tiles of 64 queries x 32 keys: 2 of the 4 key tiles per query tile.
    # The max pass and the first solver pass read all 4; the first drops the 2 others for every later pass.
    for row in (halley, newton):
        assert row[local]["tiles_visited"] == pytest.approx(0.5)
        assert row[local]["reads"] == pytest.approx(2 + 0.5 * (row[local]["passes"] - 2))
    assert "| 1.5-entmax, its own formulas (Halley) |" in (tmp_path / "kernel_passes.md").read_text()


def test_bad_rows_are_one_line():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rows", "entmax16"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown rows or scores ['entmax16']" in proc.stderr


@pytest.mark.slow  # compiles nine kernels for sm_90 (~20-60 s on 2 cores)
def test_the_specialised_modes_have_few_special_function_instructions(tmp_path):
    """1.5-entmax and sparsemax's builds hold a fraction of the general build's MUFU instructions in every
    kernel (the general one evaluates log and exp per score), and the same tensor-core work."""
    pytest.importorskip("triton.backends.nvidia")
    cmd = [sys.executable, str(SCRIPT), "--lengths", "64", "--spreads", "1", "--rows", "entmax15", "--scores", "random",
           "--sass", "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=SCRIPT.parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    sass = json.loads((tmp_path / "kernel_passes.json").read_text())["sass"]
    for kernel, by_mode in sass.items():
        for mode in ("15", "20"):
            assert by_mode[mode]["mufu"] * 3 < by_mode["0"]["mufu"], (kernel, by_mode)
            assert by_mode[mode]["mma"] == by_mode["0"]["mma"], (kernel, by_mode)
