"""Bhojanapalli et al. (2020), Tables 1 and 2: BERT fine-tuned on SQuAD (F1, EM) and MNLI (accuracy) against
the number of heads and the head size, published numbers (PAPERS.md B.3) beside ours.

Three tables, shown even without runs (the published numbers, the parameter count of each model by
`bert_parameters`, and the commands that fill our cells):

    Table 1   BERT-large, d 1024, head size d/h, heads 8/16/32   experiment=bhojanapalli2020_table1
    Table 2A  d 512, head size 128, heads 8/12/16/32             experiment=bhojanapalli2020_table2a
    Table 2B  d 512, 8 heads, head size 32/64/128/256            experiment=bhojanapalli2020_table2b

One row per head geometry. Ours come from completed fine-tuning runs (task family `squad` or `mnli`) of the
table's experiment: a squad run and an mnli run of one geometry fill one row; runs of a cell that differ only
in their seed show as mean ± std (n) (seeds.py). Pre-trained runs (metrics.json `pretraining` set) and runs
from scratch (`pretrain=none`) are separate rows, never averaged together; so are runs with other overrides
than the sweep's (`+ trainer.max_steps=100` in the row label). Runs of the CPU-sized presets
(`experiment=bhojanapalli2020_table*_cpu`) are rows of their own below a rule, geometry read from their
config, labelled CPU-sized: they check the pipeline and are not comparable with the published numbers. A cell
measured on substitute data carries a dagger; the table notes name the data and its trivial baselines.

Torch-free, like all report code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sparse_runner.reporting import seeds
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup, best_group, seed_groups
from sparse_runner.reporting.values import as_float, as_str, number_format, pct
from sparse_runner.run_metrics import NON_RESULT_KEYS

CITATION = "Bhojanapalli et al., ICML 2020"

# The BERT vocabulary (WordPiece, uncased) and position table the paper's models inherit from BERT.
BERT_VOCAB = 30522
BERT_MAX_POSITIONS = 512

SQUAD, MNLI = "squad", "mnli"
SQUAD_F1, SQUAD_EM = "test/f1", "test/exact_match"                          # percent 0-100
MNLI_MATCHED, MNLI_MISMATCHED = "test/accuracy_matched", "test/accuracy_mismatched"  # fractions 0-1
MNLI_ACCURACY = "test/accuracy"  # = matched; read when a run lacks test/accuracy_matched

SUBSTITUTE = "†"
# What a substitute measures, per family: the reader must not take it for SQuAD or MNLI.
SUBSTITUTE_KIND = {
    SQUAD: "cloze questions generated over real text",
    MNLI: "sentence-pair substitute, not entailment",
}
OFFICIAL_DATA = {SQUAD: "SQuAD v1.1", MNLI: "MNLI (matched / mismatched dev sets)"}


# ------------------------------------------------------------------------------- parameter count
def bert_parameters(*, d_model: int, num_layers: int, num_heads: int, head_size: int, ffn_dim: int, vocab_size: int,
                    max_positions: int, learned_positions: bool, norm_first: bool, learned_alpha: bool = False) -> int:
    """The exact parameter count of our masked-LM model (models/bert.py MaskedLM):

    token embedding vocab x d; a learned position table max_positions x d (none when sinusoidal); per layer,
    with inner = heads x head size, the query, key and value projections 3 (d inner + inner), the output
    projection inner d + d, two LayerNorms 4 d, the feed-forward d f + f + f d + d, and one alpha per head when
    alpha is learned; a final LayerNorm 2 d only in pre-LN (norm_first) encoders; the MLM head: dense d d + d,
    LayerNorm 2 d and an output bias of vocab (its weight is the tied embedding).
    """
    d, f, inner = d_model, ffn_dim, num_heads * head_size
    attention = 3 * (d * inner + inner) + inner * d + d + (num_heads if learned_alpha else 0)
    layer = attention + 4 * d + d * f + f + f * d + d
    embeddings = vocab_size * d + (max_positions * d if learned_positions else 0)
    head = d * d + d + 2 * d + vocab_size
    return embeddings + num_layers * layer + (2 * d if norm_first else 0) + head


@dataclass(frozen=True, order=True)
class Geometry:
    d_model: int
    num_layers: int
    num_heads: int
    head_size: int
    ffn_dim: int

    def parameters(self, *, vocab_size: int = BERT_VOCAB, max_positions: int = BERT_MAX_POSITIONS,
                   learned_positions: bool = True, norm_first: bool = False, learned_alpha: bool = False) -> int:
        """bert_parameters of this geometry; the defaults are the paper's models (BERT's vocabulary, 512
        learned positions, post-LN, softmax)."""
        return bert_parameters(d_model=self.d_model, num_layers=self.num_layers, num_heads=self.num_heads,
                               head_size=self.head_size, ffn_dim=self.ffn_dim, vocab_size=vocab_size,
                               max_positions=max_positions, learned_positions=learned_positions,
                               norm_first=norm_first, learned_alpha=learned_alpha)

    @property
    def label(self) -> str:
        return f"d {self.d_model}, {self.num_layers} layers, FFN {self.ffn_dim}"


# ------------------------------------------------------------------------------ published numbers
@dataclass(frozen=True)
class Published:
    """One published row: SQuAD F1 / EM and MNLI accuracy in percent, ± where the transcription has one."""

    num_heads: int
    head_size: int
    params_m: float
    f1: float
    em: float
    mnli: float
    f1_std: float | None = None
    mnli_std: float | None = None


@dataclass(frozen=True)
class PaperTable:
    key: str
    slug: str
    title: str
    experiment: str       # the GPU preset; its CPU-sized twin is experiment + "_cpu"
    swept: str            # the config key its sweep varies
    d_model: int
    num_layers: int
    ffn_dim: int
    rows: tuple[Published, ...]
    note: str

    @property
    def cpu_experiment(self) -> str:
        return f"{self.experiment}_cpu"

    def geometry(self, pub: Published) -> Geometry:
        return Geometry(self.d_model, self.num_layers, pub.num_heads, pub.head_size, self.ffn_dim)

    @property
    def swept_name(self) -> str:
        """`heads` or `head size`, as the notes name the swept value."""
        return "head size" if self.swept == "model.head_size" else "heads"

    def swept_value(self, geometry: Geometry) -> int:
        return geometry.head_size if self.swept == "model.head_size" else geometry.num_heads

    def command(self, setting: str, values: list[int], *, scratch: bool = False, variant: tuple[str, ...] = ()) -> str:
        """The multirun that fills the rows of `values` (each job a squad or an mnli fine-tuning run)."""
        experiment = self.experiment if setting == GPU else self.cpu_experiment
        parts = ["sparse-run -m", f"experiment={experiment}", f"{self.swept}={','.join(str(v) for v in values)}",
                 *variant, *(["pretrain=none"] if scratch else [])]
        return " ".join(parts)


# Bhojanapalli, Yun, Rawat, Reddi, Kumar, "Low-Rank Bottleneck in Multi-head Attention Models", ICML 2020
# (arXiv:2002.07028 v1), Tables 1 and 2, as transcribed in PAPERS.md B.3 (SECONDARY: one transcription;
# ± only where it gave one). Table 1's models all have 336M parameters (one number for the three rows).
TABLE1 = PaperTable(
    key="table1", slug="bhojanapalli2020_table1",
    title="Bhojanapalli et al. 2020, Table 1: BERT-large (24 layers, d 1024), head size d/h; SQuAD F1/EM and MNLI accuracy (%)",
    experiment="bhojanapalli2020_table1", swept="model.num_heads", d_model=1024, num_layers=24, ffn_dim=4096,
    rows=(
        Published(8, 128, 336, 90.89, 84.1, 85.0, f1_std=0.15, mnli_std=0.2),
        Published(16, 64, 336, 90.61, 83.75, 84.5, f1_std=0.14, mnli_std=0.4),
        Published(32, 32, 336, 90.45, 83.48, 84.4, f1_std=0.08, mnli_std=0.2),
    ),
    note="Table 1: standard multi-head attention (head size d/h) at a fixed 336M parameters: more heads, "
         "smaller heads, slightly worse (the low-rank bottleneck once d/h < n = 128).",
)
TABLE2A = PaperTable(
    key="table2a", slug="bhojanapalli2020_table2a",
    title="Bhojanapalli et al. 2020, Table 2A: fixed head size 128, d 512, 24 layers, more heads; SQuAD F1/EM and MNLI accuracy (%)",
    experiment="bhojanapalli2020_table2a", swept="model.num_heads", d_model=512, num_layers=24, ffn_dim=4096,
    rows=(
        Published(8, 128, 168, 89.6, 82.73, 83.5),
        Published(12, 128, 193, 90.25, 83.18, 84.2),
        Published(16, 128, 218, 90.43, 83.59, 83.9),
        Published(32, 128, 319, 90.95, 84.4, 84.9, f1_std=0.14),
    ),
    note="Table 2A: the head size fixed at d_p = 128 (the pre-training length n) and decoupled from d = 512; "
         "more heads add parameters and help.",
)
TABLE2B = PaperTable(
    key="table2b", slug="bhojanapalli2020_table2b",
    title="Bhojanapalli et al. 2020, Table 2B: 8 heads, d 512, 24 layers, growing head size; SQuAD F1/EM and MNLI accuracy (%)",
    experiment="bhojanapalli2020_table2b", swept="model.head_size", d_model=512, num_layers=24, ffn_dim=4096,
    rows=(
        Published(8, 32, 130, 88.53, 81.19, 82.5),
        Published(8, 64, 142, 89.51, 82.41, 83.4),
        Published(8, 128, 168, 89.6, 82.73, 83.5),
        Published(8, 256, 218, 90.33, 83.36, 83.9),
    ),
    note="Table 2B: 8 heads at d = 512 with the head size growing from 32 to 256: larger heads help.",
)
PAPER_TABLES = (TABLE1, TABLE2A, TABLE2B)

GPU, CPU = "gpu", "cpu"
SETTING_LABEL = {GPU: "GPU preset", CPU: "CPU-sized preset"}
# experiment -> (table, setting)
EXPERIMENTS: dict[str, tuple[PaperTable, str]] = {
    **{paper.experiment: (paper, GPU) for paper in PAPER_TABLES},
    **{paper.cpu_experiment: (paper, CPU) for paper in PAPER_TABLES},
}
# Overrides that say which cell a job fills rather than what model it is: left out of a row's variant.
# (The swept key is left out per table; `pretrain=none` is the row's init.)
# Overrides that say which cell a run fills (the experiment sweeps `finetune`, the recipe of squad or mnli),
# and keys that change no result (run_metrics.NON_RESULT_KEYS: threads, output folder ...).
CELL_OVERRIDES = {"experiment", "task", "seed", "finetune", *NON_RESULT_KEYS}


# ------------------------------------------------------------------------------------ our runs
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


def _int(value: Any) -> int | None:
    number = as_float(value)
    return int(number) if number is not None and number == int(number) else None


def geometry_of(rec: RunRecord) -> Geometry | None:
    """The run's model geometry from its config (head size null = d_model / heads); None when incomplete."""
    c = rec.config
    d, layers, heads, ffn = (_int(c.get(f"model.{k}")) for k in ("d_model", "num_layers", "num_heads", "ffn_dim"))
    head_size = _int(c.get("model.head_size"))
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
    measured = _int((pretraining(rec) or {}).get("num_parameters"))
    if measured is not None:
        return measured
    geometry, c = geometry_of(rec), rec.config
    tokenizer = _task_info(rec).get("tokenizer")
    vocab = _int(tokenizer.get("vocab_size")) if isinstance(tokenizer, dict) else None
    positions, norm_first = as_str(c.get("model.positions")), c.get("model.norm_first")
    learned = positions == "learned"
    max_positions = _int(c.get("model.max_positions", c.get("task.max_length"))) if learned else 0
    if geometry is None or vocab is None or positions is None or not isinstance(norm_first, bool) or max_positions is None:
        return None
    learned_alpha = c.get("model.normaliser") == "alpha_entmax" and c.get("model.alpha") is None
    return geometry.parameters(vocab_size=vocab + 1, max_positions=max_positions, learned_positions=learned,
                               norm_first=norm_first, learned_alpha=learned_alpha)


