"""sparse-report: collect run directories and write the paper tables next to the published numbers.

What it reads: every `metrics.json` below the given folders (written atomically by the trainer, schema 1)
and, for runs that never wrote one, `.hydra/config.yaml`. It never infers anything from directory names:
Hydra names run directories after the overrides, but users may rename or move them.

What it writes (markdown, CSV, LaTeX; atomically, into `<first path>/report` or `--out`):
- one paper table per task family (LRA ListOps for now): published rows side by side with our best run
  of the paper setting; an empty cell of ours says which command fills it; our other completed runs are
  listed underneath with their scale;
- Correia et al. (2019) Table 1 (translation, tokenized BLEU), published next to ours with the scale our
  runs trained at, the table of our translation runs behind it (sacreBLEU, chrF, speed vs softmax), and
  the paper's analysis figures comparing our models per task+experiment (PNG in `figures/`, linked from
  the markdown; drawn whatever --formats says);
- one runs table per task: every run with its status, the config values that vary between the runs,
  test accuracy (test BLEU for translation), best validation value, size, speed and wall time.

Exit codes of `main`: 0 report written; 1 no runs found (nothing written); 2 bad input (unknown format,
a path that does not exist, an output folder that cannot be written).
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from sparse_runner.io import atomic_write_text
from sparse_runner.reporting import references as refs

PROG = "sparse-report"
FORMATS = ("md", "csv", "tex")

# Folders that never contain runs of their own; hidden folders (.hydra, .git, ...) are skipped as well.
SKIP_DIRS = {"checkpoints", "tb"}

# Display status -> sort rank: finished work first, then work that stopped, then what never ran.
STATUS_ORDER = ["completed", "preempted", "unfinished", "failed", "not started", "unreadable", "unknown"]
_STATUS_RANK = {status: rank for rank, status in enumerate(STATUS_ORDER)}

# Config keys that differ between runs without changing the result (where it ran, how it logs, where
# files go), mirroring the keys Hydra leaves out of run-directory names. `model.name`/`task.name` have
# their own columns (and a runs table holds one task).
NOISE_KEYS = {
    "trainer.device", "trainer.resume", "trainer.progress", "trainer.log_every", "trainer.num_threads",
    "run_dir", "model.name", "task.name",
}
NOISE_PATTERNS = ("paths.*", "hydra.*", "*_dir", "*.dir", "*_path", "*.path")

_MISSING = ""  # how an absent config key shows in a table


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# Reading runs


@dataclass
class RunRecord:
    """One run directory as the report sees it. Every field tolerates an absent key in metrics.json."""

    path: Path                         # absolute run directory
    display: str                       # how the run is named in tables (relative to the walked root)
    status: str                        # completed | preempted | unfinished | failed | not started | unreadable | ...
    task: str | None = None
    task_family: str | None = None
    model: str | None = None
    experiment: str | None = None
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)   # flattened to dotted keys
    data: dict[str, Any] = field(default_factory=dict)     # metrics.json as read ({} when there is none)

    @property
    def metrics(self) -> dict[str, Any]:
        value = self.data.get("metrics")
        return value if isinstance(value, dict) else {}

    @property
    def test_accuracy(self) -> float | None:
        return _as_float(self.metrics.get("test/accuracy"))

    def attention_mean(self, field_name: str) -> float | None:
        """An analysis value (`mean_density`, `js_mean`) averaged over the attention types of the run."""
        analysis = self.data.get("analysis")
        attention = analysis.get("attention") if isinstance(analysis, dict) else None
        if not isinstance(attention, dict):
            return None
        values = [_as_float(v.get(field_name)) for v in attention.values() if isinstance(v, dict)]
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    @property
    def val_accuracy(self) -> float | None:
        return self.best_value("val/accuracy")

    def metric(self, name: str) -> float | None:
        """A final metric of the run (`test/bleu`, `test/chrf`, ...), or None when it has none."""
        return _as_float(self.metrics.get(name))

    def best_value(self, name: str) -> float | None:
        """The best value of a validation metric: the checkpoint-selection value when the run selected on
        `name`, else the trainer's `best/<name>`, else the final value."""
        selection = self.data.get("selection")
        if isinstance(selection, dict) and selection.get("metric") == name:
            best = _as_float(selection.get("best_value"))
            if best is not None:
                return best
        best = self.metric(f"best/{name}")
        return best if best is not None else self.metric(name)


