"""Liu et al. 2022 (ERNIE-Sparse, arXiv 2203.12276), downstream results: long-document classification and QA.

The abstract reports averages only: pre-trained ERNIE-Sparse scores 92.46 on average over 3 long-document
classification tasks (a baseline: 91.63) and 74.67 over 2 QA tasks (71.43); the tasks are named in no
public source we found. OUR CHOICE of tasks, the long-document suite of its time: IMDB, Hyperpartisan, arXiv
(accuracy) and TriviaQA, HotpotQA (F1). One table, `ernie_sparse_downstream`, shown once the report holds a
run of one of these tasks or their offline substitutes (a part of the paper `ernie_sparse`'s tables):

- published rows: ERNIE-Sparse and the unnamed baseline, averages only;
- ours: one row per model preset (`model=ernie_sparse`, `bigbird`, `softmax`) and setting (paper presets
  `experiment=liu2022_<task>`, CPU presets `experiment=liu2022_<task>_cpu` or the QA substitute's
  `liu2022_qa_cpu`). A run fills a cell when its resolved config is that cell's preset in every
  result-changing key but the seed (presets.py), whatever its command line said; a cell is the mean ± std
  (n) over seeds (seeds.py); an empty cell shows the command that fills it. Any other run of these tasks is
  an "other runs" row naming the nearest preset and what differs.
- the offline substitutes (`sotu_era` for classification, `sotu_long_cloze` for QA) have columns of their
  own, marked †, and never enter an average.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparse_runner.reporting import seeds
from sparse_runner.reporting.presets import CONF_DIR, Preset, match, model_names, shown
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup, best_group, seed_groups
from sparse_runner.reporting.values import mean, number_format, pct

CITATION = "Liu et al., arXiv 2203.12276, 2022"
SUBSTITUTE = "†"
NOT_PUBLISHED = "n/p"

# task.name -> column; each group's Avg follows its tasks, then its substitute's column.
CLASSIFICATION = {"imdb_long": "IMDB", "hyperpartisan": "Hyperpartisan", "arxiv_classification": "arXiv"}
QA = {"triviaqa": "TriviaQA", "hotpotqa": "HotpotQA"}
SUBSTITUTES = {"sotu_era": f"SOTU era {SUBSTITUTE}", "sotu_long_cloze": f"SOTU cloze {SUBSTITUTE}"}
CLS_AVG, QA_AVG = "Cls Avg", "QA Avg"
COLUMNS = [*CLASSIFICATION.values(), CLS_AVG, SUBSTITUTES["sotu_era"], *QA.values(), QA_AVG, SUBSTITUTES["sotu_long_cloze"]]
TASKS = {**CLASSIFICATION, **QA, **SUBSTITUTES}

ACCURACY, F1 = "test/accuracy", "test/f1"
# Classification accuracy is a fraction (shown in %); QA F1 is a percentage already (SQuAD's script).
METRICS = {task: (ACCURACY if task in CLASSIFICATION or task == "sotu_era" else F1) for task in TASKS}
_PERCENT = number_format(".2f")
FORMATS = {ACCURACY: pct, F1: _PERCENT}

# The abstract's numbers: averages over the paper's (unnamed) tasks.
PUBLISHED = {"ERNIE-Sparse": {CLS_AVG: 92.46, QA_AVG: 74.67}, "baseline (unnamed in the abstract)": {CLS_AVG: 91.63, QA_AVG: 71.43}}

# Our rows: model preset -> what it is.
MODELS = {"ernie_sparse": "ERNIE-Sparse: HST + SAR", "bigbird": "BigBird", "softmax": "dense Transformer"}
# setting -> task.name -> the experiment of its preset (only those conf/experiment has are used).
SETTINGS = {
    "paper": {"label": "ours: paper presets", "experiments": {
        "imdb_long": "liu2022_imdb", "hyperpartisan": "liu2022_hyperpartisan", "arxiv_classification": "liu2022_arxiv",
        "sotu_era": "liu2022_sotu_era", "triviaqa": "liu2022_triviaqa", "hotpotqa": "liu2022_hotpotqa"}},
    "cpu": {"label": "ours: CPU presets", "experiments": {
        "imdb_long": "liu2022_imdb_cpu", "hyperpartisan": "liu2022_hyperpartisan_cpu", "arxiv_classification": "liu2022_arxiv_cpu",
        "sotu_era": "liu2022_sotu_era_cpu", "triviaqa": "liu2022_triviaqa_cpu", "hotpotqa": "liu2022_hotpotqa_cpu",
        "sotu_long_cloze": "liu2022_qa_cpu"}},
}


def has_experiment(name: str) -> bool:
    return (CONF_DIR / "experiment" / f"{name}.yaml").is_file()


def preset(task: str, setting: str, model: str) -> Preset | None:
    """The preset of our cell of `task` in `setting` for `model`; None where the runner has none."""
    experiment = SETTINGS[setting]["experiments"].get(task)
    if experiment is None or not has_experiment(experiment) or model not in model_names():
        return None
    return Preset((f"experiment={experiment}", f"model={model}"))


@dataclass
class OurRow:
    """A model preset in one setting, or the runs that differ from it in the same `other` keys and values."""

    model: str
    setting: str
    other: tuple[str, ...] = ()
    computed: str = ""
    candidates: dict[str, list[SeedGroup]] = field(default_factory=dict)   # task -> its configurations

    @property
    def cells(self) -> dict[str, SeedGroup]:
        return {task: group for task, groups in self.candidates.items() if (group := best_group(groups)) is not None}

    @property
    def label(self) -> str:
        return self.computed if self.other else f"{MODELS[self.model]} ({self.model})"

    @property
    def source(self) -> str:
        if not self.other:
            return SETTINGS[self.setting]["label"]
        return f"ours: other runs (nearest: {self.setting} preset, model={self.model}; {shown(self.other)})"

    def sort_key(self) -> tuple:
        return (bool(self.other), list(SETTINGS).index(self.setting), list(MODELS).index(self.model), self.other)


def file_run(rec: RunRecord) -> tuple[str, str, tuple[str, ...]] | None:
    """(setting, model, differences) of the preset the run is, else the nearest; None when none composes."""
    where = {}
    for setting in SETTINGS:
        for model in MODELS:
            if (found := preset(rec.task or "", setting, model)) is not None:
                where[found] = (setting, model)
    found = match(rec.keys, where, primary_metric=rec.primary_metric)
    return None if found is None else (*where[found.preset], found.pairs)


def our_rows(records: list[RunRecord]) -> list[OurRow]:
    """The preset rows (every model in both settings), then a row per other-runs difference."""
    rows = {(model, setting, ()): OurRow(model, setting) for setting in SETTINGS for model in MODELS}
    runs: dict[tuple, list[RunRecord]] = {}
    for rec in records:
        if rec.task in TASKS and rec.status == "completed" and rec.metric(METRICS[rec.task]) is not None:
            if (filed := file_run(rec)) is not None:
                setting, model, other = filed
                rows.setdefault((model, setting, other), OurRow(model, setting, other, rec.label))
                runs.setdefault((model, setting, other), []).append(rec)
    for key, row in rows.items():
        for task in TASKS:
            if groups := seed_groups([rec for rec in runs.get(key, []) if rec.task == task]):
                row.candidates[task] = groups
    return sorted(rows.values(), key=OurRow.sort_key)


# ----------------------------------------------------------------------------------------------- cells
def cell(group: SeedGroup, task: str) -> str:
    metric = METRICS[task]
    return group.text(metric, FORMATS[metric]) + (f" {SUBSTITUTE}" if group.substitute else "")


def average(row: OurRow, tasks: dict[str, str]) -> str:
    """The mean of the group's cell means (in %), only when every task of the group is filled."""
    means = []
    for task in tasks:
        group = row.cells.get(task)
        value = group.mean(METRICS[task]) if group is not None else None
        if value is None:
            return ""
        means.append(100 * value if METRICS[task] == ACCURACY else value)
    return f"{mean(means):.2f}" + (f" {SUBSTITUTE}" if any(row.cells[t].substitute for t in tasks) else "")


