"""Long Range Arena (Tay et al., ICLR 2021), Table 1: published test accuracy beside our runs.

Two tables:
- `lra_table1`: Table 1 as the paper prints it (ListOps, Text, Retrieval, Image, Pathfinder, Avg), the 11
  published rows, then our rows. A row of ours is a model preset in one setting: the paper presets
  (`experiment=lra_<task>`) or the CPU presets (`experiment=lra_<task>_cpu`), `model=<preset>`. A run fills
  a cell of it only when its resolved config is that cell's preset in every result-changing key but the seed
  (presets.py), whatever its command line said: `model=softmax normaliser=alpha_entmax` is in the `entmax`
  row, not the Transformer's. Any other run is in an "other runs" row that names the nearest preset and what
  differs from it (`trainer.lr=0.01`). Each cell is the mean ± std (n) of the completed runs of that column in
  that row that differ only in their seed (seeds.py), the best such group where several compete (substitute
  data beside official data); an empty cell we know how to fill shows the command that fills it; a cell
  measured on substitute data carries a dagger.
- `lra_table1_runs`: every completed LRA run behind it, a row per group of seeds, with its scale, data,
  majority-class floor and overrides (only when there is one).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from sparse_runner.reporting import seeds
from sparse_runner.reporting.papers import register_paper
from sparse_runner.reporting.papers.lra.published import (  # noqa: F401 (the paper's data, read as lra.X)
    CITATION,
    COLUMNS,
    DEFAULT_MODEL,
    LRA_TABLE1,
    MAJORITY_METRIC,
    METRIC,
    OFFICIAL_DATA,
    OUR_MODEL_ROWS,
    POOLED_KEYS,
    PRINTED_AVG,
    SETTINGS,
    SUBSTITUTE,
    DataInfo,
    data_info,
)
from sparse_runner.reporting.papers.lra.runs import runs_table
from sparse_runner.reporting.presets import Match, Preset, agrees, closest_models, match, model_names, shown
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, completed
from sparse_runner.reporting.seeds import SeedGroup, best_group, cell_seed_groups
from sparse_runner.reporting.values import mean, pct

OTHER = "other"   # the rows of runs that are no preset, after the settings' rows
# What an experiment fixes whatever the model preset: a run is compared key by key only with the presets of the
# settings whose experiment agrees with it on these (both settings when neither does).
SHAPE_KEYS = ("task.name", "model.d_model", "model.num_layers")


def runner_has_model(model: str) -> bool:
    """Whether conf/model has the preset: a row, a command and a candidate only for a model it can run."""
    return model in model_names()


def table_models() -> list[str]:
    """The model presets of our rows in table order: the published rows' (OUR_MODEL_ROWS), then the others by
    name; only those the runner has."""
    ordered = [*OUR_MODEL_ROWS, *(name for name in model_names() if name not in OUR_MODEL_ROWS)]
    return [name for name in ordered if runner_has_model(name)]


def preset(task_family: str, setting: str, model: str = DEFAULT_MODEL, extra: Sequence[str] = ()) -> Preset | None:
    """The preset of our cell of `task_family` in `setting` for `model` (and `extra` overrides); None for a
    family or setting without one."""
    experiment = SETTINGS.get(setting, {}).get("experiments", {}).get(task_family)
    if experiment is None:
        return None
    return Preset((f"experiment={experiment}", *(() if model == DEFAULT_MODEL else (f"model={model}",)), *extra))


def fill_command(task_family: str, setting: str = "paper", model: str | None = None) -> str | None:
    """The command that fills our cell of `task_family` in `setting` (and `model`); None for "other" rows,
    which belong to no preset."""
    found = preset(task_family, setting, model or DEFAULT_MODEL)
    return found.command if found else None


def row_command(setting: str, model: str | None = None) -> str:
    """One multirun that fills a whole row (Hydra sweeps over the experiment config group)."""
    experiments = ",".join(SETTINGS[setting]["experiments"].values())
    command = f"sparse-run -m experiment={experiments}"
    return command if model in (None, DEFAULT_MODEL) else f"{command} model={model}"


@dataclass(frozen=True)
class Filing:
    """Where a run is in our rows: the preset it is (`match.exact`) or the nearest one, as setting, model and
    the extra overrides of the row's variant (ERNIE-Sparse's `regulariser=rdrop`)."""

    setting: str
    model: str
    extra: tuple[str, ...]
    match: Match

    @property
    def other(self) -> tuple[str, ...]:
        """What differs from the preset, `key=value`; () for a run that is the preset."""
        return self.match.pairs


def file_run(rec: RunRecord, models: Sequence[str], extra: Sequence[str] = ()) -> Filing | None:
    """The preset of `rec`'s task family among `models` (the ones whose recipe is closest to the run's,
    presets.closest_models) in the settings whose experiment has the run's task and size (else both) that the
    run is, else the nearest; `extra` overrides are added to every candidate. None when no candidate composes."""
    family = rec.task_family or ""
    settings = [s for s in SETTINGS if agrees(rec.keys, preset(family, s), SHAPE_KEYS)] or list(SETTINGS)
    where: dict[Preset, tuple[str, str]] = {}
    for model in closest_models(rec.keys, models):
        for setting in settings:
            if (found := preset(family, setting, model, extra)) is not None:
                where[found] = (setting, model)
    found = match(rec.keys, where, primary_metric=rec.primary_metric, ignore=POOLED_KEYS)
    return None if found is None else Filing(*where[found.preset], tuple(extra), found)


# --------------------------------------------------------------------------------------- our rows
def setting_label(setting: str, model: str, other: tuple[str, ...] = (), extra: Sequence[str] = ()) -> str:
    """`ours: CPU presets`, or for runs that are no preset `ours: other runs (nearest: CPU presets, model=entmax;
    trainer.lr=0.01)`: the nearest preset and what differs from it."""
    if not other:
        return SETTINGS[setting]["label"]
    nearest = [SETTINGS[setting]["name"], *([f"model={model}"] if model != DEFAULT_MODEL else []), *extra]
    return f"ours: other runs (nearest: {', '.join(nearest)}; {shown(other)})"


@dataclass
class OurRow:
    """One row of ours: a model preset in one setting, or the runs that differ from that preset in the same
    `other` keys and values."""

    model: str
    setting: str
    other: tuple[str, ...] = ()       # other runs: `key=value` differences from the preset; () = the preset
    computed: str = ""                # other runs: what they computed (identity.axes label)
    candidates: dict[str, list[SeedGroup]] = field(default_factory=dict)   # column -> its configurations

    @property
    def cells(self) -> dict[str, SeedGroup]:
        """Column -> the group shown (seeds.best_group)."""
        return best_groups(self.candidates)

    @property
    def is_preset(self) -> bool:
        return not self.other

    @property
    def model_label(self) -> str:
        """`Transformer (softmax)` for a preset that reproduces a published row, else the preset's name; other
        runs: their axes (`alpha_entmax · dense · h4`)."""
        if self.other:
            return self.computed
        published = OUR_MODEL_ROWS.get(self.model)
        return f"{published} ({self.model})" if published else self.model

    @property
    def setting_label(self) -> str:
        return setting_label(self.setting, self.model, self.other)

    @property
    def group(self) -> str:
        """The rows a rule separates: each setting's presets, then every other run."""
        return OTHER if self.other else self.setting

    def sort_key(self) -> tuple:
        models = table_models()
        model_rank = models.index(self.model) if self.model in models else len(models)
        return (bool(self.other), list(SETTINGS).index(self.setting), model_rank, self.model, self.other)


