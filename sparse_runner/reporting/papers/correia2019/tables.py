"""Correia et al. (2019) Table 1, published BLEU beside ours with the scale our runs trained at, and the
table of our translation runs behind it (sacreBLEU, chrF, speed against softmax, scale). A cell of ours is
the mean ± std (n) over runs that differ only in their seed (seeds.py)."""

from __future__ import annotations

from typing import Any, Iterable

from sparse_runner.reporting import seeds
from sparse_runner.reporting.papers.correia2019.picks import Picks, RowKey, table1_rows
from sparse_runner.reporting.papers.correia2019.published import (
    CORREIA2019_MODEL_SIZE,
    CORREIA2019_SPEED,
    CORREIA2019_TABLE1,
    METRIC,
    TRANSLATION_COLUMNS,
    translation_fill_command,
)
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord
from sparse_runner.reporting.seeds import SeedGroup, distinct
from sparse_runner.reporting.values import as_float, as_int, as_str, fmt_number, number_format, score


def _steps(value: Any) -> str:
    """200000 -> `200k`, 1400 -> `1400`."""
    number = as_int(value)
    if number is None:
        return "?"
    return f"{number // 1000}k" if number >= 10_000 and number % 1000 == 0 else str(number)


def translation_scale(rec: RunRecord) -> str:
    """`CPU size: 3+3 layers d256 h4, 3000 tokens/batch, 1400 steps`, read from the run's config and how far
    it trained, so that nobody mistakes a small run for a reproduction. `paper size` means the paper's
    Transformer-Base dimensions (published.CORREIA2019_MODEL_SIZE)."""
    config = rec.config
    dims = {
        "model.num_layers": config.get("model.num_layers"),
        # a null decoder_layers means as deep as the encoder
        "model.decoder_layers": config.get("model.decoder_layers") or config.get("model.num_layers"),
        "model.d_model": config.get("model.d_model"),
        "model.num_heads": config.get("model.num_heads"),
    }
    size = "paper size" if dims == CORREIA2019_MODEL_SIZE else "CPU size"
    steps = rec.data.get("step") if as_float(rec.data.get("step")) is not None else config.get("trainer.max_steps")
    text = (f"{size}: {dims['model.num_layers']}+{dims['model.decoder_layers']} layers d{dims['model.d_model']} "
            f"h{dims['model.num_heads']}, {config.get('trainer.batch_tokens')} tokens/batch, {_steps(steps)} steps")
    return text + " (stopped early)" if rec.data.get("stopped_early") is True else text


def _tokens_per_second(rec: RunRecord) -> float | None:
    return as_float(rec.data.get("tokens_per_second"))


def _speed_vs_softmax(group: SeedGroup, picks: Picks, column: str | None, key: RowKey | None) -> str:
    """Mean training tokens/s in % of our softmax runs' of the same cell column and difference from the presets
    (the paper's comparison): a ratio of two means, without a std."""
    softmax = picks.column(column).get(("softmax", key[1])) if column and key else None
    ours = group.mean(_tokens_per_second)
    base = softmax.mean(_tokens_per_second) if softmax else None
    return f"{100.0 * ours / base:.0f}" if ours is not None and base else ""


def _task_info_values(runs: Iterable[RunRecord], key: str) -> list[str]:
    """The distinct values of metrics.json task_info[key] among `runs`, in first-seen order."""
    values = []
    for rec in runs:
        info = rec.data.get("task_info")
        value = as_str(info.get(key)) if isinstance(info, dict) else None
        if value and value not in values:
            values.append(value)
    return values


def _shown_runs(picks: Picks) -> list[RunRecord]:
    """Every run behind a cell of Table 1."""
    return [rec for column in TRANSLATION_COLUMNS for group in picks.column(column).values() for rec in group.runs]


def table1(picks: Picks) -> Table:
    """Per language pair the published BLEU and ours, rows = models; a cell we have no run for says which
    command fills it. The last row says at which scale our runs trained."""
    columns = list(TRANSLATION_COLUMNS)
    published_rows = CORREIA2019_TABLE1["rows"]
    headers, scale_row = ["model"], ["scale"]
    for column in columns:
        groups = picks.preset_cells(column).values()   # other runs say in their label what differs
        scales = distinct((translation_scale(rec) for group in groups for rec in group.runs), sep="; ")
        if TRANSLATION_COLUMNS[column]["published"]:
            headers.append(f"{column} published")
            scale_row.append("")  # the paper's scale is in the caption
        headers.append(f"{column} ours" if TRANSLATION_COLUMNS[column]["published"] else column)
        scale_row.append(scales)

    rows, missing = [], []
    for key in table1_rows(picks):
        (model, other), label = key, picks.label(key)
        row = [label]
        for column in columns:
            if TRANSLATION_COLUMNS[column]["published"]:
                row.append("" if other else fmt_number(published_rows.get(label, {}).get(column), ".2f"))
            group = picks.column(column).get(key)
            if group is not None:
                row.append(group.text(METRIC, score))
            elif other:
                row.append("")   # other runs: no preset to run
            else:
                row.append(f"run: {translation_fill_command(column, model)}")
                missing.append(column)
        rows.append(row)
    return Table(
        slug="correia2019_table1",
        title="Correia et al. 2019 Table 1: translation (published vs ours, test BLEU, tokenized)",
        headers=headers, rows=rows + [scale_row], numeric=set(range(1, len(headers))),
        rules_before={len(rows)}, notes=_table1_notes(picks, missing),
    )


