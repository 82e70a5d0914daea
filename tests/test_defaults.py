"""Every default is written once, in conf/: the schema carries types, and every reader of defaults (the resume
check, the report's preset matching, the model-key check) sees the values a run composes."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sparse_runner import identity
from sparse_runner.config import RunConfig
from sparse_runner.run_metrics import flatten
from sparse_runner.tasks import task_families
from tests.conftest import compose_config
from tests.test_report import set_dotted

ROOT = Path(__file__).resolve().parents[1]


def composed_defaults() -> dict:
    """Every model / trainer / paths key of the default config (paths.cache_dir aside: it reads the environment)."""
    config = OmegaConf.to_container(compose_config([], tiny=False), resolve=True)
    return {key: value for key, value in flatten({node: config[node] for node in ("model", "trainer", "paths")}).items()
            if key != "paths.cache_dir"}


def test_the_defaults_every_reader_sees_are_the_composed_ones():
    composed = composed_defaults()
    seen = identity.default_values()
    assert {key: seen[key] for key in composed} == composed
    # a pre-training stage's trainer starts from conf/trainer/default.yaml too
    assert {key: seen[f"pretrain.{key}"] for key in composed if key.startswith("trainer.")} == {
        key: value for key, value in composed.items() if key.startswith("trainer.")}
    assert (seen["trainer.max_steps"], seen["trainer.warmup_steps"], seen["trainer.eval_every"]) == (
        composed["trainer.max_steps"], composed["trainer.warmup_steps"], composed["trainer.eval_every"])


def test_the_schema_holds_no_default():
    """A value in a dataclass would be a second copy of the YAML's: every leaf of the schemas is '???'."""
    run = flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig)))
    assert set(run.values()) == {"???"}, {k: v for k, v in run.items() if v != "???"}
    for family, task in task_families().items():
        leaves = flatten(OmegaConf.to_container(OmegaConf.structured(task.config_class)))
        assert set(leaves.values()) <= {"???"}, (family, {k: v for k, v in leaves.items() if v != "???"})


def test_the_resume_check_reads_the_composed_defaults(tiny_config, tmp_path, monkeypatch):
    """run.py hands the trainer the defaults a checkpoint without a key is taken to hold."""
    from sparse_runner import run as run_module

    seen = {}

    class Captured(Exception):
        pass

    def trainer(*args, fingerprint_defaults, **kwargs):
        seen.update(fingerprint_defaults)
        raise Captured

    monkeypatch.setattr(run_module, "Trainer", trainer)
    with pytest.raises(Captured):
        run_module.run(tiny_config(), tmp_path / "run")
    composed = composed_defaults()
    assert {key: seen[key] for key in composed} == composed


def test_the_report_takes_a_missing_key_to_hold_the_composed_default():
    """A run whose config lacks a key (its schema had none) is the preset when the preset holds the key's default."""
    from sparse_runner.reporting import presets

    preset = presets.Preset(())
    run_keys = dict(preset.keys.values)
    for key in ("trainer.max_steps", "trainer.warmup_steps", "trainer.eval_every"):
        del run_keys[key]
    assert presets.differences(presets.Keys.of(OmegaConf.to_container(OmegaConf.create(set_dotted({}, run_keys)))), preset.keys) == {}


def test_a_model_key_a_family_does_not_read_must_hold_the_composed_default(tiny_config):
    """The model-key check compares with the default model (conf/), not with a second copy."""
    from sparse_runner.models.config import default_model

    defaults = composed_defaults()
    model = default_model()
    assert all(getattr(model, key.split(".", 1)[1]) == value for key, value in defaults.items()
               if key.startswith("model.") and key.count(".") == 1)


def test_precision_names_are_the_trainers():
    from sparse_runner.config import ConfigError
    from sparse_runner.training.trainer import PRECISIONS

    with pytest.raises(ConfigError, match=rf"valid: {', '.join(PRECISIONS)}$"):
        from sparse_runner.config import validate

        validate(compose_config(["trainer.precision=fp8"]))