def our_cell(row: OurRow, task: str) -> str:
    group = row.cells.get(task)
    if group is not None:
        return cell(group, task)
    found = None if row.other else preset(task, row.setting, row.model)
    return f"run: {found.command}" if found else ""


def body_row(row: OurRow) -> list[str]:
    out = [row.label, row.source]
    for column in COLUMNS:
        if column == CLS_AVG:
            out.append(average(row, CLASSIFICATION))
        elif column == QA_AVG:
            out.append(average(row, QA))
        else:
            out.append(our_cell(row, next(task for task, name in TASKS.items() if name == column)))
    return out


# ----------------------------------------------------------------------------------------------- table
def shown_for(records: list[RunRecord]) -> bool:
    """Whether the report holds a run (whatever its status) of one of the table's tasks."""
    return any(rec.task in TASKS for rec in records)


def tables(records: list[RunRecord]) -> list[Table]:
    if not shown_for(records):
        return []
    rows = our_rows(records)
    body = [[name, "published: " + CITATION, *(f"{values[c]:.2f}" if c in values else NOT_PUBLISHED for c in COLUMNS)]
            for name, values in PUBLISHED.items()]
    rules, previous = set(), None
    for row in rows:
        group = (bool(row.other), row.setting)
        if group != previous:
            rules.add(len(body))
            previous = group
        body.append(body_row(row))
    return [Table(
        slug="ernie_sparse_downstream",
        title="ERNIE-Sparse downstream: long-document classification (test accuracy %) and QA (test F1), published vs ours",
        headers=["model", "source", *COLUMNS], rows=body, numeric=set(range(2, 2 + len(COLUMNS))), rules_before=rules,
        notes=_notes(rows),
    )]


