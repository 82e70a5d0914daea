"""Attention analysis of a trained model (Correia et al. 2019, section 5), run by the trainer at the end.

Density, head diversity (JS) and the learned alphas are measured on the validation split with the best
checkpoint; alpha trajectories come from the step log, so a resumed run has its whole history.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from torch import nn

from sparse_runner.analysis.attention_stats import AttentionStats, alpha_summary
from sparse_runner.attention import attention_layers, head_alphas, set_observer
from sparse_runner.attention.memory_efficient import count_skipped_blocks

log = logging.getLogger(__name__)

ALPHA_PREFIX = "alpha/"


def analyse(model: nn.Module, evaluate: Callable[[], Any]) -> dict[str, Any]:
    """Run `evaluate()` with every attention layer reporting its weights; return the statistics."""
    stats = AttentionStats()
    set_observer(model, stats.update)
    try:
        with count_skipped_blocks() as blocks:
            evaluate()
    finally:
        set_observer(model, None)
    alphas = {(key.split("/")[0], int(key.split("/")[1])): values for key, values in head_alphas(model).items()}
    # Key blocks the memory-efficient path could skip (all of a query block's weights on them zero).
    skipped = {"key_blocks": blocks[0], "skipped_fraction": blocks[1] / blocks[0] if blocks[0] else None}
    return {"attention": stats.summary(), "alpha": alpha_summary(alphas), "memory_efficient": skipped}


def alpha_log_values(model: nn.Module) -> dict[str, list[float]]:
    """Step-log entries for learned alphas: {'alpha/encoder_self/0': [per-head alphas]} (empty if none are learned)."""
    learned = any(getattr(layer.normaliser, "alpha_logit", None) is not None for layer in attention_layers(model))
    return {ALPHA_PREFIX + key: values for key, values in head_alphas(model).items()} if learned else {}


def alpha_trajectory(log_path: Path) -> dict[str, list[tuple[int, list[float]]]]:
    """'type/layer' -> [(step, per-head alphas), ...] read back from log.jsonl."""
    out: dict[str, list[tuple[int, list[float]]]] = {}
    if not Path(log_path).exists():
        return out
    for line in Path(log_path).read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key.startswith(ALPHA_PREFIX) and isinstance(value, list):
                out.setdefault(key[len(ALPHA_PREFIX) :], []).append((row["step"], value))
    return out


def write_figures(run_dir: Path, analysis: dict[str, Any], trajectory: dict) -> list[str]:
    """The paper's figures for one run, under run_dir/figures/. Returns the written paths."""
    from sparse_runner.analysis import figures

    out = Path(run_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    written = [
        figures.plot_density_histograms(analysis["attention"], out / "density_histogram.png"),
        figures.plot_js_per_layer(analysis["attention"], out / "js_per_layer.png"),
        figures.plot_head_density_per_layer(analysis["attention"], out / "head_density_per_layer.png"),
    ]
    if trajectory:
        written.append(figures.plot_alpha_histograms(analysis["alpha"], out / "alpha_histogram.png"))
        written.append(figures.plot_alpha_trajectories(trajectory, out / "alpha_trajectories.png"))
    return [str(p) for p in written]