def _as_float(value: Any) -> float | None:
    """A number from a JSON value, or None (booleans and non-numeric strings are not numbers)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _as_str(value: Any) -> str | None:
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """`{"model": {"num_heads": 2}}` -> `{"model.num_heads": 2}`; lists stay whole (one value)."""
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, dotted))
        else:
            flat[dotted] = value
    return flat


def _load_hydra(run_dir: Path) -> tuple[dict | None, list[str] | None]:
    """Hydra's saved config and overrides of a run directory, or None where missing or unreadable."""
    config = overrides = None
    config_file, overrides_file = run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml"
    if not config_file.is_file() and not overrides_file.is_file():
        return None, None
    try:  # imported here: only runs without a usable metrics.json need it
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return None, None
    if config_file.is_file():
        try:
            loaded = OmegaConf.load(config_file)
            try:
                config = OmegaConf.to_container(loaded, resolve=True)
            except Exception:  # an interpolation that needs Hydra or a missing env var: keep it as written
                config = OmegaConf.to_container(loaded, resolve=False)
        except Exception as exc:
            _warn(f"{config_file}: cannot read ({_one_line(exc)})")
    if overrides_file.is_file():
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(overrides_file))
            overrides = [str(item) for item in loaded] if isinstance(loaded, list) else None
        except Exception as exc:
            _warn(f"{overrides_file}: cannot read ({_one_line(exc)})")
    return (config if isinstance(config, dict) else None), overrides


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _experiment_from_overrides(overrides: list[str]) -> str | None:
    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if sep and key == "experiment" and value not in ("", "null"):
            return value
    return None


def _read_run(run_dir: Path, display: str) -> RunRecord:
    """One RunRecord from metrics.json, falling back to .hydra/ for whatever metrics.json lacks."""
    metrics_file = run_dir / "metrics.json"
    data: dict[str, Any] = {}
    if metrics_file.is_file():
        try:
            loaded = json.loads(metrics_file.read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):
                raise ValueError("not a JSON object")
            data = loaded
            raw_status = _as_str(data.get("status"))
            status = {"running": "unfinished", None: "unknown"}.get(raw_status, raw_status)
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            _warn(f"{metrics_file}: unreadable ({_one_line(exc)}); listed as unreadable")
            status = "unreadable"
    else:
        status = "not started"

    hydra_config, hydra_overrides = _load_hydra(run_dir)
    config = data.get("config") if isinstance(data.get("config"), dict) else hydra_config
    overrides = data.get("overrides") if isinstance(data.get("overrides"), list) else hydra_overrides
    overrides = [str(item) for item in overrides or []]
    flat = flatten(config or {})

    task = _as_str(data.get("task")) or _as_str(flat.get("task.name"))
    # cfg.task.family names the paper table; a config without it belongs to the table named like the task.
    family = _as_str(data.get("task_family")) or _as_str(flat.get("task.family")) or task
    model = _as_str(data.get("model")) or _as_str(flat.get("model.name"))
    experiment = _as_str(data.get("experiment")) if "experiment" in data else _experiment_from_overrides(overrides)
    return RunRecord(
        path=run_dir, display=display, status=status, task=task, task_family=family, model=model,
        experiment=experiment, overrides=overrides, config=flat, data=data,
    )


def collect_runs(paths: Iterable[str | os.PathLike]) -> list[RunRecord]:
    """Walk `paths` recursively and read every run directory found below them.

    A run directory is one holding `metrics.json`, or `.hydra/config.yaml` without it (a run that never
    got going: status `not started`). Hidden folders, `checkpoints` and `tb` are not searched. Runs are
    named relative to the path they were found under (prefixed by that path when several are given).
    """
    roots = [Path(p) for p in paths]
    records: list[RunRecord] = []
    seen: set[Path] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda exc: _warn(_one_line(exc))):
            # Prune in place so os.walk never descends into these.
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
            run_dir = Path(dirpath)
            if "metrics.json" not in filenames and not (run_dir / ".hydra" / "config.yaml").is_file():
                continue
            key = run_dir.resolve()
            if key in seen:  # overlapping paths (outputs and outputs/runs): report each run once
                continue
            seen.add(key)
            rel = run_dir.relative_to(root).as_posix()
            if len(roots) == 1 and rel != ".":
                display = rel
            else:
                display = root.as_posix() if rel == "." else f"{root.as_posix().rstrip('/')}/{rel}"
            records.append(_read_run(run_dir, display))
    return records


# --------------------------------------------------------------------------------------------------
# Tables (format-independent: lists of strings, rendered by the writers below)


@dataclass
class Table:
    slug: str                          # file name stem for its CSV / LaTeX file
    title: str
    headers: list[str]
    rows: list[list[str]]
    numeric: set[int] = field(default_factory=set)        # right-aligned columns
    rules_before: set[int] = field(default_factory=set)   # row indices preceded by a rule (LaTeX)
    notes: list[str] = field(default_factory=list)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100.0 * value:.2f}"


def _fmt_number(value: Any, spec: str) -> str:
    number = _as_float(value)
    if number is None:
        return ""
    if not math.isfinite(number):
        return str(number)
    return format(number, spec)


