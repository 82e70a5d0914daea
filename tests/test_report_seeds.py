"""Seed sweeps in sparse-report: completed runs that differ only in their seed show as mean ± sample std (n) in
every table, one run as its value alone, and failed or diverged runs are never averaged in."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main, seeds
from sparse_runner.reporting.papers import bhojanapalli2020, correia2019, ernie_sparse, lra
from sparse_runner.reporting.papers.bhojanapalli2020 import bert, lm as bhojanapalli2020_lm
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import STATUS_ORDER
from sparse_runner.reporting.runs_table import runs_tables
from sparse_runner.reporting.values import pct
from test_report import write_run
from test_report_bhojanapalli2020_bert import write_bert_run
from test_report_bhojanapalli2020 import write_lowrank_run
from test_report_bhojanapalli2020_lm import write_lm_run
from test_report_ernie_sparse import write_run as write_ernie_run
from test_report_lra import FAMILIES, write_lra_run
from test_report_translation import CPU_SIZE, write_run as write_translation_run

ACCURACIES = (0.40, 0.42, 0.47)   # three seeds; mean 43.00, sample std 3.61 (population std would be 2.94)
MEAN_STD = "43.00 ± 3.61 (n=3)"


def as_dicts(table: Table) -> list[dict[str, str]]:
    return [dict(zip(table.headers, row)) for row in table.rows]


def test_summary_is_mean_and_sample_std_with_n() -> None:
    assert seeds.summary([0.40, 0.42, 0.47], pct) == MEAN_STD
    assert f"{statistics.stdev(ACCURACIES) * 100:.2f}" == "3.61"
    assert seeds.summary([0.4], pct) == "40.00"                      # one run: no ±, no n
    assert seeds.summary([], pct) == ""
    assert seeds.summary([1.0, -1.0], lambda v: f"{v:+.2f}", lambda v: f"{v:.2f}") == "+0.00 ± 1.41 (n=2)"


def test_diverged_is_a_status_of_its_own_next_to_failed() -> None:
    assert STATUS_ORDER.index("diverged") == STATUS_ORDER.index("failed") + 1


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """`sparse-run -m seed=0,1,2,3,4`: three seeds completed, one failed and one diverged (with numbers that
    would move any mean), plus one run of another configuration."""
    root = tmp_path / "outputs"
    for seed, acc in enumerate(ACCURACIES):
        write_run(root / f"seed={seed}", config_updates={"seed": seed}, overrides=[f"seed={seed}"], test_acc=acc,
                  val_acc=acc - 0.01, tokens_per_second=1000.0 + 100 * seed)
    write_run(root / "seed=3", status="failed", error="CUDA out of memory", config_updates={"seed": 3},
              test_acc=0.99, val_acc=0.99)
    write_run(root / "seed=4", status="diverged", error="loss became non-finite at step 12",
              config_updates={"seed": 4}, test_acc=0.99, val_acc=0.99, step=12)
    write_run(root / "heads=8", config_updates={"model.num_heads": 8}, test_acc=0.5)
    return root


def test_runs_table_has_a_row_per_seed_group(sweep: Path) -> None:
    [table] = runs_tables(collect_runs([sweep]))
    rows = as_dicts(table)
    assert [(r["run"], r["status"]) for r in rows] == [
        ("heads=8", "completed"), ("seed=0; seed=1; seed=2", "completed"), ("seed=3", "failed"),
        ("seed=4", "diverged")]
    lone, group, failed, diverged = rows
    assert group["seed"] == "0,1,2" and group["model.num_heads"] == "4"
    assert group["test acc (%)"] == MEAN_STD
    assert group["best val"] == "42.00 ± 3.61 (n=3)"
    assert group["tokens/s"] == "1100 ± 100 (n=3)"
    assert group["params"] == "123456"              # the config fixes it: shown once
    assert lone["test acc (%)"] == "50.00" and "±" not in "".join(lone.values())
    assert failed["test acc (%)"] == "99.00" and "CUDA out of memory" in failed["note"]
    assert diverged["test acc (%)"] == "99.00" and "non-finite" in diverged["note"]
    assert table.notes == [seeds.NOTE] and "ddof=1" in seeds.NOTE


def test_a_seed_run_twice_counts_once(tmp_path: Path) -> None:
    write_run(tmp_path / "a", test_acc=0.40, val_acc=0.40)
    write_run(tmp_path / "a_again", test_acc=0.90, val_acc=0.10)   # seed 0 again, worse on validation
    [table] = runs_tables(collect_runs([tmp_path]))
    [row] = as_dicts(table)
    assert row["run"] == "a (not counted, a seed run again: a_again)" and row["test acc (%)"] == "40.00"


def test_single_runs_need_no_legend(tmp_path: Path) -> None:
    write_run(tmp_path / "a")
    [table] = runs_tables(collect_runs([tmp_path]))
    assert table.notes == []


def test_report_summary_counts_diverged_runs(sweep: Path, capsys) -> None:
    assert main([str(sweep), "--formats", "md"]) == 0
    md = capsys.readouterr().out
    assert "6 run(s) under" in md and "4 completed, 1 failed, 1 diverged." in md
    assert f"| seed=0; seed=1; seed=2 | completed | softmax · dense · h4 | 4 | 0,1,2 | {MEAN_STD} |" in md


# ------------------------------------------------------------------------------------ LRA Table 1
def write_lra_seeds(root: Path, family: str = "listops", model: str = "softmax", **kwargs) -> None:
    """Three completed seeds of a paper-preset LRA run, one failed and one diverged (at 99 %)."""
    experiment = lra.SETTINGS["paper"]["experiments"][family]
    for seed, acc in enumerate(ACCURACIES):
        run = write_lra_run(root / f"{family}_{model}_s{seed}", family, experiment=experiment, model=model,
                            test_acc=acc, val_acc=acc, overrides=(f"experiment={experiment}", f"seed={seed}"), **kwargs)
        write_seed(run, seed)
    for seed, status in ((3, "failed"), (4, "diverged")):
        write_seed(write_lra_run(root / f"{family}_{model}_{status}", family, experiment=experiment, model=model,
                               test_acc=0.99, val_acc=0.99, status=status, **kwargs), seed)


def write_seed(run_dir: Path, seed: int) -> Path:
    """The seed into a metrics.json written by a helper that has no seed argument."""
    path = run_dir / "metrics.json"
    data = json.loads(path.read_text())
    data["config"]["seed"] = seed
    path.write_text(json.dumps(data))
    return run_dir


def test_lra_cells_and_runs_table_average_the_seeds(tmp_path: Path) -> None:
    write_lra_seeds(tmp_path)
    write_lra_run(tmp_path / "text", "lra_text", experiment="lra_text", test_acc=0.6)
    table1, runs = lra.tables(collect_runs([tmp_path]))
    ours = next(dict(zip(table1.headers, r)) for r in table1.rows if r[1] == "ours: paper presets")
    assert ours["ListOps"] == MEAN_STD and ours["Text"] == "60.00"
    assert seeds.NOTE in table1.notes and seeds.NOTE in runs.notes
    listops, text = as_dicts(runs)
    assert listops["test acc"] == MEAN_STD and listops["best val acc"] == MEAN_STD
    assert listops["run"] == "listops_softmax_s0; listops_softmax_s1; listops_softmax_s2"
    assert listops["overrides"] == "experiment=lra_listops seed=0,1,2" and listops["majority floor"] == "10.00"
    assert text["test acc"] == "60.00"


def test_lra_avg_is_the_mean_of_the_cell_means(tmp_path: Path) -> None:
    write_lra_seeds(tmp_path)
    for family in FAMILIES[1:]:
        write_lra_run(tmp_path / family, family, experiment=lra.SETTINGS["paper"]["experiments"][family],
                      test_acc=0.43)
    ours = next(dict(zip(t.headers, r)) for t in [lra.tables(collect_runs([tmp_path]))[0]] for r in t.rows
                if r[1] == "ours: paper presets")
    assert ours["Avg"] == "43.00"


# ---------------------------------------------------------------------------------- ERNIE-Sparse
def test_ernie_sparse_tables_average_the_seeds(tmp_path: Path) -> None:
    for seed, acc in enumerate(ACCURACIES):
        write_ernie_run(tmp_path, f"e{seed}", "pathfinder", seed=seed, acc=acc, shifted=acc - 0.1 * (seed + 1),
                        shift=1)
    for seed, status in ((3, "failed"), (4, "diverged")):
        write_ernie_run(tmp_path, f"e_{status}", "pathfinder", seed=seed, acc=0.99, shifted=0.99, shift=1,
                        status=status)
    write_ernie_run(tmp_path, "h", "pathfinder", model="hst", acc=0.35)
    tables = {t.slug: t for t in ernie_sparse.tables(collect_runs([tmp_path]))}
    cpu = lra.SETTINGS["cpu"]["label"]

    def ours(table: Table, label: str) -> dict[str, str]:
        return next(d for d in as_dicts(table) if d[table.headers[0]].startswith(label) and cpu in d.values())

    assert ours(tables["ernie_sparse_lra"], "ERNIE-Sparse")["Pathfinder"] == MEAN_STD
    assert ours(tables["ernie_sparse_lra"], "w/o SAR")["Pathfinder"] == "35.00"
    robustness = ours(tables["ernie_sparse_robustness"], "ERNIE-Sparse")
    assert robustness["test acc"] == MEAN_STD and robustness["shifted test acc"] == "23.00 ± 6.56 (n=3)"
    assert robustness["change (points)"] == "-20.00 ± 10.00 (n=3)"
    assert all(seeds.NOTE in table.notes for table in tables.values())


def test_ernie_sparse_ablation_shows_both_cells(tmp_path: Path) -> None:
    for seed, acc in enumerate(ACCURACIES):
        write_ernie_run(tmp_path, f"e{seed}", seed=seed, acc=acc)
    write_ernie_run(tmp_path, "e_diverged", seed=3, acc=0.99, status="diverged")
    write_ernie_run(tmp_path, "h", model="hst", acc=0.35)
    ablation = ernie_sparse.tables(collect_runs([tmp_path]))[1]
    [row] = [r for r in ablation.rows if r[0].startswith("ERNIE-Sparse minus w/o SAR (")]
    assert row[2] == f"+8.00 ({MEAN_STD} vs 35.00)"


# ------------------------------------------------------------------------------ Correia et al. 2019
def test_correia2019_tables_average_the_seeds(tmp_path: Path) -> None:
    for seed, acc in enumerate(ACCURACIES):
        write_translation_run(tmp_path, f"s{seed}", model="softmax", size=CPU_SIZE, seed=seed, test_bleu=100 * acc,
                              val_bleu=100 * acc, tokens_per_second=1000.0 + 100 * seed, analysis=False)
    for seed, status in ((3, "failed"), (4, "diverged")):
        write_translation_run(tmp_path, status, model="softmax", size=CPU_SIZE, seed=seed, status=status,
                              test_bleu=99.0, val_bleu=99.0, analysis=False)
    write_translation_run(tmp_path, "e", model="entmax", size=CPU_SIZE, test_bleu=40.0, tokens_per_second=880.0,
                          analysis=False)
    table1, runs = correia2019.tables(collect_runs([tmp_path]))
    bible = {r[0]: r[-1] for r in table1.rows}
    assert bible["softmax"] == MEAN_STD and bible["α-entmax"] == "40.00"
    softmax, entmax = as_dicts(runs)
    assert softmax["BLEU (tok.)"] == MEAN_STD and softmax["tokens/s"] == "1100 ± 100 (n=3)"
    assert softmax["run"] == "s0; s1; s2" and softmax["speed vs softmax (%)"] == "100"
    assert entmax["BLEU (tok.)"] == "40.00" and entmax["speed vs softmax (%)"] == "80"   # 880 / mean 1100
    assert seeds.NOTE in table1.notes and seeds.NOTE in runs.notes


# ------------------------------------------------------------------------ Bhojanapalli et al. 2020
def test_bert_tables_average_the_seeds(tmp_path: Path) -> None:
    for seed, acc in enumerate(ACCURACIES):
        write_bert_run(tmp_path / f"squad_s{seed}", "squad", experiment=bert.TABLE1.experiment, heads=16, seed=seed,
                       scores=(100 * acc, 100 * acc - 10))
    for seed, status in ((3, "failed"), (4, "diverged")):
        write_bert_run(tmp_path / f"squad_{status}", "squad", experiment=bert.TABLE1.experiment, heads=16,
                       seed=seed, status=status)
    write_bert_run(tmp_path / "mnli", "mnli", experiment=bert.TABLE1.experiment, heads=16, scores=(0.84, 0.83))
    table = bert.tables(collect_runs([tmp_path]))[0]
    h16 = next(d for d in as_dicts(table) if d["heads"] == "16" and d["ours (setting, init)"] == "GPU preset, pre-trained")
    assert h16["SQuAD F1 ours"] == MEAN_STD and h16["SQuAD EM ours"] == "33.00 ± 3.61 (n=3)"
    assert h16["MNLI-m ours"] == "84.00" and h16["MNLI-mm ours"] == "83.00"
    assert seeds.NOTE in table.notes


def test_lm_head_sweep_averages_the_seeds(tmp_path: Path) -> None:
    for seed, ppl in enumerate((40.0, 42.0, 47.0)):
        write_seed(write_lm_run(tmp_path / f"h2_s{seed}", heads=2, head_size=None, ppl=ppl), seed)
    for seed, status in ((3, "failed"), (4, "diverged")):
        write_seed(write_lm_run(tmp_path / f"h2_{status}", heads=2, head_size=None, ppl=1.0, status=status), seed)
    write_lm_run(tmp_path / "h8", heads=8, head_size=None, ppl=30.0)
    [table] = bhojanapalli2020_lm.lm_tables(collect_runs([tmp_path]))
    assert [row[:2] for row in table.rows] == [["2", "43.00 ± 3.61 (n=3)"], ["8", "30.00"]]
    assert seeds.NOTE in " ".join(table.notes)


def test_lowrank_tables_average_the_seeds(tmp_path: Path) -> None:
    for seed, kl in enumerate(ACCURACIES):
        set_kl(write_seed(write_lowrank_run(tmp_path / f"s{seed}"), seed), kl)
    set_kl(write_seed(write_lowrank_run(tmp_path / "diverged"), 3), 0.99, status="diverged")
    sweep, multihead = bhojanapalli2020.tables(collect_runs([tmp_path]))[:2]
    assert sweep.headers[1] == "s0; s1; s2 (n=4, d=8)"
    assert sweep.rows[0][1] == "4.30e-01 ± 3.61e-02 (n=3)"
    assert multihead.rows[0][0] == "s0; s1; s2" and multihead.rows[0][3] == "1.00e-14 ± 0.00e+00 (n=3)"
    assert seeds.NOTE in " ".join(sweep.notes) and seeds.NOTE in multihead.notes


def set_kl(run_dir: Path, kl: float, status: str = "completed") -> None:
    """KL at d_p = 1 (the first row of the sweep table) and the run's status."""
    path = run_dir / "metrics.json"
    data = json.loads(path.read_text())
    data["metrics"]["test/kl/dp_1"] = kl
    data["status"] = status
    path.write_text(json.dumps(data))
