"""Long Range Arena (Tay et al., ICLR 2021), Table 1: published test accuracy beside our runs.

Two tables:
- `lra_table1`: Table 1 as the paper prints it (ListOps, Text, Retrieval, Image, Pathfinder, Avg), the 11
  published rows, then our rows: one per (model, setting), where the setting is the paper presets
  (`experiment=lra_<task>`), the CPU presets (`experiment=lra_<task>_cpu`) or, for any other run, its task
  config. Each cell is the mean ± std (n) of the completed runs of that column in that row that differ only in
  their seed (seeds.py), the best such group where several configurations compete; an empty cell we know how
  to fill shows the command that fills it; a cell measured on substitute data carries a dagger.
- `lra_table1_runs`: every completed LRA run behind it, a row per group of seeds, with its scale, data,
  majority-class floor and overrides (only when there is one).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from sparse_runner.reporting import seeds
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, completed
from sparse_runner.reporting.seeds import SeedGroup, best_group, distinct, seed_groups
from sparse_runner.reporting.values import as_float, as_str, pct

CITATION = "Tay et al., ICLR 2021, Table 1"

# Official results: Tay et al., "Long Range Arena: A Benchmark for Efficient Transformers", ICLR 2021,
# Table 1 (test accuracy %, identical in google-research/long-range-arena's README leaderboard; PAPERS.md
# D.2). Path-X: every model FAILed (no better than chance). "Avg" is the paper's printed mean of the five
# tasks without Path-X.
# Discrepancy kept on purpose: Sinkhorn Trans.'s five scores average to 51.48, yet the paper prints 51.39
# and the README 51.29. We store the paper's printed value (see "notes") rather than recompute it.
LRA_TABLE1: dict = {
    "citation": CITATION,
    "columns": ["ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Path-X", "Avg"],
    "rows": {
        "Transformer": {"ListOps": 36.37, "Text": 64.27, "Retrieval": 57.46, "Image": 42.44, "Pathfinder": 71.40, "Path-X": "FAIL", "Avg": 54.39},
        "Local Attention": {"ListOps": 15.82, "Text": 52.98, "Retrieval": 53.39, "Image": 41.46, "Pathfinder": 66.63, "Path-X": "FAIL", "Avg": 46.06},
        "Sparse Trans.": {"ListOps": 17.07, "Text": 63.58, "Retrieval": 59.59, "Image": 44.24, "Pathfinder": 71.71, "Path-X": "FAIL", "Avg": 51.24},
        "Longformer": {"ListOps": 35.63, "Text": 62.85, "Retrieval": 56.89, "Image": 42.22, "Pathfinder": 69.71, "Path-X": "FAIL", "Avg": 53.46},
        "Linformer": {"ListOps": 35.70, "Text": 53.94, "Retrieval": 52.27, "Image": 38.56, "Pathfinder": 76.34, "Path-X": "FAIL", "Avg": 51.36},
        "Reformer": {"ListOps": 37.27, "Text": 56.10, "Retrieval": 53.40, "Image": 38.07, "Pathfinder": 68.50, "Path-X": "FAIL", "Avg": 50.67},
        "Sinkhorn Trans.": {"ListOps": 33.67, "Text": 61.20, "Retrieval": 53.83, "Image": 41.23, "Pathfinder": 67.45, "Path-X": "FAIL", "Avg": 51.39},
        "Synthesizer": {"ListOps": 36.99, "Text": 61.68, "Retrieval": 54.67, "Image": 41.61, "Pathfinder": 69.45, "Path-X": "FAIL", "Avg": 52.88},
        "BigBird": {"ListOps": 36.05, "Text": 64.02, "Retrieval": 59.29, "Image": 40.83, "Pathfinder": 74.87, "Path-X": "FAIL", "Avg": 55.01},
        "Linear Trans.": {"ListOps": 16.13, "Text": 65.90, "Retrieval": 53.09, "Image": 42.34, "Pathfinder": 75.30, "Path-X": "FAIL", "Avg": 50.55},
        "Performer": {"ListOps": 18.01, "Text": 65.40, "Retrieval": 53.82, "Image": 42.77, "Pathfinder": 77.05, "Path-X": "FAIL", "Avg": 51.41},
    },
    "notes": {
        "Sinkhorn Trans.": "Avg printed as 51.39 in the paper, 51.29 in the README; its five scores average to 51.48",
    },
}

# What the published numbers measure, as a run's primary metric: only runs scored on it fill a cell.
METRIC = "test/accuracy"
# The accuracy of always predicting the most frequent training label, which the LRA tasks write beside it.
MAJORITY_METRIC = "test/majority_accuracy"
# Config keys that change no test accuracy (the shifted test is measured beside it, on the same model): runs
# that differ only in them and in their seed share a cell.
POOLED_KEYS = ("trainer.test_topology_shift",)

# Which column of Table 1 a run belongs to, keyed by metrics.json "task_family" (cfg.task.family), in the
# paper's column order. Path-X is left out: every published model FAILed it and we have no such task.
COLUMNS: dict[str, str] = {
    "listops": "ListOps",
    "lra_text": "Text",
    "lra_retrieval": "Retrieval",
    "lra_image": "Image",
    "pathfinder": "Pathfinder",
}

# The data behind each published column (PAPERS.md D.3), to set beside the data of our cells.
OFFICIAL_DATA: dict[str, str] = {
    "ListOps": "LRA's generated ListOps (96k/2k/2k, 500-2000 tokens)",
    "Text": "IMDB reviews, byte level",
    "Retrieval": "AAN (ACL Anthology Network) citation pairs, byte level",
    "Image": "CIFAR-10 in 8-bit grayscale, 1024 pixels",
    "Pathfinder": "generated 32x32 Pathfinder images",
}

# Which published row each of our models reproduces (our model=softmax at the LRA configs is LRA's vanilla
# "Transformer"). Keyed by metrics.json "model" (cfg.model.name). Any other model is a row of our own.
OUR_MODEL_ROWS: dict[str, str] = {
    "softmax": "Transformer",
    "bigbird": "BigBird",
    "local": "Local Attention",
}
# The model the LRA experiments use when no model= is given: its commands need no model= override.
DEFAULT_MODEL = "softmax"

# Our settings, in the order their rows appear. A run is in the paper or CPU setting when its experiment is
# that setting's experiment for the run's task family; every other run is "other" (grouped by task config).
SETTINGS: dict[str, dict] = {
    "paper": {
        "label": "ours: paper presets",
        "experiments": {"listops": "lra_listops", "lra_text": "lra_text", "lra_retrieval": "lra_retrieval",
                        "lra_image": "lra_image", "pathfinder": "lra_pathfinder"},
    },
    "cpu": {
        "label": "ours: CPU presets",
        "experiments": {"listops": "lra_listops_cpu", "lra_text": "lra_text_cpu",
                        "lra_retrieval": "lra_retrieval_cpu", "lra_image": "lra_image_cpu",
                        "pathfinder": "lra_pathfinder_cpu"},
    },
}
OTHER = "other"

# What scale a task config trains at, for the label of an "other" row (runs without either preset, such
# as the embedded default). Keyed by metrics.json "task" (cfg.task.name); unknown tasks show their name.
TASK_SCALES: dict[str, str] = {
    "listops": "CPU size",
    "listops_lra": "paper size",
}

# Cell markers. SUBSTITUTE: the run's data is another real dataset standing in for the official one.
SUBSTITUTE = "†"
PRINTED_AVG = "‡"  # a published Avg that is not the mean of its row (see LRA_TABLE1["notes"])

# The model configs the runner has: a command is offered only for a model it can run.
MODEL_CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "model"


def runner_has_model(model: str) -> bool:
    return (MODEL_CONF_DIR / f"{model}.yaml").is_file()


def fill_command(task_family: str, setting: str = "paper", model: str | None = None) -> str | None:
    """The command that fills our cell of `task_family` in `setting` (and `model`); None for "other" rows,
    which belong to no preset."""
    experiment = SETTINGS.get(setting, {}).get("experiments", {}).get(task_family)
    if experiment is None:
        return None
    command = f"sparse-run experiment={experiment}"
    return command if model in (None, DEFAULT_MODEL) else f"{command} model={model}"


def row_command(setting: str, model: str | None = None) -> str:
    """One multirun that fills a whole row (Hydra sweeps over the experiment config group)."""
    experiments = ",".join(SETTINGS[setting]["experiments"].values())
    command = f"sparse-run -m experiment={experiments}"
    return command if model in (None, DEFAULT_MODEL) else f"{command} model={model}"


def setting_of(rec: RunRecord) -> str:
    for name, setting in SETTINGS.items():
        if rec.experiment is not None and rec.experiment == setting["experiments"].get(rec.task_family or ""):
            return name
    return OTHER


# ------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class DataInfo:
    """metrics.json task_info.data: what a run trained and was tested on."""

    source: str                  # release | hub | generated | substitute | unknown
    name: str | None = None
    substitute_for: str | None = None
    description: str | None = None

    @property
    def is_substitute(self) -> bool:
        return self.source == "substitute"

    @property
    def label(self) -> str:
        """`bbc_news † (substitute for IMDB)`, `imdb (hub)`, `generated`."""
        if self.is_substitute:
            return f"{self.name or '?'} {SUBSTITUTE} (substitute for {self.substitute_for or '?'})"
        return f"{self.name} ({self.source})" if self.name else self.source


def data_info(rec: RunRecord) -> DataInfo:
    """A run's data as task_info.data states it. ListOps runs from before the tasks wrote it are ours
    generated, unless task.data_dir pointed at LRA's release files; any other run without it is unknown."""
    info = rec.data.get("task_info")
    data = info.get("data") if isinstance(info, dict) else None
    if isinstance(data, dict) and as_str(data.get("source")):
        return DataInfo(source=str(data["source"]), name=as_str(data.get("name")),
                        substitute_for=as_str(data.get("substitute_for")), description=as_str(data.get("description")))
    if rec.task_family == "listops":
        return DataInfo(source="release") if rec.config.get("task.data_dir") else DataInfo(source="generated")
    return DataInfo(source="unknown")