def _fmt_value(value: Any) -> str:
    """A config value as shown in a cell (and compared when deciding whether it varies)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def _is_noise(key: str) -> bool:
    return key in NOISE_KEYS or any(fnmatch.fnmatchcase(key, pattern) for pattern in NOISE_PATTERNS)


def varying_keys(records: list[RunRecord]) -> list[str]:
    """Dotted config keys that take at least two different values among `records`, noise excluded.

    A key absent from a run counts as unknown, not as a different value: older or partial files (a
    hand-written .hydra/config.yaml, a metrics.json from before a key existed) would otherwise turn every
    key they lack into a column.
    """
    values: dict[str, set[str]] = {}
    for rec in records:
        for key, value in rec.config.items():
            if not _is_noise(key):
                values.setdefault(key, set()).add(_fmt_value(value))
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def _best_val(rec: RunRecord) -> str:
    selection = rec.data.get("selection")
    if isinstance(selection, dict) and _as_float(selection.get("best_value")) is not None:
        metric = str(selection.get("metric") or "")
        if metric.endswith("accuracy"):
            return _pct(_as_float(selection["best_value"]))
        return f"{_fmt_number(selection['best_value'], '.4g')} ({metric})" if metric else _fmt_number(
            selection["best_value"], ".4g")
    return _pct(rec.val_accuracy)


def _note(rec: RunRecord) -> str:
    """Why a run has no result: its error, how far it got, or that its files are unusable."""
    if rec.status == "unreadable":
        return "metrics.json is not valid JSON"
    if rec.status == "not started":
        return "no metrics.json"
    error = _as_str(rec.data.get("error"))
    if error:
        error = " ".join(error.split())
        return error if len(error) <= 100 else error[:97] + "..."
    if rec.status in ("unfinished", "preempted", "unknown"):
        step, max_steps = rec.data.get("step"), rec.data.get("max_steps")
        if _as_float(step) is not None:
            return f"step {step}/{max_steps}" if _as_float(max_steps) is not None else f"step {step}"
    return ""


def _sort_key(rec: RunRecord) -> tuple[int, str]:
    return (_STATUS_RANK.get(rec.status, len(STATUS_ORDER)), rec.display)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "unknown"


def _bleu(value: float | None) -> str:
    """BLEU for display: 2 decimals, so a perfect score's float noise (100.00000000000004) reads 100.00."""
    return _fmt_number(value, ".2f")


def _test_column(runs: list[RunRecord]) -> tuple[str, Callable[[RunRecord], str]]:
    """Header and cell of a runs table's test column: BLEU for translation tasks, accuracy (%) otherwise."""
    if any(rec.metric("test/bleu") is not None for rec in runs):
        return "test BLEU", lambda rec: _bleu(rec.metric("test/bleu"))
    return "test acc (%)", lambda rec: _pct(rec.test_accuracy)


def runs_tables(records: list[RunRecord]) -> list[Table]:
    """One table per task: every run, the config values that vary between them, and its results."""
    by_task: dict[str, list[RunRecord]] = {}
    for rec in records:
        by_task.setdefault(rec.task or "(unknown)", []).append(rec)
    tables = []
    for task in sorted(by_task, key=lambda t: (t == "(unknown)", t)):
        runs = sorted(by_task[task], key=_sort_key)
        varied = varying_keys(runs)
        show_experiment = len({rec.experiment or "" for rec in runs}) > 1
        notes = [_note(rec) for rec in runs]
        headers = ["run", "status", "model"] + (["experiment"] if show_experiment else []) + varied
        first_numeric = len(headers)
        test_header, test_cell = _test_column(runs)
        headers += [test_header, "best val", "attn density", "head JS", "params", "tokens/s", "wall time (s)"]
        numeric = set(range(first_numeric, len(headers)))
        if any(notes):
            headers.append("note")
        rows = []
        for rec, note in zip(runs, notes):
            row = [rec.display, rec.status, rec.model or ""]
            if show_experiment:
                row.append(rec.experiment or "")
            row += [_fmt_value(rec.config[key]) if key in rec.config else _MISSING for key in varied]
            row += [
                test_cell(rec),
                _best_val(rec),
                _fmt_number(rec.attention_mean("mean_density"), ".3f"),
                _fmt_number(rec.attention_mean("js_mean"), ".3f"),
                _fmt_number(rec.data.get("num_parameters"), ".0f"),
                _fmt_number(rec.data.get("tokens_per_second"), ".0f"),
                _fmt_number(rec.data.get("wall_time_s"), ".1f"),
            ]
            if any(notes):
                row.append(note)
            rows.append(row)
        label = "unknown task (no readable config)" if task == "(unknown)" else f"task={task}"
        tables.append(Table(slug=f"runs_{_slug(task)}", title=f"Runs: {label}", headers=headers,
                            rows=rows, numeric=numeric))
    return tables


