"""A run never deletes or overwrites what it did not write, and a refusal is one line on the terminal.

A run directory that exists and is not a run of sparse-run (files of the user's, no metrics.json of a run)
is refused before anything in it is touched; stale temporary files are removed only by the names
sparse_runner.io gives them, only in a run directory of ours, and only once the run is accepted there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparse_runner import io
from sparse_runner.checks import ConfigError
from sparse_runner.run import run
from tests.conftest import TINY, sparse_run

FEW_STEPS = ("trainer.max_steps=2", "trainer.eval_every=2")


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (hidden ones too) with its bytes (None for a folder)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def users_folder(root: Path) -> Path:
    """The issue's folder (S4): a config.yaml of the user's, temporaries of the user's at two levels, and one
    whose name looks like one of io's."""
    (root / "sub").mkdir(parents=True)
    (root / "config.yaml").write_text("mine\n")
    (root / ".a.tmp").write_text("x")
    (root / "sub" / ".b.tmp").write_text("y")
    (root / ".notes.abcd1234.tmp").write_text("z")
    return root


def terminal_lines(result) -> list[str]:
    """The non-empty lines a terminal shows: stdout and stderr together."""
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


# ------------------------------------------------------------------------------------ io's temporaries
def test_io_recognises_exactly_the_temporaries_it_writes(tmp_path):
    names = {}
    with io.atomic_open(tmp_path / "metrics.json") as handle:
        handle.write("{}")
        names["file"] = [p.name for p in tmp_path.iterdir() if p.name != "metrics.json"]
    with io.atomic_directory(tmp_path / "generated-0123") as folder:
        names["folder"] = [folder.name]
    assert io.is_temporary(names["file"][0]) and io.temporary_target(names["file"][0]) == "metrics.json"
    assert io.is_temporary(names["folder"][0]) and io.temporary_target(names["folder"][0]) == "generated-0123"
    for name in (".a.tmp", "a.tmp", ".notes.tmp", ".notes.old.tmp", "metrics.json", ".hydra"):
        assert not io.is_temporary(name) and io.temporary_target(name) is None, name


# ------------------------------------------------------------------------------------------- S4
@pytest.mark.parametrize("where", ["a folder", "the current folder"])
def test_s4_a_users_folder_as_hydra_run_dir_is_refused_in_one_line_and_left_as_it_was(tmp_path, cache_dir, where):
    folder = users_folder(tmp_path / "p")
    before = snapshot(folder)
    run_dir = str(folder) if where == "a folder" else "."
    result = sparse_run([*TINY, f"hydra.run.dir={run_dir}"], cwd=folder if where != "a folder" else tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = terminal_lines(result)
    assert line.startswith("sparse-run: error: ") and "not a run directory of sparse-run" in line, line
    assert "'config.yaml'" in line and "hydra.run.dir=" in line, line
    assert snapshot(folder) == before  # not even Hydra's .hydra/ or its log


def test_a_run_directory_that_hydra_names_is_checked_before_hydra_writes_there(tmp_path, cache_dir):
    """hydra.run.dir as an interpolation, as the default one is (paths.output_dir/runs/<name>): resolved as
    Hydra resolves it, and refused before Hydra writes .hydra/ and its log there."""
    folder = tmp_path / "out" / "mine"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    result = sparse_run([*TINY, f"paths.output_dir={tmp_path / 'out'}", "hydra.run.dir=${paths.output_dir}/mine"], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = terminal_lines(result)
    assert f"{folder} is not a run directory of sparse-run: it holds 'notes.txt'" in line, line
    assert snapshot(folder) == {"notes.txt": b"mine"}


def test_run_refuses_a_users_folder_before_touching_it(tiny_config, tmp_path):
    """The same rule for every caller of run() (a Hydra-named directory, a script): checked before the lock
    file, the stale-temporary cleanup or any write."""
    folder = users_folder(tmp_path / "p")
    before = snapshot(folder)
    with pytest.raises(ConfigError, match=r"not a run directory of sparse-run.*'\.a\.tmp'") as info:
        run(tiny_config(*FEW_STEPS), folder)
    assert "\n" not in str(info.value)
    assert snapshot(folder) == before


@pytest.mark.parametrize("metrics", ['{"accuracy": 0.9}', "not json"])
def test_a_metrics_json_that_is_not_a_runs_does_not_make_a_folder_ours(tiny_config, tmp_path, metrics):
    (tmp_path / "metrics.json").write_text(metrics)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"not a run directory of sparse-run: it holds 'metrics.json'"):
        run(tiny_config(*FEW_STEPS), tmp_path)
    assert snapshot(tmp_path) == before


def test_a_folder_holding_only_what_hydra_writes_first_is_a_fresh_run(tiny_config, tmp_path):
    """Hydra creates the run directory and writes .hydra/ and the job's log before sparse_runner's code runs."""
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "sparse_run.log").write_text("")
    run(tiny_config(*FEW_STEPS), tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"


def test_stale_temporaries_are_removed_by_ios_names_only(tiny_config, tmp_path):
    """A run of ours, resumed: io's temporaries that a killed run left go, the user's `.tmp` files stay."""
    cfg = tiny_config(*FEW_STEPS)
    run(cfg, tmp_path)
    stale = [tmp_path / ".metrics.json.k2j_x9q1.tmp", tmp_path / "checkpoints" / ".last.pt.ab_12cd3.tmp"]
    users = [tmp_path / ".a.tmp", tmp_path / "checkpoints" / ".b.tmp", tmp_path / "notes.tmp"]
    for path in stale + users:
        path.write_text("x")
    run(cfg, tmp_path)
    assert not any(path.exists() for path in stale)
    assert all(path.read_text() == "x" for path in users)


def test_a_different_config_is_refused_before_anything_is_deleted(tiny_config, tmp_path):
    run(tiny_config(*FEW_STEPS), tmp_path)
    stale = tmp_path / ".config.yaml.k2j_x9q1.tmp"
    stale.write_text("x")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="different config.*model.num_heads"):
        run(tiny_config(*FEW_STEPS, "model.num_heads=4"), tmp_path)
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------- one line on the terminal
# A bad value (`trainer.max_steps=-1`), the whole terminal one line: tests/test_config.py,
# test_cli_exits_2_with_one_line_and_writes_nothing. A failed run says so once, after the accepted run's
# start-up, and its log file keeps it: tests/test_faults.py, test_a_non_finite_validation_loss_is_a_divergence_*
# (the same command, lr 1e9, diverging at step 1).
def test_a_refusal_after_the_data_is_prepared_is_one_line_on_the_terminal(tiny_config, tmp_path, cache_dir):
    """The checkpoint of another config is found once the task is built: the start-up's INFO lines (the CPU
    block cache, the data cache) stay in the log file."""
    run(tiny_config(*FEW_STEPS), tmp_path / "run")
    result = sparse_run([*TINY, *FEW_STEPS, "model.num_heads=4", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = terminal_lines(result)
    assert "holds a checkpoint of a different config" in line, line
    assert "CPU block cache" in (tmp_path / "run" / "sparse_run.log").read_text()