def _override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def variant_of(rec: RunRecord, paper: PaperTable) -> tuple[str, ...]:
    """The run's overrides beyond which cell it fills (experiment, task, seed, the swept key, pretrain=none):
    runs that differ in them are not the same model and never share a cell."""
    kept = []
    for override in rec.overrides:
        key = _override_key(override)
        if key in CELL_OVERRIDES or key == paper.swept or key.startswith("hydra.") or override == "pretrain=none":
            continue
        kept.append(override)
    return tuple(sorted(kept))


@dataclass(frozen=True)
class RowKey:
    setting: str                   # GPU | CPU
    pretrained: bool
    geometry: Geometry | None
    variant: tuple[str, ...] = ()


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
        parts = [setting, self.init] + ([f"+ {' '.join(self.key.variant)}"] if self.key.variant else [])
        return ", ".join(parts)

    def shown(self, family: str) -> SeedGroup | None:
        """The runs a cell averages: those that differ only in their seed; among several configurations, one
        on the official data (a mean over two datasets measures nothing), the best on validation."""
        return best_group(seed_groups(self.runs[family]))

    @property
    def complete(self) -> bool:
        return bool(self.runs[SQUAD]) and bool(self.runs[MNLI])


def paper_runs(records: list[RunRecord], paper: PaperTable) -> list[tuple[RunRecord, str]]:
    """(run, setting) for the completed squad/mnli runs of the table's GPU or CPU experiment."""
    out = []
    for rec in records:
        table = EXPERIMENTS.get(rec.experiment or "")
        if table and table[0] is paper and rec.task_family in (SQUAD, MNLI) and rec.status == "completed":
            out.append((rec, table[1]))
    return out


