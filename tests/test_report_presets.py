"""sparse-report's preset matching (sparse_runner/reporting/presets.py): a run is a paper preset when its resolved
config is the preset's composed config in every result-changing key but the seed; what differs otherwise, as
`key=value`; keys only one side has; `auto` as the runner resolves it; each preset composed once; torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sparse_runner.reporting import collect_runs, main, presets
from sparse_runner.reporting.papers import lra
from sparse_runner.reporting.presets import ABSENT, Keys, Match, Preset, differences, match
from test_report import preset_config
from test_report_lra import write_lra_run

CPU_LISTOPS = Preset(("experiment=lra_listops_cpu",))


def keys(config: dict) -> Keys:
    return Keys.of(config)


def test_a_preset_is_its_fill_command_composed() -> None:
    assert CPU_LISTOPS.command == "sparse-run experiment=lra_listops_cpu"
    values = CPU_LISTOPS.keys.values
    assert values["task.name"] == "listops" and values["model.normaliser"] == "softmax"
    assert "seed" not in values and "model.name" not in values       # averaged over; a label
    assert not any(key.startswith(("paths.", "trainer.device", "trainer.num_threads")) for key in values)
    assert Preset(("experiment=no_such_experiment",)).keys is None    # a preset conf/ lacks fills nothing


def test_the_seed_and_the_model_label_never_count() -> None:
    run = preset_config("experiment=lra_listops_cpu", seed=7, **{"model.name": "whatever"})
    assert differences(keys(run), CPU_LISTOPS.keys) == {}


def test_what_differs_is_the_runs_value_per_key() -> None:
    run = preset_config("experiment=lra_listops_cpu", **{"trainer.lr": 0.01, "model.num_heads": 2})
    found = match(keys(run), [CPU_LISTOPS])
    assert not found.exact
    assert found.pairs == ("model.num_heads=2", "trainer.lr=0.01")
    assert presets.shown(("a=1", "b=2", "c=3"), limit=2) == "a=1, b=2 (+1 more)"
    # A config's name first: the one difference that says the most.
    run = preset_config("task=listops_lra")
    assert match(keys(run), [CPU_LISTOPS]).pairs[0] == "task.name=listops_lra"


def test_a_key_the_run_lacks_agrees_when_the_preset_holds_its_default() -> None:
    # A config without trainer.min_lr_ratio (its schema lacked the key) ran as its default (0.0).
    run = preset_config("experiment=lra_listops_cpu")
    del run["trainer"]["min_lr_ratio"]
    assert differences(keys(run), CPU_LISTOPS.keys) == {}
    # A preset that sets it otherwise is not what that run did.
    decayed = Preset(("experiment=lra_listops_cpu", "trainer.min_lr_ratio=0.1"))
    assert differences(keys(run), decayed.keys) == {"trainer.min_lr_ratio": ABSENT}
    assert Match(decayed, (("trainer.min_lr_ratio", ABSENT),)).pairs == ("trainer.min_lr_ratio=(absent)",)


def test_how_a_run_was_executed_does_not_decide_its_cell() -> None:
    run = preset_config("experiment=lra_listops_cpu", "trainer.precision=bf16", "trainer.activation_checkpointing=true")
    assert differences(keys(run), CPU_LISTOPS.keys) == {}


def test_a_key_only_the_run_has_agrees_unless_it_sits_under_a_preset_leaf() -> None:
    # A pre-training trainer without a stage (`pretrain.task: null`, kept evidence holds them) trains nothing.
    run = preset_config("experiment=lra_listops_cpu", **{"pretrain.trainer": {"lr": 0.001, "max_steps": 1000}})
    assert differences(keys(run), CPU_LISTOPS.keys) == {}
    # A pre-training stage where the preset has none (`pretrain.task: null`) is a difference, key by key.
    run = preset_config("experiment=lra_listops_cpu", **{"pretrain.task": {"name": "mlm_sotu", "family": "mlm"}})
    assert differences(keys(run), CPU_LISTOPS.keys) == {"pretrain.task.family": "mlm", "pretrain.task.name": "mlm_sotu"}
    # ... and none where the preset has one is the run's null.
    bert = Preset(("experiment=bhojanapalli2020_table1_cpu",))
    scratch = preset_config("experiment=bhojanapalli2020_table1_cpu", "pretrain=none")
    assert differences(keys(scratch), bert.keys) == {"pretrain.task": None}


def test_where_the_files_are_is_no_difference() -> None:
    # Retrieval and KFTT read local files: every run names its folder, the preset leaves it null.
    retrieval = Preset(("experiment=lra_retrieval",))
    run = preset_config("experiment=lra_retrieval", **{"task.data_dir": "/data/lra_release/tsv_data"})
    assert differences(keys(run), retrieval.keys) == {}


def test_auto_is_what_the_runner_resolves_it_to() -> None:
    run = preset_config("experiment=lra_listops_cpu", **{"trainer.monitor": "val/accuracy", "trainer.monitor_mode": "max"})
    assert differences(keys(run), CPU_LISTOPS.keys, primary_metric="test/accuracy") == {}
    run = preset_config("experiment=lra_listops_cpu", **{"trainer.monitor": "val/loss", "trainer.monitor_mode": "min"})
    assert differences(keys(run), CPU_LISTOPS.keys, primary_metric="test/accuracy") == {
        "trainer.monitor": "val/loss", "trainer.monitor_mode": "min"}


def test_a_validated_config_is_its_preset(tmp_path: Path) -> None:
    # What sparse-run writes into metrics.json: validated (schema defaults, monitor resolved), not only composed.
    from conftest import compose_config
    from sparse_runner.config import validate

    written = OmegaConf.to_container(validate(compose_config(["experiment=lra_listops_cpu", "normaliser=alpha_entmax"],
                                                             tiny=False)), resolve=True)
    assert written["trainer"]["monitor"] == "val/accuracy" and "trainer" in written["pretrain"]
    entmax = Preset(("experiment=lra_listops_cpu", "model=entmax"))
    assert differences(keys(written), entmax.keys, primary_metric="test/accuracy") == {}
    assert differences(keys(written), CPU_LISTOPS.keys, primary_metric="test/accuracy") == {
        "model.normaliser": "alpha_entmax"}


def test_the_first_exact_candidate_wins_else_the_nearest() -> None:
    softmax, entmax = CPU_LISTOPS, Preset(("experiment=lra_listops_cpu", "model=entmax"))
    run = keys(preset_config("experiment=lra_listops_cpu", "model=entmax"))
    assert match(run, [softmax, entmax]).preset == entmax
    far = keys(preset_config("experiment=lra_listops_cpu", "model=entmax", **{"trainer.lr": 0.5}))
    assert match(far, [softmax, entmax]) == Match(entmax, (("trainer.lr", 0.5),))
    assert match(run, []) is None
    assert presets.closest_models(run, ["softmax", "bigbird", "entmax", "entmax15"]) == ["entmax"]


def test_each_preset_is_composed_once_however_many_runs(tmp_path: Path) -> None:
    for i in range(60):
        write_lra_run(tmp_path / f"s{i}", "listops", experiment="lra_listops_cpu", seed=i, test_acc=0.4)
        write_lra_run(tmp_path / f"lr{i}", "listops", experiment="lra_listops_cpu", seed=i, test_acc=0.3,
                      config_updates={"trainer.lr": 0.01})
        write_lra_run(tmp_path / f"e{i}", "lra_text", experiment="lra_text_cpu", model="entmax", seed=i)
    records = collect_runs([tmp_path])
    presets.cache_clear()
    table = lra.tables(records)[0]
    composed = presets.compose.cache_info()
    # The model presets' recipes once (12 today), then only the jobs that the runs' recipes may be: two settings
    # of the two tasks for softmax (and its twin standard_heads) and for entmax.
    assert composed.misses <= len(presets.model_names()) + 2 * 2 * 2 + 1
    assert composed.hits >= 0
    assert [r[2] for r in table.rows if r[1] == "ours: CPU presets"] == ["40.00 ± 0.00 (n=60)",
                                                                       "run: sparse-run experiment=lra_listops_cpu model=entmax"]


def test_the_report_composes_without_torch() -> None:
    code = ("import sys; from sparse_runner.reporting import presets; import sparse_runner.reporting.report; "
            "assert presets.Preset(('experiment=lra_listops_cpu', 'model=entmax')).keys is not None; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    write_lra_run(root / "spelled", "listops", experiment="lra_listops_cpu", more=("model.normaliser=alpha_entmax",),
                  test_acc=0.45)
    return root


def test_the_runs_table_says_what_a_run_computed(outputs: Path, capsys) -> None:
    assert json.loads((outputs / "spelled" / "metrics.json").read_text())["model"] == "softmax"
    assert main([str(outputs), "--formats", "md"]) == 0
    runs = capsys.readouterr().out.split("## Runs: task=listops")[1]
    assert "| spelled | completed | alpha_entmax · dense · h4 |" in runs


def test_a_pre_trained_run_s_init_from_is_where_its_stage_put_the_weights():
    """run.py records the stage's directory as model.init_from; with a stage on both sides that is no
    difference (the stage's config is compared), without one it is."""
    from sparse_runner.reporting.presets import Keys, differences

    stage = {"pretrain.task.name": "mlm_sotu", "pretrain.trainer.max_steps": 700}
    preset = Keys.of({**stage, "model.init_from": None, "model.d_model": 128})
    run = Keys.of({**stage, "model.init_from": "outputs/pretrain/mlm_abc", "model.d_model": 128})
    assert differences(run, preset) == {}
    other_stage = Keys.of({**stage, "pretrain.trainer.max_steps": 10, "model.init_from": "outputs/pretrain/mlm_x", "model.d_model": 128})
    assert differences(other_stage, preset) == {"pretrain.trainer.max_steps": 10}
    plain = Keys.of({"model.init_from": None, "model.d_model": 128})
    assert differences(Keys.of({"model.init_from": "my_weights.pt", "model.d_model": 128}), plain) == {"model.init_from": "my_weights.pt"}
