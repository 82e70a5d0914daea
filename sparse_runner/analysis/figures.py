"""Figures of Correia et al. (2019), Section 5, drawn from `AttentionStats.summary()` / `alpha_summary()`.

Every function writes one PNG atomically (temporary sibling + `os.replace`, via `sparse_runner.io`) and
returns its path. Figures are built with `matplotlib.figure.Figure` and the Agg canvas: no pyplot, no
display, no global backend switch, no figure left open. Nothing here imports torch: the trainer draws a
run's figures (`analysis.collect`) and sparse-report draws the same figures comparing runs from their
metrics.json, without torch.

Functions that take a summary accept either one summary ({attention_type: {...}}) or several models
to overlay ({model name: summary}), e.g. {"softmax": s1, "1.5-entmax": s2, "alpha-entmax": s3}.
Models are coloured in order from matplotlib's cycle unless `colours` ({model name: colour}) says
otherwise: a caller drawing different subsets of its models in different figures passes the same
`colours` to all of them, so that a model keeps its colour throughout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sparse_runner.analysis.bins import (
    ALPHA_BINS,
    ALPHA_RANGE,
    DENSITY_BINS,
    DENSITY_RANGE,
    bin_edges,
    order_types,
)
from sparse_runner.io import atomic_open

TYPE_TITLES = {
    "encoder_self": "Encoder self-attention",
    "context": "Context attention",
    "decoder_self": "Decoder self-attention",
}
PANEL_SIZE = (4.2, 3.2)  # inches per panel
DPI = 120


def type_title(attn_type: str) -> str:
    return TYPE_TITLES.get(attn_type, attn_type.replace("_", " ").capitalize())


def _is_summary(obj: Any, entry_key: str) -> bool:
    """Whether `obj` is one model's {attention type: entry}, every entry holding `entry_key`."""
    return isinstance(obj, Mapping) and bool(obj) and all(
        isinstance(v, Mapping) and entry_key in v for v in obj.values()
    )


def _as_models(summary: Mapping, entry_key: str = "layers") -> dict[str, Mapping]:
    """{model name: summary}; a single summary becomes {"": summary} (drawn without a model legend).

    entry_key: a key every entry of a summary has ("layers" in `AttentionStats.summary()`, "counts" in
    `alpha_summary()`), which tells one summary from several.
    """
    if _is_summary(summary, entry_key):
        return {"": summary}
    if isinstance(summary, Mapping) and summary and all(_is_summary(v, entry_key) for v in summary.values()):
        return dict(summary)
    raise ValueError("expected a summary {attention type: ...} or a dict {model name: summary} with data")


def _colours(models: Mapping[str, Mapping], colours: Mapping[str, str] | None) -> dict[str, str]:
    colours = colours or {}
    return {name: colours.get(name, f"C{i}") for i, name in enumerate(models)}


def _types(models: Mapping[str, Mapping]) -> list[str]:
    return order_types(t for s in models.values() for t in s)


def _figure(n_rows: int, n_cols: int, *, sharey: bool = False) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(PANEL_SIZE[0] * n_cols, PANEL_SIZE[1] * n_rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharey=sharey)
    return fig, axes


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI)
    return path