def our_rows(records: list[RunRecord], paper: PaperTable) -> list[OurRow]:
    """The published rows (GPU preset, pre-trained; there without runs), then every other row our runs
    make, in the order: the paper's rows each followed by its from-scratch twin, other GPU rows, CPU rows."""
    rows: dict[RowKey, OurRow] = {}
    for pub in paper.rows:
        key = RowKey(GPU, True, paper.geometry(pub))
        rows[key] = OurRow(key, published=pub, paper_geometry=True)
    order = {paper.geometry(pub): i for i, pub in enumerate(paper.rows)}
    for rec, setting in paper_runs(records, paper):
        key = RowKey(setting, pretraining(rec) is not None, geometry_of(rec), variant_of(rec, paper))
        if key not in rows:
            rows[key] = OurRow(key, paper_geometry=setting == GPU and key.geometry in order)
        rows[key].runs[rec.task_family].append(rec)

    def sort_key(row: OurRow) -> tuple:
        k = row.key
        in_paper = k.setting == GPU and not k.variant and k.geometry in order
        swept = paper.swept_value(k.geometry) if k.geometry else 0
        return ([GPU, CPU].index(k.setting), order[k.geometry] if in_paper else len(order), swept,
                k.geometry or Geometry(0, 0, 0, 0, 0), k.variant, not k.pretrained)

    return sorted(rows.values(), key=sort_key)


