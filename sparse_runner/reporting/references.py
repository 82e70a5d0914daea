"""Published numbers that sparse-report puts next to ours, and how our runs map onto them.

Everything here is plain data so that adding a task or a paper table is adding a dict entry, not code.
"""

from __future__ import annotations

# Long Range Arena, official results: Tay et al., "Long Range Arena: A Benchmark for Efficient
# Transformers", ICLR 2021, Table 1 (test accuracy %, identical in google-research/long-range-arena's
# README leaderboard). Path-X: every model FAILed (no better than chance). "Avg" is the paper's printed
# mean of the five tasks without Path-X.
# Discrepancy kept on purpose: Sinkhorn Trans.'s five scores average to 51.48, yet the paper prints 51.39
# and the README 51.29. We store the paper's printed value (see "notes") rather than recompute it.
LRA_TABLE1: dict = {
    "citation": "Tay et al., ICLR 2021, Table 1",
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

# Which column of which published table a run belongs to, keyed by metrics.json "task_family"
# (cfg.task.family). All five LRA tasks are listed so their runs land in the right column as soon as the
# trainer supports them; only families that also appear in FILL_COMMANDS get a table when no run exists.
PAPER_COLUMNS: dict[str, tuple[str, str]] = {
    "listops": ("lra_table1", "ListOps"),
    "text": ("lra_table1", "Text"),
    "retrieval": ("lra_table1", "Retrieval"),
    "image": ("lra_table1", "Image"),
    "pathfinder": ("lra_table1", "Pathfinder"),
}

# The published tables by the name PAPER_COLUMNS uses, with a human title for the report.
PAPER_TABLES: dict[str, dict] = {
    "lra_table1": {"title": "LRA Table 1", "table": LRA_TABLE1},
}

# Which published row each of our models reproduces (our model=softmax at the LRA config is LRA's
# vanilla "Transformer"). Keyed by metrics.json "model" (cfg.model.name).
OUR_MODEL_ROWS: dict[str, str] = {
    "softmax": "Transformer",
}

# How to produce the run that fills our cell of a paper table, per task family: the experiment= file
# whose runs count as the paper setting, the model that experiment uses when none is given, and the
# command. A row for another model adds `model=<name>` to the command (see fill_command).
FILL_COMMANDS: dict[str, dict[str, str]] = {
    "listops": {
        "experiment": "lra_listops",
        "default_model": "softmax",
        "command": "sparse-run experiment=lra_listops",
    },
}

# What scale a task config trains at, so extra "ours" rows say whether they are a CPU-size run or the
# paper's size. Keyed by metrics.json "task" (cfg.task.name); unknown tasks just show their name.
TASK_SCALES: dict[str, str] = {
    "listops": "CPU size",
    "listops_lra": "paper size",
}


def fill_command(task_family: str, model: str | None = None) -> str | None:
    """The command that fills our cell for `task_family` (and `model`), or None if there is none yet."""
    entry = FILL_COMMANDS.get(task_family)
    if entry is None:
        return None
    command = entry["command"]
    if model is not None and model != entry.get("default_model"):
        command += f" model={model}"
    return command


# --------------------------------------------------------------------------------------------------
# Correia, Niculae and Martins, "Adaptively Sparse Transformers", EMNLP 2019 (PAPERS.md A.2-A.5).

# Table 1: test BLEU, tokenized (Moses-tokenised, multi-bleu.perl style), single runs, no std reported.
# Identical in the author's thesis chapter and the EMNLP slides (PAPERS.md A.2).
CORREIA2019_TABLE1: dict = {
    "citation": "Correia et al., EMNLP 2019, Table 1",
    "columns": ["IWSLT17 de→en", "KFTT ja→en", "WMT16 ro→en", "WMT14 en→de"],
    "rows": {
        "softmax": {"IWSLT17 de→en": 29.79, "KFTT ja→en": 21.57, "WMT16 ro→en": 32.70, "WMT14 en→de": 26.02},
        "1.5-entmax": {"IWSLT17 de→en": 29.83, "KFTT ja→en": 22.13, "WMT16 ro→en": 33.10, "WMT14 en→de": 25.89},
        "α-entmax": {"IWSLT17 de→en": 29.90, "KFTT ja→en": 21.74, "WMT16 ro→en": 32.89, "WMT14 en→de": 26.93},
    },
}

# Training speed (tokens/s) relative to softmax, end to end: α-entmax and 1.5-entmax run at 75 % and 90 % of
# the softmax model's speed (Correia et al. 2019; confirmed in the thesis chapter, PAPERS.md A.3).
CORREIA2019_SPEED: dict[str, float] = {"softmax": 1.00, "1.5-entmax": 0.90, "α-entmax": 0.75}

# Transformer-Base as trained in the paper (PAPERS.md A.3): a run at these dimensions is "paper size".
CORREIA2019_MODEL_SIZE: dict[str, int] = {
    "model.num_layers": 6, "model.decoder_layers": 6, "model.d_model": 512, "model.num_heads": 8,
}

# The row of Table 1 each of our models reproduces, keyed by metrics.json "model" (cfg.model.name).
# sparsemax has no published number: it becomes an extra row when we have runs of it.
TRANSLATION_MODEL_ROWS: dict[str, str] = {
    "softmax": "softmax",
    "entmax15": "1.5-entmax",
    "entmax": "α-entmax",
    "sparsemax": "sparsemax",
}

# The columns of our Table 1, in order: the tasks (metrics.json "task") whose runs fill a column and the
# experiment= file whose runs count as that column's setting. `published` is False for our own CPU-size
# column, which the paper does not have. `iwslt` is the short alias of the iwslt17_de_en task config.
TRANSLATION_COLUMNS: dict[str, dict] = {
    "IWSLT17 de→en": {"tasks": ("iwslt17_de_en", "iwslt"), "experiment": "correia2019_iwslt17_de_en", "published": True},
    "KFTT ja→en": {"tasks": ("kftt_ja_en",), "experiment": "correia2019_kftt_ja_en", "published": True},
    "WMT16 ro→en": {"tasks": ("wmt16_ro_en",), "experiment": "correia2019_wmt16_ro_en", "published": True},
    "WMT14 en→de": {"tasks": ("wmt14_en_de",), "experiment": "correia2019_wmt14_en_de", "published": True},
    "es→en Bible (ours, CPU)": {"tasks": ("bible_es_en",), "experiment": "mt_cpu", "published": False},
}

# The models a column's sweep trains: the three rows of the paper's Table 1.
TRANSLATION_SWEEP_MODELS = ("softmax", "entmax15", "entmax")


def translation_fill_command(column: str, model: str | None = None) -> str:
    """The command that fills one cell of our Table 1 (`model` given) or the whole column (a sweep)."""
    experiment = TRANSLATION_COLUMNS[column]["experiment"]
    if model is not None:
        return f"sparse-run experiment={experiment} model={model}"
    return f"sparse-run -m experiment={experiment} model={','.join(TRANSLATION_SWEEP_MODELS)}"


def canonical_task(task: str | None) -> str | None:
    """The task name a Table 1 column knows a task by (`iwslt` -> `iwslt17_de_en`); others unchanged."""
    for spec in TRANSLATION_COLUMNS.values():
        if task in spec["tasks"]:
            return spec["tasks"][0]
    return task