def _value(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _layer_ticks(ax, layers: list[int]) -> None:
    ax.set_xticks([l + 1 for l in layers])
    ax.set_xlabel("layer")


def _histogram_figure(models: Mapping[str, Mapping], colours: dict[str, str], *, bins: int,
                      value_range: tuple[float, float], xlabel: str, sharey: bool) -> tuple[Figure, np.ndarray]:
    """One panel per attention type; each model's histogram {"counts", "edges"?, "count"?} of that type as
    bars, several models side by side within each bin."""
    types = _types(models)
    fig, axes = _figure(1, len(types), sharey=sharey)
    bar_width = (value_range[1] - value_range[0]) / bins / len(models)
    for ax, attn_type in zip(axes[0], types):
        for i, (name, model) in enumerate(models.items()):
            hist = model.get(attn_type)
            if hist is None:
                continue
            counts = np.asarray(hist["counts"])
            edges = np.asarray(hist.get("edges", bin_edges(bins, *value_range)))
            n = hist.get("count", int(counts.sum()))
            ax.bar(edges[:-1] + i * bar_width, counts, width=bar_width, align="edge", color=colours[name],
                   edgecolor="white", linewidth=0.5, label=f"{name} (n={n})" if name else f"n={n}")
        ax.set_xlim(*value_range)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no 0.5 heads
        ax.set_xlabel(xlabel)
        ax.set_title(type_title(attn_type))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    return fig, axes


def plot_alpha_histograms(alpha_summary: Mapping, path: str | os.PathLike, *,
                          colours: Mapping[str, str] | None = None) -> Path:
    """Histogram of learned alphas per attention type (15 equal bins over [1, 2], as in the paper)."""
    models = _as_models(alpha_summary, entry_key="counts")
    fig, axes = _histogram_figure(models, _colours(models, colours), bins=ALPHA_BINS, value_range=ALPHA_RANGE,
                                  xlabel="learned α  (1 = softmax, 2 = sparsemax)", sharey=True)
    for ax in axes[0]:
        ax.axvline(1.5, color="grey", linestyle=":", linewidth=1)  # 1.5-entmax, for reference
    axes[0, 0].set_ylabel("number of heads")
    fig.suptitle("Distribution of learned α per attention type")
    return _save(fig, path)


def plot_density_histograms(summary: Mapping, path: str | os.PathLike, *,
                            colours: Mapping[str, str] | None = None) -> Path:
    """Histogram of per-sentence head densities (heads × sentences), one panel per attention type."""
    models = {name: {t: entry["sentence_density_hist"] for t, entry in model.items()}
              for name, model in _as_models(summary).items()}
    fig, axes = _histogram_figure(models, _colours(models, colours), bins=DENSITY_BINS, value_range=DENSITY_RANGE,
                                  xlabel="attention density (non-zero / possible pairs)", sharey=False)
    for ax in axes[0]:
        ax.set_ylabel("heads × sentences")
    fig.suptitle("Per-sentence head density")
    return _save(fig, path)


def plot_js_per_layer(summary: Mapping, path: str | os.PathLike, *,
                      colours: Mapping[str, str] | None = None) -> Path:
    """Head diversity (JS divergence / log H) per layer.

    One summary: one panel, one line per attention type. Several models: one panel per attention type,
    one line per model (the paper's layout).
    """
    models = _as_models(summary)
    types = _types(models)
    if list(models) == [""]:
        fig, axes = _figure(1, 1)
        ax = axes[0, 0]
        all_layers: set[int] = set()
        for i, attn_type in enumerate(types):
            layers = models[""][attn_type]["layers"]
            all_layers.update(l["layer"] for l in layers)
            ax.plot([l["layer"] + 1 for l in layers], [_value(l["js"]) for l in layers], marker="o",
                    color=f"C{i}", label=type_title(attn_type))
        _layer_ticks(ax, sorted(all_layers))
        ax.set_title("Head diversity per layer")
    else:
        colours = _colours(models, colours)
        fig, axes = _figure(1, len(types), sharey=True)
        for ax, attn_type in zip(axes[0], types):
            all_layers = set()
            for name, model in models.items():
                if attn_type not in model:
                    continue
                layers = model[attn_type]["layers"]
                all_layers.update(l["layer"] for l in layers)
                ax.plot([l["layer"] + 1 for l in layers], [_value(l["js"]) for l in layers],
                        marker="o", color=colours[name], label=name)
            _layer_ticks(ax, sorted(all_layers))
            ax.set_title(type_title(attn_type))
        fig.suptitle("Head diversity per layer")
    # Limits once every panel is drawn: the panels share y, and fixing it earlier would cut off the
    # lines of later panels.
    for ax in axes[0]:
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0, 0].set_ylabel("JS divergence / log H")
    return _save(fig, path)