# ------------------------------------------------------------------------------------------ cells
def _cell(group: SeedGroup | None, read, fmt) -> str:
    if group is None:
        return ""
    return group.text(read, fmt) + (f" {SUBSTITUTE}" if group.substitute else "")


_PERCENT = number_format(".2f")   # SQuAD F1 and EM are percentages already; MNLI accuracies are fractions (pct)


def _matched(rec: RunRecord) -> float | None:
    value = rec.metric(MNLI_MATCHED)
    return value if value is not None else rec.metric(MNLI_ACCURACY)


def _published(value: float | None, std: float | None = None) -> str:
    if value is None:
        return ""
    return f"{value:g}" + (f" ± {std:g}" if std is not None else "")


def _millions(count: float) -> str:
    return f"{count / 1e6:.2f}"


def params_cell(row: OurRow, paper: PaperTable) -> str:
    """The paper's rows: bert_parameters of the GPU geometry (so it shows without runs). Other rows: what
    their runs' masked LMs have (pre-training count or computed from the config); distinct values joined."""
    if row.published is not None:
        return _millions(row.key.geometry.parameters())
    counts = sorted({n for rec in row.runs[SQUAD] + row.runs[MNLI] if (n := run_parameters(rec)) is not None})
    return " / ".join(_millions(n) for n in counts)


