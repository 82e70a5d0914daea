"""The ERNIE-Sparse downstream table of sparse-report on fake run directories (their configs the presets' own):
published averages, our rows per model and setting, cells as mean ± std over seeds, averages only when a group
is complete, substitutes marked † in their own columns, fill commands, other runs, and the floors note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.papers.ernie_sparse import downstream
from sparse_runner.reporting.render import Table
from test_report import preset_config

ERNIE, BIGBIRD, DENSE = "ERNIE-Sparse: HST + SAR (ernie_sparse)", "BigBird (bigbird)", "dense Transformer (softmax)"
CPU, PAPER = "ours: CPU presets", "ours: paper presets"
SOTU_DATA = {"name": "sotu_era", "source": "substitute", "substitute_for": "long-document classification"}


def write_run(root: Path, name: str, experiment: str, model: str, *, seed: int = 0, metrics: dict, status: str = "completed",
              data: dict | None = None, updates: dict | None = None, baselines: dict | None = None) -> Path:
    """A metrics.json as the trainer writes it for `sparse-run experiment=<experiment> model=<model>` (+ dotted `updates`)."""
    config = preset_config(f"experiment={experiment}", f"model={model}", **{**(updates or {}), "seed": seed})
    if config["pretrain"]["task"] is not None and "model.init_from" not in (updates or {}):
        config["model"]["init_from"] = str(root / "pretrain" / "stage")  # as run.py records the stage it started from
    primary = "test/f1" if "test/f1" in metrics else "test/accuracy"
    validation = primary.replace("test/", "val/")
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({
        "schema": 1, "status": status, "error": None, "run_dir": str(run_dir), "task": config["task"]["name"],
        "task_family": config["task"]["family"], "model": model, "experiment": experiment, "overrides": [],
        "config": config, "seed": seed, "primary_metric": primary,
        "metrics": {**metrics, validation: metrics[primary]},
        "selection": {"metric": validation, "mode": "max", "best_value": metrics[primary], "best_step": 10},
        "step": 150, "max_steps": 150,
        "task_info": {"data": data or {"name": config["task"]["name"], "source": "hub"}, **({"baselines": baselines} if baselines else {})},
    }))
    return run_dir


def table(root: Path) -> Table:
    found = downstream.tables(collect_runs([root]))
    assert len(found) == 1
    return found[0]


def row(t: Table, label: str, source: str) -> dict[str, str]:
    matches = [r for r in t.rows if r[0] == label and r[1] == source]
    assert len(matches) == 1, [r[:2] for r in t.rows]
    return dict(zip(t.headers, matches[0]))


def test_shown_only_with_a_run_of_its_tasks(tmp_path):
    assert downstream.tables([]) == []
    write_run(tmp_path, "failed", "liu2022_sotu_era_cpu", "ernie_sparse", metrics={"test/accuracy": 0.5}, status="failed", data=SOTU_DATA)
    t = table(tmp_path)
    published = row(t, "ERNIE-Sparse", "published: " + downstream.CITATION)
    assert (published["Cls Avg"], published["QA Avg"], published["IMDB"]) == ("92.46", "74.67", "n/p")
    baseline = row(t, "baseline (unnamed in the abstract)", "published: " + downstream.CITATION)
    assert (baseline["Cls Avg"], baseline["QA Avg"]) == ("91.63", "71.43")
    # A failed run fills nothing: the cell says how to fill it.
    assert row(t, ERNIE, CPU)["SOTU era †"] == "run: sparse-run experiment=liu2022_sotu_era_cpu model=ernie_sparse"
    assert row(t, BIGBIRD, PAPER)["IMDB"] == "run: sparse-run experiment=liu2022_imdb model=bigbird"
    assert "OUR CHOICE of tasks" in "\n".join(t.notes)


def test_cells_average_over_seeds_and_mark_substitutes(tmp_path):
    for seed, acc in enumerate((0.50, 0.60, 0.70)):
        write_run(tmp_path, f"era{seed}", "liu2022_sotu_era_cpu", "ernie_sparse", seed=seed, metrics={"test/accuracy": acc},
                  data=SOTU_DATA, baselines={"majority": 0.3051, "bag_of_words_nearest_centroid": 0.9153})
    write_run(tmp_path, "era_dense", "liu2022_sotu_era_cpu", "softmax", metrics={"test/accuracy": 0.4}, data=SOTU_DATA)
    t = table(tmp_path)
    assert row(t, ERNIE, CPU)["SOTU era †"] == "60.00 ± 10.00 (n=3) †"
    assert row(t, DENSE, CPU)["SOTU era †"] == "40.00 †"
    assert row(t, ERNIE, CPU)["Cls Avg"] == ""  # a substitute never enters an average
    assert "SOTU era †: majority 30.51, bag_of_words_nearest_centroid 91.53" in "\n".join(t.notes)


def test_classification_average_needs_all_three_tasks(tmp_path):
    write_run(tmp_path, "imdb", "liu2022_imdb", "bigbird", metrics={"test/accuracy": 0.90})
    write_run(tmp_path, "hp", "liu2022_hyperpartisan", "bigbird", metrics={"test/accuracy": 0.80})
    t = table(tmp_path)
    assert (row(t, BIGBIRD, PAPER)["IMDB"], row(t, BIGBIRD, PAPER)["Cls Avg"]) == ("90.00", "")
    assert row(t, BIGBIRD, PAPER)["arXiv"] == "run: sparse-run experiment=liu2022_arxiv model=bigbird"
    write_run(tmp_path, "arxiv", "liu2022_arxiv", "bigbird", metrics={"test/accuracy": 0.85})
    assert row(table(tmp_path), BIGBIRD, PAPER)["Cls Avg"] == "85.00"


@pytest.mark.skipif(not downstream.has_experiment("liu2022_triviaqa") or not downstream.has_experiment("liu2022_hotpotqa"),
                    reason="the QA presets are not in conf/experiment")
def test_qa_columns_read_f1_in_percent(tmp_path):
    write_run(tmp_path, "tqa", "liu2022_triviaqa", "ernie_sparse", metrics={"test/f1": 70.0, "test/exact_match": 60.0})
    write_run(tmp_path, "hqa", "liu2022_hotpotqa", "ernie_sparse", metrics={"test/f1": 60.0, "test/exact_match": 50.0})
    r = row(table(tmp_path), ERNIE, PAPER)
    assert (r["TriviaQA"], r["HotpotQA"], r["QA Avg"]) == ("70.00", "60.00", "65.00")


def test_a_run_from_another_pre_trained_encoder_is_an_other_run(tmp_path):
    write_run(tmp_path, "mine", "liu2022_sotu_era_cpu", "ernie_sparse", metrics={"test/accuracy": 0.6}, data=SOTU_DATA,
              updates={"pretrain.task": None, "model.init_from": "/my/encoder"})
    t = table(tmp_path)
    others = [r for r in t.rows if r[1].startswith("ours: other runs")]
    assert len(others) == 1 and "model.init_from=/my/encoder" in others[0][1]


def test_a_run_that_is_no_preset_is_an_other_run(tmp_path):
    write_run(tmp_path, "lr", "liu2022_sotu_era_cpu", "bigbird", metrics={"test/accuracy": 0.55}, data=SOTU_DATA,
              updates={"trainer.lr": 0.01})
    t = table(tmp_path)
    others = [r for r in t.rows if r[1].startswith("ours: other runs")]
    assert len(others) == 1 and "model=bigbird" in others[0][1] and "trainer.lr=0.01" in others[0][1]
    assert dict(zip(t.headers, others[0]))["SOTU era †"] == "55.00 †"
    assert row(t, BIGBIRD, CPU)["SOTU era †"].startswith("run: ")  # the preset's own cell stays empty


def test_in_the_written_report(tmp_path):
    runs, out = tmp_path / "outputs", tmp_path / "report"
    write_run(runs, "era", "liu2022_sotu_era_cpu", "ernie_sparse", metrics={"test/accuracy": 0.5}, data=SOTU_DATA)
    assert main([str(runs), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "ERNIE-Sparse downstream" in text and "50.00 †" in text
    assert (out / "ernie_sparse_downstream.csv").is_file()
