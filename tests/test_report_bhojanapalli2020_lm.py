"""sparse-report's LM head sweep (Bhojanapalli et al. 2020, Fig. 1/3): perplexity against heads, one line per
head geometry, from LM runs' metrics.json as the runner writes them, their configs the sweep's jobs (no torch,
no training); runs that are no job form a sweep of their own."""

from __future__ import annotations

import json
from pathlib import Path

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.papers import bhojanapalli2020
from sparse_runner.reporting.papers.bhojanapalli2020 import lm as bhojanapalli2020_lm
from test_report import preset_config


def write_lm_run(run_dir: Path, *, heads: int, head_size: int | None, ppl: float, status: str = "completed",
                 experiment: str = "bhojanapalli2020_lm_cpu", more: tuple = ()) -> Path:
    """An LM run's metrics.json, its config what `experiment=<experiment> model=standard_heads|fixed_head
    model.num_heads=<heads> [model.head_size=<head_size>]` composes."""
    model = "fixed_head" if head_size else "standard_heads"
    overrides = [f"experiment={experiment}", f"model={model}", f"model.num_heads={heads}",
                 *([f"model.head_size={head_size}"] if head_size else []), *more]
    config = preset_config(*overrides)
    data = {
        "schema": 2, "status": status, "task": config["task"]["name"], "task_family": "lm", "experiment": experiment,
        "model": model, "overrides": overrides, "primary_metric": "test/ppl",
        "num_parameters": 1_000_000 + heads * (head_size or 256 // heads) * 4 * 256 * 2,
        "config": config,
        "metrics": {"test/ppl": ppl, "val/ppl": ppl + 1} if status == "completed" else {},
        "selection": {"metric": "val/ppl", "mode": "min", "best_value": ppl + 1, "best_step": 10},
    }
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps(data))
    return run_dir


def sweep_dir(root: Path) -> Path:
    for h, ppl in ((2, 90.0), (8, 85.0), (32, 99.0)):
        write_lm_run(root / f"standard_h{h}", heads=h, head_size=None, ppl=ppl)
        write_lm_run(root / f"fixed_h{h}", heads=h, head_size=32, ppl=ppl - h / 4)
    write_lm_run(root / "crashed", heads=4, head_size=32, ppl=1.0, status="failed")
    write_lm_run(root / "lone", heads=4, head_size=None, ppl=70.0, experiment="lm_cpu")  # one point: no sweep
    return root


def test_table_has_a_column_pair_per_geometry_and_a_row_per_heads(tmp_path):
    tables = [t for t in bhojanapalli2020.tables(collect_runs([sweep_dir(tmp_path / "runs")])) if "_lm_" in t.slug]
    assert len(tables) == 1
    table = tables[0]
    assert table.headers == ["heads", "d=256, d/h test ppl", "d=256, d/h params (M)", "d=256, d_p=32 test ppl", "d=256, d_p=32 params (M)"]
    assert [row[0] for row in table.rows] == ["2", "8", "32"]  # the failed 4-head run is left out
    assert table.rows[0][1] == "90.00" and table.rows[0][3] == "89.50" and table.rows[2][1] == "99.00"
    assert table.rows[0][2] == "1.52"  # parameters from metrics.json, in millions


def test_figure_is_drawn_and_linked(tmp_path):
    records = collect_runs([sweep_dir(tmp_path / "runs")])
    sections, written = bhojanapalli2020_lm.lm_sections(records, tmp_path / "report")
    assert len(written) == 1 and written[0].read_bytes().startswith(b"\x89PNG")
    assert len(sections) == 1 and "figures/bhojanapalli2020_lm_sotu_en_bhojanapalli2020_lm_cpu.png" in sections[0]


def test_report_command_shows_the_sweep(tmp_path, capsys):
    assert main([str(sweep_dir(tmp_path / "runs")), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "LM head sweep: test perplexity against heads" in text and "d=256, d_p=32 test ppl" in text


def test_runs_that_are_no_job_sweep_apart(tmp_path):
    root = tmp_path / "runs"
    for h, ppl in ((2, 90.0), (8, 85.0)):
        write_lm_run(root / f"standard_h{h}", heads=h, head_size=None, ppl=ppl)
        write_lm_run(root / f"lr_h{h}", heads=h, head_size=None, ppl=ppl + 10, more=("trainer.lr=0.01",))
    tables = [t for t in bhojanapalli2020.tables(collect_runs([root])) if "_lm_" in t.slug]
    assert [t.title.split("(")[-1] for t in tables] == [
        "task=sotu_en, experiment=bhojanapalli2020_lm_cpu)",
        "task=sotu_en, experiment=bhojanapalli2020_lm_cpu + trainer.lr=0.01)"]
    assert [row[1] for row in tables[0].rows] == ["90.00", "85.00"]
    assert [row[1] for row in tables[1].rows] == ["100.00", "95.00"]
    assert "differs from the nearest job in trainer.lr=0.01" in " ".join(tables[1].notes)


def test_the_head_study_is_a_sweep_of_its_own(tmp_path):
    """experiment=bhojanapalli2020_lm_study_cpu's jobs (d_model 64) are that study's sweep, not "other runs"."""
    root = tmp_path / "runs"
    for h, ppl in ((2, 120.0), (32, 150.0)):
        write_lm_run(root / f"standard_h{h}", heads=h, head_size=None, ppl=ppl, experiment="bhojanapalli2020_lm_study_cpu")
        write_lm_run(root / f"fixed_h{h}", heads=h, head_size=32, ppl=ppl - 10, experiment="bhojanapalli2020_lm_study_cpu")
    tables = [t for t in bhojanapalli2020.tables(collect_runs([root])) if "_lm_" in t.slug]
    assert [t.title.split("(")[-1] for t in tables] == ["task=sotu_en, experiment=bhojanapalli2020_lm_study_cpu)"]
    assert tables[0].headers[1] == "d=64, d/h test ppl" and [row[0] for row in tables[0].rows] == ["2", "32"]
