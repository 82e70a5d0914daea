"""sparse-report on run folders from anyone: configs read as written (no interpolation reads the environment),
numbers that are not finite or too large for a float, metrics.json nested too deep or unreadable, and `$` in
every text that reaches a figure. Each case runs the whole report on hand-made run folders (metrics.json in
the layout the runner writes): exit 0, no traceback, the safe text in report.md."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.curves import task_curves
from test_report import write_run

SECRET = "hunter2"
HUGE = int("9" * 400)                 # a 400-digit integer: beyond any float
MATHTEXT = r"x$\sqrt{$y"              # a malformed mathtext expression: matplotlib raises drawing it


def report(root: Path, out: Path, capsys) -> tuple[str, str]:
    """sparse-report over `root` into `out`: (report.md, stderr); fails unless it exits 0 with report.html."""
    assert main([str(root), "--out", str(out), "--print", "none"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (out / "report.html").is_file()
    return (out / "report.md").read_text(encoding="utf-8"), err


def runs_section(markdown: str) -> str:
    return markdown.split("\n## Runs: ")[1].split("\n## ")[0]


def runs_row(markdown: str, name: str) -> str:
    """The row of run (or seed group) `name` in the runs tables."""
    rows = [line for section in markdown.split("\n## Runs: ")[1:] for line in section.split("\n## ")[0].splitlines()
            if line.startswith(f"| {name} |")]
    assert len(rows) == 1, markdown
    return rows[0]


def log(run_dir: Path, *rows: dict) -> None:
    """A log.jsonl of `rows`, written as the trainer writes it (json.dumps: NaN and Infinity as such)."""
    (run_dir / "log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


# ------------------------------------------------------------------------------- configs read as written
CONFIG_WITH_INTERPOLATIONS = """\
model:
  name: softmax
  num_heads: 4
task:
  name: listops-${oc.env:MY_SECRET}
  family: listops
paths:
  cache_dir: ${oc.env:MY_SECRET,'~/.cache'}
trainer:
  lr: ${oc.decode:'0.5'}
seed: 0
"""


def test_a_config_is_shown_as_written_and_never_reads_the_environment(tmp_path: Path, monkeypatch, capsys):
    """S1: a run without metrics.json is reported from .hydra/config.yaml; `${oc.env:...}` stays as written."""
    monkeypatch.setenv("MY_SECRET", SECRET)
    hydra = tmp_path / "runs" / "never" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text(CONFIG_WITH_INTERPOLATIONS)
    (hydra / "overrides.yaml").write_text("- task.name=listops-${oc.env:MY_SECRET}\n")
    out = tmp_path / "report"
    markdown, err = report(tmp_path / "runs", out, capsys)
    (record,) = collect_runs([tmp_path / "runs"])
    assert record.task == "listops-${oc.env:MY_SECRET}"
    assert record.config["paths.cache_dir"] == "${oc.env:MY_SECRET,'~/.cache'}"
    assert record.overrides == ["task.name=listops-${oc.env:MY_SECRET}"]
    assert "## Runs: task=listops-${oc.env:MY_SECRET}" in markdown
    for path in [out, *out.rglob("*")]:
        assert SECRET not in path.name
        assert path.is_dir() or SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in err


@pytest.mark.parametrize("text, problem", [
    ("a: &shared {b: 1}\nc: *shared\n", "YAML aliases are not read"),
    ("model: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "nested deeper than"),
])
def test_a_config_with_aliases_or_nested_too_deep_is_one_warning(tmp_path: Path, capsys, text, problem):
    """An alias can expand a small file into billions of values (a YAML bomb), and deep nesting exhausts the
    parser's recursion: either is refused in one line, and the run is still listed."""
    hydra = tmp_path / "runs" / "never" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text(text)
    (record,) = collect_runs([tmp_path / "runs"])
    err = capsys.readouterr().err
    assert record.status == "not started" and record.config == {}
    assert err.count("\n") == 1 and "config.yaml: cannot read" in err and problem in err


