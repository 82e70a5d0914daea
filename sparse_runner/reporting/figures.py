"""The analysis figures of Correia et al. (2019), Section 5, comparing our models on one task+experiment.

sparse-report draws them from the "analysis" block of each run's metrics.json (what
`AttentionStats.summary()` and `alpha_summary()` wrote at the end of training), one line or bar group per
model. The per-run figures of `sparse_runner.analysis.figures` cannot be reused here: importing that module
imports the analysis package, which needs torch, and the report stays torch-free.

Inputs are plain dicts keyed by a model's display name ("softmax", "1.5-entmax", "α-entmax"), each value
being the run's `analysis["attention"]` or `analysis["alpha"]`: {attention type: block}. Every figure has
one panel per attention type and is written atomically (temporary sibling + os.replace). Matplotlib is used
through `Figure` and the Agg canvas: no pyplot, no display, no global state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sparse_runner.io import atomic_open

PANEL_INCHES = (4.2, 3.2)
DPI = 110

# One model, one colour in every figure of a report (matplotlib's default cycle, in Table 1 row order).
MODEL_COLOURS = {"softmax": "C0", "1.5-entmax": "C1", "α-entmax": "C2", "sparsemax": "C3"}

# What each panel of a figure draws for one model: (axes, model name, colour, block of one attention type,
# index of the model among those drawn, number of models drawn).
Drawer = Callable[[Any, str, str, Mapping, int, int], None]
# How a panel's axes are finished once every model is on it (limits, ticks).
Styler = Callable[[Any], None]


@dataclass(frozen=True)
class DrawnFigure:
    caption: str
    path: Path


def attention_types(models: Iterable[Mapping[str, Any]]) -> list[str]:
    """Attention types in first-seen order; the trainer writes encoder_self, context, decoder_self."""
    return list(dict.fromkeys(t for blocks in models for t in blocks))


def _colour(model: str, index: int) -> str:
    return MODEL_COLOURS.get(model, f"C{(len(MODEL_COLOURS) + index) % 10}")


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _save(fig: Figure, path: Path) -> Path:
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI)
    return path


def _per_type_figure(models: Mapping[str, Mapping], draw: Drawer, style: Styler, *, title: str, ylabel: str,
                     path: Path) -> Path:
    """One panel per attention type; `draw` puts each model's block of that type on the panel, then `style`
    sets its axes (after drawing, so that limits fit every model)."""
    types = attention_types(models.values())
    if not types:
        raise ValueError("nothing to plot")
    fig = Figure(figsize=(PANEL_INCHES[0] * len(types), PANEL_INCHES[1]), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(types), squeeze=False, sharey=True)[0]
    colours = {name: _colour(name, index) for index, name in enumerate(models)}
    for ax, attn_type in zip(axes, types):
        drawn = [(name, blocks[attn_type]) for name, blocks in models.items() if attn_type in blocks]
        for index, (name, block) in enumerate(drawn):
            draw(ax, name, colours[name], block, index, len(drawn))
    for ax, attn_type in zip(axes, types):  # the panels share y: set limits once every panel is drawn
        style(ax)
        ax.set_title(f"{attn_type.replace('_', ' ')} attention")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title)
    return _save(fig, path)


def _layer_axis(ax, top: float | None = None) -> None:
    """x: layers 1..L as integers; y: from 0 (to `top` when given)."""
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, top)


def _count_axis(ax) -> None:
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_js(ax, name: str, colour: str, block: Mapping, index: int, count: int) -> None:
    layers = block["layers"]
    ax.plot([layer["layer"] + 1 for layer in layers], [_number(layer["js"]) for layer in layers],
            marker="o", color=colour, label=name)


def _draw_head_density(ax, name: str, colour: str, block: Mapping, index: int, count: int) -> None:
    """Mean head density of each layer, the bar spanning the layer's sparsest to densest head."""
    layers = block["layers"]
    offset = (index - (count - 1) / 2) * 0.08  # side by side, so overlapping models stay readable
    mean = np.array([_number(layer["mean_density"]) for layer in layers])
    low = np.array([_number(layer["min_density"]) for layer in layers])
    high = np.array([_number(layer["max_density"]) for layer in layers])
    ax.errorbar([layer["layer"] + 1 + offset for layer in layers], mean, yerr=[mean - low, high - mean],
                marker="o", capsize=4, color=colour, label=f"{name} mean (min–max)")


def _draw_histogram(ax, name: str, colour: str, block: Mapping, index: int, count: int) -> None:
    """Counts per bin as bars; several models share each bin side by side."""
    counts = np.asarray(block["counts"], dtype=float)
    edges = np.asarray(block["edges"], dtype=float)
    width = (edges[1] - edges[0]) / count
    ax.bar(edges[:-1] + index * width, counts, width=width, align="edge", color=colour, edgecolor="white",
           linewidth=0.5, label=f"{name} (n={int(block.get('count', counts.sum()))})")
    ax.set_xlim(edges[0], edges[-1])


def plot_js_per_layer(attention: Mapping[str, Mapping], path: Path) -> Path:
    """Head diversity: JS divergence between the heads of a layer (normalised by log H), per layer."""
    return _per_type_figure(attention, _draw_js, _layer_axis, title="Head diversity (JS divergence) per layer",
                            ylabel="JS divergence / log H", path=path)


def plot_alpha_histograms(alphas: Mapping[str, Mapping], path: Path) -> Path:
    """Learned α of all heads, per attention type; the paper's 15 bins over [1, 2] come with the data."""
    return _per_type_figure(alphas, _draw_histogram, _count_axis, title="Learned α (1 = softmax, 2 = sparsemax)",
                            ylabel="number of heads", path=path)


def plot_density_histograms(attention: Mapping[str, Mapping], path: Path) -> Path:
    """Attention density of each head on each validation sentence (15 bins over [0, 1])."""
    histograms = {name: {t: block["sentence_density_hist"] for t, block in blocks.items()}
                  for name, blocks in attention.items()}
    return _per_type_figure(histograms, _draw_histogram, _count_axis, title="Per-sentence attention density",
                            ylabel="heads × sentences", path=path)


def plot_head_density_per_layer(attention: Mapping[str, Mapping], path: Path) -> Path:
    """Head density (non-zero weights / possible pairs) per layer: mean and min–max over the heads."""
    return _per_type_figure(attention, _draw_head_density, lambda ax: _layer_axis(ax, top=1.05),
                            title="Head density per layer",
                            ylabel="head density", path=path)


def draw_comparison(attention: Mapping[str, Mapping], sparse_attention: Mapping[str, Mapping],
                    learned_alphas: Mapping[str, Mapping], folder: str | os.PathLike,
                    stem: str) -> list[DrawnFigure]:
    """The paper's four analysis figures for one task+experiment, as `<folder>/<stem>_<figure>.png`.

    attention: every analysed model; sparse_attention: the sparse ones (softmax is dense by construction,
    so its density histogram is one spike at 1); learned_alphas: models with a learned α per head. A figure
    with no model to show is not drawn.
    """
    folder = Path(folder)
    plans = [
        ("js_per_layer", "Head diversity (JS divergence) per layer", plot_js_per_layer, attention),
        ("alpha_histograms", "Learned α per attention type", plot_alpha_histograms, learned_alphas),
        ("density_histograms", "Per-sentence attention density of the sparse models", plot_density_histograms,
         sparse_attention),
        ("head_density_per_layer", "Head density per layer (mean, min–max)", plot_head_density_per_layer,
         attention),
    ]
    return [DrawnFigure(caption, plot(models, folder / f"{stem}_{name}.png"))
            for name, caption, plot, models in plans if models]