def lra_runs(records: list[RunRecord]) -> list[RunRecord]:
    """Completed runs of the five Table 1 families scored on test accuracy; failed, unfinished and
    unreadable runs never fill a cell."""
    return [rec for family in COLUMNS for rec in completed(records, family, METRIC)]


def cell_groups(runs: list[RunRecord]) -> list[SeedGroup]:
    """The configurations competing for one cell: its runs that differ only in their seed (and POOLED_KEYS)
    pooled."""
    return cell_seed_groups(runs, ignore=POOLED_KEYS)


def best_groups(candidates: dict[str, list[SeedGroup]]) -> dict[str, SeedGroup]:
    """Column -> the group a cell shows: official data first, then the best on validation (seeds.best_group)."""
    return {column: best_group(groups) for column, groups in candidates.items()}


def fill_rows(rows: dict[tuple, OurRow], keyed: list[tuple[tuple, RunRecord]]) -> list[OurRow]:
    """Each row's cells from `keyed` (row key, run), in COLUMNS order."""
    by_row: dict[tuple, list[RunRecord]] = {}
    for key, rec in keyed:
        by_row.setdefault(key, []).append(rec)
    for key, row in rows.items():
        runs = by_row.get(key, [])
        for family, column in COLUMNS.items():
            if configurations := cell_groups([rec for rec in runs if rec.task_family == family]):
                row.candidates[column] = configurations
    return list(rows.values())


