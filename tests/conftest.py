"""Shared test helpers: compose the real configs, shrunk to CPU size and a few steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sparse_runner.config import CONF_DIR, validate

# A model and a data set small enough that a run takes a few seconds on 2 cores.
TINY = [
    "task.generator.num_train=256",
    "task.generator.num_val=64",
    "task.generator.num_test=64",
    "task.generator.max_length=40",
    "task.max_length=40",
    "model.d_model=32",
    "model.num_heads=2",
    "model.ffn_dim=64",
    "trainer.max_steps=30",
    "trainer.eval_every=10",
    "trainer.batch_size=16",
    "trainer.warmup_steps=5",
    "trainer.log_every=5",
    "trainer.progress=false",
    "trainer.num_threads=1",
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One data cache for the whole test session (generated data are reused, as in real use)."""
    path = tmp_path_factory.mktemp("cache")
    os.environ["SPARSE_RUNNER_CACHE"] = str(path)
    return path


def compose_config(overrides: list[str] = (), *, cache_dir: Path | None = None, tiny: bool = True):
    """Compose conf/config.yaml with overrides (no validation)."""
    GlobalHydra.instance().clear()
    extra = [f"paths.cache_dir={cache_dir}"] if cache_dir else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=(TINY if tiny else []) + extra + list(overrides))


@pytest.fixture
def tiny_config(cache_dir):
    """Factory: a validated tiny config with extra overrides."""

    def make(*overrides: str):
        return validate(compose_config(list(overrides), cache_dir=cache_dir))

    return make


def sparse_run(args: list[str], cwd: Path, cache_dir: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run the real `sparse-run` entry point in a subprocess."""
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kwargs,
    )


def on_train_batch(patch, task_class, n: int, action) -> None:
    """Make the n-th training batch that `task_class` makes call `action()` first (a crash or a signal).
    `patch`: a monkeypatch (or its context)."""
    original, calls = task_class.make_batch, {"n": 0}

    def make_batch(self, split, indices, device):
        if split == "train":
            calls["n"] += 1
            if calls["n"] == n:
                action()
        return original(self, split, indices, device)

    patch.setattr(task_class, "make_batch", make_batch)


def simulated_crash() -> None:
    raise RuntimeError("simulated crash")


@pytest.fixture(scope="session")
def cpp():
    """The compiled entmax C++ kernel module (built once for all tests), or skip the cpp cases."""
    from sparse_runner.attention.kernels import entmax_cpu_status, load_entmax_cpu

    module = load_entmax_cpu()
    if module is None:
        pytest.skip(f"C++ kernels unavailable: {entmax_cpu_status()}")
    return module


@pytest.fixture(params=["cpp", "torch"])
def backend(request):
    """Each entmax backend in turn: 'cpp' (skipped when the kernel cannot be built) and 'torch'."""
    if request.param == "cpp":
        request.getfixturevalue("cpp")
    return request.param


def load_bench_script(path: Path):
    """A script under scripts/ as a module (not __main__: nothing runs), with scripts/ on sys.path so that its
    helpers (benchmarking.py) are found beside it, as when it runs."""
    import importlib.util

    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
