"""Which of our runs stand for each model of a task+experiment: the group of seeds Table 1, the runs table
behind it and the analysis figures all show."""

from __future__ import annotations

from sparse_runner.reporting.papers.correia2019.published import (
    CORREIA2019_TABLE1,
    FAMILY,
    METRIC,
    TRANSLATION_COLUMNS,
    TRANSLATION_MODEL_ROWS,
    canonical_task,
)
from sparse_runner.reporting.runs import RunRecord, completed
from sparse_runner.reporting.seeds import SeedGroup, best_group, seed_groups

# (task, experiment) -> {model: our runs of it}, models in Table 1 row order.
Picks = dict[tuple[str | None, str | None], dict[str, SeedGroup]]


def model_rank(model: str) -> tuple[int, str]:
    """Table 1 row order: softmax, 1.5-entmax, α-entmax, sparsemax, then other models by name."""
    order = list(TRANSLATION_MODEL_ROWS)
    return (order.index(model) if model in order else len(order), model)


def row_label(model: str) -> str:
    return TRANSLATION_MODEL_ROWS.get(model, model)


def paper_groups(records: list[RunRecord]) -> list[SeedGroup]:
    """Completed translation runs scored on Table 1's metric, those that differ only in their seed together:
    failed, diverged, unfinished and unreadable runs never stand for a model."""
    return seed_groups(completed(records, FAMILY, METRIC))


def translation_picks(records: list[RunRecord]) -> Picks:
    """Our runs of each model for every task+experiment: among several configurations, the best on
    validation BLEU (seeds.best_group)."""
    candidates: dict[tuple[str | None, str | None], dict[str, list[SeedGroup]]] = {}
    for group in paper_groups(records):
        rec = group.first
        if rec.model:
            candidates.setdefault((canonical_task(rec.task), rec.experiment), {}).setdefault(rec.model, []).append(group)
    return {
        key: {model: best_group(models[model]) for model in sorted(models, key=model_rank)}
        for key, models in candidates.items()
    }


def column_runs(picks: Picks, column: str) -> dict[str, SeedGroup]:
    """The runs of a Table 1 column: those of its task with its experiment, by model."""
    spec = TRANSLATION_COLUMNS[column]
    return picks.get((spec["tasks"][0], spec["experiment"]), {})


def table1_models(picks: Picks) -> list[str]:
    """Table 1 rows as our model names: the paper's three, then any other model we ran for a column."""
    published = [m for m, row in TRANSLATION_MODEL_ROWS.items() if row in CORREIA2019_TABLE1["rows"]]
    ran = {model for column in TRANSLATION_COLUMNS for model in column_runs(picks, column)}
    return published + sorted(ran - set(published), key=model_rank)
