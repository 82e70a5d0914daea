"""Task families by name: each registers itself, with its config schema, where it is defined.

    @register_task("listops", config=ListOpsTaskConfig)
    class ListOpsTask(SequenceClassificationTask): ...

The schema, the checks (`check_config`), the metrics (`val_metrics`, `primary_metric`) and the model
keys a family uses all live on the class, so `config.validate`, the trainer and metrics.json read them
from here. Every module of the `sparse_runner.tasks` package is imported on first use, so a new
family is one module there plus one YAML file in conf/task/.
"""

from __future__ import annotations

from typing import Callable

from sparse_runner.registry import Registry
from sparse_runner.tasks.base import Task, TaskConfig

# family -> Task subclass, filled by @register_task (another package: the entry-point group sparse_runner.tasks).
TASK_FAMILIES: Registry[type[Task]] = Registry("task family", package="sparse_runner.tasks", entry_points="sparse_runner.tasks")


def register_task(family: str, *, config: type[TaskConfig]) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: `family` (the value of `task.family` in YAML) -> the task class, whose schema
    is `config` (set as `cls.family`, `cls.config_class`)."""
    return TASK_FAMILIES.register(family, family=family, config_class=config)


def task_families() -> dict[str, type[Task]]:
    """Every registered family, after importing the modules of the tasks package (and the entry points)."""
    return TASK_FAMILIES.load()
