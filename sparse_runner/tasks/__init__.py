"""Tasks: data, batching, model head, loss and metrics for one task family each.

`build_task(cfg)` picks the task class by `cfg.task.family`; a new family registers in `TASKS`.
"""

from __future__ import annotations

from omegaconf import DictConfig

from sparse_runner.tasks.base import Task
from sparse_runner.tasks.listops import ListOpsTask
from sparse_runner.tasks.translation import TranslationTask

TASKS: dict[str, type[Task]] = {"listops": ListOpsTask, "translation": TranslationTask}


def build_task(cfg: DictConfig) -> Task:
    return TASKS[cfg.task.family](cfg.task, cache_dir=cfg.paths.cache_dir, batch_size=cfg.trainer.batch_size, batch_tokens=cfg.trainer.batch_tokens)


__all__ = ["TASKS", "Task", "build_task"]
