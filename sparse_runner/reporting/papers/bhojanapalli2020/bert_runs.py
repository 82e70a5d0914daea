"""Bhojanapalli et al. (2020), Tables 1 and 2: which of our fine-tuning runs fill which row (the rows of
bert.py).

A run is in a table's row when its resolved config is one job of the table's multirun (its experiment, the swept
key at the run's own value, the fine-tuning recipe of its task, `pretrain=none` from scratch) in every
result-changing key but the seed (presets.py), whatever its command line said. Runs of two tables' identical
jobs (Table 2A's 8 heads and Table 2B's head size 128) are in both. A squad or mnli run that is no job of any
table is an "other runs" row of the table of the nearest job, labelled with what differs from it
(`+ trainer.max_steps=100`). Geometry, pre-training and data are read from the run's config and metrics.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparse_runner.reporting.papers.bhojanapalli2020.bert_published import (
    CPU,
    GPU,
    MNLI,
    OFFICIAL_DATA,
    PAPER_TABLES,
    SETTING_LABEL,
    SQUAD,
    SUBSTITUTE,
    SUBSTITUTE_KIND,
    Geometry,
    PaperTable,
    Published,
    cell_preset,
)
from sparse_runner.reporting.presets import Match, Preset, match, shown
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup, best_group, seed_groups
from sparse_runner.reporting.values import as_int, as_str, override_value

# The keys that tell a table's GPU preset from its CPU one, and Table 1 (standard heads) from Table 2: a run
# is compared key by key only with the jobs of the tables whose experiment agrees with it on these.
_SHAPE_KEYS = ("model.d_model", "model.num_layers", "model.ffn_dim")


@dataclass(frozen=True)
class DataInfo:
    family: str
    source: str
    name: str | None = None
    substitute_for: str | None = None
    description: str | None = None

    @property
    def is_substitute(self) -> bool:
        return self.source == "substitute"

    @property
    def label(self) -> str:
        if self.is_substitute:
            return (f"{self.name or '?'} {SUBSTITUTE} ({SUBSTITUTE_KIND.get(self.family, 'substitute data')}; substitute for "
                    f"{self.substitute_for or OFFICIAL_DATA[self.family]})")
        return f"{self.name} ({self.source})" if self.name else self.source


def _task_info(rec: RunRecord) -> dict:
    info = rec.data.get("task_info")
    return info if isinstance(info, dict) else {}


def data_info(rec: RunRecord) -> DataInfo:
    data = _task_info(rec).get("data")
    if isinstance(data, dict) and as_str(data.get("source")):
        return DataInfo(rec.task_family or "?", str(data["source"]), as_str(data.get("name")),
                        as_str(data.get("substitute_for")), as_str(data.get("description")))
    return DataInfo(rec.task_family or "?", "unknown")


def geometry_of(rec: RunRecord) -> Geometry | None:
    """The run's model geometry from its config (head size null = d_model / heads); None when incomplete."""
    c = rec.config
    d, layers, heads, ffn = (as_int(c.get(f"model.{k}")) for k in ("d_model", "num_layers", "num_heads", "ffn_dim"))
    head_size = as_int(c.get("model.head_size"))
    if head_size is None and d is not None and heads:
        head_size = d // heads if d % heads == 0 else None
    if None in (d, layers, heads, head_size, ffn):
        return None
    return Geometry(d, layers, heads, head_size, ffn)


def pretraining(rec: RunRecord) -> dict | None:
    value = rec.data.get("pretraining")
    return value if isinstance(value, dict) else None


def run_parameters(rec: RunRecord) -> int | None:
    """Parameters of the masked LM the run fine-tunes: the pre-training run's count, else bert_parameters of
    the run's config with its vocabulary (task_info tokenizer + [MASK]); None when something is unknown."""
    measured = as_int((pretraining(rec) or {}).get("num_parameters"))
    if measured is not None:
        return measured
    geometry, c = geometry_of(rec), rec.config
    tokenizer = _task_info(rec).get("tokenizer")
    vocab = as_int(tokenizer.get("vocab_size")) if isinstance(tokenizer, dict) else None
    positions, norm_first = as_str(c.get("model.positions")), c.get("model.norm_first")
    learned = positions == "learned"
    max_positions = as_int(c.get("model.max_positions", c.get("task.max_length"))) if learned else 0
    if geometry is None or vocab is None or positions is None or not isinstance(norm_first, bool) or max_positions is None:
        return None
    learned_alpha = c.get("model.normaliser") == "alpha_entmax" and c.get("model.normaliser_options.alpha") is None
    return geometry.parameters(vocab_size=vocab + 1, max_positions=max_positions, learned_positions=learned,
                               norm_first=norm_first, learned_alpha=learned_alpha)


