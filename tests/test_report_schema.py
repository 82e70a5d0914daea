"""metrics.json schema 2 (sparse_runner.run_metrics): the writer's keys, the reader, the primary metric of
schema-2 files and the one fallback for schema-1 files, as sparse-report's tables show them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sparse_runner import run_metrics
from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.runs import NOISE_KEYS
from sparse_runner.run_metrics import SCHEMA, SCHEMA_VERSION, MetricsFile, flatten, primary_metric, validation_metric
from test_report import write_run as write_listops_run
from test_report_translation import CPU_SIZE, write_run as write_translation_run


def update_metrics(run_dir: Path, **fields) -> Path:
    path = run_dir / "metrics.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return run_dir


def runs_section(markdown: str, task: str) -> str:
    return markdown.split(f"\n## Runs: task={task}")[1].split("\n## ")[0]


def test_writer_starts_a_schema_2_file_with_documented_keys(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(run_metrics, "versions", lambda: {})   # the real one imports torch
    cfg = OmegaConf.create({"task": {"name": "listops", "family": "listops"}, "model": {"name": "softmax"}, "seed": 0})
    metrics = MetricsFile(tmp_path, cfg, {"experiment": None, "overrides": []})
    metrics.write(primary_metric="test/accuracy")
    data = run_metrics.read(tmp_path / "metrics.json")
    assert data["schema"] == SCHEMA_VERSION == 2
    assert set(data) <= set(SCHEMA)
    assert primary_metric(data) == "test/accuracy"


def test_reader_rejects_what_is_not_an_object(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        run_metrics.read(tmp_path / "metrics.json")


@pytest.mark.parametrize("data, family, expected", [
    ({"schema": 2, "task_family": "listops", "primary_metric": "test/f1"}, None, "test/f1"),  # named: wins
    ({"schema": 1, "task_family": "listops"}, None, "test/accuracy"),
    ({"schema": 1, "task_family": "translation"}, None, "test/bleu"),
    ({"schema": 1, "task_family": "qa", "selection": {"metric": "val/f1"}}, None, "test/f1"),
    ({"schema": 1, "task_family": "qa", "selection": {"metric": "train/loss"}}, None, None),
    ({"schema": 1}, None, None),
    ({}, "listops", "test/accuracy"),                           # no metrics.json: family from .hydra/
    ({"schema": 2, "task_family": "translation", "primary_metric": None}, None, "test/bleu"),  # failed early
])
def test_primary_metric_and_the_schema_1_fallback(data, family, expected) -> None:
    assert primary_metric(data, family) == expected


def test_validation_metric() -> None:
    assert validation_metric("test/bleu") == "val/bleu"
    assert validation_metric("loss") == "loss"


def test_flatten_keeps_empty_mappings_only_when_asked() -> None:
    config = {"model": {"pattern_options": {}, "num_heads": 2}}
    assert flatten(config) == {"model.num_heads": 2}
    assert flatten(config, keep_empty=True) == {"model.pattern_options": {}, "model.num_heads": 2}


def test_noise_keys_include_the_non_result_keys() -> None:
    assert set(run_metrics.NON_RESULT_KEYS) <= NOISE_KEYS


def test_schema_2_primary_metric_is_read_from_metrics_json(tmp_path: Path, capsys) -> None:
    """A translation task declaring chrF as its primary metric: its runs table shows chrF, not BLEU, and
    its runs do not stand in Correia et al.'s Table 1, whose published numbers are BLEU."""
    root = tmp_path / "outputs"
    update_metrics(write_translation_run(root, "chrf", model="softmax", size=CPU_SIZE, analysis=False),
                   schema=2, primary_metric="test/chrf")
    [record] = collect_runs([root])
    assert (record.primary_metric, record.primary_value) == ("test/chrf", 47.5)
    assert main([str(root), "--formats", "md"]) == 0
    markdown = capsys.readouterr().out
    runs = runs_section(markdown, "bible_es_en")
    assert "| test chrF |" in runs.splitlines()[2] and "test BLEU" not in runs
    assert "| chrf | completed | softmax · dense · h4 | 47.50 |" in runs
    assert "run: sparse-run experiment=mt_cpu model=softmax" in markdown          # Table 1's cell stays empty
    assert "## Correia et al. 2019 Table 1: our runs" not in markdown


def test_schema_1_fallback_in_the_runs_table(tmp_path: Path, capsys) -> None:
    """A schema-1 run of a family without a listed metric falls back on its selection metric."""
    root = tmp_path / "outputs"
    write_listops_run(root / "qa", task="qa", task_family="qa", metrics={"test/f1": 0.8125, "val/f1": 0.75},
                      selection={"metric": "val/f1", "mode": "max", "best_value": 0.75, "best_step": 40})
    assert main([str(root), "--formats", "md"]) == 0
    runs = runs_section(capsys.readouterr().out, "qa")
    assert "| test/f1 | best val |" in runs and "| 0.8125 | 0.75 (val/f1) |" in runs


def test_runs_table_follows_the_primary_metric_most_runs_declare(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    for name in ("a", "b"):
        write_listops_run(root / name, schema=2, primary_metric="test/accuracy")
    update_metrics(write_listops_run(root / "c", test_acc=0.5), schema=2, primary_metric="test/loss")
    assert main([str(root), "--formats", "md"]) == 0
    runs = runs_section(capsys.readouterr().out, "listops")
    assert "| test acc (%) |" in runs and "| c | completed | softmax · dense · h4 | 50.00 |" in runs
