"""Bhojanapalli et al., "Low-Rank Bottleneck in Multi-head Attention Models", ICML 2020.

What the report shows today: the low-rank study (`task=lowrank`, Theorem 1, docs/papers.md) from completed
lowrank runs' metrics.json: the best KL(P || A) a head of size d_p reaches against d_p, as a table and a
figure with d_p = n marked, and standard (d_p = d/h) against fixed (d_p = n) heads as h grows; runs that
differ only in their seed are one column or row (mean ± std (n), seeds.py; the figure draws the means).
Nothing is shown until such a run exists (`sparse-run experiment=bhojanapalli2020_lowrank`).

The LM1B head sweep (perplexity against heads and parameters, paper Fig. 1/3) is in `lm.py`.
Tables 1, 2A and 2B (BERT fine-tuned on SQuAD and MNLI against heads and head size, docs/papers.md: published
numbers, parameter counts, ours from the `bhojanapalli2020_table*` experiments) are in `bert.py`;
they are shown once the report holds a run of the BERT experiments (pre-training, squad or mnli), with the
published numbers and the commands that fill their empty cells.

Torch-free, like all report code; matplotlib is imported only when there is a figure to draw.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sparse_runner.checks import one_line
from sparse_runner.io import atomic_open
from sparse_runner.reporting.console import warn
from sparse_runner.reporting.papers import register_paper
from sparse_runner.reporting.papers.bhojanapalli2020 import bert, lm
from sparse_runner.reporting.papers.bhojanapalli2020.lm import lm_sections, lm_tables
from sparse_runner.reporting.render import Table
from sparse_runner.reporting import seeds
from sparse_runner.reporting.claims import HELD, INCONCLUSIVE, MIN_RUNS, NOT_HELD, NOT_RUN, ClaimRow, Design, compute_time
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup, seed_groups, summary
from sparse_runner.reporting.sinks import mathtext
from sparse_runner.reporting.values import as_int, finite, mean

CITATION = "Bhojanapalli et al., ICML 2020"

LOWRANK_FAMILY = "lowrank"
LOWRANK_COMMAND = "sparse-run experiment=bhojanapalli2020_lowrank"
FIGURE = "figures/bhojanapalli2020_lowrank_kl.png"
# The metric names of tasks/lowrank.py: test/kl/dp_<k>, test/kl/standard_h<h>, test/kl/fixed_h<h>.
SWEEP_METRIC = re.compile(r"^test/kl/dp_(\d+)$")
MULTIHEAD_METRIC = re.compile(r"^test/kl/(standard|fixed)_h(\d+)$")
# A KL below this is a perfect fit to float64 rounding; the log-scale figure draws it here.
KL_FLOOR = 1e-16


# KL of every run of a group, keyed by head size d_p or by the number of heads h.
Curve = dict[int, list[float]]


@dataclass
class LowRankRun:
    """What one group of completed lowrank runs that differ only in their seed measured (test split = the
    fitted problem)."""

    group: SeedGroup
    n: int | None  # sequence length (task.seq_len)
    d: int | None  # rows of X (task.d_model)
    sweep: Curve  # d_p -> KL
    standard: Curve  # h -> mean KL of h heads of size d/h
    fixed: Curve  # h -> mean KL of h heads of size n

    @property
    def label(self) -> str:
        return f"{self.group.display} (n={self.n}, d={self.d})"


def _size(rec: RunRecord, key: str, info_key: str) -> int | None:
    info = rec.data.get("task_info") if isinstance(rec.data.get("task_info"), dict) else {}
    return as_int(rec.config.get(f"task.{key}", info.get(info_key)))


def lowrank_runs(records: list[RunRecord]) -> list[LowRankRun]:
    """Groups of completed lowrank runs with at least one d_p measured, by run name."""
    runs = []
    for group in seed_groups(rec for rec in records if rec.task_family == LOWRANK_FAMILY):
        sweep, curves = {}, {"standard": {}, "fixed": {}}
        for name in sorted({name for rec in group.runs for name in rec.metrics}):
            values = group.values(name)
            if not values:
                continue
            if match := SWEEP_METRIC.match(name):
                sweep[int(match.group(1))] = values
            elif match := MULTIHEAD_METRIC.match(name):
                curves[match.group(1)][int(match.group(2))] = values
        if sweep or curves["standard"] or curves["fixed"]:
            rec = group.first
            runs.append(LowRankRun(group, _size(rec, "seq_len", "n"), _size(rec, "d_model", "d"),
                                   dict(sorted(sweep.items())), dict(sorted(curves["standard"].items())),
                                   dict(sorted(curves["fixed"].items()))))
    return runs


def kl_cell(values: list[float] | None) -> str:
    """KL in nats, 3 significant digits: the values span 1e-15 .. 1, so scientific notation."""
    return summary(values or [], lambda value: f"{value:.2e}")


def _means(curve: Curve) -> list[float]:
    """The figure's points, floored: a KL below KL_FLOOR is a perfect fit the log scale draws there; the mean
    of the finite values, NaN (a gap) without any."""
    return [max(mean(numbers), KL_FLOOR) if (numbers := finite(values)) else math.nan for values in curve.values()]


# ------------------------------------------------------------------------------------------ tables
def tables(records: list[RunRecord]) -> list[Table]:
    runs = lowrank_runs(records)
    # Tables 1-2 always: without runs they show the published numbers, our parameter counts and the commands.
    return (lowrank_tables(runs) if runs else []) + lm_tables(records) + bert.tables(records)


def lowrank_tables(runs: list[LowRankRun]) -> list[Table]:
    out = []
    sizes = sorted({k for run in runs for k in run.sweep})
    if sizes:
        ns = {run.n for run in runs if run.sweep}
        common_n = ns.pop() if len(ns) == 1 else None

        def row_label(k: int) -> str:
            return f"{k} (= n)" if k == common_n else str(k)

        out.append(Table(
            slug="bhojanapalli2020_lowrank_sweep",
            title="Bhojanapalli et al. 2020, Theorem 1: best KL(P || A) of one head against its size d_p",
            headers=["d_p", *(run.label for run in runs if run.sweep)],
            rows=[[row_label(k), *(kl_cell(run.sweep.get(k)) for run in runs if run.sweep)] for k in sizes],
            numeric=set(range(1, 1 + sum(1 for run in runs if run.sweep))),
            notes=[
                f"Theorem 1 ({CITATION}): a head of size d_p >= n can produce any attention matrix P with positive "
                "entries on a full-column-rank X; below n a generic P is out of reach.",
                "KL in nats, mean over the n queries, of the head fitted by Adam (the run's best checkpoint). Every "
                "d_p fits the same random P. Expect ~0 (float64 rounding, ~1e-14) from d_p = n - 1 on: softmax "
                "ignores a constant per query, a rank-one change of the scores, so n - 1 dimensions already suffice.",
                f"Fill or refresh: `{LOWRANK_COMMAND}`.",
                seeds.NOTE + " n in a column header is the sequence length.",
            ],
        ))
    multihead = [run for run in runs if run.standard or run.fixed]
    if multihead:
        rows = []
        for run in multihead:
            for h in sorted(set(run.standard) | set(run.fixed)):
                standard_size = run.d // h if run.d else None
                rows.append([run.group.display, str(h), "" if standard_size is None else str(standard_size),
                             kl_cell(run.standard.get(h)), "" if run.n is None else str(run.n), kl_cell(run.fixed.get(h))])
        out.append(Table(
            slug="bhojanapalli2020_lowrank_multihead",
            title="Bhojanapalli et al. 2020: h standard heads (d_p = d/h) against h fixed heads (d_p = n), mean KL",
            headers=["run", "heads h", "standard d_p", "standard KL", "fixed d_p", "fixed KL"],
            rows=rows, numeric={1, 2, 3, 4, 5},
            notes=["Head i of either kind fits the same target P_i; KL is the mean over the h heads. Standard heads "
                   "fall below n once h > d/n (the low-rank bottleneck); fixed heads keep d_p = n whatever h is.",
                   seeds.NOTE],
        ))
    return out


# ----------------------------------------------------------------------------------------- figures
def sections(records: list[RunRecord], out_dir: Path) -> tuple[list[str], list[Path]]:
    sections_, written = [], []
    runs = lowrank_runs(records)
    if runs:
        try:
            path = draw_lowrank(runs, out_dir / FIGURE)
        except (OSError, ValueError, TypeError) as exc:
            warn(f"{CITATION} low-rank figure skipped: {one_line(exc)}")
        else:
            written.append(path)
            sections_.append("\n".join([
                "## Figures: Bhojanapalli et al. 2020, low-rank study", "",
                "Runs: " + ", ".join(f"`{run.label}`" for run in runs) + ".", "",
                f"![KL against head size d_p (d_p = n marked), and standard against fixed heads]({FIGURE})",
            ]))
    more_sections, more_written = lm_sections(records, out_dir)
    return sections_ + more_sections, written + more_written


def draw_lowrank(runs: list[LowRankRun], path: Path) -> Path:
    """One PNG: left, KL against d_p per run (log scale, d_p = n dashed); right, mean KL against h for
    standard and fixed heads. Returns `path`. Run names are drawn as written (sinks.mathtext)."""
    # Not at module level: the report imports every paper, and only a report with lowrank runs draws this.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with_multihead = any(run.standard or run.fixed for run in runs)
    fig = Figure(figsize=(9.0 if with_multihead else 4.8, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if with_multihead else 1, squeeze=False)[0]
    sweep_ax = axes[0]
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        if run.sweep:
            sweep_ax.plot(list(run.sweep), _means(run.sweep), "o-", ms=3, color=colour,
                          label=mathtext(run.label) if len(runs) > 1 else None)
        if run.n is not None:
            sweep_ax.axvline(run.n, color=colour, ls="--", lw=1, label=f"d_p = n = {run.n}")
    sweep_ax.set(xlabel="head size d_p", ylabel="best KL(P || A) (nats)", yscale="log", title="One head, sizes 1 ... 2n")
    sweep_ax.legend(fontsize=7)
    if with_multihead:
        ax = axes[1]
        for i, run in enumerate(runs):
            colour = f"C{i % 10}"
            for kind, curve, style in (("standard d/h", run.standard, "o-"), ("fixed n", run.fixed, "s--")):
                if curve:
                    label = kind + (f" ({mathtext(run.group.display)})" if len(runs) > 1 else "")
                    ax.plot(list(curve), _means(curve), style, ms=4, color=colour, label=label)
        ax.set(xlabel="heads h", ylabel="mean KL over heads (nats)", yscale="log", title="Head size d/h (standard) vs n (fixed)")
        ax.set_xscale("log", base=2)
        heads = sorted({h for run in runs for h in [*run.standard, *run.fixed]})
        ax.set_xticks(heads, [str(h) for h in heads])
        ax.legend(fontsize=7)
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=120)
    return path


# ----------------------------------------------------------------------------------------- claims
# A cliff counts as Theorem 1's when every seed's fit at d_p = n - 2 is at least CLIFF_HELD times its worst fit
# at d_p >= n - 1; none is when every seed's ratio is below CLIFF_NOT_HELD.
CLIFF_HELD, CLIFF_NOT_HELD = 100.0, 10.0


@dataclass(frozen=True)
class LowRankCliff:
    """Theorem 1 as a claim of its own shape (reporting/claims.py `Testable`): in each seed's sweep, the cliff
    ratio r = KL(d_p = n - 2) / max KL(d_p >= n - 1). Softmax ignores a constant added to a query's scores,
    so a generic P needs d_p = n - 1, not n (tasks/lowrank.py): the cliff is expected between n - 2 and n - 1."""

    paper: str = CITATION
    statement: str = ("Theorem 1: a head of size d_p below n cannot represent every attention matrix; "
                      "from d_p = n - 1 on (n with the paper's count) it can")
    published: str = "Theorem 1 (a proof; no number)"
    setting: str = "low-rank study (one random P, n = 32, d = 64, d_p = 1 .. 2n)"
    design: Design = Design(
        "KL(P || A) of the best fit on the fitted problem", "own rule", sesoi=CLIFF_NOT_HELD,
        family="Bhojanapalli et al. 2020, Theorem 1", published_source="a proof: no number",
        rule=f"cliff ratio per seed: held when >= {CLIFF_HELD:g} in every seed, not held when < {CLIFF_NOT_HELD:g} "
             f"in every seed (the SESOI: a {CLIFF_NOT_HELD:g}-fold drop)")

    def row(self, records: list[RunRecord]) -> ClaimRow:
        ratios, below, above, used = [], [], [], []
        runs = [run for run in lowrank_runs(records) if run.n and run.n - 2 in run.sweep and run.n - 1 in run.sweep]
        if runs:
            run = max(runs, key=lambda r: len(r.group.runs))
            used = run.group.runs
            for i in range(len(run.sweep[run.n - 2])):
                at_cliff = run.sweep[run.n - 2][i]
                beyond = [values[i] for d_p, values in run.sweep.items() if d_p >= run.n - 1 and i < len(values)]
                if not beyond or len(finite([at_cliff, *beyond])) <= len(beyond):   # a KL that is not finite: no ratio
                    continue
                below.append(at_cliff)
                above.append(max(beyond))
                ratios.append(at_cliff / max(above[-1], KL_FLOOR))
        if not ratios:
            verdict = NOT_RUN
        elif len(ratios) < MIN_RUNS:
            verdict = INCONCLUSIVE
        elif min(ratios) >= CLIFF_HELD:
            verdict = HELD
        elif max(ratios) < CLIFF_NOT_HELD:
            verdict = NOT_HELD
        else:
            verdict = INCONCLUSIVE
        kl = lambda values: summary(values, lambda v: f"{v:.1e}")  # noqa: E731
        return ClaimRow(
            f"d_p >= n - 1, worst KL: {kl(above)}" if above else "d_p >= n - 1: no runs",
            f"d_p = n - 2, KL: {kl(below)}" if below else "d_p = n - 2: no runs",
            f"cliff ratio >= {min(ratios):.3g} (every seed)" if ratios else "",
            self.design.text("×"), verdict, compute_time(used),
            [] if len(ratios) >= 3 else [f"{LOWRANK_COMMAND.replace('sparse-run', 'sparse-run -m')} seed=0,1,2"],
            arms=(("low-rank sweep", frozenset(str(rec.path) for rec in used)),))


# Theorem 1, then the studies' claims: the LM head sweep and the pre-training / head-size study.
CLAIMS = [LowRankCliff(), *lm.CLAIMS, *bert.CLAIMS]

register_paper("bhojanapalli2020", order=30)(sys.modules[__name__])