def our_rows(records: list[RunRecord]) -> list[OurRow]:
    """Our rows in table order: paper presets, CPU presets (published models first within each), then other
    runs. The paper row of every published model the runner has, and the CPU row of softmax, are there even
    without runs, so that their empty cells say what to run."""
    rows: dict[tuple, OurRow] = {}
    for model in OUR_MODEL_ROWS:
        if runner_has_model(model):
            rows[(model, "paper", ())] = OurRow(model, "paper")
    rows.setdefault((DEFAULT_MODEL, "cpu", ()), OurRow(DEFAULT_MODEL, "cpu"))
    keyed = []
    models = table_models()
    for rec in lra_runs(records):
        filing = file_run(rec, models)
        if filing is None:
            continue
        key = (filing.model, filing.setting, filing.other)
        rows.setdefault(key, OurRow(filing.model, filing.setting, filing.other, rec.label))
        keyed.append((key, rec))
    return sorted(fill_rows(rows, keyed), key=OurRow.sort_key)


# ----------------------------------------------------------------------------------------- tables
def tables(records: list[RunRecord]) -> list[Table]:
    """Table 1 (always: without runs its empty cells say what to run), and our runs behind it if any."""
    rows = our_rows(records)
    runs = runs_table(rows)
    return [table1(rows)] + ([runs] if runs else [])


def sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    return [], []


