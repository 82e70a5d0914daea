"""Which of our runs stands for each model of a task+experiment: the one Table 1, the runs table behind it
and the analysis figures all show."""

from __future__ import annotations

from sparse_runner.reporting.papers.correia2019.published import (
    CORREIA2019_TABLE1,
    FAMILY,
    METRIC,
    TRANSLATION_COLUMNS,
    TRANSLATION_MODEL_ROWS,
    canonical_task,
)
from sparse_runner.reporting.runs import RunRecord, completed, pick_best

# (task, experiment) -> {model: our run of it}, models in Table 1 row order.
Picks = dict[tuple[str | None, str | None], dict[str, RunRecord]]


def model_rank(model: str) -> tuple[int, str]:
    """Table 1 row order: softmax, 1.5-entmax, α-entmax, sparsemax, then other models by name."""
    order = list(TRANSLATION_MODEL_ROWS)
    return (order.index(model) if model in order else len(order), model)


def row_label(model: str) -> str:
    return TRANSLATION_MODEL_ROWS.get(model, model)


def paper_runs(records: list[RunRecord]) -> list[RunRecord]:
    """Completed translation runs scored on Table 1's metric: failed, unfinished and unreadable runs never
    stand for a model."""
    return completed(records, FAMILY, METRIC)


def translation_picks(records: list[RunRecord]) -> Picks:
    """Our run of each model for every task+experiment, chosen on validation BLEU (runs.pick_best)."""
    groups: dict[tuple[str | None, str | None], dict[str, list[RunRecord]]] = {}
    for rec in paper_runs(records):
        if rec.model:
            groups.setdefault((canonical_task(rec.task), rec.experiment), {}).setdefault(rec.model, []).append(rec)
    return {
        key: {model: pick_best(models[model]) for model in sorted(models, key=model_rank)}
        for key, models in groups.items()
    }


def column_runs(picks: Picks, column: str) -> dict[str, RunRecord]:
    """The runs of a Table 1 column: those of its task with its experiment."""
    spec = TRANSLATION_COLUMNS[column]
    return picks.get((spec["tasks"][0], spec["experiment"]), {})


def table1_models(picks: Picks) -> list[str]:
    """Table 1 rows as our model names: the paper's three, then any other model we ran for a column."""
    published = [m for m, row in TRANSLATION_MODEL_ROWS.items() if row in CORREIA2019_TABLE1["rows"]]
    ran = {model for column in TRANSLATION_COLUMNS for model in column_runs(picks, column)}
    return published + sorted(ran - set(published), key=model_rank)