# ---------------------------------------------------------------------------------------- filing
@dataclass(frozen=True)
class Filing:
    """A run in one table: the setting of the job it is (or the nearest one) and what differs from it."""

    paper: PaperTable
    setting: str
    match: Match


def _shape(values: dict[str, Any]) -> tuple:
    return (*(as_int(values.get(key)) for key in _SHAPE_KEYS), values.get("model.head_size") is None)


def _agrees(rec: RunRecord, paper: PaperTable, setting: str) -> bool:
    """Whether the run has the shape of the table's experiment in `setting` (before its swept key)."""
    experiment = paper.experiment if setting == GPU else paper.cpu_experiment
    base = Preset((f"experiment={experiment}",)).keys
    return base is not None and _shape(base.values) == _shape(rec.keys.values)


def file_run(rec: RunRecord) -> list[Filing]:
    """The tables and settings whose job the run is; without one, the nearest job's (ties: each of them)."""
    if rec.task_family not in (SQUAD, MNLI):
        return []
    places = [(paper, setting) for paper in PAPER_TABLES for setting in (GPU, CPU)]
    places = [place for place in places if _agrees(rec, *place)] or places
    found = []
    for paper, setting in places:
        swept = rec.keys.values.get(paper.swept)
        if override_value(swept) is None:   # no plain value (an interpolation, say): never given to Hydra
            continue
        job = cell_preset(paper, setting, rec.task_family, swept, scratch=not rec.axes.pretrained)
        if (near := match(rec.keys, [job], primary_metric=rec.primary_metric)) is not None:
            found.append(Filing(paper, setting, near))
    exact = [filing for filing in found if filing.match.exact]
    fewest = min((len(filing.match.differences) for filing in found), default=0)
    return exact or [filing for filing in found if len(filing.match.differences) == fewest]


def file_runs(records: list[RunRecord]) -> list[tuple[RunRecord, Filing]]:
    """Every completed squad/mnli run with each table it is in."""
    return [(rec, filing) for rec in records if rec.status == "completed" for filing in file_run(rec)]


# ------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class RowKey:
    setting: str                   # GPU | CPU
    pretrained: bool
    geometry: Geometry | None
    other: tuple[str, ...] = ()    # other runs: `key=value` differences from the nearest job; () = a job


@dataclass
class OurRow:
    key: RowKey
    published: Published | None = None
    paper_geometry: bool = False   # the geometry of a published row (the GPU preset's)
    runs: dict[str, list[RunRecord]] = field(default_factory=lambda: {SQUAD: [], MNLI: []})

    @property
    def init(self) -> str:
        return "pre-trained" if self.key.pretrained else "from scratch"

    def label(self) -> str:
        setting = SETTING_LABEL[self.key.setting]
        if not self.paper_geometry:
            setting += f" ({self.key.geometry.label if self.key.geometry else 'geometry unknown'})"
        parts = [setting, self.init] + ([f"+ {shown(self.key.other)}"] if self.key.other else [])
        return ", ".join(parts)

    def shown(self, family: str) -> SeedGroup | None:
        """The runs a cell averages: those that differ only in their seed; among several configurations (data),
        one on the official data (a mean over two datasets measures nothing), the best on validation."""
        return best_group(seed_groups(self.runs[family]))

    @property
    def complete(self) -> bool:
        return bool(self.runs[SQUAD]) and bool(self.runs[MNLI])


def our_rows(filed: list[tuple[RunRecord, Filing]], paper: PaperTable) -> list[OurRow]:
    """The published rows (GPU preset, pre-trained; there without runs), then every other row our runs
    make, in the order: the paper's rows each followed by its from-scratch twin, other GPU rows, CPU rows."""
    rows: dict[RowKey, OurRow] = {}
    for pub in paper.rows:
        key = RowKey(GPU, True, paper.geometry(pub))
        rows[key] = OurRow(key, published=pub, paper_geometry=True)
    order = {paper.geometry(pub): i for i, pub in enumerate(paper.rows)}
    for rec, filing in filed:
        if filing.paper is not paper:
            continue
        key = RowKey(filing.setting, rec.axes.pretrained, geometry_of(rec), filing.match.pairs)
        if key not in rows:
            rows[key] = OurRow(key, paper_geometry=filing.setting == GPU and key.geometry in order)
        rows[key].runs[rec.task_family].append(rec)

    def sort_key(row: OurRow) -> tuple:
        k = row.key
        in_paper = k.setting == GPU and not k.other and k.geometry in order
        swept = paper.swept_value(k.geometry) if k.geometry else 0
        return ([GPU, CPU].index(k.setting), order[k.geometry] if in_paper else len(order), swept,
                k.geometry or Geometry(0, 0, 0, 0, 0), k.other, not k.pretrained)

    return sorted(rows.values(), key=sort_key)