def _published_cell(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else str(value or "")


def _our_cell(row: OurRow, family: str, column: str) -> str:
    group = row.cells.get(column)
    if group is not None:
        return group_cell(group)
    command = None if row.other else fill_command(family, row.setting, row.model)
    return f"run: {command}" if command else ""


def group_cell(group: SeedGroup, metric: str = METRIC) -> str:
    """`36.50 ± 0.42 (n=3)`, marked when measured on substitute data."""
    return group.text(metric, pct) + (f" {SUBSTITUTE}" if group.substitute else "")


def avg_value(cells: dict[str, SeedGroup]) -> float | None:
    """The mean of the five cell means, only when all five are there (the paper's Avg has five terms)."""
    means = [cells[column].mean(METRIC) if column in cells else None for column in COLUMNS.values()]
    return None if None in means else mean(means)


def avg_cell(cells: dict[str, SeedGroup]) -> str:
    """avg_value, marked when any of its cells is measured on substitute data."""
    value = avg_value(cells)
    if value is None:
        return ""
    return pct(value) + (f" {SUBSTITUTE}" if any(group.substitute for group in cells.values()) else "")


def table1(rows: list[OurRow]) -> Table:
    columns = list(COLUMNS.values())
    body = []
    for name, values in LRA_TABLE1["rows"].items():
        avg = _published_cell(values.get("Avg")) + (f" {PRINTED_AVG}" if name in LRA_TABLE1["notes"] else "")
        body.append([name, "published", *(_published_cell(values.get(c)) for c in columns), avg])
    # A rule under the published rows and between our settings (LaTeX \midrule).
    rules, previous = set(), None
    for row in rows:
        if row.group != previous:
            rules.add(len(body))
            previous = row.group
        body.append([row.model_label, row.setting_label,
                     *(_our_cell(row, family, column) for family, column in COLUMNS.items()), avg_cell(row.cells)])
    return Table(
        slug="lra_table1",
        title="LRA Table 1: published vs ours (test accuracy %)",
        headers=["model", "source", *columns, "Avg"],
        rows=body, numeric=set(range(2, 3 + len(columns))), rules_before=rules, notes=_table1_notes(rows),
    )


def _table1_notes(rows: list[OurRow]) -> list[str]:
    notes = [
        f"Published: {CITATION} (test accuracy %; the same numbers are in the google-research/long-range-arena "
        "README). Avg is the paper's printed mean of the five tasks. Path-X is not shown: every published model "
        "FAILed it (chance level) and we have no Path-X task.",
        *(f"{PRINTED_AVG} {name}: {text}." for name, text in LRA_TABLE1["notes"].items()),
        "Ours: one row per model preset (softmax reproduces LRA's vanilla Transformer, bigbird BigBird, local Local "
        "Attention; any other model is a row of our own) and setting. A run is in a cell when its resolved config "
        "is the cell's preset (the config its command composes) in every result-changing key but the seed and "
        "`trainer.test_topology_shift` (which changes no test accuracy), however its command line spelled it: "
        "its `model=` name is only a label. Each cell is the test accuracy of those runs, the mean over seeds; "
        "where runs on several data compete, the one on official data with the best mean validation accuracy; "
        "failed, diverged and unfinished runs never fill a cell."
        + (" Every completed run is listed in 'LRA Table 1: our runs'." if any(row.candidates for row in rows) else ""),
        seeds.NOTE,
        "Settings: `paper presets` = `experiment=lra_<task>` (LRA's released configs; GPU-sized), the rows to "
        "compare with the published ones where their data is the official one; `CPU presets` = "
        "`experiment=lra_<task>_cpu` (small models and data that train in minutes on a CPU): they check the "
        "pipeline and are NOT comparable with the published numbers; `other runs` rows = runs that are no preset "
        "in some result-changing key, a row per nearest preset and difference (`key=value`, the overrides that "
        "turn that preset into the run; the model column says what they computed), also not comparable.",
        "Avg of ours: the mean of the five cell means, shown only when all five are filled.",
        "Official data: " + "; ".join(f"{column}: {text}" for column, text in OFFICIAL_DATA.items()) + ".",
    ]
    notes += _data_notes(rows)
    commands = [f"{row.model_label}, {row.setting_label}: `{row_command(row.setting, row.model)}`" for row in rows
                if row.is_preset and len(row.cells) < len(COLUMNS)]
    notes.append("An empty cell of ours shows the command that fills it" +
                 (("; a whole row at once: " + "; ".join(commands)) if commands else "") + ".")
    return notes


def _data_notes(rows: list[OurRow]) -> list[str]:
    """Where the data of our cells comes from, per column, and which cells are on substitute data."""
    per_column: dict[str, list[str]] = {}
    substitutes = []
    for row in rows:
        cells = []
        for column, group in row.cells.items():
            info = data_info(group.first)
            labels = per_column.setdefault(column, [])
            if info.label not in labels:
                labels.append(info.label)
            if info.is_substitute:
                cells.append(f"{column} = {info.name or '?'} for {info.substitute_for or '?'}")
        if cells:
            avg = "; its Avg includes them" if avg_value(row.cells) is not None else ""
            substitutes.append(f"{row.model_label}, {row.setting_label}: {', '.join(cells)}{avg}")
    notes = []
    if per_column:
        notes.append("Data of our cells: " + "; ".join(
            f"{column}: {', '.join(per_column[column])}" for column in COLUMNS.values() if column in per_column)
            + ". `generated` = synthetic by design, made by our generator with LRA's rules (not LRA's released "
            "files); `release` = LRA's released files; `hub` = the official dataset from a dataset hub.")
    if substitutes:
        notes.append(f"{SUBSTITUTE} substitute data: real data of another dataset standing in for the official one, "
                     "so the cell measures another task than the published number (and an Avg marked "
                     f"{SUBSTITUTE} averages such cells with the others). Cells: " + "; ".join(substitutes) + ".")
    return notes


register_paper("lra", order=10)(sys.modules[__name__])