def _table1_notes(picks: Picks, missing: list[str]) -> list[str]:
    """The caption of Table 1: sources, how our cells are chosen and scored, and how to fill the gaps."""
    used = _shown_runs(picks)
    tokenization = _task_info_values(used, "bleu_tokenization")
    signatures = _task_info_values(used, "sacrebleu_signature")
    notes = [
        f"Published: {CORREIA2019_TABLE1['citation']}: test BLEU, tokenized (Moses-tokenised, "
        "multi-bleu.perl style); single runs. es→en Bible is our own CPU-size pair, not in the paper.",
        f"Ours: per cell, the test BLEU (metrics.json `{METRIC}`, rounded to 2 decimals) of the completed runs whose "
        "resolved config is the cell's preset, the column's experiment (`experiment=correia2019_<pair>`; es→en "
        "Bible: `experiment=mt_cpu`) with the row's `model=`, in every result-changing key but the seed, whatever "
        "their command line said (their `model=` name is only a label); the mean over seeds, and where runs on "
        "several data compete, the one with the best mean validation BLEU. `other runs` rows: runs of a column's "
        "task that are no preset, under the nearest preset's model and what differs from it (`key=value`); not "
        "comparable with the published numbers.",
        seeds.NOTE,
        "Tokenized BLEU of ours: " + (" | ".join(tokenization) if tokenization else "no run yet") + ".",
        "sacreBLEU signature of ours (detokenized BLEU, in the runs table below): "
        + (" | ".join(signatures) if signatures else "no run yet") + ".",
        "Scale (of the preset rows' runs): `paper size` = the paper's Transformer-Base (6+6 layers, d_model 512, 8 heads, 8192-token "
        "batches; docs/papers.md). A `CPU size` cell is a small model trained briefly: it checks the pipeline "
        "and is not a reproduction of the published number.",
    ]
    columns = list(dict.fromkeys(missing))
    if columns:
        notes.append("Missing cells; fill a whole column with: " + "; ".join(
            f"{column}: `{translation_fill_command(column)}`" for column in columns) + ".")
    return notes


def runs_table(picks: Picks) -> Table | None:
    """Every completed translation run behind Table 1 with sacreBLEU, chrF, speed and scale, a row per group of
    seeds; our other completed translation runs below a rule. None when there are no completed translation runs."""
    cells = [(column, key, group) for column in TRANSLATION_COLUMNS for key, group in picks.column(column).items()]
    if not cells and not picks.hidden:
        return None
    rows = [_run_row(column, picks.label(key), group, picks, column, key) for column, key, group in cells]
    rows += [_run_row(f"not in Table 1: task={group.first.task}", group.first.label, group, picks)
             for group in picks.hidden]
    notes = [
        "BLEU (tok.) is Table 1's metric; sacreBLEU is detokenized BLEU (signature in Table 1's caption); "
        "chrF in sacreBLEU's default setting. Best val BLEU chose among configurations.",
        "Speed: mean training tokens/s in % of our softmax runs' of the same column and row kind (preset or the "
        "same other runs' difference); published: α-entmax 75 %, 1.5-entmax 90 % of softmax (Correia et al. 2019; "
        "docs/papers.md).",
        seeds.NOTE,
    ]
    if picks.hidden:
        notes.append("Rows below the rule are our other completed translation runs (a task of no column, or a "
                     "cell's runs on other data, not the best on validation); they are not in Table 1. Their model "
                     "column says what they computed.")
    return Table(
        slug="correia2019_table1_runs",
        title="Correia et al. 2019 Table 1: our runs (BLEU, sacreBLEU, chrF, speed, scale)",
        headers=["column", "model", "BLEU (tok.)", "sacreBLEU", "chrF", "best val BLEU", "tokens/s",
                 "speed vs softmax (%)", "published speed (%)", "scale", "run"],
        rows=rows, numeric=set(range(2, 9)), rules_before={len(cells)} if picks.hidden and cells else set(),
        notes=notes,
    )


def _run_row(column_label: str, label: str, group: SeedGroup, picks: Picks, column: str | None = None,
             key: RowKey | None = None) -> list[str]:
    published_speed = CORREIA2019_SPEED.get(label)
    return [
        column_label, label,
        # BLEU (tok.) is the runs' primary metric (translation_picks), sacreBLEU and chrF are reported beside it
        group.text(METRIC, score), group.text("test/sacrebleu", score), group.text("test/chrf", score),
        group.text(lambda rec: rec.validation_value, score),
        group.text(_tokens_per_second, number_format(".0f")),
        _speed_vs_softmax(group, picks, column, key),
        "" if published_speed is None else f"{100.0 * published_speed:.0f}",
        distinct((translation_scale(rec) for rec in group.runs), sep="; "), group.display,
    ]