def test_a_run_value_never_reaches_hydra_as_an_interpolation(tmp_path: Path, monkeypatch, capsys):
    """The paper modules compose the job a run belongs to from the run's own values (the LM head sweep's width
    and heads, the BERT tables' swept key, the ERNIE-Sparse variant's regulariser): a value that is an
    interpolation is no job, and never given to Hydra, which would resolve it (`${oc.env:...}`)."""
    from sparse_runner.reporting import presets
    from sparse_runner.reporting.papers import lra
    from test_report_bhojanapalli2020_bert import write_bert_run
    from test_report_bhojanapalli2020_lm import write_lm_run
    from test_report_ernie_sparse import MODELS, write_run as write_lra_run

    monkeypatch.setenv("MY_SECRET", SECRET)
    monkeypatch.setattr(lra, "runner_has_model", lambda name: name in MODELS)
    composed: list[tuple[str, ...]] = []
    presets.cache_clear()   # presets an earlier test composed would not be composed again
    compose = presets.compose
    monkeypatch.setattr(presets, "compose", lambda overrides: composed.append(overrides) or compose(overrides))
    runs = tmp_path / "runs"
    interpolation = "${oc.env:MY_SECRET}"
    for run_dir, key in ((write_lm_run(runs / "lm", heads=4, head_size=None, ppl=80.0), "model.d_model"),
                         (write_bert_run(runs / "squad", "squad", experiment="bhojanapalli2020_table1_cpu", heads=4),
                          "model.num_heads"),
                         (write_lra_run(runs, "ernie", model="ernie_sparse", block=8), "model.regulariser")):
        data = json.loads((run_dir / "metrics.json").read_text())
        group, name = key.split(".")
        data["config"][group][name] = interpolation
        (run_dir / "metrics.json").write_text(json.dumps(data))
    markdown, err = report(runs, tmp_path / "report", capsys)
    assert composed and not [overrides for overrides in composed if any("${" in item for item in overrides)]
    assert SECRET not in markdown and SECRET not in err


# ------------------------------------------------------------------------------------------ numbers
def test_nan_and_infinity_in_a_seed_group_are_shown_never_averaged(tmp_path: Path, capsys):
    runs = tmp_path / "runs"
    for seed, accuracy in enumerate((float("nan"), float("inf"), 0.41, 0.43)):
        write_run(runs / f"s{seed}", config_updates={"seed": seed}, test_acc=accuracy)
    write_run(runs / "alone", config_updates={"model.num_heads": 2}, test_acc=float("-inf"), val_acc=float("nan"))
    markdown, _ = report(runs, tmp_path / "report", capsys)
    cells = runs_row(markdown, "s0; s1; s2; s3").split(" | ")
    assert "42.00 ± 1.41 (n=2; not averaged: nan, inf)" in cells
    cells = runs_row(markdown, "alone").split(" | ")
    assert "-inf" in cells and "nan" in cells
    assert "never averaged" in runs_section(markdown)


def test_nan_in_a_claim_arm_is_shown_and_left_out(tmp_path: Path, monkeypatch, capsys):
    from sparse_runner.reporting.claims import HELD, evaluate
    from sparse_runner.reporting.papers import all_claims, ernie_sparse, lra
    from test_report_ernie_sparse import MODELS, write_run as write_lra_run

    monkeypatch.setattr(lra, "runner_has_model", lambda name: name in MODELS)
    runs = tmp_path / "runs"
    # the arms are pinned to the kept seeds 0-2: two finite values and one that is not, per arm
    for seed, (full, bigbird) in enumerate([(0.46, 0.44), (0.461, 0.441), (float("nan"), float("inf"))]):
        write_lra_run(runs, f"e{seed}", "lra_text", model="ernie_sparse", seed=seed, acc=full)
        write_lra_run(runs, f"b{seed}", "lra_text", model="bigbird", seed=seed, acc=bigbird)
    claim = next(c for c in ernie_sparse.CLAIMS if c.setting == "Text, CPU preset"
                 and c.statement == "ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA")
    evidence = evaluate(claim, collect_runs([runs]))
    assert evidence.verdict == HELD and evidence.difference == pytest.approx(2.0)
    assert sorted(v for v in evidence.treatment if math.isfinite(v)) == pytest.approx([46.0, 46.1])
    assert sum(math.isnan(v) for v in evidence.treatment) == 1
    row = next(dict(zip(table.headers, r)) for table in all_claims.tables(collect_runs([runs]))
               for r in table.rows if r[0] == claim.statement and r[3] == claim.setting)
    assert row["treatment"] == "ERNIE-Sparse: 46.05 ± 0.07 (n=2; not averaged: nan)"
    assert row["baseline"] == "BigBird (bigbird): 44.05 ± 0.07 (n=2; not averaged: inf)"
    markdown, _ = report(runs, tmp_path / "report", capsys)
    assert "46.05 ± 0.07 (n=2; not averaged: nan)" in markdown


