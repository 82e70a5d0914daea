"""scripts/gpu_check.sh: valid bash, executable, every file it names exists, and its dry run lists each step
(with the flags that the scripts it calls really take) and writes the summary. Nothing here needs a GPU."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_syntax_and_executable():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert os.access(SCRIPT, os.X_OK)


def test_every_referenced_file_exists():
    text = SCRIPT.read_text()
    paths = set(re.findall(r"\b((?:scripts|tests|conf)/[\w./-]*\w)", text))
    assert {"scripts/gpu_check.sh", "scripts/bench_scaling.py"} <= paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing
    assert "constraints.txt" in text and (ROOT / "constraints.txt").exists()
    # The benchmark scripts it looks for (their names are built in a loop).
    (loop,) = re.findall(r"for bench in ([\w ]+); do", text)
    for bench in loop.split():
        assert (ROOT / "scripts" / f"{bench}.py").exists(), bench
    # The experiment and model it trains with.
    for group, option in re.findall(r"\b(experiment|model)=(\w+)", text):
        assert (ROOT / "conf" / group / f"{option}.yaml").exists(), (group, option)


def test_dry_run_lists_the_steps_and_writes_the_summary(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_DRY_RUN": "1"}
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    status = {line.split()[0]: line.split()[1] for line in summary}
    assert [status[s] for s in ("setup", "gpu_tests", "scaling", "train_bf16")] == ["DRY"] * 4
    assert all(status.get(b) in ("DRY", "SKIP") for b in ("bench_attention", "bench_normalisers", "bench_long_attention", "bench_block_sparse"))
    assert "=== gpu_check summary" in proc.stdout

    commands = {line.split()[0]: line.split(None, 2)[2] for line in summary}
    assert " -m pytest " in commands["gpu_tests"] and " -m gpu " in commands["gpu_tests"]
    scaling = shlex.split(commands["scaling"])
    assert scaling[1] == "scripts/bench_scaling.py" and "--device" in scaling and scaling[scaling.index("--device") + 1] == "cuda"
    # Every flag it passes is one that bench_scaling.py takes.
    helptext = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_scaling.py"), "--help"], capture_output=True, text=True, cwd=ROOT).stdout
    for flag in (a for a in scaling if a.startswith("--")):
        assert flag in helptext, flag
    assert "trainer.device=cuda" in commands["train_bf16"] and "trainer.precision=bf16" in commands["train_bf16"]