def _scale_label(rec: RunRecord) -> str:
    """`ours (CPU size, task=listops, model=softmax)`: enough for the reader to see which scale a row is."""
    if rec.experiment:
        scale = f"experiment={rec.experiment}"
    elif rec.task in refs.TASK_SCALES:
        scale = f"{refs.TASK_SCALES[rec.task]}, task={rec.task}"
    else:
        scale = f"task={rec.task}"
    return f"ours ({scale}, model={rec.model or '?'})"


def _selection_key(rec: RunRecord, val_metric: str = "val/accuracy",
                   test_metric: str = "test/accuracy") -> tuple[float, float, str]:
    # Pick our run by its validation score, not its test score, so the reported test number is not itself
    # chosen on the test set; the test score only breaks ties, then the run name keeps it deterministic.
    val, test = rec.best_value(val_metric), rec.metric(test_metric)
    return (-math.inf if val is None else val, -math.inf if test is None else test, rec.display)


def _pick(candidates: list[RunRecord], val_metric: str = "val/accuracy",
          test_metric: str = "test/accuracy") -> RunRecord:
    """The run shown when several match a cell: the best on validation (rule of `_selection_key`)."""
    return max(candidates, key=lambda rec: _selection_key(rec, val_metric, test_metric))


def paper_tables(records: list[RunRecord]) -> list[Table]:
    """One table per task family that maps onto a published column: published rows, ours beside them."""
    families = [
        family for family in refs.PAPER_COLUMNS
        if family in refs.FILL_COMMANDS or any(rec.task_family == family for rec in records)
    ]
    tables = []
    for family in families:
        table_key, column = refs.PAPER_COLUMNS[family]
        paper = refs.PAPER_TABLES[table_key]
        published = paper["table"]
        fill = refs.FILL_COMMANDS.get(family, {})
        completed = [rec for rec in records if rec.task_family == family and rec.status == "completed"]
        used: set[int] = set()
        rows, missing = [], []
        for row_name, values in published["rows"].items():
            value = values.get(column)
            published_cell = f"{value:.2f}" if isinstance(value, (int, float)) else str(value or "")
            models = [m for m, row in refs.OUR_MODEL_ROWS.items() if row == row_name]
            ours = run = overrides = ""
            if models:
                candidates = [rec for rec in completed
                              if fill and rec.experiment == fill.get("experiment") and rec.model in models]
                if candidates:
                    best = _pick(candidates)
                    used.add(id(best))
                    ours, run, overrides = _pct(best.test_accuracy), best.display, " ".join(best.overrides)
                else:
                    command = refs.fill_command(family, models[0])
                    ours = f"run: {command}" if command else "(no experiment config yet)"
                    if command:
                        missing.append(f"{row_name}, run `{command}`")
            rows.append([row_name, published_cell, ours, run, overrides])
        extra = sorted((rec for rec in completed if id(rec) not in used), key=lambda r: (r.display,))
        rules_before = {len(rows)} if extra else set()
        for rec in extra:
            rows.append([_scale_label(rec), "", _pct(rec.test_accuracy), rec.display, " ".join(rec.overrides)])

        notes = [f"Published: {published['citation']} (test accuracy %)."]
        if fill:
            notes.append(
                f"Ours: the completed `experiment={fill['experiment']}` run of the matching model with the best "
                "validation accuracy (its test accuracy is shown)."
            )
        if extra:
            notes.append("Rows below the published ones are our other completed runs, labelled with their scale; "
                         "they are not the paper's setting.")
        if missing:
            notes.append("Missing cells: " + "; ".join(missing) + ".")
        tables.append(Table(
            slug=f"{table_key}_{_slug(family)}",
            title=f"{paper['title']}: {column} (published vs ours, test accuracy %)",
            headers=["model", f"{column} published", f"{column} ours", "run", "overrides"],
            rows=rows, numeric={1, 2}, rules_before=rules_before, notes=notes,
        ))
    return tables


# --------------------------------------------------------------------------------------------------
# Correia et al. (2019) Table 1: translation BLEU, published next to ours, and the paper's analysis figures

TRANSLATION_FAMILY = "translation"

# A run of ours per (task, experiment) and model: see translation_picks.
Picks = dict[tuple[str | None, str | None], dict[str, RunRecord]]


def _model_rank(model: str) -> tuple[int, str]:
    """Table 1 row order: softmax, 1.5-entmax, α-entmax, sparsemax, then other models by name."""
    order = list(refs.TRANSLATION_MODEL_ROWS)
    return (order.index(model) if model in order else len(order), model)