# --------------------------------------------------------------------------------------- our rows
@dataclass
class OurRow:
    """One row of ours: a model in one setting (and, for "other" runs, one experiment and task config)."""

    model: str
    setting: str
    experiment: str | None = None     # "other" rows only
    task: str | None = None           # "other" rows only
    candidates: dict[str, list[SeedGroup]] = field(default_factory=dict)   # column -> its configurations

    @property
    def cells(self) -> dict[str, SeedGroup]:
        """Column -> the group shown (seeds.best_group)."""
        return best_groups(self.candidates)

    @property
    def model_label(self) -> str:
        """`Transformer (softmax)` for a model that reproduces a published row, else the model name."""
        published = OUR_MODEL_ROWS.get(self.model)
        return f"{published} ({self.model})" if published else self.model

    @property
    def setting_label(self) -> str:
        if self.setting in SETTINGS:
            return SETTINGS[self.setting]["label"]
        parts = [f"experiment={self.experiment}"] if self.experiment else []
        parts.append(f"task={self.task or '?'}" + (f" ({TASK_SCALES[self.task]})" if self.task in TASK_SCALES else ""))
        return "ours: " + ", ".join(parts)

    def sort_key(self) -> tuple:
        settings = [*SETTINGS, OTHER]
        published_order = list(LRA_TABLE1["rows"])
        published = OUR_MODEL_ROWS.get(self.model)
        model_rank = published_order.index(published) if published else len(published_order)
        return (settings.index(self.setting), model_rank, self.model, self.experiment or "", self.task or "")


