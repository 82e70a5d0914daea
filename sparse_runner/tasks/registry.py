"""Task families by name: each registers itself, with its config schema, where it is defined.

    @register_task("listops", config=ListOpsTaskConfig)
    class ListOpsTask(SequenceClassificationTask): ...

The schema, the checks (`check_config`), the metrics (`val_metrics`, `primary_metric`) and the model
keys a family uses all live on the class, so `config.validate`, the trainer and metrics.json read them
from here. Every module of the `sparse_runner.tasks` package is imported on first use, so a new
family is one module there plus one YAML file in conf/task/.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from typing import Callable

from sparse_runner.tasks.base import Task, TaskConfig

TASK_FAMILIES: dict[str, type[Task]] = {}


def register_task(family: str, *, config: type[TaskConfig]) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: `family` (the value of `task.family` in YAML) -> the task class."""

    def add(cls: type[Task]) -> type[Task]:
        if family in TASK_FAMILIES and TASK_FAMILIES[family] is not cls:
            raise ValueError(f"task family {family!r} is registered twice ({TASK_FAMILIES[family].__name__}, {cls.__name__})")
        cls.family, cls.config_class = family, config
        TASK_FAMILIES[family] = cls
        return cls

    return add


def task_families() -> dict[str, type[Task]]:
    """Every registered family, after importing the modules of the tasks package."""
    import sparse_runner.tasks as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    for entry_point in importlib.metadata.entry_points(group="sparse_runner.tasks"):
        entry_point.load()
    return TASK_FAMILIES