def _notes(rows: list[OurRow]) -> list[str]:
    notes = [
        f"Published: {CITATION}, abstract: pre-trained ERNIE-Sparse averages {PUBLISHED['ERNIE-Sparse'][CLS_AVG]:.2f} over 3 "
        f"long-document classification tasks and {PUBLISHED['ERNIE-Sparse'][QA_AVG]:.2f} over 2 QA tasks, against "
        f"{PUBLISHED['baseline (unnamed in the abstract)'][CLS_AVG]:.2f} and {PUBLISHED['baseline (unnamed in the abstract)'][QA_AVG]:.2f} "
        f"for a baseline the abstract does not name. Its tasks and per-task numbers are in no public source we found ({NOT_PUBLISHED}).",
        "OUR CHOICE of tasks (not the paper's, which are unknown): IMDB (whole reviews), Hyperpartisan News Detection "
        "(by-article, a seeded 80/10/10 split: its test set is hidden) and arXiv classification (He et al. 2019, 11 classes), "
        "test accuracy; TriviaQA and HotpotQA, test F1. So our averages and the published ones average different tasks.",
        "Ours: one row per model preset (`model=ernie_sparse`, `model=bigbird`, `model=softmax` = dense attention) and "
        "setting: paper presets (`experiment=liu2022_<task>`: 4,096 ids, 12 layers, masked-LM pre-training at 4,096 "
        "ids first) and CPU presets (`experiment=liu2022_<task>_cpu`, `liu2022_qa_cpu`: small models at 1,024 ids, "
        "NOT comparable with the published numbers). A cell takes the completed runs whose resolved config is the "
        "cell's preset in every result-changing key but the seed; `other runs` rows hold runs that are no preset "
        "(the nearest one and what differs, `key=value`). An empty cell shows the command that fills it.",
        seeds.NOTE,
        f"Avg: the mean of the task cells of the group (classification: 3, QA: 2), only when all are filled. {SUBSTITUTE} "
        "columns: the offline substitutes, real text with labels of our own (sotu_era: whole State of the Union "
        "addresses by era; sotu_long_cloze: cloze questions over whole speeches); another task than any published "
        "number, never in an average.",
    ]
    floors = _floors(rows)
    if floors:
        notes.append("Floors of our cells (metrics.json task_info.baselines, test split): " + "; ".join(floors) + ".")
    return notes


def _floors(rows: list[OurRow]) -> list[str]:
    """`SOTU era †: majority 30.51, bag_of_words_nearest_centroid 91.53` per task with a filled cell."""
    out = {}
    for row in rows:
        for task, group in row.cells.items():
            info = group.first.data.get("task_info")
            baselines = info.get("baselines") if isinstance(info, dict) else None
            if task not in out and isinstance(baselines, dict) and baselines:
                fmt = FORMATS[METRICS[task]]
                out[task] = f"{TASKS[task]}: " + ", ".join(
                    f"{name} {fmt(value)}" for name, value in baselines.items() if isinstance(value, (int, float)))
    return list(out.values())