def lra_runs(records: list[RunRecord]) -> list[RunRecord]:
    """Completed runs of the five Table 1 families scored on test accuracy; failed, unfinished and
    unreadable runs never fill a cell."""
    return [rec for family in COLUMNS for rec in completed(records, family, METRIC)]


def cell_groups(runs: list[RunRecord]) -> list[SeedGroup]:
    """The configurations competing for one cell: its runs that differ only in their seed (and POOLED_KEYS)
    pooled."""
    return seed_groups(runs, ignore=POOLED_KEYS)


def best_groups(candidates: dict[str, list[SeedGroup]]) -> dict[str, SeedGroup]:
    """Column -> the group a cell shows: official data first, then the best on validation (seeds.best_group)."""
    return {column: best_group(groups) for column, groups in candidates.items()}


def _row_key(rec: RunRecord) -> tuple:
    """(model, setting, experiment, task) of the row a run belongs to. A preset names the whole row; an
    "other" run's row is its own experiment and task config, since runs of two task configs (CPU-size and
    paper-size ListOps, say) are not candidates for one cell."""
    setting = setting_of(rec)
    return (rec.model or "?", setting, *((rec.experiment, rec.task) if setting == OTHER else (None, None)))


def our_rows(records: list[RunRecord]) -> list[OurRow]:
    """Our rows in table order: paper presets, CPU presets, other runs; published models first within each.
    The paper row of every published model the runner has, and the CPU row of softmax, are there even without
    runs, so that their empty cells say what to run."""
    groups: dict[tuple, list[RunRecord]] = {}
    for model in OUR_MODEL_ROWS:
        if runner_has_model(model):
            groups.setdefault((model, "paper", None, None), [])
    groups.setdefault((DEFAULT_MODEL, "cpu", None, None), [])
    for rec in lra_runs(records):
        groups.setdefault(_row_key(rec), []).append(rec)
    rows = []
    for (model, setting, experiment, task), runs in groups.items():
        row = OurRow(model=model, setting=setting, experiment=experiment, task=task)
        for family, column in COLUMNS.items():
            if configurations := cell_groups([rec for rec in runs if rec.task_family == family]):
                row.candidates[column] = configurations
        rows.append(row)
    return sorted(rows, key=OurRow.sort_key)


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
    command = fill_command(family, row.setting, row.model)
    return f"run: {command}" if command else ""


