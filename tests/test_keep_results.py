"""scripts/keep_results.py: colliding folder names are refused, a kept run is replaced as a whole, and every
bad destination is one line (the claims it regenerates: tests/test_claims.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "keep_results.py"


def keep_in_a_process(*args: object) -> subprocess.CompletedProcess:
    """`python scripts/keep_results.py ARGS`, as a user runs it."""
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def keep(*args: object) -> subprocess.CompletedProcess:
    """The script's `main(ARGS)` in this process (its `__main__` exits with what `main` returns: see
    keep_in_a_process, which the first test runs), its output and exit status as a process would give them."""
    module = keep_results_module()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = module.main(list(map(str, args)))
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(["keep_results.py", *map(str, args)], code, out.getvalue(), err.getvalue())


def keep_results_module():
    spec = importlib.util.spec_from_file_location("keep_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def a_run(folder: Path, *, acc: float = 0.5, log: bool = False) -> Path:
    """A completed run folder: metrics.json, and with `log` a log.jsonl and a figure."""
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"status": "completed", "metrics": {"test/accuracy": acc}}))
    if log:
        (folder / "log.jsonl").write_text('{"step": 1}\n')
        (folder / "figures").mkdir()
        (folder / "figures" / "js_per_layer.png").write_bytes(b"\x89PNG fake")
    return folder


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


def test_runs_sharing_a_folder_name_are_refused_before_anything_is_written(tmp_path):
    first, second, other = a_run(tmp_path / "a" / "x", acc=0.1), a_run(tmp_path / "b" / "x", acc=0.2), a_run(tmp_path / "b" / "y")
    dest = tmp_path / "kept"
    result = keep_in_a_process(dest, other, first, second)
    assert result.returncode == 2
    (line,) = lines(result)
    assert line.startswith("keep_results: error: ") and str(first) in line and str(second) in line and "'x'" in line, line
    assert not dest.exists()


def test_the_same_run_given_twice_is_kept_once(tmp_path):
    run = a_run(tmp_path / "runs" / "x")
    result = keep(tmp_path / "kept", run, tmp_path / "runs" / "." / "x")
    assert result.returncode == 0, result.stderr
    assert "kept 1 run(s)" in result.stdout and files(tmp_path / "kept") == ["x/metrics.json"]


@pytest.mark.parametrize("flag", [["--with-log"], []])
def test_a_kept_run_is_replaced_as_a_whole(tmp_path, flag):
    """An earlier keep --with-log of the run left a log and a figure; the run has neither now: they go."""
    run = a_run(tmp_path / "runs" / "x", acc=0.1, log=True)
    dest = tmp_path / "kept"
    assert keep("--with-log", dest, run).returncode == 0
    assert files(dest) == ["x/figures/js_per_layer.png", "x/log.jsonl", "x/metrics.json"]
    for name in ("log.jsonl", "figures/js_per_layer.png"):
        (run / name).unlink()
    (run / "metrics.json").write_text(json.dumps({"status": "completed", "metrics": {"test/accuracy": 0.2}}))
    result = keep(*flag, dest, run)
    assert result.returncode == 0, result.stderr
    assert files(dest) == ["x/metrics.json"] and list(dest.iterdir()) == [dest / "x"]  # no temporary left
    assert json.loads((dest / "x" / "metrics.json").read_text())["metrics"] == {"test/accuracy": 0.2}


def test_figures_are_kept_only_from_regular_files_of_the_run(tmp_path):
    run = a_run(tmp_path / "runs" / "x", log=True)
    (tmp_path / "secret").write_text("TOP-SECRET")
    (run / "figures" / "link.png").symlink_to(tmp_path / "secret")
    assert keep("--with-log", tmp_path / "kept", run).returncode == 0
    assert files(tmp_path / "kept") == ["x/figures/js_per_layer.png", "x/log.jsonl", "x/metrics.json"]


def test_a_destination_that_is_a_file_is_one_line(tmp_path):
    run = a_run(tmp_path / "runs" / "x")
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    for dest, problem in ((a_file, "is a file"), (a_file / "kept", "lies under")):
        result = keep(dest, run)
        assert result.returncode == 2
        (line,) = lines(result)
        assert line.startswith("keep_results: error: ") and str(dest) in line and problem in line, line
    assert a_file.read_text() == "mine"


def test_a_kept_name_taken_by_something_else_is_one_line(tmp_path):
    run = a_run(tmp_path / "runs" / "x")
    dest = tmp_path / "kept"
    dest.mkdir()
    (dest / "x").write_text("mine")
    result = keep(dest, run)
    assert result.returncode == 2
    (line,) = lines(result)
    assert str(dest / "x") in line and "not a kept run" in line, line
    (dest / "x").unlink()
    (dest / "x").mkdir()
    (dest / "x" / "notes.txt").write_text("mine")
    assert keep(dest, run).returncode == 2 and (dest / "x" / "notes.txt").read_text() == "mine"


def test_an_unwritable_destination_is_one_line(tmp_path, monkeypatch, capsys):
    """A read-only destination (simulated: root may write anywhere)."""
    module = keep_results_module()
    run = a_run(tmp_path / "runs" / "x")
    dest = tmp_path / "kept"
    dest.mkdir()
    real = tempfile.TemporaryFile

    def read_only(*args, **kwargs):
        if Path(kwargs.get("dir", "")) == dest:
            raise OSError(30, "Read-only file system", str(dest))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    assert module.main([str(dest), str(run)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and str(dest) in err and "not writable (Read-only file system)" in err, err
    assert list(dest.iterdir()) == []


def test_a_write_that_fails_midway_is_one_line_and_leaves_the_earlier_keep(tmp_path, monkeypatch, capsys):
    module = keep_results_module()
    run = a_run(tmp_path / "runs" / "x", log=True)
    dest = tmp_path / "kept"
    assert module.main(["--with-log", str(dest), str(run)]) == 0
    before = {name: (dest / name).read_bytes() for name in files(dest)}
    capsys.readouterr()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module.shutil, "copyfileobj", full_disk)
    assert module.main(["--with-log", str(dest), str(run)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "No space left on device" in err, err
    assert {name: (dest / name).read_bytes() for name in files(dest)} == before and list(dest.iterdir()) == [dest / "x"]


def test_a_metrics_json_nested_too_deep_is_skipped_with_its_reason(tmp_path):
    deep = tmp_path / "runs" / "deep"
    deep.mkdir(parents=True)
    (deep / "metrics.json").write_text('{"status": "completed", "x": ' + "[" * 5000 + "]" * 5000 + "}")
    good = a_run(tmp_path / "runs" / "good")
    result = keep(tmp_path / "kept", deep, good)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert any(str(deep) in line and "nested deeper than" in line for line in lines(result)), lines(result)
    assert files(tmp_path / "kept") == ["good/metrics.json"]


def test_the_per_example_record_is_kept_with_its_run_and_a_link_out_is_not(tmp_path):
    with_record, linked = a_run(tmp_path / "runs" / "x"), a_run(tmp_path / "runs" / "y")
    (with_record / "test_examples.npz").write_bytes(b"PK record")
    (tmp_path / "secret").write_bytes(b"private")
    (linked / "test_examples.npz").symlink_to(tmp_path / "secret")
    result = keep(tmp_path / "kept", with_record, linked)
    assert result.returncode == 0, result.stderr
    assert files(tmp_path / "kept") == ["x/metrics.json", "x/test_examples.npz", "y/metrics.json"]
    assert (tmp_path / "kept" / "x" / "test_examples.npz").read_bytes() == b"PK record"
