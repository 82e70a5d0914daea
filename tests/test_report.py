"""sparse-report on fake run directories: statuses, varying columns, paper table, writers, bad input.

Their configs are the real presets' (`preset_config`: conf/ composed as sparse-run composes it), so that the
paper tables file them by what they computed, as they file real runs."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.papers.lra import LRA_TABLE1
from sparse_runner.reporting.presets import compose


def set_dotted(config: dict, updates: dict) -> dict:
    """`{"model.num_heads": 8}` into a nested config, in place."""
    for dotted, value in updates.items():
        node = config
        *parents, leaf = dotted.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return config


def preset_config(*overrides: str, **updates) -> dict:
    """The resolved config a command composes (`preset_config("experiment=lra_listops", "model=bigbird")`), with
    dotted `updates` (`**{"trainer.lr": 0.01}`): what a run of it writes into metrics.json."""
    composed = compose(tuple(overrides))
    assert composed is not None, overrides
    return set_dotted(copy.deepcopy(composed), updates)


def write_run(run_dir: Path, *, status="completed", config_updates=None, experiment=None, task=None,
              model=None, test_acc=0.4123, val_acc=0.40, overrides=(), preset=(), **extra) -> Path:
    """A metrics.json as the trainer writes it (schema 1), plus Hydra's .hydra/ files. Its config is the one
    `preset` composes (the embedded default, CPU-size ListOps, without), with `config_updates`; `model` is the
    model= label the command line gave (metrics.json `model`, cfg.model.name)."""
    config = preset_config(*preset, **(config_updates or {}))
    config["task"]["name"] = task = task or config["task"]["name"]
    if model is not None:
        config["model"]["name"] = model
    model = config["model"]["name"]
    metrics = {
        "schema": 1, "status": status, "error": None, "run_dir": str(run_dir), "task": task,
        "task_family": "listops", "model": model, "experiment": experiment, "overrides": list(overrides),
        "config": config, "seed": config["seed"],
        "metrics": {"test/accuracy": test_acc, "val/accuracy": val_acc, "test/loss": 1.6},
        "selection": {"metric": "val/accuracy", "mode": "max", "best_value": val_acc, "best_step": 40},
        "step": 50, "max_steps": 50, "num_parameters": 123456, "tokens_per_second": 8123.4,
        "wall_time_s": 171.2, "device": "cpu",
    }
    metrics.update(extra)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    (run_dir / ".hydra").mkdir(exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides) or "[]\n")
    return run_dir


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """A mix of every kind of run directory the report must cope with."""
    out = tmp_path / "outputs"
    # Directory names deliberately say nothing true about the run: the report must read metrics.json.
    write_run(out / "runs" / "a_done", overrides=["trainer.device=cuda"],
              config_updates={"trainer.device": "cuda"})
    write_run(out / "runs" / "b_failed", status="failed", error="CUDA out of memory\n  while allocating",
              test_acc=None, val_acc=None)
    write_run(out / "runs" / "c_running", status="running", step=20, test_acc=None)
    bad = out / "runs" / "d_bad"
    bad.mkdir(parents=True)
    (bad / "metrics.json").write_text('{"status": "compl')
    never = out / "runs" / "e_never" / ".hydra"
    never.mkdir(parents=True)
    (never / "config.yaml").write_text("model:\n  name: softmax\n  num_heads: 4\ntask:\n  name: listops\n"
                                       "  family: listops\nseed: 0\n")
    (never / "overrides.yaml").write_text("- seed=0\n")
    # A multirun sweep over model.num_heads.
    for job, heads in (("model.num_heads=2", 2), ("model.num_heads=8", 8)):
        write_run(out / "multirun" / job, config_updates={"model.num_heads": heads},
                  overrides=[f"model.num_heads={heads}"], test_acc=0.30 + heads / 100)
    # Files below these folders are never runs.
    for skipped in ("checkpoints", "tb", ".cache"):
        write_run(out / "runs" / "a_done" / skipped / "x", task="bogus")
    return out


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_collect_runs_reads_every_kind_of_run(outputs: Path, capsys) -> None:
    records = {rec.display: rec for rec in collect_runs([outputs])}
    assert set(records) == {"runs/a_done", "runs/b_failed", "runs/c_running", "runs/d_bad", "runs/e_never",
                            "multirun/model.num_heads=2", "multirun/model.num_heads=8"}
    assert records["runs/a_done"].status == "completed"
    assert records["runs/c_running"].status == "unfinished"
    assert records["runs/d_bad"].status == "unreadable"
    never = records["runs/e_never"]
    assert (never.status, never.task, never.model) == ("not started", "listops", "softmax")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d_bad/metrics.json" in err and "unreadable" in err


def test_report_markdown_csv_latex(outputs: Path, capsys) -> None:
    assert main([str(outputs)]) == 0
    captured = capsys.readouterr()
    report_dir = outputs / "report"
    md = read(report_dir / "report.md")
    assert captured.out == md

    # Runs table: statuses, the swept key as a column, constant and noise keys not.
    runs_md = md.split("## Runs: task=listops")[1].split("##")[0]
    for status in ("completed", "failed", "unfinished", "not started"):
        assert f"| {status} |" in runs_md
    # The unreadable run has no task to go under: it gets a table of its own.
    unknown_md = md.split("## Runs: unknown task")[1]
    assert "| runs/d_bad | unreadable |" in unknown_md and "metrics.json: not valid JSON" in unknown_md
    header = runs_md.strip().splitlines()[0]
    assert "model.num_heads" in header
    for absent in ("model.d_model", "trainer.max_steps", "trainer.device", "paths.output_dir", "task.name"):
        assert absent not in header
    assert "CUDA out of memory while allocating" in runs_md    # failed run's error, on one line
    assert "step 20/50" in runs_md                             # how far the unfinished run got
    assert "| 41.23 |" in runs_md                              # accuracy as percent, 2 decimals
    # Sorted by (status, run dir): completed runs first, then unfinished, failed, ...
    order = [line.split("|")[1].strip() for line in runs_md.strip().splitlines()[2:] if line.startswith("|")]
    assert order == ["multirun/model.num_heads=2", "multirun/model.num_heads=8", "runs/a_done",
                     "runs/c_running", "runs/b_failed", "runs/e_never"]

    # Paper table: published rows, a missing cell says how to fill it; the embedded default is the CPU preset
    # (no experiment= needed to compute it), the head sweep's runs are other runs beside it.
    paper_md = md.split("## LRA Table 1: published vs ours (test accuracy %)")[1].split("\n## ")[0]
    assert "| Transformer | published | 36.37 | 64.27 | 57.46 | 42.44 | 71.40 | 54.39 |" in paper_md
    assert ("| Transformer (softmax) | ours: paper presets | run: sparse-run experiment=lra_listops | "
            "run: sparse-run experiment=lra_text |") in paper_md
    assert "| Reformer | published | 37.27 |" in paper_md
    assert ("| Transformer (softmax) | ours: CPU presets | 41.23 | run: sparse-run experiment=lra_text_cpu |"
            in paper_md)
    for heads, acc in ((2, "32.00"), (8, "38.00")):
        assert (f"| softmax · dense · h{heads} | ours: other runs (nearest: CPU presets; model.num_heads={heads}) "
                f"| {acc} |  |  |  |  |  |") in paper_md
    runs_md = md.split("## LRA Table 1: our runs")[1].split("\n## ")[0]
    assert runs_md.count("| ListOps | Transformer (softmax) | ours: CPU presets |") == 1
    assert runs_md.count("| ListOps | softmax · dense · h") == 2

    # CSV: one file per table, parseable, same content.
    paper_csv = list(csv.reader(io.StringIO(read(report_dir / "lra_table1.csv"))))
    assert paper_csv[0] == ["model", "source", "ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Avg"]
    assert ["Transformer", "published", "36.37", "64.27", "57.46", "42.44", "71.40", "54.39"] in paper_csv
    runs_csv = list(csv.DictReader(io.StringIO(read(report_dir / "runs_listops.csv"))))
    assert {row["status"] for row in runs_csv} == {"completed", "failed", "unfinished", "not started"}
    assert (report_dir / "runs_unknown.csv").is_file()
    assert sorted(row["model.num_heads"] for row in runs_csv) == ["2", "4", "4", "4", "4", "8"]

    # LaTeX: booktabs, special characters escaped.
    tex = read(report_dir / "runs_listops.tex")
    assert "\\toprule" in tex and "\\bottomrule" in tex and "\\end{tabular}" in tex
    assert "model.num\\_heads" in tex and "test acc (\\%)" in tex
    assert "model.num_heads" not in tex.replace("model.num\\_heads", "")
    paper_tex = read(report_dir / "lra_table1.tex")
    assert "Transformer (softmax) & ours: paper presets & run: sparse-run experiment=lra\\_listops &" in paper_tex
    assert "wrote" in captured.err


def test_completed_paper_run_fills_our_cell(outputs: Path, capsys) -> None:
    paper = ("experiment=lra_listops",)
    write_run(outputs / "runs" / "lra_a", experiment="lra_listops", preset=paper, test_acc=0.3650,
              val_acc=0.37, overrides=["experiment=lra_listops"])
    # Another seed of the same configuration: averaged in.
    write_run(outputs / "runs" / "lra_b", experiment="lra_listops", preset=paper, test_acc=0.3900,
              val_acc=0.35, config_updates={"seed": 1}, overrides=["experiment=lra_listops", "seed=1"])
    # A failed paper run never fills the cell.
    write_run(outputs / "runs" / "lra_c", experiment="lra_listops", preset=paper, status="failed",
              test_acc=0.99, val_acc=0.99, config_updates={"seed": 2})
    assert main([str(outputs), "--formats", "md,csv"]) == 0
    md = capsys.readouterr().out
    paper_md = md.split("## LRA Table 1: published vs ours (test accuracy %)")[1].split("\n## ")[0]
    assert ("| Transformer (softmax) | ours: paper presets | 37.75 ± 1.77 (n=2) | run: sparse-run experiment=lra_text |"
            in paper_md)
    assert "run: sparse-run experiment=lra_listops |" not in paper_md
    runs_md = md.split("## LRA Table 1: our runs")[1].split("\n## ")[0]
    assert ("| 37.75 ± 1.77 (n=2) | 36.00 ± 1.41 (n=2) |  | 4L d512 h8, len 2000, 50 steps | yes | runs/lra_a; "
            "runs/lra_b | experiment=lra_listops seed=0,1 |") in runs_md
    assert "runs/lra_c" not in runs_md             # failed
    assert "## Runs: task=listops_lra" in md       # the paper-size task gets its own runs table
    assert not (outputs / "report" / "runs_listops.tex").exists()   # tex not requested


def test_published_table_is_complete() -> None:
    assert len(LRA_TABLE1["rows"]) == 11
    assert LRA_TABLE1["rows"]["Transformer"]["ListOps"] == 36.37
    assert LRA_TABLE1["rows"]["BigBird"]["Avg"] == 55.01
    assert LRA_TABLE1["rows"]["Sinkhorn Trans."]["Avg"] == 51.39
    for row in LRA_TABLE1["rows"].values():
        assert set(row) == set(LRA_TABLE1["columns"])


def test_out_dir_and_single_run_dir(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "somewhere", test_acc=0.5)
    out = tmp_path / "rep"
    assert main([str(run), "--out", str(out), "--formats", "csv"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""                        # markdown goes to stdout only when requested
    rows = list(csv.DictReader(io.StringIO(read(out / "runs_listops.csv"))))
    assert rows[0]["run"] == str(run) and rows[0]["test acc (%)"] == "50.00"
    assert "model.num_heads" not in rows[0]          # a single run varies nothing


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--formats", "md,pdf"], "sparse-report: unknown format 'pdf'; valid: md, csv, tex, html"),
        (["does-not-exist"], "sparse-report: no such directory: does-not-exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, monkeypatch, capsys, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out == ""


def test_unwritable_out_is_one_line(outputs: Path, tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main([str(outputs), "--out", str(blocker / "report")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[-1].startswith("sparse-report: cannot write the report")  # + unreadable warning


def test_no_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert main([str(tmp_path / "empty")]) == 1
    assert "no runs found" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)                      # default `outputs` does not exist yet
    assert main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sparse-run" in err