def _row_label(model: str) -> str:
    return refs.TRANSLATION_MODEL_ROWS.get(model, model)


def translation_picks(records: list[RunRecord]) -> Picks:
    """Our run of each model for every task+experiment, from completed translation runs only (failed,
    unfinished and unreadable runs never stand for a model), chosen on validation BLEU."""
    groups: dict[tuple[str | None, str | None], dict[str, list[RunRecord]]] = {}
    for rec in records:
        if rec.task_family == TRANSLATION_FAMILY and rec.status == "completed" and rec.model:
            key = (refs.canonical_task(rec.task), rec.experiment)
            groups.setdefault(key, {}).setdefault(rec.model, []).append(rec)
    return {
        key: {model: _pick(models[model], "val/bleu", "test/bleu") for model in sorted(models, key=_model_rank)}
        for key, models in groups.items()
    }


def _column_runs(picks: Picks, column: str) -> dict[str, RunRecord]:
    spec = refs.TRANSLATION_COLUMNS[column]
    return picks.get((spec["tasks"][0], spec["experiment"]), {})


def _table1_models(picks: Picks) -> list[str]:
    """Table 1 rows as our model names: the paper's three, then any other model we ran for a column."""
    published = [m for m, row in refs.TRANSLATION_MODEL_ROWS.items() if row in refs.CORREIA2019_TABLE1["rows"]]
    ran = {model for column in refs.TRANSLATION_COLUMNS for model in _column_runs(picks, column)}
    return published + sorted(ran - set(published), key=_model_rank)


def _steps(value: Any) -> str:
    """200000 -> `200k`, 1400 -> `1400`."""
    number = _as_float(value)
    if number is None:
        return "?"
    number = int(number)
    return f"{number // 1000}k" if number >= 10_000 and number % 1000 == 0 else str(number)


def translation_scale(rec: RunRecord) -> str:
    """`CPU size: 3+3 layers d256 h4, 3000 tokens/batch, 1400 steps`, read from the run's config and how far
    it trained, so that nobody mistakes a small run for a reproduction. `paper size` means the paper's
    Transformer-Base dimensions (references.CORREIA2019_MODEL_SIZE)."""
    config = rec.config
    dims = {
        "model.num_layers": config.get("model.num_layers"),
        # a null decoder_layers means as deep as the encoder
        "model.decoder_layers": config.get("model.decoder_layers") or config.get("model.num_layers"),
        "model.d_model": config.get("model.d_model"),
        "model.num_heads": config.get("model.num_heads"),
    }
    size = "paper size" if dims == refs.CORREIA2019_MODEL_SIZE else "CPU size"
    steps = rec.data.get("step") if _as_float(rec.data.get("step")) is not None else config.get("trainer.max_steps")
    text = (f"{size}: {dims['model.num_layers']}+{dims['model.decoder_layers']} layers d{dims['model.d_model']} "
            f"h{dims['model.num_heads']}, {config.get('trainer.batch_tokens')} tokens/batch, {_steps(steps)} steps")
    return text + " (stopped early)" if rec.data.get("stopped_early") is True else text


def _speed_vs_softmax(rec: RunRecord, picks: Picks) -> str:
    """Training tokens/s in % of our softmax run of the same task and experiment (the paper's comparison)."""
    softmax = picks.get((refs.canonical_task(rec.task), rec.experiment), {}).get("softmax")
    ours = _as_float(rec.data.get("tokens_per_second"))
    base = _as_float(softmax.data.get("tokens_per_second")) if softmax else None
    return f"{100.0 * ours / base:.0f}" if ours is not None and base else ""


def _task_info_values(runs: Iterable[RunRecord], key: str) -> list[str]:
    """The distinct values of metrics.json task_info[key] among `runs`, in first-seen order."""
    values = []
    for rec in runs:
        info = rec.data.get("task_info")
        value = _as_str(info.get(key)) if isinstance(info, dict) else None
        if value and value not in values:
            values.append(value)
    return values


