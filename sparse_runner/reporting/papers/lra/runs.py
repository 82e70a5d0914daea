"""LRA Table 1: our runs, the table behind Table 1 (__init__.py): every completed LRA run, a row per group of
seeds, with its data, majority-class floor, scale and overrides."""

from __future__ import annotations

from typing import Protocol

from sparse_runner.reporting import seeds
from sparse_runner.reporting.papers.lra.published import COLUMNS, MAJORITY_METRIC, METRIC, data_info
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup, distinct
from sparse_runner.reporting.values import as_int, pct


class RowWithRuns(Protocol):
    """What the runs table reads of a row of ours (lra.OurRow): its label, its setting, and per column the
    configurations that compete for the cell and the one shown."""

    model_label: str
    setting_label: str
    candidates: dict[str, list[SeedGroup]]

    @property
    def cells(self) -> dict[str, SeedGroup]: ...


def _scale(rec: RunRecord) -> str:
    """`4L d512 h8, len 2000, 5000 steps`, from the run's config and how far it trained: what a reader needs
    to tell a CPU-size run from the paper's size."""
    config = rec.config
    layers, width, heads = (config.get(f"model.{key}") for key in ("num_layers", "d_model", "num_heads"))
    model = [text for value, text in ((layers, f"{layers}L"), (width, f"d{width}"), (heads, f"h{heads}"))
             if value is not None]
    parts = [" ".join(model)] if model else []
    if config.get("task.max_length") is not None:
        parts.append(f"len {config['task.max_length']}")
    steps = as_int(rec.data.get("step"))
    steps = steps if steps is not None else as_int(config.get("trainer.max_steps"))
    if steps is not None:
        parts.append(f"{steps} steps")
    return ", ".join(parts)


def runs_table(rows: list[RowWithRuns]) -> Table | None:
    """Every completed LRA run, a row per group of seeds, by column and row; None when there is none."""
    columns = list(COLUMNS.values())
    # (column, row rank, not shown, run name, row, group): sorted on the first four, Table 1's order with the
    # group shown first
    listed = []
    for rank, row in enumerate(rows):
        shown = row.cells
        for column, groups in row.candidates.items():
            listed += [(columns.index(column), rank, group is not shown[column], group.first.display, row, group)
                       for group in groups]
    if not listed:
        return None
    body = []
    descriptions: dict[str, str] = {}
    for index, _, hidden, _, row, group in sorted(listed, key=lambda item: item[:4]):
        info = data_info(group.first)
        if info.name and info.description:
            descriptions.setdefault(info.name, info.description)
        body.append([
            columns[index], row.model_label, row.setting_label, info.label,
            group.text(METRIC, pct), group.text(lambda rec: rec.validation_value, pct),
            distinct(pct(rec.metric(MAJORITY_METRIC)) for rec in group.runs),
            distinct(_scale(rec) for rec in group.runs), "" if hidden else "yes", group.display,
            " ".join(group.overrides),
        ])
    notes = [
        "Every completed LRA run, a row per configuration (its runs differ only in their seed); `in Table 1` marks "
        "the one shown in its cell (of its row and column: official data first, then the best mean validation "
        "accuracy). Scale: layers, d_model, heads, task max length, steps trained.",
        "majority floor = test accuracy of always predicting the most frequent training label: a run near it has "
        "learned nothing.",
        seeds.NOTE,
    ]
    if descriptions:
        notes.append("Data: " + "; ".join(f"{name}: {text}" for name, text in descriptions.items()) + ".")
    return Table(
        slug="lra_table1_runs",
        title="LRA Table 1: our runs (test accuracy %)",
        headers=["column", "model", "setting", "data", "test acc", "best val acc", "majority floor", "scale",
                 "in Table 1", "run", "overrides"],
        rows=body, numeric={4, 5, 6}, notes=notes,
    )
