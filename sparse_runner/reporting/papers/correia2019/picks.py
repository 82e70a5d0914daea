"""Which of our runs stand for each cell of Table 1: the group of seeds Table 1, the runs table behind it and
the analysis figures all show.

A run is in a column by its task (cfg.task.name) and in a row by the preset its resolved config is: the
column's experiment with `model=<row>` (presets.py: every result-changing key but the seed, whatever its
command line said, so `model=softmax normaliser=alpha_entmax` is α-entmax). A run of a column's task that is
no preset is an "other runs" row: the nearest preset's model and what differs from it (`key=value`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparse_runner.reporting.papers.correia2019.published import (
    CORREIA2019_TABLE1,
    FAMILY,
    METRIC,
    TRANSLATION_COLUMNS,
    TRANSLATION_MODEL_ROWS,
    canonical_task,
)
from sparse_runner.reporting.presets import Preset, closest_models, match, model_names, shown
from sparse_runner.reporting.runs import RunRecord, completed
from sparse_runner.reporting.seeds import SeedGroup, best_group, seed_groups

# A row of Table 1: the model preset of its runs (the nearest one for other runs) and what they differ in from
# it, `key=value` (() for the preset itself).
RowKey = tuple[str, tuple[str, ...]]


@dataclass
class Picks:
    """column -> row -> the group of seeds its cell shows (models in Table 1 row order), and every other
    completed translation group: another configuration beside a cell's, or a task of no column."""

    cells: dict[str, dict[RowKey, SeedGroup]] = field(default_factory=dict)
    hidden: list[SeedGroup] = field(default_factory=list)
    computed: dict[RowKey, str] = field(default_factory=dict)   # other runs' rows: what they computed (axes)

    def label(self, key: RowKey) -> str:
        """`softmax`, or `other runs: softmax · dense · h8 (softmax + trainer.batch_tokens=4096)`: what the
        runs computed, the nearest preset's model and what differs from it."""
        model, other = key
        if not other:
            return row_label(model)
        return f"other runs: {self.computed.get(key, '?')} ({row_label(model)} + {shown(other)})"

    def column(self, column: str) -> dict[RowKey, SeedGroup]:
        return self.cells.get(column, {})

    def preset_cells(self, column: str) -> dict[str, SeedGroup]:
        """The cells of a column whose runs are its presets, by model."""
        return {model: group for (model, other), group in self.column(column).items() if not other}


def model_rank(model: str) -> tuple[int, str]:
    """Table 1 row order: softmax, 1.5-entmax, α-entmax, sparsemax, then other models by name."""
    order = list(TRANSLATION_MODEL_ROWS)
    return (order.index(model) if model in order else len(order), model)


def row_label(model: str) -> str:
    return TRANSLATION_MODEL_ROWS.get(model, model)


def table_models() -> list[str]:
    """The model presets of Table 1's rows in row order, then the runner's others by name."""
    names = model_names()
    return sorted(names, key=model_rank)


def column_of(rec: RunRecord) -> str | None:
    """The Table 1 column of a run's task (its resolved cfg.task.name, an alias such as `iwslt` included)."""
    task = canonical_task(rec.task)
    return next((column for column, spec in TRANSLATION_COLUMNS.items() if spec["tasks"][0] == task), None)


def cell_preset(column: str, model: str) -> Preset:
    """The preset of a cell: what `translation_fill_command(column, model)` composes."""
    return Preset((f"experiment={TRANSLATION_COLUMNS[column]['experiment']}", f"model={model}"))


def row_of(rec: RunRecord, column: str) -> RowKey | None:
    """The row a run of `column`'s task is in: the model preset it is, else the nearest one with the
    differences; None when no candidate composes."""
    where = {cell_preset(column, model): model for model in closest_models(rec.keys, table_models())}
    found = match(rec.keys, where, primary_metric=rec.primary_metric)
    return None if found is None else (where[found.preset], found.pairs)


def translation_picks(records: list[RunRecord]) -> Picks:
    """Our runs of each cell: completed translation runs scored on Table 1's metric (failed, diverged,
    unfinished and unreadable runs never stand for a model), those that differ only in their seed together;
    among several configurations of a cell (data), the best on validation BLEU (seeds.best_group)."""
    by_cell: dict[str, dict[RowKey, list[RunRecord]]] = {}
    outside: list[RunRecord] = []
    computed: dict[RowKey, str] = {}
    for rec in completed(records, FAMILY, METRIC):
        column = column_of(rec)
        key = row_of(rec, column) if column else None
        if key is None:
            outside.append(rec)
        else:
            by_cell.setdefault(column, {}).setdefault(key, []).append(rec)
            computed.setdefault(key, rec.label)
    picks = Picks(hidden=seed_groups(outside), computed=computed)
    for column in TRANSLATION_COLUMNS:
        rows = by_cell.get(column, {})
        for key in sorted(rows, key=_row_order):
            groups = seed_groups(rows[key])
            best = best_group(groups)
            picks.cells.setdefault(column, {})[key] = best
            picks.hidden += [group for group in groups if group is not best]
    return picks


def _row_order(key: RowKey) -> tuple:
    return (bool(key[1]), model_rank(key[0]), key[1])


def table1_rows(picks: Picks) -> list[RowKey]:
    """Table 1 rows: the paper's three models, then any other model preset we ran for a column, then the other
    runs (by nearest model and difference)."""
    published = [(m, ()) for m, row in TRANSLATION_MODEL_ROWS.items() if row in CORREIA2019_TABLE1["rows"]]
    ran = {key for column in TRANSLATION_COLUMNS for key in picks.column(column)} - set(published)
    return published + sorted(ran, key=_row_order)