def correia2019_table1(picks: Picks) -> Table:
    """Correia et al. (2019) Table 1: per language pair the published BLEU and ours, rows = models; a cell
    we have no run for says which command fills it. The last row says at which scale our runs trained."""
    columns = list(refs.TRANSLATION_COLUMNS)
    published_rows = refs.CORREIA2019_TABLE1["rows"]
    headers, scale_row = ["model"], ["scale"]
    for column in columns:
        runs = _column_runs(picks, column).values()
        scales = "; ".join(dict.fromkeys(translation_scale(rec) for rec in runs))
        if refs.TRANSLATION_COLUMNS[column]["published"]:
            headers.append(f"{column} published")
            scale_row.append("")  # the paper's scale is in the caption
        headers.append(f"{column} ours" if refs.TRANSLATION_COLUMNS[column]["published"] else column)
        scale_row.append(scales)

    rows, missing = [], []
    for model in _table1_models(picks):
        label = _row_label(model)
        row = [label]
        for column in columns:
            if refs.TRANSLATION_COLUMNS[column]["published"]:
                row.append(_fmt_number(published_rows.get(label, {}).get(column), ".2f"))
            run = _column_runs(picks, column).get(model)
            if run is None:
                row.append(f"run: {refs.translation_fill_command(column, model)}")
                missing.append(column)
            else:
                row.append(_bleu(run.metric("test/bleu")))
        rows.append(row)
    return Table(
        slug="correia2019_table1",
        title="Correia et al. 2019 Table 1: translation (published vs ours, test BLEU, tokenized)",
        headers=headers, rows=rows + [scale_row], numeric=set(range(1, len(headers))),
        rules_before={len(rows)}, notes=_table1_notes(picks, missing),
    )


def _table1_notes(picks: Picks, missing: list[str]) -> list[str]:
    """The caption of Table 1: sources, how our cells are chosen and scored, and how to fill the gaps."""
    used = [rec for column in refs.TRANSLATION_COLUMNS for rec in _column_runs(picks, column).values()]
    tokenization = _task_info_values(used, "bleu_tokenization")
    signatures = _task_info_values(used, "sacrebleu_signature")
    notes = [
        f"Published: {refs.CORREIA2019_TABLE1['citation']}: test BLEU, tokenized (Moses-tokenised, "
        "multi-bleu.perl style); single runs. es→en Bible is our own CPU-size pair, not in the paper.",
        "Ours: per cell, the completed run of the column's experiment (`experiment=correia2019_<pair>`; "
        "es→en Bible: `experiment=mt_cpu`) and the row's model with the best validation BLEU; its test BLEU "
        "(metrics.json `test/bleu`) is shown, rounded to 2 decimals.",
        "Tokenized BLEU of ours: " + (" | ".join(tokenization) if tokenization else "no run yet") + ".",
        "sacreBLEU signature of ours (detokenized BLEU, in the runs table below): "
        + (" | ".join(signatures) if signatures else "no run yet") + ".",
        "Scale: `paper size` = the paper's Transformer-Base (6+6 layers, d_model 512, 8 heads, 8192-token "
        "batches; PAPERS.md A.3). A `CPU size` cell is a small model trained briefly: it checks the pipeline "
        "and is not a reproduction of the published number.",
    ]
    columns = list(dict.fromkeys(missing))
    if columns:
        notes.append("Missing cells; fill a whole column with: " + "; ".join(
            f"{column}: `{refs.translation_fill_command(column)}`" for column in columns) + ".")
    return notes


def correia2019_runs_table(picks: Picks, records: list[RunRecord]) -> Table | None:
    """Every completed translation run behind Table 1 with sacreBLEU, chrF, speed and scale; our other
    completed translation runs below a rule. None when there are no completed translation runs."""
    cells = [(column, rec) for column in refs.TRANSLATION_COLUMNS
             for rec in _column_runs(picks, column).values()]
    used = {id(rec) for _, rec in cells}
    extra = sorted((rec for rec in records if rec.task_family == TRANSLATION_FAMILY and rec.status == "completed"
                    and id(rec) not in used), key=lambda rec: rec.display)
    if not cells and not extra:
        return None
    rows = [_translation_run_row(column, rec, picks) for column, rec in cells]
    rows += [_translation_run_row(f"not in Table 1: task={rec.task}, experiment={rec.experiment}", rec, picks)
             for rec in extra]
    notes = [
        "BLEU (tok.) is Table 1's metric; sacreBLEU is detokenized BLEU (signature in Table 1's caption); "
        "chrF in sacreBLEU's default setting. Best val BLEU chose the run.",
        "Speed: training tokens/s in % of our softmax run of the same task and experiment; published: "
        "α-entmax 75 %, 1.5-entmax 90 % of softmax (Correia et al. 2019; PAPERS.md A.3).",
    ]
    if extra:
        notes.append("Rows below the rule are our other completed translation runs (another experiment, or "
                     "not the best on validation); they are not in Table 1.")
    return Table(
        slug="correia2019_table1_runs",
        title="Correia et al. 2019 Table 1: our runs (BLEU, sacreBLEU, chrF, speed, scale)",
        headers=["column", "model", "BLEU (tok.)", "sacreBLEU", "chrF", "best val BLEU", "tokens/s",
                 "speed vs softmax (%)", "published speed (%)", "scale", "run"],
        rows=rows, numeric=set(range(2, 9)), rules_before={len(cells)} if extra and cells else set(), notes=notes,
    )


