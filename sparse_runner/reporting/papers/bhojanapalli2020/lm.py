"""Bhojanapalli et al. (2020), the LM1B experiment (paper Fig. 1/3): perplexity against the number of heads,
one line per head geometry (standard head size d/h against a fixed head size d_p), and against parameters.

Built from completed language-model runs (task family `lm`) that differ in their heads:
`sparse-run -m experiment=bhojanapalli2020_lm_cpu model=standard_heads,fixed_head model.num_heads=2,4,8,16,32`.
A run is in the sweep of an experiment when its resolved config is a job of such a sweep (the experiment, the
geometry preset, and the run's own heads, width and head size) in every result-changing key but the seed
(presets.py), whatever its command line said; a run that is no job is in a sweep of its own, titled with what
differs from the nearest job (`+ trainer.lr=0.01`). Runs that differ only in their seed are one point, their
mean (± std (n) in the table, seeds.py). The paper gives these results only as plots (docs/papers.md), so there are no published
numbers to print beside ours. Torch-free; matplotlib is imported only to draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sparse_runner.checks import one_line
from sparse_runner.io import atomic_open
from sparse_runner.reporting import seeds
from sparse_runner.reporting.claims import Arm, Design, TrendClaim, preset_arm, union_arm
from sparse_runner.reporting.console import warn
from sparse_runner.reporting.presets import Preset, agrees, closest_models, match, shown
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, completed
from sparse_runner.reporting.seeds import SeedGroup, best_group, distinct, seed_groups
from sparse_runner.reporting.sinks import mathtext
from sparse_runner.reporting.values import as_float, as_int, number_format, override_value, slug

LM_FAMILY = "lm"
METRIC = "test/ppl"
SWEEP_COMMAND = "sparse-run -m experiment=bhojanapalli2020_lm_cpu model=standard_heads,fixed_head model.num_heads=2,4,8,16,32"
# The experiments whose sweeps the figure draws, and the geometry presets they sweep (standard d/h, fixed d_p).
EXPERIMENTS = ("bhojanapalli2020_lm_cpu", "bhojanapalli2020_lm1b", "bhojanapalli2020_lm_study_cpu")
GEOMETRY_MODELS = ("standard_heads", "fixed_head")
# What a job of the sweep sets to the run's own values (so runs differing in them share a sweep), and what tells
# the two experiments apart before any job is composed.
SWEPT_KEYS = ("model.d_model", "model.num_heads")
_SHAPE_KEYS = ("task.name", "model.num_layers", "model.ffn_dim")


@dataclass(frozen=True)
class Point:
    heads: int
    ppl: float                  # the mean over the group's seeds (their finite values)
    parameters: float | None    # the config fixes it: the same for every seed
    group: SeedGroup


def _int(rec: RunRecord, key: str) -> int | None:
    return as_int(rec.config.get(key))


def geometry(rec: RunRecord) -> str:
    """The line a run belongs to: its width and head size rule ("d=256, d/h" or "d=256, d_p=32")."""
    head_size = _int(rec, "model.head_size")
    return f"d={_int(rec, 'model.d_model')}, " + ("d/h" if head_size is None else f"d_p={head_size}")


def _job(experiment: str, model: str, values: dict) -> Preset | None:
    """A job of an experiment's head sweep with a run's own width, heads (and head size, for fixed heads); None
    where one of them is no plain value (values.override_value), so no job."""
    swept = [*SWEPT_KEYS, *(["model.head_size"] if model != "standard_heads" else [])]
    texts = [override_value(values.get(key)) for key in swept]
    if None in texts:
        return None
    return Preset((f"experiment={experiment}", f"model={model}", *(f"{key}={text}" for key, text in zip(swept, texts))))


def sweep_of(rec: RunRecord) -> tuple[str, tuple[str, ...]] | None:
    """The experiment whose sweep the run is a job of, else the nearest job's, with what differs from it."""
    values = rec.keys.values
    near = [e for e in EXPERIMENTS if agrees(rec.keys, Preset((f"experiment={e}",)), _SHAPE_KEYS)]
    where = {job: experiment for experiment in near or EXPERIMENTS for model in closest_models(rec.keys, GEOMETRY_MODELS)
             if (job := _job(experiment, model, values)) is not None}
    found = match(rec.keys, where, primary_metric=rec.primary_metric)
    return None if found is None else (where[found.preset], found.pairs)


Sweep = tuple[str | None, str, tuple[str, ...]]   # (task, experiment, what differs from its jobs: `key=value`)


