"""Long and GPU checks (not in the default run): `pytest -m slow`, `pytest -m gpu`."""

from __future__ import annotations

import json

import pytest
import torch

from sparse_runner.config import validate
from sparse_runner.run import run
from tests.conftest import compose_config


@pytest.mark.slow
def test_embedded_default_beats_the_majority_class(tmp_path, cache_dir):
    """The README's default run, unchanged: its test accuracy must clearly beat the majority class."""
    cfg = validate(compose_config(["trainer.progress=false"], cache_dir=cache_dir, tiny=False))
    run(cfg, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert m["test/accuracy"] > m["test/majority_accuracy"] + 0.15, m


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_gpu_training_with_autocast(tmp_path, tiny_config, precision):
    run(tiny_config("trainer.device=cuda", f"trainer.precision={precision}"), tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "completed" and m["device"].startswith("cuda")
    assert m["metrics"]["test/loss"] == m["metrics"]["test/loss"]  # not NaN
