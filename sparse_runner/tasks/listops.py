"""LRA ListOps: 10-way classification of nested MIN/MAX/MED/SM expressions (Tay et al. 2021).

The data come from `listops_data` (the generator and the official release reader); batching, model,
loss and scoring are the generic sequence classification's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from sparse_runner.checks import existing_dir, fail, positive
from sparse_runner.tasks import listops_data
from sparse_runner.tasks.base import TaskConfig
from sparse_runner.tasks.classification import ClassificationData, SequenceClassificationTask
from sparse_runner.tasks.registry import register_task


@dataclass
class ListOpsGeneratorConfig:
    num_train: int = 20000
    num_val: int = 1000
    num_test: int = 1000
    min_length: int = 10
    max_length: int = 100
    max_depth: int = 10
    max_args: int = 10
    seed: int = 0


@dataclass
class ListOpsTaskConfig(TaskConfig):
    name: str = "listops"
    family: str = "listops"
    data_dir: Optional[str] = None
    max_length: int = 100
    generator: ListOpsGeneratorConfig = field(default_factory=ListOpsGeneratorConfig)


RELEASE_FILES = "a folder with basic_{train,val,test}.tsv, or null to generate"


@register_task("listops", config=ListOpsTaskConfig)
class ListOpsTask(SequenceClassificationTask):
    @classmethod
    def check_config(cls, t) -> None:
        if t.data_dir is not None:
            path = existing_dir("task.data_dir", t.data_dir, RELEASE_FILES)
            missing = [f"basic_{s}.tsv" for s in ("train", "val", "test") if not (path / f"basic_{s}.tsv").is_file()]
            if missing:
                fail("task.data_dir", f"{t.data_dir} lacks {', '.join(missing)}", RELEASE_FILES)
            return
        g = t.generator
        for key in ("num_train", "num_val", "num_test", "max_length", "max_depth"):
            positive(f"task.generator.{key}", g[key])
        positive("task.generator.min_length", g.min_length, allow_zero=True)
        if g.max_args < 3:
            fail("task.generator.max_args", f"must be >= 3 (children are drawn from 2..max_args-1), got {g.max_args}")
        if g.max_length - g.min_length < 2:
            fail("task.generator.max_length", f"must exceed min_length + 1 (lengths are strict bounds), got {g.min_length}..{g.max_length}")

    def load_data(self) -> ClassificationData:
        g = self.cfg.generator
        splits = listops_data.prepare_listops(
            data_dir=os.path.expanduser(self.cfg.data_dir) if self.cfg.data_dir else None,
            cache_dir=os.path.expanduser(self.cache_dir),
            num_train=g.num_train,
            num_val=g.num_val,
            num_test=g.num_test,
            min_length=g.min_length,
            max_length=g.max_length,
            max_depth=g.max_depth,
            max_args=g.max_args,
            seed=g.seed,
        )
        return ClassificationData(splits, vocab_size=len(listops_data.VOCAB), num_classes=listops_data.NUM_CLASSES, pad_id=listops_data.PAD_ID)