def table_rows(rows: list[OurRow], paper: PaperTable) -> tuple[list[list[str]], set[int]]:
    body, rules, previous = [], set(), None
    for row in rows:
        if row.key.setting != previous:
            if previous is not None:
                rules.add(len(body))
            previous = row.key.setting
        pub, g = row.published, row.key.geometry
        squad, mnli = row.shown(SQUAD), row.shown(MNLI)
        body.append([
            row.label(),
            str(g.num_heads) if g else "", str(g.head_size) if g else "",
            f"{pub.params_m:g}" if pub else "", params_cell(row, paper),
            _published(pub.f1, pub.f1_std) if pub else "", _cell(squad, SQUAD_F1, _PERCENT),
            _published(pub.em) if pub else "", _cell(squad, SQUAD_EM, _PERCENT),
            _published(pub.mnli, pub.mnli_std) if pub else "", _cell(mnli, _matched, pct),
            _cell(mnli, MNLI_MISMATCHED, pct),
        ])
    return body, rules


HEADERS = ["ours (setting, init)", "heads", "head size", "params (M) published", "params (M) ours",
           "SQuAD F1 published", "SQuAD F1 ours", "SQuAD EM published", "SQuAD EM ours",
           "MNLI-m published", "MNLI-m ours", "MNLI-mm ours"]


# ------------------------------------------------------------------------------------------ notes
def _agreement_note(paper: PaperTable) -> str:
    pairs = []
    for pub in paper.rows:
        ours = paper.geometry(pub).parameters()
        pairs.append(f"{paper.swept_name} {paper.swept_value(paper.geometry(pub))}: "
                     f"{_millions(ours)}M vs {pub.params_m:g}M ({100 * (ours / 1e6 - pub.params_m) / pub.params_m:+.2f}%)")
    return ("params (M) ours = `bert_parameters` of the GPU preset's masked LM (BERT's 30,522-token vocabulary, 512 "
            "learned positions, post-LN, MLM head with tied output weights), computed, not measured: "
            + "; ".join(pairs) + ". It has no token-type embeddings and no pooler, which BERT's published counts "
            f"include ({_millions(2 * paper.d_model + paper.d_model ** 2 + paper.d_model)}M at d = {paper.d_model}).")


def _measured_note(rows: list[OurRow]) -> list[str]:
    """Paper rows whose runs' pre-trained models have another count than bert_parameters says."""
    out = []
    for row in rows:
        if row.published is None:
            continue
        expected = row.key.geometry.parameters()
        measured = sorted({n for rec in row.runs[SQUAD] + row.runs[MNLI]
                           if (n := _int((pretraining(rec) or {}).get("num_parameters"))) is not None and n != expected})
        if measured:
            out.append(f"heads {row.key.geometry.num_heads}, head size {row.key.geometry.head_size}: the pre-trained "
                       f"model of its runs has {', '.join(f'{n:,}' for n in measured)} parameters, not {expected:,} "
                       "(another vocabulary or position table than BERT's?).")
    return ["Measured counts that differ: " + " ".join(out)] if out else []


