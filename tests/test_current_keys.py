"""Kept evidence stays readable: the report reads a config that holds the regulariser and normaliser settings
under other keys (`model.sar`, `model.alpha`, `trainer.regulariser` ...) through `reporting.runs.current_keys`,
and files it as the same run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparse_runner.attention import NORMALISERS
from sparse_runner.attention.spec import check_options
from sparse_runner.identity import run_name
from sparse_runner.reporting.runs import current_keys
from sparse_runner.training.regularisers import REGULARISERS

EVIDENCE = sorted((Path(__file__).resolve().parents[1] / "docs" / "evidence").glob("**/metrics.json"))


def test_there_is_evidence_with_the_old_keys():
    configs = [json.loads(path.read_text())["config"] for path in EVIDENCE]
    assert any("sar" in config["model"] and config["model"]["sar"]["weight"] > 0 for config in configs)
    assert any(config["model"]["normaliser"] == "alpha_entmax" and "alpha" in config["model"] for config in configs)


@pytest.mark.parametrize("path", EVIDENCE, ids=lambda p: p.parent.name)
def test_an_evidence_config_reads_as_a_valid_config_of_the_same_run(path):
    """Translated, its normaliser and regulariser take the options it holds, and its run name but the hash is the
    directory's (the axes the report's labels and cells are built from: normaliser, pattern, heads, regulariser,
    pre-training)."""
    config = json.loads(path.read_text())["config"]
    current = current_keys(config)
    assert "sar" not in current["model"] and "alpha" not in current["model"]
    assert not {"regulariser", "regulariser_weight", "rdrop_task_loss"} & set(current["trainer"])
    model = current["model"]
    check_options("model.normaliser_options", model["normaliser_options"], NORMALISERS[model["normaliser"]].Options, "normaliser")
    check_options("model.regulariser_options", model["regulariser_options"], REGULARISERS[model["regulariser"]].Options, "regulariser")
    without_hash = re.sub(r"_[0-9a-f]{8}$", "", run_name(current))
    assert without_hash == re.sub(r"_[0-9a-f]{8}$", "", path.parent.name)


def test_a_config_with_the_new_keys_is_left_as_it_is():
    config = {"model": {"normaliser": "softmax", "normaliser_options": {}, "regulariser": "none", "regulariser_options": {}},
              "trainer": {"lr": 1e-3}}
    assert current_keys(config) is config


def test_sar_and_alpha_move_to_the_axes_options():
    old = {"model": {"normaliser": "alpha_entmax", "alpha": 1.3, "alpha_init": "random",
                     "sar": {"weight": 0.5, "shift": 2, "random_shift": True}},
           "trainer": {"regulariser": "none", "regulariser_weight": 1.0, "rdrop_task_loss": "both", "lr": 1e-3},
           "pretrain": {"task": None, "trainer": {"regulariser": "none", "regulariser_weight": 1.0, "lr": 1e-3}}}
    new = current_keys(old)
    assert new["model"] == {"normaliser": "alpha_entmax", "normaliser_options": {"alpha": 1.3, "alpha_init": "random"},
                            "regulariser": "sar", "regulariser_options": {"weight": 0.5, "shift": 2, "random_shift": True}}
    assert new["trainer"] == {"lr": 1e-3} and new["pretrain"]["trainer"] == {"lr": 1e-3}
    assert old["model"]["sar"]["weight"] == 0.5   # the record read is not changed
