"""LRA Table 1 in sparse-report: the published rows, our rows per (model preset, setting) filled from fake run
directories whose configs are the real presets', runs filed by what they computed (not by their model= label),
other runs beside their nearest preset, substitute-data markers, averages, the commands in empty cells, and the
runs table behind it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.papers import lra
from sparse_runner.reporting.render import Table, render_markdown_table
from test_report import preset_config

# The task config each family's runs name without an experiment= (the report reads the family).
TASKS = {"listops": "listops_lra", "lra_text": "lra_text", "lra_retrieval": "lra_retrieval",
         "lra_image": "lra_image", "pathfinder": "pathfinder"}
FAMILIES = list(TASKS)

OFFICIAL = {"name": "imdb", "source": "hub", "substitute_for": None, "description": "IMDB reviews, bytes"}
BBC = {"name": "bbc_news", "source": "substitute", "substitute_for": "IMDB",
       "description": "BBC News articles, business vs rest, bytes"}
FASHION = {"name": "fashion_mnist", "source": "substitute", "substitute_for": "CIFAR-10",
           "description": "Fashion-MNIST, 28x28 grayscale padded to 32x32"}


def lra_config(family: str, experiment: str | None = None, model: str = "softmax", *more: str, **updates) -> dict:
    """The config `sparse-run experiment=<experiment> model=<model> <more>` composes (without an experiment:
    `task=<the family's task>`), with dotted `updates`."""
    overrides = [f"experiment={experiment}"] if experiment else [f"task={TASKS[family]}"]
    return preset_config(*overrides, *([f"model={model}"] if model != "softmax" else []), *more, **updates)


def write_lra_run(run_dir: Path, family: str, *, experiment: str | None = None, model: str = "softmax",
                  test_acc: float | None = 0.40, val_acc: float | None = 0.40, status: str = "completed",
                  data: dict | None = None, majority: float = 0.10, overrides: tuple = (), more: tuple = (),
                  seed: int = 0, label: str | None = None, config_updates: dict | None = None) -> Path:
    """A metrics.json of an LRA task as the trainer writes it: its config (lra_config of `experiment`, `model`
    and `more` overrides, `seed`), test/val accuracy, the majority-class floor and task_info.data (left out when
    `data` is None, like ListOps runs of old). `label`: the model= name the command line gave, when it is not
    `model` (metrics.json `model` and cfg.model.name)."""
    config = lra_config(family, experiment, model, *more, **{**(config_updates or {}), "seed": seed})
    if label is not None:
        config["model"]["name"] = label
    task, model = config["task"]["name"], config["model"]["name"]
    assert config["task"]["family"] == family
    metrics = {
        "schema": 1, "status": status, "error": None, "run_dir": str(run_dir), "task": task,
        "task_family": family, "model": model, "experiment": experiment, "overrides": list(overrides),
        "config": config, "seed": seed, "primary_metric": "test/accuracy",
        "metrics": {"test/accuracy": test_acc, "val/accuracy": val_acc, "test/majority_accuracy": majority},
        "selection": {"metric": "val/accuracy", "mode": "max", "best_value": val_acc, "best_step": 4000},
        "step": 5000, "max_steps": 5000,
        "task_info": {"data": data} if data is not None else {},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    return run_dir


def table1(root: Path) -> Table:
    return lra.tables(collect_runs([root]))[0]


def row(table: Table, model: str, source: str) -> dict[str, str]:
    """The row of `model` with `source` as {header: cell}; fails when there is not exactly one."""
    matches = [r for r in table.rows if r[0] == model and r[1] == source]
    assert len(matches) == 1, [r[:2] for r in table.rows]
    return dict(zip(table.headers, matches[0]))


def notes(table: Table) -> str:
    return "\n".join(table.notes)


@pytest.fixture(autouse=True)
def runner_models(monkeypatch):
    """The runner has softmax and the sparse models but not bigbird/local (yet), whatever conf/ holds today;
    a test that needs bigbird adds it."""
    models = {"softmax", "entmax", "entmax15", "sparsemax"}
    monkeypatch.setattr(lra, "runner_has_model", lambda name: name in models)
    return models


# ------------------------------------------------------------------------------------- published
def test_published_rows_all_present_with_their_numbers() -> None:
    table = lra.tables([])[0]
    assert table.slug == "lra_table1"
    assert table.headers == ["model", "source", "ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Avg"]
    published = [r for r in table.rows if r[1] == "published"]
    assert [r[0] for r in published] == list(lra.LRA_TABLE1["rows"])
    assert len(published) == 11
    assert row(table, "Transformer", "published") == {
        "model": "Transformer", "source": "published", "ListOps": "36.37", "Text": "64.27",
        "Retrieval": "57.46", "Image": "42.44", "Pathfinder": "71.40", "Avg": "54.39"}
    assert row(table, "Performer", "published")["Pathfinder"] == "77.05"
    assert row(table, "BigBird", "published")["Avg"] == "55.01"
    for name, values in lra.LRA_TABLE1["rows"].items():
        cells = row(table, name, "published")
        five = [float(cells[c]) for c in ("ListOps", "Text", "Retrieval", "Image", "Pathfinder")]
        assert five == [values[c] for c in ("ListOps", "Text", "Retrieval", "Image", "Pathfinder")]
        if name == "Sinkhorn Trans.":
            # The printed average, flagged: the five scores average to 51.48.
            assert cells["Avg"] == "51.39 ‡"
            assert round(sum(five) / 5, 2) == 51.48
        else:
            assert abs(float(cells["Avg"]) - sum(five) / 5) < 0.006
    assert "‡ Sinkhorn Trans.: Avg printed as 51.39 in the paper, 51.29 in the README" in notes(table)
    assert "Tay et al., ICLR 2021, Table 1" in notes(table)
    assert table.rules_before == {11, 12}   # rules under the published rows and between our settings


def test_without_runs_only_the_rows_we_can_fill_and_no_runs_table() -> None:
    tables = lra.tables([])
    assert [t.slug for t in tables] == ["lra_table1"]
    ours = [r[:2] for r in tables[0].rows if r[1] != "published"]
    assert ours == [["Transformer (softmax)", "ours: paper presets"], ["Transformer (softmax)", "ours: CPU presets"]]


def test_published_models_we_can_run_get_a_paper_row(runner_models) -> None:
    runner_models.add("bigbird")
    table = lra.tables([])[0]
    assert row(table, "BigBird (bigbird)", "ours: paper presets")["Image"] == \
        "run: sparse-run experiment=lra_image model=bigbird"
    assert not [r for r in table.rows if r[0].startswith("Local Attention (")]   # no local model yet


# ------------------------------------------------------------------------------------ our cells
def test_paper_run_fills_the_transformer_cell_and_others_show_their_command(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "a", "listops", experiment="lra_listops", test_acc=0.365, val_acc=0.37)
    # The same seed run again, better on test but worse on validation: it counts once, as its best run on
    # validation (we select on validation).
    write_lra_run(tmp_path / "b", "listops", experiment="lra_listops", test_acc=0.39, val_acc=0.35)
    table = table1(tmp_path)
    assert row(table, "Transformer (softmax)", "ours: paper presets") == {
        "model": "Transformer (softmax)", "source": "ours: paper presets", "ListOps": "36.50",
        "Text": "run: sparse-run experiment=lra_text", "Retrieval": "run: sparse-run experiment=lra_retrieval",
        "Image": "run: sparse-run experiment=lra_image", "Pathfinder": "run: sparse-run experiment=lra_pathfinder",
        "Avg": ""}
    assert row(table, "Transformer (softmax)", "ours: CPU presets") == {
        "model": "Transformer (softmax)", "source": "ours: CPU presets",
        "ListOps": "run: sparse-run experiment=lra_listops_cpu", "Text": "run: sparse-run experiment=lra_text_cpu",
        "Retrieval": "run: sparse-run experiment=lra_retrieval_cpu",
        "Image": "run: sparse-run experiment=lra_image_cpu",
        "Pathfinder": "run: sparse-run experiment=lra_pathfinder_cpu", "Avg": ""}
    assert ("a whole row at once: Transformer (softmax), ours: paper presets: "
            "`sparse-run -m experiment=lra_listops,lra_text,lra_retrieval,lra_image,lra_pathfinder`" in notes(table))


def test_failed_and_unfinished_runs_never_fill_a_cell(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "failed", "lra_text", experiment="lra_text", status="failed", test_acc=0.99, val_acc=0.99)
    write_lra_run(tmp_path / "running", "lra_image", experiment="lra_image", status="running", test_acc=None)
    write_lra_run(tmp_path / "entmax_failed", "listops", experiment="lra_listops", model="entmax", status="failed")
    tables = lra.tables(collect_runs([tmp_path]))
    assert [t.slug for t in tables] == ["lra_table1"]            # no completed run: no runs table
    cells = row(tables[0], "Transformer (softmax)", "ours: paper presets")
    assert cells["Text"] == "run: sparse-run experiment=lra_text"
    assert cells["Image"] == "run: sparse-run experiment=lra_image"
    assert not [r for r in tables[0].rows if r[0] == "entmax"]   # a failed run makes no row


def test_other_models_get_their_own_rows_with_commands(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "e", "lra_text", experiment="lra_text", model="entmax15", test_acc=0.61, val_acc=0.6)
    write_lra_run(tmp_path / "s", "pathfinder", experiment="lra_pathfinder_cpu", model="sparsemax", test_acc=0.7)
    table = table1(tmp_path)
    entmax = row(table, "entmax15", "ours: paper presets")
    assert entmax["Text"] == "61.00"
    assert entmax["ListOps"] == "run: sparse-run experiment=lra_listops model=entmax15"
    sparsemax = row(table, "sparsemax", "ours: CPU presets")
    assert sparsemax["Pathfinder"] == "70.00"
    assert sparsemax["Image"] == "run: sparse-run experiment=lra_image_cpu model=sparsemax"
    # Order: paper presets (published models first), then CPU presets; a rule before each setting.
    ours = [r[:2] for r in table.rows[11:]]
    assert ours == [["Transformer (softmax)", "ours: paper presets"], ["entmax15", "ours: paper presets"],
                    ["Transformer (softmax)", "ours: CPU presets"], ["sparsemax", "ours: CPU presets"]]
    assert table.rules_before == {11, 13}


def test_a_run_is_filed_by_what_it_computed_not_by_its_model_label(tmp_path: Path) -> None:
    # `model=softmax normaliser=alpha_entmax` computes what `model=entmax` computes: its metrics.json says
    # "model": "softmax", yet it is the entmax preset, in the entmax row and not in the Transformer's.
    write_lra_run(tmp_path / "spelled", "listops", experiment="lra_listops_cpu", more=("normaliser=alpha_entmax",),
                  test_acc=0.45, overrides=("experiment=lra_listops_cpu", "normaliser=alpha_entmax"))
    # ... and so is the group override of the same axis, on another task.
    write_lra_run(tmp_path / "group", "pathfinder", experiment="lra_pathfinder_cpu", more=("normaliser=alpha_entmax",),
                  test_acc=0.66, overrides=("experiment=lra_pathfinder_cpu", "normaliser=alpha_entmax"))
    records = collect_runs([tmp_path])
    assert {rec.model for rec in records} == {"softmax"}
    table = lra.tables(records)[0]
    entmax = row(table, "entmax", "ours: CPU presets")
    assert entmax["ListOps"] == "45.00" and entmax["Pathfinder"] == "66.00"
    assert entmax["Text"] == "run: sparse-run experiment=lra_text_cpu model=entmax"
    softmax = row(table, "Transformer (softmax)", "ours: CPU presets")
    assert softmax["ListOps"] == "run: sparse-run experiment=lra_listops_cpu"
    assert softmax["Pathfinder"] == "run: sparse-run experiment=lra_pathfinder_cpu"
    assert "45.00" not in str([r for r in table.rows if r[0] != "entmax"])
    runs = lra.tables(records)[1]
    assert {r[1] for r in runs.rows} == {"entmax"}


def test_a_run_that_is_no_preset_is_an_other_run_beside_the_nearest(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "preset", "listops", experiment="lra_listops_cpu", test_acc=0.41)
    write_lra_run(tmp_path / "lr", "listops", experiment="lra_listops_cpu", config_updates={"trainer.lr": 0.01},
                  test_acc=0.20, val_acc=0.9, overrides=("experiment=lra_listops_cpu", "trainer.lr=0.01"))
    write_lra_run(tmp_path / "lr_text", "lra_text", experiment="lra_text_cpu", config_updates={"trainer.lr": 0.01},
                  test_acc=0.55)
    table = table1(tmp_path)
    # The preset's cell holds its own run only, however much better the other run is on validation.
    assert row(table, "Transformer (softmax)", "ours: CPU presets")["ListOps"] == "41.00"
    other = row(table, "softmax · dense · h4", "ours: other runs (nearest: CPU presets; trainer.lr=0.01)")
    assert other["ListOps"] == "20.00" and other["Text"] == "55.00"
    assert other["Retrieval"] == "" and other["Avg"] == ""           # no preset, no command
    assert table.rules_before == {11, 12, 13}                        # published | paper | CPU | other runs
    assert "`other runs` rows = runs that are no preset" in notes(table)
    runs = lra.tables(collect_runs([tmp_path]))[1]
    assert [(r[0], r[2], r[-2]) for r in runs.rows] == [
        ("ListOps", "ours: CPU presets", "preset"),
        ("ListOps", "ours: other runs (nearest: CPU presets; trainer.lr=0.01)", "lr"),
        ("Text", "ours: other runs (nearest: CPU presets; trainer.lr=0.01)", "lr_text")]


def test_a_run_far_from_every_preset_names_its_first_differences(tmp_path: Path) -> None:
    # Paper-size ListOps without the paper preset's model and training: an other run, not the paper preset.
    write_lra_run(tmp_path / "big", "listops", test_acc=0.35, overrides=("task=listops_lra",))
    table = table1(tmp_path)
    [other] = [r for r in table.rows if r[1].startswith("ours: other runs")]
    assert other[1].startswith("ours: other runs (nearest: ") and "more)" in other[1]
    assert other[2] == "35.00" and other[3:] == ["", "", "", "", ""]
    assert row(table, "Transformer (softmax)", "ours: paper presets")["ListOps"] == \
        "run: sparse-run experiment=lra_listops"


def test_the_embedded_default_is_the_cpu_preset(tmp_path: Path) -> None:
    # `sparse-run` alone computes what `sparse-run experiment=lra_listops_cpu` computes.
    write_lra_run(tmp_path / "default", "listops", test_acc=0.41, label="softmax")
    data = json.loads((tmp_path / "default" / "metrics.json").read_text())
    data["config"] = preset_config(seed=0)
    (tmp_path / "default" / "metrics.json").write_text(json.dumps(data))
    assert row(table1(tmp_path), "Transformer (softmax)", "ours: CPU presets")["ListOps"] == "41.00"


def test_two_seeds_of_a_preset_share_its_cell(tmp_path: Path) -> None:
    for seed, acc in ((0, 0.40), (1, 0.44)):
        write_lra_run(tmp_path / f"s{seed}", "lra_text", experiment="lra_text_cpu", seed=seed, test_acc=acc,
                      val_acc=acc)
    write_lra_run(tmp_path / "s2_lr", "lra_text", experiment="lra_text_cpu", seed=2, test_acc=0.9, val_acc=0.9,
                  config_updates={"trainer.lr": 0.01})
    table = table1(tmp_path)
    assert row(table, "Transformer (softmax)", "ours: CPU presets")["Text"] == "42.00 ± 2.83 (n=2)"
    assert row(table, "softmax · dense · h4", "ours: other runs (nearest: CPU presets; trainer.lr=0.01)")["Text"] == \
        "90.00"
    # Old ListOps runs wrote no task_info.data: our generator's data.
    write_lra_run(tmp_path / "listops", "listops", experiment="lra_listops_cpu")
    assert "ListOps: generated;" in notes(table1(tmp_path))


# ---------------------------------------------------------------------------- data and averages
def test_substitute_data_is_marked_and_named_in_the_notes(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "text", "lra_text", experiment="lra_text_cpu", test_acc=0.8, data=BBC)
    write_lra_run(tmp_path / "image", "lra_image", experiment="lra_image_cpu", test_acc=0.5, data=FASHION)
    table = table1(tmp_path)
    cells = row(table, "Transformer (softmax)", "ours: CPU presets")
    assert cells["Text"] == "80.00 †" and cells["Image"] == "50.00 †"
    text = notes(table)
    assert ("Cells: Transformer (softmax), ours: CPU presets: Text = bbc_news for IMDB, "
            "Image = fashion_mnist for CIFAR-10.") in text
    assert "Text: bbc_news † (substitute for IMDB)" in text


def test_a_cell_prefers_official_data_over_a_substitute(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "bbc", "lra_text", experiment="lra_text", test_acc=0.9, val_acc=0.9, data=BBC)
    write_lra_run(tmp_path / "imdb", "lra_text", experiment="lra_text", test_acc=0.6, val_acc=0.6, data=OFFICIAL)
    table = table1(tmp_path)
    assert row(table, "Transformer (softmax)", "ours: paper presets")["Text"] == "60.00"
    assert "substitute data:" not in notes(table)    # no cell shown is a substitute


def test_avg_only_when_all_five_columns_are_filled(tmp_path: Path) -> None:
    accuracies = dict(zip(FAMILIES, (0.30, 0.60, 0.50, 0.40, 0.70)))
    for family, acc in accuracies.items():
        write_lra_run(tmp_path / "paper" / family, family, experiment=lra.SETTINGS["paper"]["experiments"][family],
                      test_acc=acc, data=OFFICIAL if family == "lra_text" else None)
    # The CPU row misses Pathfinder: no average.
    for family in FAMILIES[:4]:
        write_lra_run(tmp_path / "cpu" / family, family, experiment=lra.SETTINGS["cpu"]["experiments"][family])
    table = table1(tmp_path)
    paper = row(table, "Transformer (softmax)", "ours: paper presets")
    assert [paper[c] for c in ("ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Avg")] == \
        ["30.00", "60.00", "50.00", "40.00", "70.00", "50.00"]
    cpu = row(table, "Transformer (softmax)", "ours: CPU presets")
    assert cpu["Image"] == "40.00" and cpu["Pathfinder"] == "run: sparse-run experiment=lra_pathfinder_cpu"
    assert cpu["Avg"] == ""
    # The whole-row command is offered for the incomplete row only.
    assert "`sparse-run -m experiment=lra_listops_cpu," in notes(table)
    assert "`sparse-run -m experiment=lra_listops," not in notes(table)


def test_an_avg_over_substitute_cells_is_marked(tmp_path: Path) -> None:
    for family in FAMILIES:
        write_lra_run(tmp_path / family, family, experiment=lra.SETTINGS["cpu"]["experiments"][family],
                      test_acc=0.5, data=BBC if family == "lra_text" else None)
    table = table1(tmp_path)
    assert row(table, "Transformer (softmax)", "ours: CPU presets")["Avg"] == "50.00 †"
    assert "Text = bbc_news for IMDB; its Avg includes them." in notes(table)


# ------------------------------------------------------------------------------------ runs table
def test_runs_table_lists_every_completed_run(tmp_path: Path) -> None:
    write_lra_run(tmp_path / "a", "listops", experiment="lra_listops", test_acc=0.365, val_acc=0.37,
                  overrides=("experiment=lra_listops",))
    # The same preset on other data (a substitute), better on validation: listed, not shown (official data
    # first).
    write_lra_run(tmp_path / "b", "listops", experiment="lra_listops", test_acc=0.39, val_acc=0.5, data=BBC)
    write_lra_run(tmp_path / "t", "lra_text", experiment="lra_text_cpu", test_acc=0.8, data=BBC, majority=0.77)
    write_lra_run(tmp_path / "f", "lra_text", experiment="lra_text", status="failed")
    runs = lra.tables(collect_runs([tmp_path]))[1]
    assert runs.slug == "lra_table1_runs"
    got = [dict(zip(runs.headers, r)) for r in runs.rows]
    assert [(r["run"], r["in Table 1"]) for r in got] == [("a", "yes"), ("b", ""), ("t", "yes")]
    assert got[0] == {
        "column": "ListOps", "model": "Transformer (softmax)", "setting": "ours: paper presets",
        "data": "generated", "test acc": "36.50", "best val acc": "37.00", "majority floor": "10.00",
        "scale": "4L d512 h8, len 2000, 5000 steps", "in Table 1": "yes", "run": "a",
        "overrides": "experiment=lra_listops"}
    assert got[1]["data"] == "bbc_news † (substitute for IMDB)"
    assert got[2]["data"] == "bbc_news † (substitute for IMDB)" and got[2]["majority floor"] == "77.00"
    assert "bbc_news: BBC News articles, business vs rest, bytes" in notes(runs)


def test_listops_from_the_release_files_is_release_data(tmp_path: Path) -> None:
    run = write_lra_run(tmp_path / "r", "listops", experiment="lra_listops")
    data = json.loads((run / "metrics.json").read_text())
    data["config"]["task"]["data_dir"] = "/data/lra_release/listops-1000"
    (run / "metrics.json").write_text(json.dumps(data))
    assert lra.data_info(collect_runs([run])[0]) == lra.DataInfo(source="release")


def test_report_writes_the_lra_tables(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    write_lra_run(root / "a", "listops", experiment="lra_listops", test_acc=0.365, val_acc=0.37)
    write_lra_run(root / "t", "lra_text", experiment="lra_text_cpu", test_acc=0.8, data=BBC)
    assert main([str(root)]) == 0
    md = capsys.readouterr().out
    table_md = md.split("## LRA Table 1: published vs ours (test accuracy %)")[1].split("\n## ")[0]
    assert render_markdown_table(table1(root)) in table_md
    assert ("| Transformer (softmax) | ours: paper presets | 36.50 | run: sparse-run experiment=lra_text |"
            in table_md)
    assert "## LRA Table 1: our runs (test accuracy %)" in md
    rows = list(csv.reader(io.StringIO((root / "report" / "lra_table1.csv").read_text(encoding="utf-8"))))
    assert rows[0] == ["model", "source", "ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Avg"]
    assert ["Transformer (softmax)", "ours: CPU presets", "run: sparse-run experiment=lra_listops_cpu", "80.00 †",
            "run: sparse-run experiment=lra_retrieval_cpu", "run: sparse-run experiment=lra_image_cpu",
            "run: sparse-run experiment=lra_pathfinder_cpu", ""] in rows
    tex = (root / "report" / "lra_table1.tex").read_text(encoding="utf-8")
    assert "Transformer (softmax) & ours: paper presets & 36.50 & run: sparse-run experiment=lra\\_text" in tex
    assert (root / "report" / "lra_table1_runs.csv").is_file()