def test_a_model_variant_states_its_axes_and_its_own_name():
    """conf/model/<variant>.yaml: its name, the axis groups it picks and an axis value (head_size); the sizes are
    the base's (conf/config.yaml `model:`), so no variant extends another."""
    import yaml

    for path in sorted((identity.CONF_DIR / "model").glob("*.yaml")):
        content = yaml.safe_load(path.read_text())
        assert content["name"] == path.stem, path
        assert set(content) - {"defaults"} <= {"name", "head_size"}, (path, sorted(content))
        for entry in content.get("defaults", []):
            assert isinstance(entry, dict) and all(key.startswith("override /") for key in entry), (path, entry)
    sizes = {key for key in identity.default_config()["model"] if key not in ("name", "head_size")}
    assert {"d_model", "num_layers", "num_heads", "ffn_dim"} <= sizes


def test_one_file_per_geometry():
    """A geometry is an axis option; a head size is its value (model=fixed_head_128 is fixed_head at 128)."""
    assert sorted(p.stem for p in (identity.CONF_DIR / "geometry").glob("*.yaml")) == ["fixed_head", "standard"]
    a = compose_config(["model=fixed_head_128"], tiny=False).model
    b = compose_config(["model=fixed_head", "model.head_size=128"], tiny=False).model
    assert {**a, "name": None} == {**b, "name": None} and a.name == "fixed_head_128"


def test_a_regularisers_options_are_written_once_in_its_yaml():
    """conf/regulariser/<name>.yaml sets every option; the registered Options dataclass carries their types alone."""
    import dataclasses

    import yaml

    from sparse_runner.training.regularisers import REGULARISERS

    for path in sorted((ROOT / "conf" / "regulariser").glob("*.yaml")):
        options = yaml.safe_load(path.read_text())["regulariser_options"]
        schema = dataclasses.fields(REGULARISERS[path.stem].Options)
        assert set(options) == {f.name for f in schema}, path.name
        with_default = [f.name for f in schema if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
        assert not with_default, f"{path.stem}: {with_default} hold a default, a second copy of {path.name}'s"


def test_a_normalisers_options_are_written_in_its_yaml_as_its_python_defaults():
    """conf/normaliser/<name>.yaml sets every option of the normaliser, at the values its Options dataclass gives
    code that builds one directly (AlphaEntmax(num_heads)): one set of values, held equal here."""
    import dataclasses

    import yaml

    from sparse_runner.attention.normalisers import NORMALISERS, NoOptions

    for path in sorted((ROOT / "conf" / "normaliser").glob("*.yaml")):
        options = yaml.safe_load(path.read_text())["normaliser_options"] or {}
        schema = getattr(NORMALISERS[path.stem], "Options", NoOptions)
        assert options == dataclasses.asdict(schema()), path.name


def test_a_fixed_alpha_run_is_not_filed_as_the_learned_alpha_preset():
    from sparse_runner.reporting.presets import Keys, differences

    learned = Keys.of(OmegaConf.to_container(compose_config(["normaliser=alpha_entmax"]), resolve=True))
    fixed = Keys.of(OmegaConf.to_container(compose_config(["normaliser=alpha_entmax", "model.normaliser_options.alpha=1.3"]), resolve=True))
    assert differences(fixed, learned) != {}
    assert differences(learned, learned) == {}


def test_a_normaliser_named_without_its_options_is_refused_naming_the_group():
    from sparse_runner.checks import ConfigError
    from sparse_runner.config import validate

    cfg = compose_config(["model.normaliser=alpha_entmax"])
    with pytest.raises(ConfigError, match=r"model.normaliser_options: normaliser 'alpha_entmax' needs alpha, alpha_init; select it with normaliser=alpha_entmax"):
        validate(cfg)