def group_cell(group: SeedGroup, metric: str = METRIC) -> str:
    """`36.50 ± 0.42 (n=3)`, marked when measured on substitute data."""
    return group.text(metric, pct) + (f" {SUBSTITUTE}" if group.substitute else "")


def avg_value(cells: dict[str, SeedGroup]) -> float | None:
    """The mean of the five cell means, only when all five are there (the paper's Avg has five terms)."""
    means = [cells[column].mean(METRIC) if column in cells else None for column in COLUMNS.values()]
    return None if None in means else statistics.fmean(means)


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
        if row.setting != previous:
            rules.add(len(body))
            previous = row.setting
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
        "Ours: one row per model (softmax reproduces LRA's vanilla Transformer, bigbird BigBird, local Local "
        "Attention; any other model is a row of our own) and setting. Each cell is the test accuracy of the "
        "completed runs of that column that differ only in their seed (and `trainer.test_topology_shift`, which "
        "changes no test accuracy); where runs of several configurations compete, the one on official data with "
        "the best mean validation accuracy; failed, diverged and unfinished runs never fill a cell."
        + (" Every completed run is listed in 'LRA Table 1: our runs'." if any(row.candidates for row in rows) else ""),
        seeds.NOTE,
        "Settings: `paper presets` = `experiment=lra_<task>` (LRA's released configs; GPU-sized), the rows to "
        "compare with the published ones where their data is the official one; `CPU presets` = "
        "`experiment=lra_<task>_cpu` (small models and data that train in minutes on a CPU): they check the "
        "pipeline and are NOT comparable with the published numbers; `task=...` rows = runs without either "
        "preset, one row per task config, also not comparable.",
        "Avg of ours: the mean of the five cell means, shown only when all five are filled.",
        "Official data: " + "; ".join(f"{column}: {text}" for column, text in OFFICIAL_DATA.items()) + ".",
    ]
    notes += _data_notes(rows)
    commands = [f"{row.model_label}, {row.setting_label}: `{row_command(row.setting, row.model)}`" for row in rows
                if row.setting in SETTINGS and len(row.cells) < len(COLUMNS)]
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


# ------------------------------------------------------------------------------------- runs table
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
    steps = as_float(rec.data.get("step"))
    steps = steps if steps is not None else as_float(config.get("trainer.max_steps"))
    if steps is not None:
        parts.append(f"{int(steps)} steps")
    return ", ".join(parts)


def runs_table(rows: list[OurRow]) -> Table | None:
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
