"""A run is named by what it computed: aliases share a directory, recipes and axes combine by name."""

from __future__ import annotations

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from sparse_runner.checks import ConfigError
from sparse_runner.cli import preflight
from sparse_runner.config import group_options, validate
from sparse_runner.identity import axes, config_hash, run_name
from tests.conftest import compose_config


def resolved(*overrides: str, tiny: bool = True) -> dict:
    return OmegaConf.to_container(compose_config(list(overrides), tiny=tiny), resolve=True)


def run_dir(*overrides: str) -> str:
    """hydra.run.dir as Hydra resolves it for a job with these overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sparse_runner.config import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return str(cfg.hydra.run.dir)


def test_an_alias_and_its_target_share_a_run_directory():
    assert run_dir("task=iwslt") == run_dir("task=iwslt17_de_en")
    assert run_dir("task=iwslt").startswith("outputs/runs/iwslt17_de_en_softmax_dense_h4_seed0_")


def test_a_recipe_and_the_same_axes_share_a_name_and_the_label_follows_the_config():
    by_recipe = resolved("model=entmax")
    assert run_name(by_recipe) == run_name(resolved("model=softmax", "normaliser=alpha_entmax"))
    assert axes(resolved("model=softmax", "normaliser=alpha_entmax")).normaliser == "alpha_entmax"
    # `model.normaliser=alpha_entmax` without its options is refused (test_defaults.py), so it names no run


def test_the_hash_changes_with_results_only():
    base = resolved()
    assert config_hash(base) == config_hash(resolved("trainer.device=cpu", "trainer.num_threads=1", "paths.output_dir=elsewhere"))
    assert config_hash(base) != config_hash(resolved("trainer.lr=0.01"))
    assert config_hash(base) != config_hash(resolved("seed=1"))
    assert run_name(resolved("seed=1")).split("_")[-2] == "seed1"


def test_axes_of_recipes_and_overrides():
    assert axes(resolved("model=ernie_sparse", "normaliser=entmax15")).label() == "entmax15 · hst · h2 · sar"
    assert axes(resolved("model=hst", "regulariser=rdrop")).regulariser == "rdrop"
    assert axes(resolved("model=fixed_head", "model.num_heads=8")).geometry == "h8_dp32"
    assert axes(resolved("normaliser=alpha_entmax", "++model.normaliser_options.alpha=1.5")).normaliser == "alpha_entmax(1.5)"
    assert axes(resolved("experiment=bhojanapalli2020_table2b_cpu", tiny=False)).pretrained


def test_every_recipe_is_its_axes():
    """Each model= recipe composes to exactly what its axis groups give on the softmax recipe."""
    recipes = {
        "entmax": ["normaliser=alpha_entmax"], "entmax15": ["normaliser=entmax15"], "sparsemax": ["normaliser=sparsemax"],
        "fixed_head": ["geometry=fixed_head"], "fixed_head_128": ["geometry=fixed_head", "model.head_size=128"], "standard_heads": [],
        "local": ["pattern=local"], "bigbird": ["pattern=bigbird"], "hst": ["pattern=hst"],
        "bigbird_sar": ["pattern=bigbird", "regulariser=sar"], "ernie_sparse": ["pattern=hst", "regulariser=sar"], "softmax": [],
    }
    assert set(recipes) == set(group_options("model"))
    for recipe, axis_overrides in recipes.items():
        a, b = resolved(f"model={recipe}"), resolved("model=softmax", *axis_overrides)
        a["model"].pop("name"), b["model"].pop("name")
        assert a == b, recipe


@pytest.mark.parametrize("normaliser", ["softmax", "sparsemax", "entmax15", "alpha_entmax"])
@pytest.mark.parametrize("pattern", ["dense", "local", "bigbird", "hst"])
def test_any_combination_of_axes_validates(normaliser, pattern, cache_dir):
    validate(compose_config([f"normaliser={normaliser}", f"pattern={pattern}", "geometry=fixed_head"], cache_dir=cache_dir))


def test_a_group_given_twice_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^model= is given twice \(entmax, fixed_head\).*normaliser=") as info:
        preflight(["model=entmax", "model=fixed_head"], multirun=False, check_resources=False)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^pattern= is given twice"):
        preflight(["pattern=hst", "pattern=local"], multirun=False, check_resources=False)


def test_a_preset_plus_an_axis_override_runs_preflight():
    preflight(["model=ernie_sparse", "normaliser=entmax15"], multirun=False, check_resources=False)
    preflight(["model=bigbird", "pattern=hst"], multirun=False, check_resources=False)