def plot_head_density_per_layer(summary: Mapping, path: str | os.PathLike, *,
                                colours: Mapping[str, str] | None = None) -> Path:
    """Mean head density per layer with the min-max range over the layer's heads, per attention type."""
    models = _as_models(summary)
    colours = _colours(models, colours)
    types = _types(models)
    fig, axes = _figure(1, len(types), sharey=True)
    n = len(models)
    for ax, attn_type in zip(axes[0], types):
        all_layers: set[int] = set()
        for i, (name, model) in enumerate(models.items()):
            if attn_type not in model:
                continue
            layers = model[attn_type]["layers"]
            all_layers.update(l["layer"] for l in layers)
            offset = (i - (n - 1) / 2) * 0.08  # models side by side, so that their ranges stay readable
            xs = np.array([l["layer"] + 1 + offset for l in layers])
            mean = np.array([_value(l["mean_density"]) for l in layers])
            low = np.array([_value(l["min_density"]) for l in layers])
            high = np.array([_value(l["max_density"]) for l in layers])
            ax.errorbar(xs, mean, yerr=[mean - low, high - mean], marker="o", capsize=4, color=colours[name],
                        label=f"{name} mean (min–max)" if name else "mean (min–max over heads)")
        _layer_ticks(ax, sorted(all_layers))
        ax.set_ylim(0, 1.05)
        ax.set_title(type_title(attn_type))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0, 0].set_ylabel("head density")
    fig.suptitle("Head density per layer")
    return _save(fig, path)


def _parse_key(key: str) -> tuple[str, int | str]:
    attn_type, _, layer = str(key).rpartition("/")
    if not attn_type:
        return str(key), 0
    try:
        return attn_type, int(layer)
    except ValueError:
        return attn_type, layer


def plot_alpha_trajectories(trajectory: Mapping[str, list[tuple[int, list[float]]]], path: str | os.PathLike) -> Path:
    """Alpha of every head against the training step; one panel per "attention_type/layer" key.

    trajectory: {"encoder_self/0": [(step, [alpha per head]), ...], ...}. Rows are attention types,
    columns layers.
    """
    keys = [k for k, points in trajectory.items() if points]
    if not keys:
        raise ValueError("no alpha trajectories to plot")
    parsed = {k: _parse_key(k) for k in keys}
    types = order_types(t for t, _ in parsed.values())
    columns = {t: sorted({l for tt, l in parsed.values() if tt == t}, key=lambda l: (isinstance(l, str), l))
               for t in types}
    n_cols = max(len(c) for c in columns.values())
    fig, axes = _figure(len(types), n_cols, sharey=True)
    for key in keys:
        attn_type, layer = parsed[key]
        ax = axes[types.index(attn_type), columns[attn_type].index(layer)]
        points = sorted(trajectory[key], key=lambda p: p[0])
        steps = np.array([p[0] for p in points])
        values = np.array([list(p[1]) for p in points], dtype=float)  # (steps, heads)
        for h in range(values.shape[1]):
            ax.plot(steps, values[:, h], color=f"C{h % 10}", linewidth=1.2, label=f"head {h + 1}")
        layer_label = f"layer {layer + 1}" if isinstance(layer, int) else str(layer)
        ax.set_title(f"{type_title(attn_type)}, {layer_label}", fontsize="medium")
        ax.set_ylim(*ALPHA_RANGE)
        ax.grid(alpha=0.3)
        ax.set_xlabel("training step")
    for r, attn_type in enumerate(types):
        axes[r, 0].set_ylabel("α")
        for c in range(len(columns[attn_type]), n_cols):
            axes[r, c].set_visible(False)
    handles, labels = max((ax for ax in axes.flat if ax.get_visible()), key=lambda a: len(a.lines)).get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle("Learned α per head during training")
    return _save(fig, path)


__all__ = [
    "plot_alpha_histograms",
    "plot_alpha_trajectories",
    "plot_density_histograms",
    "plot_head_density_per_layer",
    "plot_js_per_layer",
    "type_title",
]