def _baselines_text(family: str, baselines: dict) -> str:
    """`first_sentence F1 20.00 / EM 10.00, ...` (SQuAD: percent, nested {"f1", "exact_match"} or flat
    `<name>_f1` / `<name>_exact_match` keys) or `majority 35.00%, ...` (MNLI: fractions, or one per split)."""
    grouped: dict[str, Any] = {}
    for name, value in baselines.items():
        flat = re.fullmatch(r"(.+)_(f1|exact_match)", str(name)) if family == SQUAD and not isinstance(value, dict) else None
        if flat:
            grouped.setdefault(flat.group(1), {})[flat.group(2)] = value
        else:
            grouped[str(name)] = value
    parts = []
    for name, value in grouped.items():
        if family == SQUAD and isinstance(value, dict):
            f1, em = as_float(value.get("f1")), as_float(value.get("exact_match"))
            parts.append(f"{name} F1 {'?' if f1 is None else f'{f1:.2f}'} / EM {'?' if em is None else f'{em:.2f}'}")
        elif isinstance(value, dict):
            splits = [f"{split} {100 * v:.2f}%" if family == MNLI else f"{split} {v:.2f}"
                      for split, raw in value.items() if (v := as_float(raw)) is not None]
            if splits:
                parts.append(f"{name} " + " / ".join(splits))
        elif (number := as_float(value)) is not None:
            parts.append(f"{name} {100 * number:.2f}%" if family == MNLI else f"{name} {number:.2f}")
    return ", ".join(parts)


def _data_notes(rows: list[OurRow]) -> list[str]:
    labels: dict[tuple[str, str], list[str]] = {}          # (family, setting) -> data labels of shown runs
    baselines: dict[tuple[str, str, str], list[str]] = {}  # (family, setting, data name) -> baseline texts
    descriptions: dict[str, str] = {}
    left_out = []
    for row in rows:
        for family in (SQUAD, MNLI):
            cell = row.shown(family)
            shown = cell.runs if cell else []
            for rec in shown:
                info = data_info(rec)
                group = labels.setdefault((family, row.key.setting), [])
                if info.label not in group:
                    group.append(info.label)
                if info.name and info.description:
                    descriptions.setdefault(info.name, info.description)
                raw = _task_info(rec).get("baselines")
                if info.is_substitute and isinstance(raw, dict) and (text := _baselines_text(family, raw)):
                    texts = baselines.setdefault((family, row.key.setting, info.name or "?"), [])
                    if text not in texts:
                        texts.append(text)
            if len(shown) < len(row.runs[family]):
                left_out.append(f"{row.label()}, {family}: {len(row.runs[family]) - len(shown)} run(s) of another "
                                "configuration (substitute data beside the official data, or other config values) "
                                "or a seed run again")
    notes = []
    if labels:
        notes.append("Data of our cells: " + "; ".join(
            f"{'SQuAD' if family == SQUAD else 'MNLI'}, {SETTING_LABEL[setting]} rows: {', '.join(group)}"
            for (family, setting), group in labels.items()) + ".")
    if any(SUBSTITUTE in label for group in labels.values() for label in group):
        notes.append(f"{SUBSTITUTE} a cell measured on substitute data: real text standing in for "
                     f"{OFFICIAL_DATA[SQUAD]} or {OFFICIAL_DATA[MNLI]}, so it measures another task than the published "
                     "number, whatever the row.")
    for (family, setting, name), texts in baselines.items():
        notes.append(f"Trivial baselines of {name} ({SETTING_LABEL[setting]} rows): " + "; ".join(texts)
                     + ". A cell near them has learned nothing.")
    if descriptions:
        notes.append("Data: " + "; ".join(f"{name}: {text}" for name, text in descriptions.items()) + ".")
    if left_out:
        notes.append("Not averaged in (a cell shows one configuration: official data first, then the best on "
                     "validation): " + "; ".join(left_out) + ".")
    return notes


