"""Bhojanapalli et al. (2020), the LM1B experiment (paper Fig. 1/3): perplexity against the number of heads,
one line per head geometry (standard head size d/h against a fixed head size d_p), and against parameters.

Built from completed language-model runs (task family `lm`) of one task and experiment that differ in
their heads: `sparse-run -m experiment=bhojanapalli2020_lm_cpu model=standard_heads,fixed_head
model.num_heads=2,4,8,16,32`; runs that differ only in their seed are one point, their mean (± std (n) in the
table, seeds.py). The paper gives these results only as plots (PAPERS.md B.3), so there are no published
numbers to print beside ours. Torch-free; matplotlib is imported only to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparse_runner.checks import one_line
from sparse_runner.io import atomic_open
from sparse_runner.reporting import seeds
from sparse_runner.reporting.console import warn
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup, best_group, distinct, seed_groups
from sparse_runner.reporting.values import as_float, number_format

LM_FAMILY = "lm"
METRIC = "test/ppl"
SWEEP_COMMAND = "sparse-run -m experiment=bhojanapalli2020_lm_cpu model=standard_heads,fixed_head model.num_heads=2,4,8,16,32"


@dataclass(frozen=True)
class Point:
    heads: int
    ppl: float                  # the mean over the group's seeds
    parameters: float | None    # the config fixes it: the same for every seed
    group: SeedGroup


def _int(rec: RunRecord, key: str) -> int | None:
    value = as_float(rec.config.get(key))
    return int(value) if value is not None else None


def geometry(rec: RunRecord) -> str:
    """The line a run belongs to: its width and head size rule ("d=256, d/h" or "d=256, d_p=32")."""
    head_size = _int(rec, "model.head_size")
    return f"d={_int(rec, 'model.d_model')}, " + ("d/h" if head_size is None else f"d_p={head_size}")


def sweeps(records: list[RunRecord]) -> dict[tuple[str | None, str | None], dict[str, list[Point]]]:
    """(task, experiment) -> geometry -> points sorted by heads, for groups where the heads vary. A point is
    one group of seeds; among several configurations of one geometry and heads, the best on validation."""
    candidates: dict[tuple[str | None, str | None], dict[str, dict[int, list[SeedGroup]]]] = {}
    for group in seed_groups(rec for rec in records if rec.task_family == LM_FAMILY):
        heads = _int(group.first, "model.num_heads")
        if heads is not None and group.values(METRIC):
            lines = candidates.setdefault((group.first.task, group.first.experiment), {})
            lines.setdefault(geometry(group.first), {}).setdefault(heads, []).append(group)
    out = {}
    for key, lines in candidates.items():
        if len({heads for points in lines.values() for heads in points}) > 1:
            out[key] = {name: [_point(heads, best_group(points[heads])) for heads in sorted(points)]
                        for name, points in sorted(lines.items())}
    return out


def _point(heads: int, group: SeedGroup) -> Point:
    return Point(heads, group.mean(METRIC), as_float(group.first.data.get("num_parameters")), group)


def _millions(rec: RunRecord) -> str:
    count = as_float(rec.data.get("num_parameters"))
    return "" if count is None else f"{count / 1e6:.2f}"


def _slug(task: str | None, experiment: str | None) -> str:
    return f"bhojanapalli2020_lm_{task or 'task'}_{experiment or 'none'}".replace("/", "_")


def lm_tables(records: list[RunRecord]) -> list[Table]:
    tables = []
    for (task, experiment), lines in sweeps(records).items():
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
            slug=_slug(task, experiment),
            title=f"Bhojanapalli et al. 2020, LM head sweep: test perplexity against heads (task={task}, experiment={experiment})",
            headers=headers,
            rows=rows,
            numeric=set(range(1, len(headers))),
            notes=[
                "The paper (Fig. 1/3, LM1B, 6 layers, length 256) finds standard heads (size d/h) degrading past ~16 heads "
                "while a fixed head size d_p keeps improving; it gives no numbers, only plots.",
                f"Per-token test perplexity of the best checkpoint; a line per head geometry. Fill or extend: `{SWEEP_COMMAND}`.",
                seeds.NOTE + " The figure draws the means.",
            ],
        ))
    return tables


def lm_sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    sections, written = [], []
    for (task, experiment), lines in sweeps(records).items():
        relative = f"figures/{_slug(task, experiment)}.png"
        try:
            path = draw_sweep(lines, out_dir / relative, f"task={task}, experiment={experiment}")
        except (OSError, ValueError, TypeError) as exc:
            warn(f"LM head-sweep figure for task={task}, experiment={experiment} skipped: {one_line(exc)}")
            continue
        written.append(path)
        sections.append("\n".join([
            f"## Figures: Bhojanapalli et al. 2020, LM head sweep (task={task}, experiment={experiment})", "",
            f"![Test perplexity against heads and against parameters, standard vs fixed head size]({relative})",
        ]))
    return sections, written


def draw_sweep(lines: dict[str, list[Point]], path: Path, title: str) -> Path:
    """One PNG: perplexity against heads (log2 axis) and against parameters, a line per geometry."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    by_heads, by_params = fig.subplots(1, 2)
    for i, (name, points) in enumerate(lines.items()):
        style = dict(color=f"C{i % 10}", marker="o" if "d/h" in name else "s", ms=4, label=name)
        by_heads.plot([p.heads for p in points], [p.ppl for p in points], "-", **style)
        with_params = [p for p in points if p.parameters is not None]
        by_params.plot([p.parameters / 1e6 for p in with_params], [p.ppl for p in with_params], "-", **style)
    heads = sorted({p.heads for points in lines.values() for p in points})
    by_heads.set_xscale("log", base=2)
    by_heads.set_xticks(heads, [str(h) for h in heads])
    by_heads.set(xlabel="heads", ylabel="test perplexity", title=title)
    by_params.set(xlabel="parameters (M)", ylabel="test perplexity", title="against model size")
    for ax in (by_heads, by_params):
        ax.legend(fontsize=7)
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=120)
    return path
