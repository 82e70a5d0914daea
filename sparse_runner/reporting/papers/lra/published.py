"""Long Range Arena (Tay et al., ICLR 2021), Table 1: the published numbers, the columns and data they measure,
our two settings (the experiments each task family's presets start from), and the data our runs state.

Plain data, used by __init__.py (Table 1 and our rows) and runs.py (the runs behind it).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.values import as_str

CITATION = "Tay et al., ICLR 2021, Table 1"

# Official results: Tay et al., "Long Range Arena: A Benchmark for Efficient Transformers", ICLR 2021,
# Table 1 (test accuracy %, identical in google-research/long-range-arena's README leaderboard; docs/papers.md
# D.2). Path-X: every model FAILed (no better than chance). "Avg" is the paper's printed mean of the five
# tasks without Path-X.
# Discrepancy kept on purpose: Sinkhorn Trans.'s five scores average to 51.48, yet the paper prints 51.39
# and the README 51.29. We store the paper's printed value (see "notes") rather than recompute it.
LRA_TABLE1: dict = {
    "citation": CITATION,
    "columns": ["ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Path-X", "Avg"],
    "rows": {
        "Transformer": {"ListOps": 36.37, "Text": 64.27, "Retrieval": 57.46, "Image": 42.44, "Pathfinder": 71.40, "Path-X": "FAIL", "Avg": 54.39},
        "Local Attention": {"ListOps": 15.82, "Text": 52.98, "Retrieval": 53.39, "Image": 41.46, "Pathfinder": 66.63, "Path-X": "FAIL", "Avg": 46.06},
        "Sparse Trans.": {"ListOps": 17.07, "Text": 63.58, "Retrieval": 59.59, "Image": 44.24, "Pathfinder": 71.71, "Path-X": "FAIL", "Avg": 51.24},
        "Longformer": {"ListOps": 35.63, "Text": 62.85, "Retrieval": 56.89, "Image": 42.22, "Pathfinder": 69.71, "Path-X": "FAIL", "Avg": 53.46},
        "Linformer": {"ListOps": 35.70, "Text": 53.94, "Retrieval": 52.27, "Image": 38.56, "Pathfinder": 76.34, "Path-X": "FAIL", "Avg": 51.36},
        "Reformer": {"ListOps": 37.27, "Text": 56.10, "Retrieval": 53.40, "Image": 38.07, "Pathfinder": 68.50, "Path-X": "FAIL", "Avg": 50.67},
        "Sinkhorn Trans.": {"ListOps": 33.67, "Text": 61.20, "Retrieval": 53.83, "Image": 41.23, "Pathfinder": 67.45, "Path-X": "FAIL", "Avg": 51.39},
        "Synthesizer": {"ListOps": 36.99, "Text": 61.68, "Retrieval": 54.67, "Image": 41.61, "Pathfinder": 69.45, "Path-X": "FAIL", "Avg": 52.88},
        "BigBird": {"ListOps": 36.05, "Text": 64.02, "Retrieval": 59.29, "Image": 40.83, "Pathfinder": 74.87, "Path-X": "FAIL", "Avg": 55.01},
        "Linear Trans.": {"ListOps": 16.13, "Text": 65.90, "Retrieval": 53.09, "Image": 42.34, "Pathfinder": 75.30, "Path-X": "FAIL", "Avg": 50.55},
        "Performer": {"ListOps": 18.01, "Text": 65.40, "Retrieval": 53.82, "Image": 42.77, "Pathfinder": 77.05, "Path-X": "FAIL", "Avg": 51.41},
    },
    "notes": {
        "Sinkhorn Trans.": "Avg printed as 51.39 in the paper, 51.29 in the README; its five scores average to 51.48",
    },
}

# What the published numbers measure, as a run's primary metric: only runs scored on it fill a cell.
METRIC = "test/accuracy"
# The accuracy of always predicting the most frequent training label, which the LRA tasks write beside it.
MAJORITY_METRIC = "test/majority_accuracy"
# Config keys that change no test accuracy (the shifted test is measured beside it, on the same model): runs
# that differ only in them and in their seed share a cell, and a run that differs from a preset only in them
# is that preset.
POOLED_KEYS = ("trainer.test_topology_shift",)

# Which column of Table 1 a run belongs to, keyed by metrics.json "task_family" (cfg.task.family), in the
# paper's column order. Path-X is left out: every published model FAILed it and we have no such task.
COLUMNS: dict[str, str] = {
    "listops": "ListOps",
    "lra_text": "Text",
    "lra_retrieval": "Retrieval",
    "lra_image": "Image",
    "pathfinder": "Pathfinder",
}

# The data behind each published column (docs/papers.md), to set beside the data of our cells.
OFFICIAL_DATA: dict[str, str] = {
    "ListOps": "LRA's generated ListOps (96k/2k/2k, 500-2000 tokens)",
    "Text": "IMDB reviews, byte level",
    "Retrieval": "AAN (ACL Anthology Network) citation pairs, byte level",
    "Image": "CIFAR-10 in 8-bit grayscale, 1024 pixels",
    "Pathfinder": "generated 32x32 Pathfinder images",
}

# Which published row each of our model presets reproduces (our model=softmax at the LRA configs is LRA's
# vanilla "Transformer"), keyed by the preset a run's config is (not by its cfg.model.name, a label). Any other
# model preset is a row of our own.
OUR_MODEL_ROWS: dict[str, str] = {
    "softmax": "Transformer",
    "bigbird": "BigBird",
    "local": "Local Attention",
}
# The model the LRA experiments use when no model= is given: its commands need no model= override.
DEFAULT_MODEL = "softmax"

# Our settings, in the order their rows appear: the experiment each one's preset of a task family starts from.
SETTINGS: dict[str, dict] = {
    "paper": {
        "label": "ours: paper presets", "name": "paper presets",
        "experiments": {"listops": "lra_listops", "lra_text": "lra_text", "lra_retrieval": "lra_retrieval",
                        "lra_image": "lra_image", "pathfinder": "lra_pathfinder"},
    },
    "cpu": {
        "label": "ours: CPU presets", "name": "CPU presets",
        "experiments": {"listops": "lra_listops_cpu", "lra_text": "lra_text_cpu",
                        "lra_retrieval": "lra_retrieval_cpu", "lra_image": "lra_image_cpu",
                        "pathfinder": "lra_pathfinder_cpu"},
    },
}
# Cell markers. SUBSTITUTE: the run's data is another real dataset standing in for the official one.
SUBSTITUTE = "†"
PRINTED_AVG = "‡"  # a published Avg that is not the mean of its row (see LRA_TABLE1["notes"])


# ------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class DataInfo:
    """metrics.json task_info.data: what a run trained and was tested on."""

    source: str                  # release | hub | generated | substitute | unknown
    name: str | None = None
    substitute_for: str | None = None
    description: str | None = None

    @property
    def is_substitute(self) -> bool:
        return self.source == "substitute"

    @property
    def label(self) -> str:
        """`bbc_news † (substitute for IMDB)`, `imdb (hub)`, `generated`."""
        if self.is_substitute:
            return f"{self.name or '?'} {SUBSTITUTE} (substitute for {self.substitute_for or '?'})"
        return f"{self.name} ({self.source})" if self.name else self.source


def data_info(rec: RunRecord) -> DataInfo:
    """A run's data as task_info.data states it. A ListOps run without it is ours generated, unless
    task.data_dir pointed at LRA's release files; any other run without it is unknown."""
    info = rec.data.get("task_info")
    data = info.get("data") if isinstance(info, dict) else None
    if isinstance(data, dict) and as_str(data.get("source")):
        return DataInfo(source=str(data["source"]), name=as_str(data.get("name")),
                        substitute_for=as_str(data.get("substitute_for")), description=as_str(data.get("description")))
    if rec.task_family == "listops":
        return DataInfo(source="release") if rec.config.get("task.data_dir") else DataInfo(source="generated")
    return DataInfo(source="unknown")
