"""Correia, Niculae and Martins, "Adaptively Sparse Transformers", EMNLP 2019 (docs/papers.md): the
published numbers, how our runs map onto Table 1, and the commands that fill its cells.

Plain data, so that adding a column or a model row is adding a dict entry, not code.
"""

from __future__ import annotations

# Table 1: test BLEU, tokenized (Moses-tokenised, multi-bleu.perl style), single runs, no std reported.
# Identical in the author's thesis chapter and the EMNLP slides (docs/papers.md).
CORREIA2019_TABLE1: dict = {
    "citation": "Correia et al., EMNLP 2019, Table 1",
    "columns": ["IWSLT17 de→en", "KFTT ja→en", "WMT16 ro→en", "WMT14 en→de"],
    "rows": {
        "softmax": {"IWSLT17 de→en": 29.79, "KFTT ja→en": 21.57, "WMT16 ro→en": 32.70, "WMT14 en→de": 26.02},
        "1.5-entmax": {"IWSLT17 de→en": 29.83, "KFTT ja→en": 22.13, "WMT16 ro→en": 33.10, "WMT14 en→de": 25.89},
        "α-entmax": {"IWSLT17 de→en": 29.90, "KFTT ja→en": 21.74, "WMT16 ro→en": 32.89, "WMT14 en→de": 26.93},
    },
}

# The task family of our runs that Table 1 is about (metrics.json "task_family"), and what its published
# numbers measure as a run's primary metric (tokenized BLEU): only runs scored on it stand for a model.
FAMILY = "translation"
METRIC = "test/bleu"

# Training speed (tokens/s) relative to softmax, end to end: α-entmax and 1.5-entmax run at 75 % and 90 % of
# the softmax model's speed (Correia et al. 2019; confirmed in the thesis chapter, docs/papers.md).
CORREIA2019_SPEED: dict[str, float] = {"softmax": 1.00, "1.5-entmax": 0.90, "α-entmax": 0.75}

# Transformer-Base as trained in the paper (docs/papers.md): a run at these dimensions is "paper size".
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