def _translation_run_row(column: str, rec: RunRecord, picks: Picks) -> list[str]:
    label = _row_label(rec.model or "?")
    published_speed = refs.CORREIA2019_SPEED.get(label)
    return [
        column, label,
        _bleu(rec.metric("test/bleu")), _bleu(rec.metric("test/sacrebleu")), _bleu(rec.metric("test/chrf")),
        _bleu(rec.best_value("val/bleu")),
        _fmt_number(rec.data.get("tokens_per_second"), ".0f"),
        _speed_vs_softmax(rec, picks),
        "" if published_speed is None else f"{100.0 * published_speed:.0f}",
        translation_scale(rec), rec.display,
    ]


def correia2019_tables(picks: Picks, records: list[RunRecord]) -> list[Table]:
    """Table 1 (always: its empty cells say what to run) and, once there are runs, the table behind it."""
    runs = correia2019_runs_table(picks, records)
    return [correia2019_table1(picks)] + ([runs] if runs else [])


def _analysis_block(rec: RunRecord, key: str) -> dict | None:
    """metrics.json analysis[key] ("attention" or "alpha") when it holds data, else None."""
    analysis = rec.data.get("analysis")
    block = analysis.get(key) if isinstance(analysis, dict) else None
    return block if isinstance(block, dict) and block else None


def _learns_alpha(rec: RunRecord) -> bool:
    """α-entmax with a learned α per head (model.alpha null), the runs whose α the paper plots."""
    return rec.config.get("model.normaliser") == "alpha_entmax" and rec.config.get("model.alpha") is None


def _is_sparse(rec: RunRecord) -> bool:
    return rec.config.get("model.normaliser", rec.model) != "softmax"


# One model, one colour in every figure of a report, whichever models a figure shows (matplotlib's
# default cycle, in Table 1 row order); other models take the colours after these.
MODEL_COLOURS = {"softmax": "C0", "1.5-entmax": "C1", "α-entmax": "C2", "sparsemax": "C3"}


@dataclass(frozen=True)
class DrawnFigure:
    caption: str
    path: Path


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


def analysis_figures(picks: Picks, out_dir: Path) -> tuple[list[str], list[Path]]:
    """Draw the paper's analysis figures for every task+experiment whose runs have an analysis block, into
    `out_dir/figures`; returns the markdown sections that show them and the files written.

    The models compared are the runs Table 1 shows (translation_picks). A run without analysis is left out
    of the figures; a group whose analysis cannot be drawn is skipped with a warning.
    """
    sections: list[str] = []
    written: list[Path] = []
    for (task, experiment), runs in sorted(picks.items(), key=lambda item: tuple(map(str, item[0]))):
        analysed = {_row_label(model): rec for model, rec in runs.items() if _analysis_block(rec, "attention")}
        if not analysed:
            continue
        attention = {label: _analysis_block(rec, "attention") for label, rec in analysed.items()}
        try:
            drawn = draw_comparison(
                attention=attention,
                sparse_attention={label: attention[label] for label, rec in analysed.items() if _is_sparse(rec)},
                learned_alphas={label: _analysis_block(rec, "alpha") for label, rec in analysed.items()
                                if _learns_alpha(rec) and _analysis_block(rec, "alpha")},
                folder=out_dir / "figures", stem=_slug(f"{task}_{experiment}"),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            _warn(f"figures for task={task}, experiment={experiment} skipped: malformed analysis ({_one_line(exc)})")
            continue
        written += [figure.path for figure in drawn]
        sections.append(_figures_markdown(task, experiment, runs, analysed, drawn, out_dir))
    return sections, written


def _figures_markdown(task: str | None, experiment: str | None, runs: dict[str, RunRecord],
                      analysed: dict[str, RunRecord], drawn: list[DrawnFigure], out_dir: Path) -> str:
    """The markdown section of one task+experiment: which runs the figures compare, then the figures."""
    lines = [f"## Figures: Correia et al. 2019 analysis, task={task}, experiment={experiment}", "",
             "Runs: " + ", ".join(f"{label} `{rec.display}`" for label, rec in analysed.items()) + "."]
    skipped = [_row_label(model) for model, rec in runs.items() if _row_label(model) not in analysed]
    if skipped:
        lines[-1] += " Without analysis, so not drawn: " + ", ".join(skipped) + "."
    for figure in drawn:
        lines += ["", f"![{figure.caption}]({figure.path.relative_to(out_dir).as_posix()})"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Writers


def _md_cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_markdown_table(table: Table) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in table.headers) + " |",
             "|" + "|".join("---:" if i in table.numeric else "---" for i in range(len(table.headers))) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def render_markdown(tables: list[Table], summary: str, sections: Iterable[str] = ()) -> str:
    """The report: the summary line, every table with its notes, then `sections` (markdown, e.g. figures)."""
    parts = ["# sparse-report", "", summary]
    for table in tables:
        parts += ["", f"## {table.title}", "", render_markdown_table(table)]
        if table.notes:
            parts += [""] + [f"- {note}" for note in table.notes]
    for section in sections:
        parts += ["", section]
    return "\n".join(parts) + "\n"


def render_csv(table: Table) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")  # the csv module quotes commas, quotes and newlines
    writer.writerow(table.headers)
    writer.writerows(table.rows)
    return buffer.getvalue()


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    # Table 1's model and language-pair names, which pdflatex cannot take as UTF-8
    "α": r"$\alpha$", "→": r"$\rightarrow$",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(char, char) for char in " ".join(text.split()))


