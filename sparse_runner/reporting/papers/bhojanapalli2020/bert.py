"""Bhojanapalli et al. (2020), Tables 1 and 2: BERT fine-tuned on SQuAD (F1, EM) and MNLI (accuracy) against
the number of heads and the head size, published numbers (docs/papers.md) beside ours.

Three tables, shown even without runs (the published numbers, the parameter count of each model by
`bert_parameters`, and the commands that fill our cells):

    Table 1   BERT-large, d 1024, head size d/h, heads 8/16/32   experiment=bhojanapalli2020_table1
    Table 2A  d 512, head size 128, heads 8/12/16/32             experiment=bhojanapalli2020_table2a
    Table 2B  d 512, 8 heads, head size 32/64/128/256            experiment=bhojanapalli2020_table2b

One row per head geometry. Ours come from completed fine-tuning runs (task family `squad` or `mnli`) whose
resolved config is a job of the table's multirun (bert_runs.py: every result-changing key but
the seed, however the command line spelled it): a squad run and an mnli run of one geometry fill one row; runs
of a cell that differ only in their seed show as mean ± std (n) (seeds.py). Pre-trained runs (a pre-training
stage in their config) and runs from scratch (`pretrain=none`) are separate rows, never averaged together; a
run that is no job is an other run, in a row labelled with what differs from the nearest job
(`+ trainer.max_steps=100`). Runs of the CPU-sized presets (`experiment=bhojanapalli2020_table*_cpu`) are rows
of their own below a rule, geometry read from their config, labelled CPU-sized: they check the pipeline and are
not comparable with the published numbers. A cell measured on substitute data carries a dagger; the table notes
name the data and its trivial baselines.

Published numbers and parameter counts: bert_published.py. Torch-free, like all report code.
"""

from __future__ import annotations

import re
from typing import Any

from sparse_runner.reporting import seeds
from sparse_runner.reporting.claims import Arm, Claim, Design, preset_arm
from sparse_runner.reporting.papers.bhojanapalli2020.bert_published import (  # noqa: F401 (read as bert.X)
    CITATION,
    CPU,
    GPU,
    MNLI,
    MNLI_ACCURACY,
    MNLI_MATCHED,
    MNLI_MISMATCHED,
    OFFICIAL_DATA,
    PAPER_TABLES,
    SETTING_LABEL,
    SQUAD,
    SQUAD_EM,
    SQUAD_F1,
    SUBSTITUTE,
    TABLE1,
    TABLE2A,
    TABLE2B,
    Geometry,
    PaperTable,
    Published,
    bert_parameters,
)
from sparse_runner.reporting.papers.bhojanapalli2020.bert_runs import (  # noqa: F401
    Filing,
    OurRow,
    _task_info,
    data_info,
    file_runs,
    our_rows,
    pretraining,
    run_parameters,
)
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup
from sparse_runner.reporting.values import as_float, as_int, number_format, pct


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
                           if (n := as_int((pretraining(rec) or {}).get("num_parameters"))) is not None and n != expected})
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
    """One command per (setting, init, difference) for the rows with an empty cell of ours; none for other runs
    that lack a key the job has (no override removes a key from a config)."""
    missing: dict[tuple[str, bool, tuple[str, ...]], list[OurRow]] = {}
    for row in rows:
        if not row.complete and row.key.geometry is not None and not any("=(absent)" in o for o in row.key.other):
            missing.setdefault((row.key.setting, row.key.pretrained, row.key.other), []).append(row)
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
        extra = f", + {', '.join(variant)}" if variant else ""
        lines.append(f"{SETTING_LABEL[setting]}, {init}{extra}, {paper.swept_name} {', '.join(cells)}: "
                     f"`{paper.command(setting, values, scratch=not pretrained, variant=variant)}`")
    if not lines:
        every = paper.command(GPU, [paper.swept_value(paper.geometry(pub)) for pub in paper.rows])
        return [f"Every row of ours is filled. More seeds: `{every} seed=0,1,2` (a cell shows their mean ± std (n))."]
    return ["Empty cells of ours, and the command that fills them (each experiment job fine-tunes on squad or "
            "mnli, both in one multirun; a row with one task done reruns both): " + "; ".join(lines) + ". Add "
            "`seed=0,1,2` for several seeds (a cell then shows their mean ± std (n))."]


