"""The keys of every task that reads its data from one of several sources (the package, local files or
Hugging Face `datasets`), with their checks. `DataSourceConfig` is where the data come from;
`TextTaskConfig` adds the subword vocabulary of the text tasks (translation, language modelling);
`DocumentSourceConfig` the keys of the tasks that read text as documents (`data/documents.py`).
A family's schema extends one of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from sparse_runner.checks import choice, existing_dir, fail, positive
from sparse_runner.data.documents import TEXT_FILES
from sparse_runner.tasks.base import TaskConfig

SOURCES: tuple[str, ...] = ("embedded", "files", "hf")


@dataclass
class DataSourceConfig(TaskConfig):
    source: str  # embedded | files (data_dir) | hf (Hugging Face datasets); a family may name others
    data_dir: Optional[str]
    hf_path: Optional[str]
    hf_name: Optional[str]
    hf_revision: Optional[str]
    hf_data_dir: Optional[str]
    hf_data_files: Optional[dict[str, Any]]
    hf_splits: dict[str, str]


@dataclass
class TextTaskConfig(DataSourceConfig):
    vocab_size: int
    character_coverage: float


@dataclass
class DocumentSourceConfig(TextTaskConfig):
    """Where a text task's documents come from (TextTaskConfig's source keys) and how much of them."""

    source: str
    hf_text_field: str
    val_size: Optional[int]  # hold out the last N training lines as validation (hub sets without one)
    max_train_lines: Optional[int]  # only the first N training lines (quick experiments)


def check_source(t: Any, *, files: str, hub_example: str, sources: tuple[str, ...] = SOURCES) -> None:
    """One-line ConfigErrors for the DataSourceConfig keys of a typed `task` node. `files`: what
    task.data_dir must hold; `hub_example`: a dataset id to name when hf_path is missing; `sources`:
    the values task.source may take for this family."""
    choice("task.source", t.source, sources)
    if t.source == "files":
        if t.data_dir is None:
            fail(
                "task.data_dir",
                f"task {t.name} reads local files (task.source=files) and needs a folder (conf/task/{t.name}.yaml says where to get them)",
                files,
            )
        existing_dir("task.data_dir", t.data_dir, files)
    if t.source == "hf" and not t.hf_path:
        fail("task.hf_path", "task.source=hf needs a dataset id", f"a Hugging Face dataset id such as {hub_example}")


def check_text_source(t: Any, *, files: str, hub_example: str) -> None:
    """`check_source` plus the subword vocabulary keys of a TextTaskConfig."""
    check_source(t, files=files, hub_example=hub_example)
    if t.vocab_size < 8:
        fail("task.vocab_size", f"must be at least 8 (4 special ids + pieces), got {t.vocab_size}")
    if not 0.0 < t.character_coverage <= 1.0:
        fail("task.character_coverage", f"must be in (0, 1], got {t.character_coverage}")


def check_document_source(t: Any, *, hub_example: str) -> None:
    check_text_source(t, files=TEXT_FILES, hub_example=hub_example)
    for key in ("val_size", "max_train_lines"):
        positive(f"task.{key}", t[key], allow_none=True)
