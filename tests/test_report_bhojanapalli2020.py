"""sparse-report's Bhojanapalli et al. 2020 part: the low-rank study's table and figure, drawn from a lowrank
run's metrics.json as tasks/lowrank.py writes it (no torch, no training)."""

from __future__ import annotations

import json
from pathlib import Path

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.papers import bhojanapalli2020

N, D = 4, 8


def write_lowrank_run(run_dir: Path, *, status: str = "completed") -> Path:
    """A shrunk study: n = 4, d = 8, d_p = 1 .. 8, h = 1, 2, 4 (standard sizes 8, 4, 2)."""
    metrics = {"test/loss": 0.9, "val/loss": 0.9}
    for k in range(1, 2 * N + 1):
        metrics[f"test/kl/dp_{k}"] = 0.2 / 10 ** (k - 1) if k < N - 1 else 1e-14
        metrics[f"val/kl/dp_{k}"] = metrics[f"test/kl/dp_{k}"]
    for h in (1, 2, 4):
        metrics[f"test/kl/standard_h{h}"] = 0.05 if D // h < N - 1 else 1e-14
        metrics[f"test/kl/fixed_h{h}"] = 0.0  # a perfect fit: clamped KL, drawn at the floor
    data = {
        "schema": 2, "status": status, "task": "lowrank", "task_family": "lowrank", "model": "softmax",
        "experiment": "bhojanapalli2020_lowrank", "overrides": [], "primary_metric": "test/loss",
        "config": {"task": {"name": "lowrank", "family": "lowrank", "seq_len": N, "d_model": D}, "model": {"name": "softmax"}},
        "metrics": metrics if status == "completed" else {},
        "selection": {"metric": "val/loss", "mode": "min", "best_value": 0.9, "best_step": 300},
    }
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps(data))
    return run_dir


def test_tables_show_kl_against_head_size_and_the_multihead_comparison(tmp_path: Path) -> None:
    write_lowrank_run(tmp_path / "runs" / "study")
    write_lowrank_run(tmp_path / "runs" / "crashed", status="failed")
    sweep, multihead = bhojanapalli2020.tables(collect_runs([tmp_path / "runs"]))[:2]  # then Tables 1-2 (always shown)
    assert sweep.slug == "bhojanapalli2020_lowrank_sweep" and multihead.slug == "bhojanapalli2020_lowrank_multihead"
    assert sweep.headers == ["d_p", f"study (n={N}, d={D})"]  # the failed run has no column
    assert [row[0] for row in sweep.rows] == ["1", "2", "3", f"{N} (= n)", "5", "6", "7", "8"]
    assert sweep.rows[0][1] == "2.00e-01" and sweep.rows[N - 1][1] == "1.00e-14"
    assert multihead.rows == [
        ["study", "1", "8", "1.00e-14", "4", "0.00e+00"],
        ["study", "2", "4", "1.00e-14", "4", "0.00e+00"],
        ["study", "4", "2", "5.00e-02", "4", "0.00e+00"],
    ]


def test_sections_draw_the_figure_and_link_it(tmp_path: Path) -> None:
    records = collect_runs([write_lowrank_run(tmp_path / "study")])
    out_dir = tmp_path / "report"
    sections, written = bhojanapalli2020.sections(records, out_dir)
    assert written == [out_dir / bhojanapalli2020.FIGURE]
    assert written[0].read_bytes().startswith(b"\x89PNG")
    assert len(sections) == 1 and f"]({bhojanapalli2020.FIGURE})" in sections[0]


def test_no_lowrank_run_no_table_and_no_figure(tmp_path: Path) -> None:
    records = collect_runs([write_lowrank_run(tmp_path / "study", status="failed")])
    assert not [t for t in bhojanapalli2020.tables(records) if "lowrank" in t.slug]
    assert bhojanapalli2020.sections(records, tmp_path / "report") == ([], [])
    assert not (tmp_path / "report").exists()


def test_sparse_report_writes_the_table_and_the_figure(tmp_path: Path, capsys) -> None:
    write_lowrank_run(tmp_path / "outputs" / "study")
    assert main([str(tmp_path / "outputs"), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Theorem 1: best KL(P || A) of one head against its size d_p" in report
    assert f"| {N} (= n) | 1.00e-14 |" in report
    assert f"]({bhojanapalli2020.FIGURE})" in report and (tmp_path / "report" / bhojanapalli2020.FIGURE).is_file()
    assert (tmp_path / "report" / "bhojanapalli2020_lowrank_sweep.csv").read_text().startswith("d_p,")
