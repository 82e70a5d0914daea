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

from tests.conftest import TINY

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_training.py"
OVERRIDES = [o for o in TINY if not o.startswith(("trainer.max_steps=", "trainer.eval_every=", "trainer.num_threads="))]


def test_writes_ratios_to_softmax_per_experiment(tmp_path, cache_dir):
    out = tmp_path / "bench"
    cmd = [sys.executable, str(SCRIPT), "--experiments", "lra_listops_cpu", "--models", "entmax,sparsemax", "--steps", "2",
           "--rounds", "2", "--threads", "1", "--out", str(out), "--overrides", *OVERRIDES]
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    result = json.loads((out / "training.json").read_text())
    assert result["steps"] == 2 and result["rounds"] == 2 and result["overrides"] == OVERRIDES
    (experiment,) = result["experiments"]
    assert experiment["experiment"] == "lra_listops_cpu" and experiment["target_x_softmax"] is None
    rows = {row["model"]: row for row in experiment["rows"]}
    assert list(rows) == ["softmax", "entmax", "sparsemax"]
    for row in rows.values():
        assert len(row["rounds"]) == 2 and all(tps > 0 for tps in row["rounds"])
        assert abs(row["x_softmax"] - row["tokens_per_s"] / rows["softmax"]["tokens_per_s"]) < 1e-9
    assert rows["softmax"]["x_softmax"] == 1.0

    table = (out / "training.md").read_text()
    assert "| lra_listops_cpu | entmax |" in table and "| lra_listops_cpu | sparsemax |" in table