def test_integers_beyond_a_float_show_as_inf(tmp_path: Path, capsys):
    """A 400-digit integer in every number field the report reads: shown as inf, never a traceback."""
    runs = tmp_path / "runs"
    huge = dict(test_acc=HUGE, val_acc=HUGE, wall_time_s=HUGE, num_parameters=HUGE, tokens_per_second=-HUGE,
                cpu_time_s=HUGE, step=HUGE, max_steps=HUGE,
                analysis={"attention": {"encoder_self": {"mean_density": HUGE, "js_mean": -HUGE}}})
    for seed in (0, 1):
        write_run(runs / f"s{seed}", config_updates={"seed": seed, "model.num_heads": HUGE}, **huge)
    write_run(runs / "unfinished", status="running", **{**huge, "test_acc": None})
    markdown, _ = report(runs, tmp_path / "report", capsys)
    cells = runs_row(markdown, "s0; s1").split(" | ")
    assert "inf (n=2)" not in cells and "inf, inf" in cells and "-inf, -inf" in cells
    assert "step inf/inf" in runs_row(markdown, "unfinished")


def test_huge_and_infinite_training_losses_still_draw_the_curves(tmp_path: Path, capsys):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        run_dir = write_run(runs / f"s{seed}", config_updates={"seed": seed})
        log(run_dir, {"step": 1, "train/loss": 1e308}, {"step": 2, "train/loss": -1e308},
            {"step": 3, "train/loss": HUGE}, {"step": 4, "train/loss": float("inf")}, {"step": 5, "train/loss": 2.0},
            {"step": 5, "val/accuracy": 0.4}, {"step": 6, "val/accuracy": -1e308})
        with (run_dir / "log.jsonl").open("a") as handle:   # a line nested too deep for the JSON parser: skipped
            handle.write('{"step": 7, "train/loss": ' + "[" * 5000 + "]" * 5000 + "}\n")
    (figure,) = task_curves(collect_runs([runs]))
    assert figure.png.startswith(b"\x89PNG")
    report(runs, tmp_path / "report", capsys)


# --------------------------------------------------------------------------------- unreadable metrics
def test_a_metrics_json_nested_too_deep_is_an_unreadable_run(tmp_path: Path, capsys):
    runs = tmp_path / "runs"
    write_run(runs / "fine")
    for name, depth in (("deep", 5000), ("less_deep", 900)):
        (runs / name).mkdir()
        (runs / name / "metrics.json").write_text('{"status": "completed", "config": '
                                                  + '{"a": ' * depth + "1" + "}" * depth + "}")
    markdown, err = report(runs, tmp_path / "report", capsys)
    for name in ("deep", "less_deep"):
        assert [line for line in err.splitlines() if f"/{name}/metrics.json" in line] == [
            f"sparse-report: warning: {runs / name / 'metrics.json'}: nested deeper than 100 levels; listed as unreadable"]
        assert "| unreadable |" in runs_row(markdown, name) and "nested deeper than 100 levels" in runs_row(markdown, name)
    assert "| completed |" in runs_row(markdown, "fine")


