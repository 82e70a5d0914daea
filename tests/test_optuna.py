"""The Optuna preset (conf/hydra/sweeper/optuna_listops.yaml) through the real command line: a study kept in
the sweep directory, each trial one run whose best validation value Optuna maximises, continued by the
same command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY, sparse_run

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="the optuna extra: pip install -e '.[optuna]'")
optuna = pytest.importorskip("optuna")

SHORT = TINY + ["trainer.max_steps=10", "trainer.eval_every=5"]
# The preset's search space less trainer.warmup_steps, which TINY fixes: a value on the command line wins.
SEARCH_SPACE = {"trainer.lr", "model.dropout"}


def study_command(tmp_path: Path, n_trials: int) -> list[str]:
    return ["-m", "hydra/sweeper=optuna_listops", f"hydra.sweeper.n_trials={n_trials}", *SHORT, f"paths.output_dir={tmp_path / 'out'}"]


def test_a_study_lives_in_the_sweep_dir_and_the_same_command_continues_it(tmp_path, cache_dir):
    result = sparse_run(study_command(tmp_path, 1), cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr
    sweep_dir = tmp_path / "out" / "multirun"
    storage = f"sqlite:///{sweep_dir / 'optuna.db'}"
    trials = optuna.load_study(study_name="listops_cpu", storage=storage).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE]
    assert all(set(t.params) == SEARCH_SPACE for t in trials)
    assert 1e-4 <= min(t.params["trainer.lr"] for t in trials) and max(t.params["trainer.lr"] for t in trials) <= 3e-3

    # Each trial is one run with the sampled values; Optuna got its best val/accuracy (ListOps' monitor).
    runs = [json.loads(path.read_text()) for path in sweep_dir.glob("*/metrics.json")]
    assert len(runs) == 1
    for trial in trials:
        (run,) = [r for r in runs if r["config"]["trainer"]["lr"] == trial.params["trainer.lr"]]
        assert run["status"] == "completed"
        assert run["config"]["model"]["dropout"] == trial.params["model.dropout"]
        assert run["config"]["trainer"]["warmup_steps"] == 5
        assert run["selection"]["metric"] == "val/accuracy" and trial.value == run["selection"]["best_value"]

    again = sparse_run(study_command(tmp_path, 1), cwd=tmp_path, cache_dir=cache_dir)
    assert again.returncode == 0, again.stderr
    trials = optuna.load_study(study_name="listops_cpu", storage=storage).trials
    assert len(trials) == 2 and trials[1].state == optuna.trial.TrialState.COMPLETE
    assert len(list(sweep_dir.glob("*/metrics.json"))) == 2
