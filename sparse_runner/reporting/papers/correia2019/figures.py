"""Correia et al. (2019) Section 5 analysis figures comparing our models per Table 1 column (its task and
experiment; PNG in `figures/`, linked from the markdown), drawn from the runs of its preset cells: one per
model, the best of its seeds on validation (statistics of several seeds' attention do not add up to one
figure). Other runs (no preset) are not drawn."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from sparse_runner.checks import one_line
from sparse_runner.reporting.console import warn
from sparse_runner.reporting.papers.correia2019.picks import Picks, row_label
from sparse_runner.reporting.papers.correia2019.published import TRANSLATION_COLUMNS
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.sinks import mathtext
from sparse_runner.reporting.values import slug

# One model, one colour in every figure of a report, whichever models a figure shows (matplotlib's
# default cycle, in Table 1 row order); other models take the colours after these.
MODEL_COLOURS = {"softmax": "C0", "1.5-entmax": "C1", "α-entmax": "C2", "sparsemax": "C3"}


@dataclass(frozen=True)
class DrawnFigure:
    caption: str
    path: Path


def _learns_alpha(rec: RunRecord) -> bool:
    """α-entmax with a learned α per head (model.normaliser_options.alpha null), the runs whose α the paper plots."""
    return rec.config.get("model.normaliser") == "alpha_entmax" and rec.config.get("model.normaliser_options.alpha") is None


def _is_sparse(rec: RunRecord) -> bool:
    return rec.config.get("model.normaliser", rec.model) != "softmax"


def draw_comparison(attention: Mapping[str, dict], sparse_attention: Mapping[str, dict],
                    learned_alphas: Mapping[str, dict], folder: Path, stem: str) -> list[DrawnFigure]:
    """The paper's four analysis figures for one task+experiment, as `<folder>/<stem>_<figure>.png`.

    Each argument is {model label: the run's analysis block}. attention: every analysed model;
    sparse_attention: the sparse ones (softmax is dense by construction, so its density histogram is one
    spike at 1); learned_alphas: models with a learned α per head. A figure with no model to show is not
    drawn.
    """
    # matplotlib (but not torch): only imported when there is something to draw.
    from sparse_runner.analysis import figures

    colours = {label: MODEL_COLOURS.get(label, f"C{(len(MODEL_COLOURS) + i) % 10}")
               for i, label in enumerate(attention)}
    plans = [
        ("js_per_layer", "Head diversity (JS divergence) per layer", figures.plot_js_per_layer, attention),
        ("alpha_histograms", "Learned α per attention type", figures.plot_alpha_histograms, learned_alphas),
        ("density_histograms", "Per-sentence attention density of the sparse models",
         figures.plot_density_histograms, sparse_attention),
        ("head_density_per_layer", "Head density per layer (mean, min–max)", figures.plot_head_density_per_layer,
         attention),
    ]
    return [DrawnFigure(caption, plot(models, folder / f"{stem}_{name}.png", colours=colours))
            for name, caption, plot, models in plans if models]


def _as_drawn(block: Mapping[str, dict]) -> dict[str, dict]:
    """An analysis block with its attention types (the figures' titles and legends) drawn as written: a run's
    metrics.json names them, and matplotlib would parse a `$` in them as mathtext."""
    return {mathtext(attention_type): entry for attention_type, entry in block.items()}


def analysis_figures(picks: Picks, out_dir: Path) -> tuple[list[str], list[Path]]:
    """Draw the paper's analysis figures for every task+experiment whose runs have an analysis block, into
    `out_dir/figures`; returns the markdown sections that show them and the files written.

    The models compared are the runs Table 1 shows (picks.translation_picks). A run without analysis is
    left out of the figures; a group whose analysis cannot be drawn is skipped with a warning.
    """
    sections: list[str] = []
    written: list[Path] = []
    columns = {(spec["tasks"][0], spec["experiment"]): picks.preset_cells(column)
               for column, spec in TRANSLATION_COLUMNS.items()}
    for (task, experiment), groups in sorted(columns.items()):
        runs = {model: group.best for model, group in groups.items()}
        analysed = {row_label(model): rec for model, rec in runs.items() if rec.analysis("attention")}
        if not analysed:
            continue
        attention = {label: _as_drawn(rec.analysis("attention")) for label, rec in analysed.items()}
        try:
            drawn = draw_comparison(
                attention=attention,
                sparse_attention={label: attention[label] for label, rec in analysed.items() if _is_sparse(rec)},
                learned_alphas={label: _as_drawn(rec.analysis("alpha")) for label, rec in analysed.items()
                                if _learns_alpha(rec) and rec.analysis("alpha")},
                folder=out_dir / "figures", stem=slug(f"{task}_{experiment}"),
            )
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            warn(f"figures for task={task}, experiment={experiment} skipped: malformed analysis ({one_line(exc)})")
            continue
        written += [figure.path for figure in drawn]
        sections.append(_figures_markdown(task, experiment, runs, analysed, drawn, out_dir))
    return sections, written


def _figures_markdown(task: str | None, experiment: str | None, runs: dict[str, RunRecord],
                      analysed: dict[str, RunRecord], drawn: list[DrawnFigure], out_dir: Path) -> str:
    """The markdown section of one task+experiment: which runs the figures compare, then the figures."""
    lines = [f"## Figures: Correia et al. 2019 analysis, task={task}, experiment={experiment}", "",
             "Runs: " + ", ".join(f"{label} `{rec.display}`" for label, rec in analysed.items()) + "."]
    skipped = [row_label(model) for model, rec in runs.items() if row_label(model) not in analysed]
    if skipped:
        lines[-1] += " Without analysis, so not drawn: " + ", ".join(skipped) + "."
    for figure in drawn:
        lines += ["", f"![{figure.caption}]({figure.path.relative_to(out_dir).as_posix()})"]
    return "\n".join(lines)