def paper_table(filed: list[tuple[RunRecord, Filing]], paper: PaperTable) -> Table:
    rows = our_rows(filed, paper)
    body, rules = table_rows(rows, paper)
    notes = [
        f"Published: {CITATION}, {paper.key.replace('table', 'Table ').replace('2a', '2A').replace('2b', '2B')} "
        "(arXiv v1; transcribed in docs/papers.md, one transcription; ± only where it has one): pre-trained BERT "
        "fine-tuned on SQuAD v1.1 (F1, exact match) and MNLI (accuracy; the transcription does not say matched or "
        "mismatched: BERT papers usually mean matched, so it stands beside our MNLI-m).",
        paper.note,
        _agreement_note(paper),
        "Ours: completed fine-tuning runs whose resolved config is a job of the table's multirun (GPU preset: "
        f"`experiment={paper.experiment}`, the paper's geometry; CPU-sized preset: `experiment="
        f"{paper.cpu_experiment}`, small models on small data that train on a CPU: a check of the pipeline, NOT "
        "comparable with the published numbers) in every result-changing key but the seed, however their command "
        "line spelled it. A squad run and an mnli run of one geometry fill a row; `pre-trained` rows fine-tune a "
        "masked LM pre-trained by the experiment, `from scratch` rows (`pretrain=none`) do not; a row `+ key=value` "
        "holds other runs, no job of any table, beside the nearest job and what differs from it. F1/EM in percent; "
        "MNLI-m / MNLI-mm = test accuracy on the matched / mismatched set, percent.",
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
    filed = file_runs(records)
    return [paper_table(filed, paper) for paper in PAPER_TABLES]


# ----------------------------------------------------------------------------------------- claims
# The study (conf/experiment/bhojanapalli2020_pretrain_study_cpu.yaml): Table 2B's CPU model at head sizes 32 and
# 128, pre-trained long enough to leave the unigram regime, or from scratch; fine-tuned on 2,000 cloze questions.
STUDY = "bhojanapalli2020_pretrain_study_cpu"
STUDY_COMMAND = f"sparse-run -m experiment={STUDY}"
STUDY_SETTING = ("SQuAD cloze substitute (2,000 training questions), d 128, 2 layers, 8 heads, masked LM of "
                 "2,000 steps; 3 seeds")


def _study_arm(head_size: int, pretrained: bool) -> Arm:
    overrides = (f"experiment={STUDY}", f"model.head_size={head_size}", *(() if pretrained else ("pretrain=none",)))
    label = f"d_p {head_size}, {'pre-trained' if pretrained else 'from scratch'}"
    # pinned to the kept study's seeds: a later run of the same job asks the question again, in a study of its own
    return preset_arm(label, overrides, SQUAD, SQUAD_F1, STUDY_COMMAND, seeds=(0, 1, 2))


F1_SESOI = 0.5   # F1 points: half of Table 2B's +1.07 between head sizes 128 and 32
FAMILY_NAME = "Bhojanapalli et al. 2020, pre-training study (2 claims)"


def _claims() -> list[Claim]:
    f1 = lambda rec: rec.metric(SQUAD_F1)  # noqa: E731
    small, large = (pub for pub in TABLE2B.rows if pub.head_size in (32, 128))
    # Unpaired: the arms are different models (pre-trained weights or a random start; other head sizes), so a seed
    # aligns their batch order but not their weights.
    metric = "test F1 of the SQuAD cloze substitute at the best validation checkpoint"
    return [
        Claim(CITATION, "Pre-training helps fine-tuning (SQuAD F1, head size 128)",
              "all the paper's models are pre-trained BERTs; no from-scratch number", STUDY_SETTING,
              _study_arm(128, True), _study_arm(128, False), f1,
              Design(metric, "Welch t", sesoi=F1_SESOI, family=FAMILY_NAME,
                     published_source="the paper has no model from scratch"), unit="F1"),
        Claim(CITATION, "At 8 heads a larger head size helps: d_p 128 beats d_p 32 (SQuAD F1)",
              f"Table 2B: {large.f1:g} vs {small.f1:g} ({large.f1 - small.f1:+.2f})", STUDY_SETTING,
              _study_arm(128, True), _study_arm(32, True), f1,
              Design(metric, "Welch t", sesoi=F1_SESOI, family=FAMILY_NAME,
                     published_effect=round(large.f1 - small.f1, 2),
                     published_source="Table 2B: SQuAD v1.1 F1 of 24-layer BERTs; ours a cloze substitute at d 128"),
              unit="F1"),
    ]


CLAIMS = _claims()