def _command_notes(rows: list[OurRow], paper: PaperTable) -> list[str]:
    """One command per (setting, init, variant) for the rows with an empty cell of ours."""
    missing: dict[tuple[str, bool, tuple[str, ...]], list[OurRow]] = {}
    for row in rows:
        if not row.complete and row.key.geometry is not None:
            missing.setdefault((row.key.setting, row.key.pretrained, row.key.variant), []).append(row)
    lines = []
    for (setting, pretrained, variant), group in missing.items():
        values = sorted({paper.swept_value(row.key.geometry) for row in group})
        cells = []
        for row in group:
            value = str(paper.swept_value(row.key.geometry))
            if not row.paper_geometry:
                value += f" ({row.key.geometry.label})"
            absent = [family for family in (SQUAD, MNLI) if not row.runs[family]]
            cells.append(value + (f" (no {absent[0]} run)" if len(absent) == 1 else ""))
        init = "pre-trained" if pretrained else "from scratch"
        extra = f", + {' '.join(variant)}" if variant else ""
        lines.append(f"{SETTING_LABEL[setting]}, {init}{extra}, {paper.swept_name} {', '.join(cells)}: "
                     f"`{paper.command(setting, values, scratch=not pretrained, variant=variant)}`")
    if not lines:
        every = paper.command(GPU, [paper.swept_value(paper.geometry(pub)) for pub in paper.rows])
        return [f"Every row of ours is filled. More seeds: `{every} seed=0,1,2` (a cell shows their mean ± std (n))."]
    return ["Empty cells of ours, and the command that fills them (each experiment job fine-tunes on squad or "
            "mnli, both in one multirun; a row with one task done reruns both): " + "; ".join(lines) + ". Add "
            "`seed=0,1,2` for several seeds (a cell then shows their mean ± std (n))."]


def paper_table(records: list[RunRecord], paper: PaperTable) -> Table:
    rows = our_rows(records, paper)
    body, rules = table_rows(rows, paper)
    notes = [
        f"Published: {CITATION}, {paper.key.replace('table', 'Table ').replace('2a', '2A').replace('2b', '2B')} "
        "(arXiv v1; transcribed in PAPERS.md B.3, one transcription; ± only where it has one): pre-trained BERT "
        "fine-tuned on SQuAD v1.1 (F1, exact match) and MNLI (accuracy; the transcription does not say matched or "
        "mismatched: BERT papers usually mean matched, so it stands beside our MNLI-m).",
        paper.note,
        _agreement_note(paper),
        "Ours: completed fine-tuning runs of the table's experiment (GPU preset: `experiment="
        f"{paper.experiment}`, the paper's geometry; CPU-sized preset: `experiment={paper.cpu_experiment}`, small "
        "models on small data that train on a CPU: a check of the pipeline, NOT comparable with the published "
        "numbers). A squad run and an mnli run of one geometry fill a row; `pre-trained` rows fine-tune a masked LM "
        "pre-trained by the experiment, `from scratch` rows (`pretrain=none`) do not. F1/EM in percent; MNLI-m / "
        "MNLI-mm = test accuracy on the matched / mismatched set, percent.",
        seeds.NOTE,
        "params (M) ours of other rows: the pre-trained masked LM's count recorded by the runs, else "
        "`bert_parameters` of the run's config and vocabulary; blank when neither is known.",
        *_measured_note(rows),
        *_data_notes(rows),
        *_command_notes(rows, paper),
    ]
    return Table(slug=paper.slug, title=paper.title, headers=HEADERS, rows=body,
                 numeric=set(range(1, len(HEADERS))), rules_before=rules, notes=notes)


def tables(records: list[RunRecord]) -> list[Table]:
    """Tables 1, 2A and 2B: always (published numbers, parameter counts and the commands), ours where run."""
    return [paper_table(records, paper) for paper in PAPER_TABLES]