def sweeps(records: list[RunRecord]) -> dict[Sweep, dict[str, list[Point]]]:
    """(task, experiment, difference) -> geometry -> points sorted by heads, for sweeps where the heads vary. A
    point is one group of seeds; among several configurations of one geometry and heads, the best on validation."""
    by_sweep: dict[Sweep, list[RunRecord]] = {}
    for rec in completed(records, LM_FAMILY, METRIC):
        if (found := sweep_of(rec)) is not None:
            by_sweep.setdefault((rec.task, *found), []).append(rec)
    candidates: dict[Sweep, dict[str, dict[int, list[SeedGroup]]]] = {}
    for key, runs in by_sweep.items():
        for group in seed_groups(runs):
            heads = _int(group.first, "model.num_heads")
            if heads is not None and group.mean(METRIC) is not None:
                lines = candidates.setdefault(key, {})
                lines.setdefault(geometry(group.first), {}).setdefault(heads, []).append(group)
    out = {}
    for key, lines in sorted(candidates.items(), key=lambda item: (str(item[0][0]), item[0][1], item[0][2])):
        if len({heads for points in lines.values() for heads in points}) > 1:
            out[key] = {name: [_point(heads, best_group(points[heads])) for heads in sorted(points)]
                        for name, points in sorted(lines.items())}
    return out


def _point(heads: int, group: SeedGroup) -> Point:
    return Point(heads, group.mean(METRIC), as_float(group.first.data.get("num_parameters")), group)


def _millions(rec: RunRecord) -> str:
    count = as_float(rec.data.get("num_parameters"))
    return "" if count is None else f"{count / 1e6:.2f}"


def _slug(task: str | None, experiment: str | None, other: tuple[str, ...] = ()) -> str:
    stem = f"bhojanapalli2020_lm_{task or 'task'}_{experiment or 'none'}".replace("/", "_")
    return stem + (f"_{slug('_'.join(other))}" if other else "")


def _where(task: str | None, experiment: str, other: tuple[str, ...]) -> str:
    """`task=sotu_en, experiment=bhojanapalli2020_lm_cpu`, `+ trainer.lr=0.01` for a sweep of other runs."""
    return f"task={task}, experiment={experiment}" + (f" + {shown(other)}" if other else "")


def lm_tables(records: list[RunRecord]) -> list[Table]:
    tables = []
    for (task, experiment, other), lines in sweeps(records).items():
        names = list(lines)
        heads = sorted({p.heads for points in lines.values() for p in points})
        by_heads = {name: {p.heads: p for p in points} for name, points in lines.items()}
        rows = []
        for h in heads:
            row = [str(h)]
            for name in names:
                p = by_heads[name].get(h)
                row += ["", ""] if p is None else [p.group.text(METRIC, number_format(".2f")),
                                                   distinct(_millions(rec) for rec in p.group.runs)]
            rows.append(row)
        headers = ["heads", *(f"{name} {col}" for name in names for col in ("test ppl", "params (M)"))]
        tables.append(Table(
            slug=_slug(task, experiment, other),
            title=f"Bhojanapalli et al. 2020, LM head sweep: test perplexity against heads ({_where(task, experiment, other)})",
            headers=headers,
            rows=rows,
            numeric=set(range(1, len(headers))),
            notes=[
                "The paper (Fig. 1/3, LM1B, 6 layers, length 256) finds standard heads (size d/h) degrading past ~16 heads "
                "while a fixed head size d_p keeps improving; it gives no numbers, only plots.",
                f"Per-token test perplexity of the best checkpoint; a line per head geometry. Fill or extend: `{SWEEP_COMMAND}`.",
                seeds.NOTE + " The figure draws the means.",
                *([f"Other runs: no job of the {experiment} sweep; each differs from the nearest job in "
                   f"{', '.join(other)}."] if other else []),
            ],
        ))
    return tables


def lm_sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    sections, written = [], []
    for (task, experiment, other), lines in sweeps(records).items():
        relative, where = f"figures/{_slug(task, experiment, other)}.png", _where(task, experiment, other)
        try:
            path = draw_sweep(lines, out_dir / relative, where)
        except (OSError, ValueError, TypeError) as exc:
            warn(f"LM head-sweep figure for {where} skipped: {one_line(exc)}")
            continue
        written.append(path)
        sections.append("\n".join([
            f"## Figures: Bhojanapalli et al. 2020, LM head sweep ({where})", "",
            f"![Test perplexity against heads and against parameters, standard vs fixed head size]({relative})",
        ]))
    return sections, written