def test_an_unreadable_metrics_json_says_why(tmp_path: Path, monkeypatch, capsys):
    """Permission denied is not a parse error: each is named as what it is."""
    runs = tmp_path / "runs"
    locked = write_run(runs / "locked") / "metrics.json"
    (runs / "truncated").mkdir()
    (runs / "truncated" / "metrics.json").write_text('{"status": "compl')
    (runs / "latin1").mkdir()
    (runs / "latin1" / "metrics.json").write_bytes(b'{"status": "compl\xe9ted"}')
    # The tests may run as root, whom chmod does not stop: the file refuses to open as an unreadable one does.
    open_fd = os.open

    def refusing_open(path, *args, **kwargs):
        if Path(path) == locked.resolve():
            raise PermissionError(13, "Permission denied", str(path))
        return open_fd(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    markdown, err = report(runs, tmp_path / "report", capsys)
    warnings = {name: [line for line in err.splitlines() if f"/{name}/metrics.json" in line]
                for name in ("locked", "truncated", "latin1")}
    assert warnings["locked"] == [f"sparse-report: warning: {locked}: cannot be read: permission denied; "
                                  "listed as unreadable"]
    assert "not valid JSON" in warnings["truncated"][0] and "not valid JSON" not in warnings["locked"][0]
    assert "not UTF-8 text" in warnings["latin1"][0]
    assert "cannot be read: permission denied" in runs_row(markdown, "locked")
    assert "metrics.json: not valid JSON" in runs_row(markdown, "truncated")
    assert "not valid JSON" not in runs_row(markdown, "locked")


# ------------------------------------------------------------------------------------------- figures
def test_dollar_signs_in_names_reach_the_curves_as_text(tmp_path: Path, capsys):
    """`$` in a folder name, `experiment` and a status would be parsed as mathtext by matplotlib."""
    runs = tmp_path / "runs"
    for name, extra in ((f"run_{MATHTEXT}", {"experiment": MATHTEXT}),
                        ("b", {"experiment": MATHTEXT, "status": f"stat{MATHTEXT}"}),
                        ("c", {"experiment": MATHTEXT, "selection": {"metric": f"val/{MATHTEXT}", "mode": "max"}})):
        run_dir = write_run(runs / name, **extra)
        log(run_dir, {"step": 1, "train/loss": 2.0, f"val/{MATHTEXT}": 0.3}, {"step": 1, "val/accuracy": 0.3})
    figures = task_curves(collect_runs([runs]))
    assert figures and all(figure.png.startswith(b"\x89PNG") for figure in figures)
    markdown, _ = report(runs, tmp_path / "report", capsys)
    assert f"run_{MATHTEXT}" in markdown


def test_dollar_signs_reach_the_papers_figures_as_text(tmp_path: Path, capsys):
    """The low-rank figure names its runs, the LM sweep figure its task, Correia's figures the attention types
    of a run's analysis: untrusted texts, drawn as written."""
    from test_report_bhojanapalli2020 import write_lowrank_run
    from test_report_bhojanapalli2020_lm import write_lm_run
    from test_report_translation import CPU_SIZE, write_run as write_translation_run

    runs = tmp_path / "runs"
    write_lowrank_run(runs / f"lowrank_{MATHTEXT}")
    write_lowrank_run(runs / "lowrank_other")
    for heads, ppl in ((2, 90.0), (8, 85.0)):
        run_dir = write_lm_run(runs / f"lm_h{heads}", heads=heads, head_size=None, ppl=ppl)
        data = json.loads((run_dir / "metrics.json").read_text())
        data["task"] = data["config"]["task"]["name"] = f"sotu{MATHTEXT}"
        (run_dir / "metrics.json").write_text(json.dumps(data))
    run_dir = write_translation_run(runs, "translation", model="entmax", size=CPU_SIZE)
    data = json.loads((run_dir / "metrics.json").read_text())
    data["analysis"]["attention"][f"ctx{MATHTEXT}"] = data["analysis"]["attention"].pop("context")
    (run_dir / "metrics.json").write_text(json.dumps(data))
    out = tmp_path / "report"
    markdown, err = report(runs, out, capsys)
    assert "skipped" not in err
    figures = {path.name for path in (out / "figures").iterdir()}
    assert "bhojanapalli2020_lowrank_kl.png" in figures
    assert any(name.startswith("bhojanapalli2020_lm_sotu") for name in figures)
    assert any(name.endswith("_js_per_layer.png") for name in figures)
