"""`metrics.json`, the record of one run: written by `run.py`, read by `sparse-report`.

Torch-free on purpose (the report must not import torch). The keys a reader may rely on are listed in
`SCHEMA`; `NON_RESULT_KEYS` are the config keys that do not change a run's result (left out of the
resume fingerprint, of run-directory names and of the report's "what varies" columns).
"""

from __future__ import annotations

import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sparse_runner.io import atomic_write_json

SCHEMA_VERSION = 1

# Config keys that do not change a run's result. conf/hydra/default.yaml reads this list through the
# `non_result_keys` resolver (registered in cli.py) to keep them out of run-directory names.
NON_RESULT_KEYS = (
    "trainer.resume",
    "trainer.device",
    "trainer.progress",
    "trainer.log_every",
    "trainer.num_threads",
    "paths.output_dir",
    "paths.cache_dir",
)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """`{"model": {"num_heads": 2}}` -> `{"model.num_heads": 2}`; lists stay whole (one value)."""
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, dotted))
        else:
            flat[dotted] = value
    return flat


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    import hydra
    import numpy
    import omegaconf
    import torch

    import sparse_runner

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "hydra": hydra.__version__,
        "omegaconf": omegaconf.__version__,
        "sparse_runner": sparse_runner.__version__,
        "cuda": torch.version.cuda or "",
    }


class MetricsFile:
    """metrics.json of a run: written atomically at start (status running) and at every end."""

    def __init__(self, run_dir: Path, cfg: Any, meta: dict[str, Any]) -> None:
        from omegaconf import OmegaConf

        self.path = Path(run_dir) / "metrics.json"
        self.data: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "status": "running",
            "error": None,
            "run_dir": str(Path(run_dir).resolve()),
            "task": cfg.task.name,
            "task_family": cfg.task.family,
            "model": cfg.model.name,
            "experiment": meta.get("experiment"),
            "overrides": list(meta.get("overrides", [])),
            "config": OmegaConf.to_container(cfg, resolve=True),
            "seed": cfg.seed,
            "versions": versions(),
            "git_commit": git_commit(),
            "started_at": now(),
        }

    def write(self, **fields: Any) -> None:
        self.data.update(fields)
        atomic_write_json(self.path, self.data)