def draw_sweep(lines: dict[str, list[Point]], path: Path, title: str) -> Path:
    """One PNG: perplexity against heads (log2 axis) and against parameters, a line per geometry; `title` (it
    names the task and config values of runs) drawn as written (sinks.mathtext)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    by_heads, by_params = fig.subplots(1, 2)
    for i, (name, points) in enumerate(lines.items()):
        style = dict(color=f"C{i % 10}", marker="o" if "d/h" in name else "s", ms=4, label=name)
        by_heads.plot([p.heads for p in points], [p.ppl for p in points], "-", **style)
        with_params = [p for p in points if p.parameters is not None and math.isfinite(p.parameters)]
        by_params.plot([p.parameters / 1e6 for p in with_params], [p.ppl for p in with_params], "-", **style)
    heads = sorted({p.heads for points in lines.values() for p in points})
    by_heads.set_xscale("log", base=2)
    by_heads.set_xticks(heads, [str(h) for h in heads])
    by_heads.set(xlabel="heads", ylabel="test perplexity", title=mathtext(title))
    by_params.set(xlabel="parameters (M)", ylabel="test perplexity", title="against model size")
    for ax in (by_heads, by_params):
        ax.legend(fontsize=7)
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=120)
    return path


# ----------------------------------------------------------------------------------------- claims
# The study (conf/experiment/bhojanapalli2020_lm_study_cpu.yaml): d_model 64 and blocks of 128 tokens, so that
# standard heads shrink to d/h = 8 and 2 dimensions, far below the sequence, while fixed heads keep d_p = 32.
STUDY = "bhojanapalli2020_lm_study_cpu"
STUDY_COMMAND = f"sparse-run -m experiment={STUDY}"
STUDY_HEADS = (2, 8, 32)   # the heads of the study's sweep
STUDY_FEW, STUDY_MANY = STUDY_HEADS[0], STUDY_HEADS[-1]
HEADS_KEY = "model.num_heads"
# A quarter of a perplexity point per doubling: one point over the study's four doublings (2 -> 32 heads).
SLOPE_SESOI = 0.25


def _study_arm(model: str, heads: int) -> Arm:
    size = "d/h" if model == "standard_heads" else "d_p 32"
    # pinned to the kept study's seeds: a later run of the same job asks the question again, in a study of its own
    return preset_arm(f"{heads} heads, {size}", (f"experiment={STUDY}", f"model={model}", f"{HEADS_KEY}={heads}"),
                      LM_FAMILY, METRIC, STUDY_COMMAND, seeds=(0, 1, 2))


def _geometry_arm(model: str) -> Arm:
    """Every run of the study with the geometry `model`, at each of its heads."""
    label = "standard heads (d/h)" if model == "standard_heads" else "fixed heads (d_p 32)"
    return union_arm(label, [_study_arm(model, heads) for heads in STUDY_HEADS], STUDY_COMMAND)


def _log2_heads(rec: RunRecord) -> float | None:
    heads = as_float(rec.config.get(HEADS_KEY))
    return math.log2(heads) if heads is not None and heads > 0 else None


def _claims() -> list[TrendClaim]:
    where = (f"embedded corpus, d_model 64, 2 layers, blocks of 128; heads {', '.join(map(str, STUDY_HEADS))} "
             f"(d/h 32 -> 2), best checkpoint on validation, 3 seeds")
    # The paper's three readings (standard heads degrade, fixed heads do not, fixed beat standard at many heads) are
    # one comparison: at 2 heads both geometries are the same model, so the three differences of means rest on two
    # pieces of evidence. One trend over all runs per geometry tests them together.
    design = Design("test perplexity at the best validation checkpoint, regressed on log2(heads) per geometry",
                    "trend", sesoi=SLOPE_SESOI, family="Bhojanapalli et al. 2020, LM head study (1 claim)",
                    published_source="LM1B, d 256, d_p 32, n 256: plots only")
    return [
        TrendClaim("Bhojanapalli et al., ICML 2020, Fig. 1/3",
                   "As the heads grow at a fixed d, standard heads (size d/h) lose more perplexity than fixed-size "
                   "heads: perplexity per doubling of heads rises faster", "LM1B, d 256, d_p 32, n 256: plots only, no numbers",
                   where, _geometry_arm("standard_heads"), _geometry_arm("fixed_head"), _log2_heads,
                   "per doubling", lambda rec: rec.metric(METRIC), design),
    ]


CLAIMS = _claims()
