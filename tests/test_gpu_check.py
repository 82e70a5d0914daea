"""scripts/gpu_check.sh: valid bash, executable, every file it names exists; its dry run lists each step (with the
flags that the scripts it calls really take) and writes the summaries; the interpreter it picks, and the setup of
a CUDA interpreter that never downloads offline. Nothing here needs a GPU: a fake interpreter plays the CUDA one."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import load_bench_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ("setup", "gpu_tests", "bench_layers", "bench_blocks", "bench_training", "bench_presets")

# A stand-in for a CUDA image's python3: it sees a GPU, lacks hydra and entmax until `pip` has run, reaches no
# package index, and logs every call.
FAKE_CUDA_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_DIR/calls.log"
case "$*" in
    *torch.cuda.is_available*) exit 0 ;;
    *urllib.request*) exit 1 ;;
    *find_spec*) [ -f "$FAKE_DIR/installed" ] || echo "hydra entmax"; exit 0 ;;
    "-m pip"*) touch "$FAKE_DIR/installed"; exit 0 ;;
    *"import torch; print"*) echo "2.11.0+cu130 with CUDA 13.0"; exit 0 ;;
esac
exit 0
"""


def fake_python(tmp_path: Path, sees_cuda: bool = True) -> Path:
    path = tmp_path / "bin" / "python3"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_CUDA_PYTHON if sees_cuda else "#!/usr/bin/env bash\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def run(args: list[str], tmp_path: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "FAKE_DIR": str(tmp_path), **env})


def test_syntax_and_executable():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert os.access(SCRIPT, os.X_OK)


def test_every_referenced_file_exists():
    text = SCRIPT.read_text()
    paths = set(re.findall(r"\b((?:scripts|tests|conf)/[\w./-]*\w)", text))
    assert {"scripts/gpu_check.sh", "scripts/bench_long_attention.py", "scripts/bench_block_sparse.py", "scripts/bench_training.py",
            "scripts/bench_presets.py"} <= paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing
    assert "constraints.txt" in text and (ROOT / "constraints.txt").exists()


def test_dry_run_lists_the_steps_and_writes_the_summaries(tmp_path):
    proc = run(["--dry-run"], tmp_path, OUT=str(tmp_path / "out"), PYTHON=str(fake_python(tmp_path, sees_cuda=False)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "=== gpu_check summary" in proc.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [[step, "DRY"] for step in STEPS]
    steps = json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]
    assert [s["step"] for s in steps] == list(STEPS) and {s["status"] for s in steps} == {"DRY"}
    assert (tmp_path / "out" / "gpu_check.md").read_text().startswith("# GPU check")

    commands = {s["step"]: shlex.split(s["detail"]) for s in steps}
    assert commands["gpu_tests"][1:4] == ["-m", "pytest", "-q"] and "-m" in commands["gpu_tests"][4:] and "gpu and not slow" in commands["gpu_tests"]
    for name, script in (("bench_layers", "bench_long_attention.py"), ("bench_blocks", "bench_block_sparse.py"),
                         ("bench_training", "bench_training.py"), ("bench_presets", "bench_presets.py")):
        cmd = commands[name]
        assert cmd[1] == f"scripts/{script}" and cmd[cmd.index("--device") + 1] == "cuda"
        assert 0 < float(cmd[cmd.index("--time-budget") + 1]) < 100  # two thirds of the step's timeout
        assert str(tmp_path / "out" / "bench") in cmd  # every table under the one output folder
        helptext = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True, text=True, cwd=ROOT).stdout
        for flag in (a for a in cmd if a.startswith("--")):
            assert flag in helptext, (script, flag)
    layers = load_bench_script(ROOT / "scripts" / "bench_long_attention.py")
    cmd = commands["bench_layers"]
    assert set(cmd[cmd.index("--rows") + 1].split(",")) <= set(layers.GPU_ROWS)
    assert layers.parse_shapes(cmd[cmd.index("--shapes") + 1])[0] == (4096, 4)


def test_interpreter_with_cuda_torch_is_used_as_it_is(tmp_path):
    python = fake_python(tmp_path)
    proc = run(["--which-python"], tmp_path, PYTHON=str(python))
    assert proc.returncode == 0 and proc.stdout.split() == ["cuda", str(python)]


def test_interpreter_without_cuda_means_the_venv(tmp_path):
    proc = run(["--which-python"], tmp_path, PYTHON=str(fake_python(tmp_path, sees_cuda=False)))
    assert proc.stdout.split() == ["venv", str(ROOT / ".venv" / "bin" / "python")]
    proc = run(["--which-python"], tmp_path, PYTHON=str(tmp_path / "no-such-python"))
    assert proc.stdout.split()[0] == "venv"


def test_offline_setup_without_wheels_installs_nothing(tmp_path):
    """No index answers (the interpreter's own probe says so) and no wheel folder: setup fails in one message
    that says how to bring the wheels, and pip is never called."""
    proc = run(["__setup"], tmp_path, PYTHON=str(fake_python(tmp_path)), GPU_CHECK_WHEELS=str(tmp_path / "none"), GPU_CHECK_SITE=str(tmp_path / "site"))
    assert proc.returncode == 1
    assert "missing hydra entmax, no package index reachable and no wheels" in proc.stdout and "pip wheel --no-deps -w .whl" in proc.stdout
    calls = (tmp_path / "calls.log").read_text()
    assert "urllib.request" in calls and "-m pip" not in calls


def test_offline_setup_installs_the_wheel_folder_without_an_index(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "hydra_core-1.3.2-py3-none-any.whl").write_bytes(b"")
    proc = run(["__setup"], tmp_path, PYTHON=str(fake_python(tmp_path)), GPU_CHECK_WHEELS=str(wheels), GPU_CHECK_SITE=str(tmp_path / "site"),
               GPU_CHECK_OFFLINE="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "used as it is, no venv" in proc.stdout
    (pip,) = [line for line in (tmp_path / "calls.log").read_text().splitlines() if line.startswith("-m pip")]
    args = pip.split()
    assert "--no-index" in args and args[args.index("--target") + 1] == str(tmp_path / "site")
    assert args[-1] == str(wheels / "hydra_core-1.3.2-py3-none-any.whl")
    assert "urllib.request" not in (tmp_path / "calls.log").read_text()  # GPU_CHECK_OFFLINE=1: not even asked


def test_unknown_argument_is_refused_in_one_line(tmp_path):
    proc = run(["--fast"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == "gpu_check.sh: unknown argument '--fast'; valid: --dry-run, --which-python, --help"


def test_step_shares_fit_the_default_budget():
    """Every step's share of the default budget, summed, stays within it: the last step is not squeezed."""
    text = SCRIPT.read_text()
    budget = int(re.search(r"^DEFAULT_BUDGET=(\d+)$", text, re.M).group(1))
    shares = {name: int(limit) for name, limit in re.findall(r"^\s*step (\w+) (\d+) ", text, re.M)}
    assert set(shares) == set(STEPS) and sum(shares.values()) <= budget, shares
