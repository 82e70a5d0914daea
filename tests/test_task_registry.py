"""A new task family is one module + one YAML file: a toy family added here, outside the package,
trains end to end through the real config validation, trainer and metrics.json; and what the
registry declares (schema, checks, metrics, model keys) is what validation enforces."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

import sparse_runner.tasks as tasks_package
from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.run import run
from sparse_runner.tasks import task_families
from sparse_runner.tasks.registry import TASK_FAMILIES
from tests.conftest import compose_config

# The whole family: data (every token is the label's, so a small model learns it at once), schema, checks.
TOY_MODULE = '''
from dataclasses import dataclass

import numpy as np

from sparse_runner.checks import positive
from sparse_runner.tasks.base import TaskConfig
from sparse_runner.tasks.classification import ClassificationData, SequenceClassificationTask
from sparse_runner.tasks.registry import register_task


@dataclass
class FirstTokenConfig(TaskConfig):
    name: str = "first_token"
    family: str = "first_token"
    max_length: int = 12
    num_examples: int = 300
    num_classes: int = 3


class Split:
    def __init__(self, rng, n, classes, max_length):
        lengths = rng.integers(2, max_length + 1, size=n)
        self.labels = rng.integers(0, classes, size=n)
        self.seqs = [np.full(int(k), label + 1) for k, label in zip(lengths, self.labels)]

    def __len__(self):
        return len(self.seqs)

    def sequence(self, i):
        return self.seqs[i]

    def lengths(self):
        return np.array([len(s) for s in self.seqs])


@register_task("first_token", config=FirstTokenConfig)
class FirstTokenTask(SequenceClassificationTask):
    @classmethod
    def check_config(cls, t):
        positive("task.num_examples", t.num_examples)

    def load_data(self):
        rng = np.random.default_rng(0)
        n, c = self.cfg.num_examples, self.cfg.num_classes
        splits = {s: Split(rng, n, c, self.cfg.max_length) for s in ("train", "val", "test")}
        return ClassificationData(splits, vocab_size=c + 1, num_classes=c, pad_id=0)
'''

TOY_YAML = """\
name: first_token
family: first_token
max_length: 12
num_examples: 300
num_classes: 3
"""


TINY_MODEL = ["model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "trainer.batch_size=16", "trainer.warmup_steps=5",
              "trainer.log_every=10", "trainer.progress=false", "trainer.num_threads=1"]


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy module on the tasks package's path and its YAML on Hydra's search path."""
    module_dir, conf_dir = tmp_path / "toy_tasks", tmp_path / "toy_conf"
    module_dir.mkdir()
    (module_dir / "first_token.py").write_text(textwrap.dedent(TOY_MODULE))
    (conf_dir / "task").mkdir(parents=True)
    (conf_dir / "task" / "first_token.yaml").write_text(TOY_YAML)
    # The toy registers into a copy, and the next lookup imports the package's modules again (its own too).
    monkeypatch.setattr(TASK_FAMILIES, "_items", dict(TASK_FAMILIES.load()))
    monkeypatch.setattr(TASK_FAMILIES, "_loaded", False)
    monkeypatch.setattr(tasks_package, "__path__", [*tasks_package.__path__, str(module_dir)])
    yield [f"hydra.searchpath=[file://{conf_dir}]", "task=first_token", *TINY_MODEL]
    sys.modules.pop("sparse_runner.tasks.first_token", None)


def test_toy_family_trains_end_to_end(toy_family, cache_dir, tmp_path):
    cfg = validate(compose_config([*toy_family, "trainer.max_steps=60", "trainer.eval_every=30", "trainer.lr=3e-3"], cache_dir=cache_dir, tiny=False))
    assert "first_token" in task_families()
    assert cfg.trainer.monitor == "val/accuracy" and cfg.task.num_classes == 3
    run(cfg, tmp_path / "run")
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["status"] == "completed" and m["task_family"] == "first_token"
    assert m["primary_metric"] == "test/accuracy"
    # Any token gives the label away: far above the 1/3 of chance.
    assert m["metrics"]["test/accuracy"] > 0.9, m["metrics"]


def test_toy_family_schema_and_checks_are_enforced(toy_family, cache_dir):
    with pytest.raises(ConfigError, match=r"^task.num_examples: must be > 0") as info:
        validate(compose_config([*toy_family, "task.num_examples=0"], cache_dir=cache_dir, tiny=False))
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"task.num_exampels: unknown key; valid keys: name, family, max_length, num_examples, num_classes"):
        validate(compose_config([*toy_family, "+task.num_exampels=3"], cache_dir=cache_dir, tiny=False))
    with pytest.raises(ConfigError, match=r"trainer.monitor: unknown value 'val/bleu'; valid: auto, val/accuracy, val/loss"):
        validate(compose_config([*toy_family, "trainer.monitor=val/bleu"], cache_dir=cache_dir, tiny=False))


def test_unknown_family_lists_the_registered_ones(cache_dir):
    with pytest.raises(ConfigError, match=r"task.family: unknown task family 'nope'; valid: .*listops.*translation"):
        validate(compose_config(["task.family=nope"], cache_dir=cache_dir))


@pytest.mark.parametrize(
    "overrides, key",
    [
        # translation's model has no pooling (and no learned positions) ...
        (["experiment=mt_cpu", "model.pooling=mean"], "model.pooling"),
        (["experiment=mt_cpu", "model.positions=learned"], "model.positions"),
        # ... and a classifier has no decoder.
        (["model.decoder_layers=2"], "model.decoder_layers"),
        (["model.share_embeddings=false"], "model.share_embeddings"),
    ],
)
def test_model_keys_a_task_does_not_use_are_refused(overrides, key, cache_dir):
    with pytest.raises(ConfigError, match=rf"^{key}: task family '\w+' does not use this key") as info:
        validate(compose_config(overrides, cache_dir=cache_dir, tiny=overrides[0] != "experiment=mt_cpu"))
    assert "\n" not in str(info.value)


def test_every_registered_family_declares_its_contract():
    from omegaconf import OmegaConf

    from sparse_runner.config import CONF_DIR

    yaml_families = {OmegaConf.load(p).get("family") for p in (CONF_DIR / "task").glob("*.yaml")}
    for family, cls in task_families().items():
        assert cls.family == family  # the family name itself is a YAML value (conf/task/*.yaml), checked below
        assert cls.val_metrics and cls.primary_metric and cls.model_keys
        assert family in yaml_families, f"no conf/task/*.yaml selects task family {family}"
