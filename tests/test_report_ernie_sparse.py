"""The ERNIE-Sparse tables of sparse-report: published rows, our variants (model preset, SAR, regulariser) as
mean ± std over seeds from fake LRA run directories (their configs the presets' own), runs filed by what they
computed, other runs beside the nearest variant, averages, fill commands, the ablation differences and the
Pathfinder robustness table."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.papers import ernie_sparse, lra
from sparse_runner.reporting.render import Table
from test_report_lra import BBC, FAMILIES, write_lra_run

CPU = lra.SETTINGS["cpu"]["experiments"]
PAPER = lra.SETTINGS["paper"]["experiments"]
COLUMNS = ["ListOps", "Text", "Retrieval", "Image", "Pathfinder"]
MODELS = {"softmax", "local", "bigbird", "hst", "ernie_sparse", "bigbird_sar"}


@pytest.fixture(autouse=True)
def runner_models(monkeypatch):
    """The runner has the six models of the study, whatever conf/model holds today."""
    models = set(MODELS)
    monkeypatch.setattr(lra, "runner_has_model", lambda name: name in models)
    return models


def write_run(root: Path, name: str, family: str = "listops", *, experiment: str | None = None,
              model: str = "ernie_sparse", seed: int = 0, acc: float = 0.4, val: float | None = None,
              sar: float | None = None, regulariser: str = "none", shifted: float | None = None,
              shift: int | list[int] = 0, worst: float | None = None, lr: float | None = None, block: int | None = None,
              status: str = "completed", data: dict | None = None) -> Path:
    """An LRA run of `model` (CPU preset of `family` unless `experiment` says otherwise) with the overrides
    `sar` (regulariser=sar with this weight; 0: regulariser=none), `regulariser`, `shift`
    (trainer.test_topology_shift: one shift or a list), `lr` and `block` (model.pattern_options.block_size) where
    given; `shifted` and `worst`: its test_shifted/accuracy and test_shifted_worst/accuracy."""
    more = [*((["regulariser=sar", f"model.regulariser_options.weight={sar}"] if sar else ["regulariser=none"]) if sar is not None else []),
            *([f"regulariser={regulariser}"] if regulariser != "none" else []),
            *([f"trainer.test_topology_shift={json.dumps(shift, separators=(',', ':'))}"] if shift else []),
            *([f"trainer.lr={lr}"] if lr is not None else []),
            *([f"model.pattern_options.block_size={block}"] if block is not None else [])]
    run_dir = write_lra_run(root / name, family, experiment=experiment or CPU[family], model=model, test_acc=acc,
                            val_acc=acc if val is None else val, status=status, data=data, seed=seed, more=tuple(more))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    if shifted is not None:
        metrics["metrics"]["test_shifted/accuracy"] = shifted
    if worst is not None:
        metrics["metrics"]["test_shifted_worst/accuracy"] = worst
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    return run_dir


def tables(root: Path) -> dict[str, Table]:
    return {table.slug: table for table in ernie_sparse.tables(collect_runs([root]))}


def row(table: Table, model: str, source: str) -> dict[str, str]:
    matches = [r for r in table.rows if r[0] == model and r[1] == source]
    assert len(matches) == 1, [r[:2] for r in table.rows]
    return dict(zip(table.headers, matches[0]))


def labels(table: Table, source: str) -> list[str]:
    return [r[0] for r in table.rows if r[1] == source]


def notes(table: Table) -> str:
    return "\n".join(table.notes)


ERNIE = "ERNIE-Sparse: HST + SAR (ernie_sparse)"
HST = "w/o SAR: HST (hst)"
BIGBIRD_SAR = "w/o HST: BigBird + SAR (bigbird_sar)"
OURS_CPU, OURS_PAPER = "ours: CPU presets", "ours: paper presets"


# ------------------------------------------------------------------------------------ when shown
def test_shown_only_once_the_study_has_a_run(tmp_path: Path) -> None:
    assert ernie_sparse.tables([]) == []
    write_run(tmp_path, "softmax", model="softmax")           # a plain LRA Table 1 run: not the study's
    assert tables(tmp_path) == {}
    write_run(tmp_path, "hst", model="hst", status="failed")  # any run of the study's own models
    assert list(tables(tmp_path)) == ["ernie_sparse_lra", "ernie_sparse_ablation", "ernie_sparse_robustness"]


def test_rdrop_on_a_baseline_starts_the_study(tmp_path: Path) -> None:
    write_run(tmp_path, "rdrop", model="bigbird", regulariser="rdrop")
    table = tables(tmp_path)["ernie_sparse_lra"]
    assert row(table, "BigBird + R-Drop (bigbird)", OURS_CPU)["ListOps"] == "40.00"


# ------------------------------------------------------------------------------------- published
def test_published_rows(tmp_path: Path) -> None:
    write_run(tmp_path, "e")
    table = tables(tmp_path)["ernie_sparse_lra"]
    assert table.headers == ["model", "source", *COLUMNS, "Avg"]
    assert labels(table, "published: LRA Table 1") == ["Transformer", "Local Attention", "BigBird"]
    for name in ("Transformer", "Local Attention", "BigBird"):
        cells = row(table, name, "published: LRA Table 1")
        published = lra.LRA_TABLE1["rows"][name]
        assert [float(cells[c]) for c in [*COLUMNS, "Avg"]] == [published[c] for c in [*COLUMNS, "Avg"]]
    assert row(table, "BigBird", "published: LRA Table 1")["Avg"] == "55.01"   # ERNIE-Sparse's baseline
    assert row(table, "ERNIE-Sparse", "published: Liu et al. 2022") == {
        "model": "ERNIE-Sparse", "source": "published: Liu et al. 2022", "ListOps": "n/p", "Text": "n/p",
        "Retrieval": "n/p", "Image": "n/p", "Pathfinder": "n/p", "Avg": "57.78"}
    text = notes(table)
    assert "LRA average 57.78 against BigBird's 55.01" in text
    assert "UNCONFIRMED, docs/papers.md" in text and "assumptions of docs/papers.md" in text
    assert table.rules_before == {4, 10}   # under the published rows, between the two settings


# ------------------------------------------------------------------------------------ our cells
def test_a_cell_is_mean_and_std_over_seeds(tmp_path: Path) -> None:
    for seed, acc in enumerate((0.36, 0.38, 0.37)):
        write_run(tmp_path, f"e{seed}", seed=seed, acc=acc)
    # Seed 2 run again with a worse validation score: the seed counts once (its best run on validation).
    write_run(tmp_path, "e2_again", seed=2, acc=0.99, val=0.1)
    write_run(tmp_path, "h0", model="hst", acc=0.35)
    write_run(tmp_path, "failed", model="hst", seed=1, acc=0.99, status="failed")
    table = tables(tmp_path)["ernie_sparse_lra"]
    assert row(table, ERNIE, OURS_CPU)["ListOps"] == "37.00 ± 1.00 (n=3)"   # sample std of 36, 38, 37
    assert row(table, HST, OURS_CPU)["ListOps"] == "35.00"                  # one run: the value alone


def test_runs_differing_in_more_than_the_seed_are_not_pooled(tmp_path: Path) -> None:
    write_run(tmp_path, "a0", seed=0, acc=0.30)
    write_run(tmp_path, "a1", seed=1, acc=0.34)
    write_run(tmp_path, "b0", seed=0, acc=0.50, lr=3e-4)   # another learning rate: no preset's, however good
    write_run(tmp_path, "h0", model="hst", acc=0.45, lr=3e-4)
    table = tables(tmp_path)["ernie_sparse_lra"]
    assert row(table, ERNIE, OURS_CPU)["ListOps"] == "32.00 ± 2.83 (n=2)"
    other = "ours: other runs (nearest: CPU presets, model=ernie_sparse; trainer.lr=0.0003)"
    assert row(table, "softmax · hst · h4 · sar", other)["ListOps"] == "50.00"
    assert row(table, "softmax · hst · h4", "ours: other runs (nearest: CPU presets, model=hst; trainer.lr=0.0003)")[
        "ListOps"] == "45.00"
    assert "Cells chosen among several configurations" not in notes(table)
    # The ablation compares the two other runs of the same difference, and the two presets' runs apart.
    ablation = tables(tmp_path)["ernie_sparse_ablation"]
    assert ["ERNIE-Sparse minus w/o SAR (ernie_sparse - hst)",
            "ours: other runs (nearest: CPU presets; trainer.lr=0.0003)", "+5.00 (50.00 vs 45.00)", ""] in ablation.rows


def test_rows_are_the_variant_presets_the_runs_are(tmp_path: Path) -> None:
    write_run(tmp_path, "sar", acc=0.40)
    write_run(tmp_path, "nosar", sar=0.0, acc=0.41)                        # ernie_sparse with SAR off: it is hst
    write_run(tmp_path, "hst_sar", model="hst", sar=1.0, acc=0.39, seed=1)  # hst with ernie_sparse's SAR: it is that
    write_run(tmp_path, "hst_rdrop", model="hst", regulariser="rdrop", acc=0.42)
    write_run(tmp_path, "hst_sar_half", model="hst", sar=0.5, acc=0.44)    # a SAR weight no preset has
    table = tables(tmp_path)["ernie_sparse_lra"]
    assert labels(table, OURS_CPU) == [
        "Transformer (softmax)", "Local Attention (local)", "BigBird (bigbird)", HST, ERNIE, BIGBIRD_SAR,
        "HST + R-Drop (hst)"]
    assert row(table, ERNIE, OURS_CPU)["ListOps"] == "39.50 ± 0.71 (n=2)"   # sar and hst_sar: two seeds of it
    assert row(table, HST, OURS_CPU)["ListOps"] == "41.00"
    rdrop = row(table, "HST + R-Drop (hst)", OURS_CPU)
    assert rdrop["ListOps"] == "42.00"
    assert rdrop["Image"] == "run: sparse-run experiment=lra_image_cpu model=hst regulariser=rdrop"
    half = row(table, "softmax · hst · h4 · sar", "ours: other runs (nearest: CPU presets, model=ernie_sparse; "
                                                  "model.regulariser_options.weight=0.5)")
    assert half["ListOps"] == "44.00" and half["Text"] == ""               # no preset: no command
    assert ("HST + R-Drop (hst), ours: CPU presets: `sparse-run -m experiment=lra_listops_cpu,"
            "lra_text_cpu,lra_retrieval_cpu,lra_image_cpu,lra_pathfinder_cpu model=hst "
            "regulariser=rdrop seed=0,1,2`") in table.notes
    assert not [r for r in table.rows if r[1] == OURS_PAPER and "R-Drop" in r[0]]   # only where runs exist


def test_empty_core_cells_give_their_commands(tmp_path: Path, runner_models) -> None:
    runner_models.discard("local")
    write_run(tmp_path, "e")
    table = tables(tmp_path)["ernie_sparse_lra"]
    assert labels(table, OURS_PAPER) == ["Transformer (softmax)", "BigBird (bigbird)", HST, ERNIE, BIGBIRD_SAR]
    assert row(table, HST, OURS_CPU)["ListOps"] == "run: sparse-run experiment=lra_listops_cpu model=hst"
    assert row(table, ERNIE, OURS_PAPER)["Pathfinder"] == \
        "run: sparse-run experiment=lra_pathfinder model=ernie_sparse"
    assert row(table, "Transformer (softmax)", OURS_CPU)["Text"] == "run: sparse-run experiment=lra_text_cpu"
    for cells in (r for r in table.rows if r[1].startswith("ours:")):
        assert all(cell for cell in cells[2:7]), cells   # every empty cell of a core row has its command
    assert ("w/o HST: BigBird + SAR (bigbird_sar), ours: paper presets: `sparse-run -m experiment=lra_listops,"
            "lra_text,lra_retrieval,lra_image,lra_pathfinder model=bigbird_sar seed=0,1,2`") in table.notes


def test_avg_only_with_five_cells_and_substitutes_marked(tmp_path: Path) -> None:
    for i, family in enumerate(FAMILIES):
        for seed in (0, 1):
            write_run(tmp_path, f"e_{family}_{seed}", family, seed=seed, acc=0.30 + 0.1 * i + 0.02 * seed)
        if family != "pathfinder":
            write_run(tmp_path, f"h_{family}", family, model="hst", acc=0.5,
                      data=BBC if family == "lra_text" else None)
    table = tables(tmp_path)["ernie_sparse_lra"]
    ernie = row(table, ERNIE, OURS_CPU)
    assert [ernie[c].split(" ± ")[0] for c in COLUMNS] == ["31.00", "41.00", "51.00", "61.00", "71.00"]
    assert ernie["ListOps"] == "31.00 ± 1.41 (n=2)"
    assert ernie["Avg"] == "51.00"
    hst = row(table, HST, OURS_CPU)
    assert hst["Text"] == "50.00 †"
    assert hst["Pathfinder"] == "run: sparse-run experiment=lra_pathfinder_cpu model=hst" and hst["Avg"] == ""
    # A complete row gets no whole-row command; the incomplete one does.
    assert not any("model=ernie_sparse seed" in note for note in table.notes if "lra_listops_cpu" in note)
    assert any("model=hst seed=0,1,2" in note for note in table.notes)


# ------------------------------------------------------------------------------------- ablation
def test_ablation_differences_beside_the_published_ones(tmp_path: Path) -> None:
    for i, family in enumerate(FAMILIES):
        write_run(tmp_path, f"e_{family}", family, acc=0.40 + 0.1 * i)
        write_run(tmp_path, f"b_{family}", family, model="bigbird_sar", acc=0.39 + 0.1 * i)
    write_run(tmp_path, "h", model="hst", acc=0.35)
    table = tables(tmp_path)["ernie_sparse_ablation"]
    assert table.headers == ["difference", "source", "ListOps", "Avg"]
    assert table.rows[:2] == [["ERNIE-Sparse minus w/o HST", "published: Liu et al. 2022", "+1.78", "+1.00"],
                              ["ERNIE-Sparse minus w/o SAR", "published: Liu et al. 2022", "n/p", "n/p"]]
    assert table.rows[2:] == [
        ["ERNIE-Sparse minus w/o HST (ernie_sparse - bigbird_sar)", OURS_CPU, "+1.00 (40.00 vs 39.00)",
         "+1.00 (60.00 vs 59.00)"],
        ["ERNIE-Sparse minus w/o SAR (ernie_sparse - hst)", OURS_CPU, "+5.00 (40.00 vs 35.00)", ""]]
    assert "removing HST costs 1.00 point of LRA average and 1.78 on ListOps" in notes(table)


def test_no_ablation_of_ours_without_both_cells(tmp_path: Path) -> None:
    write_run(tmp_path, "e", experiment=PAPER["listops"])
    write_run(tmp_path, "h", model="hst")   # CPU preset: another setting than ERNIE-Sparse's run
    table = tables(tmp_path)["ernie_sparse_ablation"]
    assert [r[1] for r in table.rows] == ["published: Liu et al. 2022"] * 2


# ----------------------------------------------------------------------------------- robustness
def test_robustness_table(tmp_path: Path) -> None:
    write_run(tmp_path, "p0", "pathfinder", seed=0, acc=0.70, shifted=0.68, shift=1)
    write_run(tmp_path, "p1", "pathfinder", seed=1, acc=0.72, shifted=0.69, shift=1)
    write_run(tmp_path, "plain", "pathfinder", seed=2, acc=0.71)   # no shifted test: not in this table
    table = tables(tmp_path)["ernie_sparse_robustness"]
    assert table.headers == ["model", "source", "task", "shift", "test acc", "shifted test acc", "worst shift",
                             "change (points)"]
    assert table.rows[:2] == [
        ["ERNIE-Sparse (with SAR)", "published: Liu et al. 2022", "Pathfinder", "n/p", "n/p", "78.77", "n/p", "n/p"],
        ["w/o SAR (HST)", "published: Liu et al. 2022", "Pathfinder", "n/p", "n/p", "75.25", "n/p", "n/p"]]
    assert row(table, ERNIE, OURS_CPU) == {
        "model": ERNIE, "source": OURS_CPU, "task": "Pathfinder", "shift": "1", "test acc": "71.00 ± 1.41 (n=2)",
        "shifted test acc": "68.50 ± 0.71 (n=2)", "worst shift": "", "change (points)": "-2.50 ± 0.71 (n=2)"}
    assert row(table, HST, OURS_CPU)["shifted test acc"] == \
        "run: sparse-run experiment=lra_pathfinder_cpu model=hst trainer.test_topology_shift=1"
    assert row(table, ERNIE, OURS_PAPER)["shifted test acc"] == \
        "run: sparse-run experiment=lra_pathfinder model=ernie_sparse trainer.test_topology_shift=1"
    assert "78.77 with SAR and 75.25 without (3.52 points less degradation)" in notes(table)
    # The shifted test does not change training: the LRA table pools all three runs.
    assert row(tables(tmp_path)["ernie_sparse_lra"], ERNIE, OURS_CPU)["Pathfinder"] == "71.00 ± 1.00 (n=3)"


def test_robustness_rows_per_shift(tmp_path: Path) -> None:
    write_run(tmp_path, "s1", "pathfinder", model="hst", acc=0.70, shifted=0.60, shift=1)
    write_run(tmp_path, "s2", "pathfinder", model="hst", acc=0.70, shifted=0.55, shift=2)
    table = tables(tmp_path)["ernie_sparse_robustness"]
    ours = [(r[3], r[5], r[7]) for r in table.rows if r[0] == HST and r[1] == OURS_CPU]
    assert ours == [("1", "60.00", "-10.00"), ("2", "55.00", "-15.00")]


def test_robustness_rows_of_other_tasks_once_they_measured_the_shift(tmp_path: Path) -> None:
    write_run(tmp_path, "l0", "listops", model="hst", seed=0, acc=0.45, shifted=0.44, shift=1)
    write_run(tmp_path, "l1", "listops", model="hst", seed=1, acc=0.47, shifted=0.44, shift=1)
    write_run(tmp_path, "t", "lra_text", model="hst", acc=0.6)   # no shifted test: no Text row
    table = tables(tmp_path)["ernie_sparse_robustness"]
    tasks = [r[2] for r in table.rows[2:]]   # ours, under the two published rows: in LRA's task order
    assert "Text" not in tasks and tasks.index("ListOps") < tasks.index("Pathfinder")
    listops = [dict(zip(table.headers, r)) for r in table.rows if r[2] == "ListOps"]
    assert listops == [{"model": HST, "source": OURS_CPU, "task": "ListOps", "shift": "1", "test acc": "46.00 ± 1.41 (n=2)",
                        "shifted test acc": "44.00 ± 0.00 (n=2)", "worst shift": "", "change (points)": "-2.00 ± 1.41 (n=2)"}]


def test_a_list_of_shifts_is_a_row_of_its_own_with_the_mean_and_the_worst(tmp_path: Path) -> None:
    shifts = [1, 2, 3, 4, 5, 6, 7]
    write_run(tmp_path, "l0", model="hst", seed=0, acc=0.45, shifted=0.44, worst=0.40, shift=shifts, block=8)
    write_run(tmp_path, "l1", model="hst", seed=1, acc=0.47, shifted=0.46, worst=0.42, shift=shifts, block=8)
    write_run(tmp_path, "s3", model="hst", seed=2, acc=0.46, shifted=0.48, shift=3, block=8)
    table = tables(tmp_path)["ernie_sparse_robustness"]
    listops = {r[3]: dict(zip(table.headers, r)) for r in table.rows if r[2] == "ListOps"}
    assert list(listops) == ["3", "mean over shifts 1–7"]   # one shift first, as it reads today
    assert listops["3"]["shifted test acc"] == "48.00" and listops["3"]["worst shift"] == ""
    assert listops["mean over shifts 1–7"] == {
        "model": listops["3"]["model"], "source": listops["3"]["source"], "task": "ListOps", "shift": "mean over shifts 1–7",
        "test acc": "46.00 ± 1.41 (n=2)", "shifted test acc": "45.00 ± 1.41 (n=2)", "worst shift": "41.00 ± 1.41 (n=2)",
        "change (points)": "-1.00 ± 0.00 (n=2)"}
    assert "mean over its shifts" in notes(table)
    # Testing changes no training: the LRA table pools the three runs, whatever they were tested under.
    assert row(tables(tmp_path)["ernie_sparse_lra"], listops["3"]["model"], listops["3"]["source"])["ListOps"] == \
        "46.00 ± 1.00 (n=3)"


def test_the_command_of_a_list_of_shifts_is_quoted_for_the_shell() -> None:
    assert ernie_sparse.shift_override(3) == "trainer.test_topology_shift=3"
    assert ernie_sparse.shift_override((1, 2, 3)) == "'trainer.test_topology_shift=[1,2,3]'"
    assert ernie_sparse.shifts_text((1, 3, 7)) == "1, 3, 7" and ernie_sparse.shifts_text((2, 3, 4)) == "2–4"


# ------------------------------------------------------------------------------------ sparse-report
def test_sparse_report_writes_the_ernie_sparse_tables(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    write_run(root, "e0", seed=0, acc=0.36)
    write_run(root, "e1", seed=1, acc=0.38)
    assert main([str(root)]) == 0
    md = capsys.readouterr().out
    for title in ("ERNIE-Sparse (Liu et al. 2022) on LRA: published vs ours (test accuracy %)",
                  "ERNIE-Sparse ablations: HST + SAR minus w/o HST and minus w/o SAR (test accuracy points)",
                  "ERNIE-Sparse robustness: test accuracy % under a shifted attention topology"):
        assert f"## {title}" in md
    assert (f"| {ERNIE} | {OURS_CPU} | 37.00 ± 1.41 (n=2) | run: sparse-run experiment=lra_text_cpu "
            "model=ernie_sparse |") in md
    rows = list(csv.reader(io.StringIO((root / "report" / "ernie_sparse_lra.csv").read_text(encoding="utf-8"))))
    assert rows[0] == ["model", "source", *COLUMNS, "Avg"]
    assert ["ERNIE-Sparse", "published: Liu et al. 2022", "n/p", "n/p", "n/p", "n/p", "n/p", "57.78"] in rows
    assert (root / "report" / "ernie_sparse_robustness.tex").is_file()
    assert (root / "report" / "ernie_sparse_ablation.tex").is_file()