def render_latex(table: Table) -> str:
    spec = "".join("r" if i in table.numeric else "l" for i in range(len(table.headers)))
    lines = [f"% {latex_escape(table.title)}", "% generated by sparse-report; needs \\usepackage{booktabs}"]
    lines += [f"% {latex_escape(note)}" for note in table.notes]
    lines += [f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
              " & ".join(latex_escape(h) for h in table.headers) + " \\\\", "\\midrule"]
    for index, row in enumerate(table.rows):
        if index in table.rules_before:
            lines.append("\\midrule")
        lines.append(" & ".join(latex_escape(cell) for cell in row) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_report(tables: list[Table], markdown: str, out_dir: Path, formats: list[str]) -> list[Path]:
    """Write the report files atomically; returns the paths written."""
    written = []

    def put(path: Path, text: str) -> None:
        atomic_write_text(path, text)
        written.append(path)

    if "md" in formats:
        put(out_dir / "report.md", markdown)
    for table in tables:
        if "csv" in formats:
            put(out_dir / f"{table.slug}.csv", render_csv(table))
        if "tex" in formats:
            put(out_dir / f"{table.slug}.tex", render_latex(table))
    return written


# --------------------------------------------------------------------------------------------------
# Command line


def _summary(records: list[RunRecord], roots: list[str]) -> str:
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.status] = counts.get(rec.status, 0) + 1
    by_status = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: _STATUS_RANK.get(s, 99)))
    return f"{len(records)} run(s) under {', '.join(roots)}: {by_status}."


def _parse_formats(text: str) -> list[str]:
    formats = [item.strip().lower() for item in text.split(",") if item.strip()]
    for item in formats:
        if item not in FORMATS:
            raise ValueError(f"unknown format '{item}'; valid: {', '.join(FORMATS)}")
    if not formats:
        raise ValueError(f"no format given; valid: {', '.join(FORMATS)}")
    return formats


def main(argv: list[str] | None = None) -> int:
    """`sparse-report [PATH ...] [--out DIR] [--formats md,csv,tex]`; see the module docstring for exit codes."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Collect run directories (metrics.json) and write the paper tables next to the "
                    "published numbers as markdown, CSV and LaTeX, and the paper's analysis figures (PNG).",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="folders to search for runs, recursively (default: outputs)")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default: <first PATH>/report)")
    parser.add_argument("--formats", default="md,csv,tex",
                        help="comma-separated subset of md,csv,tex (default: all three); the analysis "
                             "figures are written as PNG whatever this says")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and its one-line error (or --help)
        return int(exc.code or 0)

    try:
        formats = _parse_formats(args.formats)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    paths = args.paths or ["outputs"]
    for path in paths:
        if not Path(path).exists():
            if not args.paths:  # the default folder is absent: nothing has been run here yet
                print(f"{PROG}: no runs found (no '{path}' folder here); create one with: sparse-run",
                      file=sys.stderr)
                return 1
            print(f"{PROG}: no such directory: {path}", file=sys.stderr)
            return 2
        if not Path(path).is_dir():
            print(f"{PROG}: not a directory: {path}", file=sys.stderr)
            return 2

    records = collect_runs(paths)
    if not records:
        print(f"{PROG}: no runs found under {', '.join(paths)}; create one with: sparse-run", file=sys.stderr)
        return 1

    picks = translation_picks(records)
    tables = paper_tables(records) + correia2019_tables(picks, records) + runs_tables(records)
    out_dir = Path(args.out) if args.out else Path(paths[0]) / "report"
    try:
        sections, written = analysis_figures(picks, out_dir)
        markdown = render_markdown(tables, _summary(records, paths), sections)
        written += write_report(tables, markdown, out_dir, formats)
    except OSError as exc:
        print(f"{PROG}: cannot write the report to {out_dir}: {_one_line(exc)}", file=sys.stderr)
        return 2
    if "md" in formats:
        sys.stdout.write(markdown)
    print(f"{PROG}: wrote {len(written)} file(s) to {out_dir}", file=sys.stderr)
    return 0
