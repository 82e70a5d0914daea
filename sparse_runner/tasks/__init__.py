"""Tasks: data, batching, model, loss and metrics, one module per task family.

A family registers itself with `@register_task(name, config=Schema)` (see registry.py); every module
of this package is imported when the registry is first read, so adding a family is adding a module
here and a YAML file in conf/task/. `build_task(cfg)` builds the family that `cfg.task.family` names.
"""

from __future__ import annotations

from typing import Any

from sparse_runner.tasks.base import EvalSums, StepOutput, Task, TaskConfig
from sparse_runner.tasks.registry import register_task, task_families


def build_task(cfg: Any) -> Task:
    """The task of a validated run config."""
    return task_families()[cfg.task.family](cfg)


__all__ = ["EvalSums", "StepOutput", "Task", "TaskConfig", "build_task", "register_task", "task_families"]
