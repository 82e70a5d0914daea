"""The claims table: Welch's interval against scipy's t-test, the verdict rule on every side of its
thresholds, and ERNIE-Sparse's claims filled from fake LRA runs (arms = the LRA table's cells)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats

from sparse_runner.reporting import collect_runs
from sparse_runner.reporting.claims import (
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    NOT_RUN,
    Arm,
    Claim,
    claims_table,
    compute_time,
    evaluate,
    verdict,
    welch_interval,
)
from sparse_runner.reporting.papers import all_claims, ernie_sparse
from test_report_ernie_sparse import runner_models, write_run  # noqa: F401 (runner_models: autouse fixture)


def test_welch_interval_is_scipys():
    a, b = [45.9, 46.3, 45.2], [45.1, 45.5, 44.2, 45.0]
    diff, low, high = welch_interval(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(sum(a) / 3 - sum(b) / 4)
    assert (low, high) == pytest.approx((ci.low, ci.high))


def test_welch_interval_needs_two_values_per_arm():
    with pytest.raises(ValueError, match="at least 2 values per arm, got 1 and 3"):
        welch_interval([1.0], [1.0, 2.0, 3.0])
    assert welch_interval([2.0, 2.0], [1.0, 1.0]) == (1.0, 1.0, 1.0)   # no spread: the difference itself


def claim(kind="greater", margin=0.0, published_effect=None) -> Claim:
    arm = Arm("x", lambda records: [], "sparse-run -m seed=0,1,2")
    return Claim("paper", "statement", "1.0", "task", arm, arm, lambda rec: None, kind=kind, margin=margin,
                 published_effect=published_effect)


@pytest.mark.parametrize("low, high, expected", [
    (0.1, 2.0, HELD), (-0.1, 2.0, INCONCLUSIVE), (-2.0, -0.1, NOT_HELD), (0.0, 1.0, INCONCLUSIVE),
])
def test_greater(low, high, expected):
    assert verdict(claim(), low, high) == expected


@pytest.mark.parametrize("low, high, expected", [
    (0.2, 0.5, HELD),            # a smaller effect than published, but positive: the direction holds
    (-0.3, 0.4, NOT_HELD),       # excludes the published 1.78 and does not show a positive effect
    (-0.3, 2.0, INCONCLUSIVE),   # wide enough to hold the published effect
])
def test_greater_against_a_published_effect(low, high, expected):
    assert verdict(claim(published_effect=1.78), low, high) == expected


@pytest.mark.parametrize("low, high, expected", [
    (-0.5, 0.9, HELD), (-1.5, 0.5, INCONCLUSIVE), (1.1, 2.0, NOT_HELD), (-3.0, -1.2, NOT_HELD), (-2.0, 2.0, INCONCLUSIVE),
])
def test_within(low, high, expected):
    assert verdict(claim("within", margin=1.0), low, high) == expected


def test_compute_is_cpu_time_on_a_cpu_and_wall_time_on_a_gpu():
    """A paused or shared CPU run's wall time is mostly waiting; its CPU time is what it cost."""
    from types import SimpleNamespace as Run

    cpu = Run(data={"device": "cpu", "cpu_time_s": 600.0, "wall_time_s": 4000.0})
    gpu = Run(data={"device": "cuda", "cpu_time_s": 90.0, "wall_time_s": 300.0})
    old = Run(data={"device": "cpu", "wall_time_s": 50.0})   # a record without CPU time: its wall time
    assert compute_time([cpu, gpu, old]) == 950.0


def test_compute_counts_each_pre_training_stage_once():
    """A fine-tuning run's times are its own; the stage it started from is added once, however many runs share it."""
    from types import SimpleNamespace as Run

    stage = {"run_dir": "outputs/pretrain/mlm_a", "device": "cpu", "cpu_time_s": 1000.0, "wall_time_s": 5000.0}
    squad = Run(data={"device": "cpu", "cpu_time_s": 300.0, "pretraining": stage})
    mnli = Run(data={"device": "cpu", "cpu_time_s": 200.0, "pretraining": dict(stage)})
    other = Run(data={"device": "cpu", "cpu_time_s": 100.0, "pretraining": {**stage, "run_dir": "outputs/pretrain/mlm_b"}})
    scratch = Run(data={"device": "cpu", "cpu_time_s": 50.0, "pretraining": None})
    assert compute_time([squad, mnli, other, scratch]) == 300 + 200 + 100 + 50 + 1000 + 1000


# ----------------------------------------------------------------------------- ERNIE-Sparse's claims
def ernie_claims(root: Path):
    records = collect_runs([root])
    return {c.setting + " | " + c.statement: (c, evaluate(c, records)) for c in ernie_sparse.CLAIMS}, records


def test_ernie_sparse_claims_take_the_lra_cells_runs(tmp_path: Path):
    for seed, (full, bigbird) in enumerate([(0.46, 0.44), (0.47, 0.45), (0.465, 0.445)]):
        write_run(tmp_path, f"e{seed}", model="ernie_sparse", seed=seed, acc=full, block=8, shift=3, shifted=full - 0.01)
        write_run(tmp_path, f"b{seed}", model="bigbird", seed=seed, acc=bigbird, block=8, shift=3)
        write_run(tmp_path, f"h{seed}", model="hst", seed=seed, acc=full, block=8, shift=3, shifted=full - 0.03)
    write_run(tmp_path, "preset", model="bigbird", seed=3, acc=0.8)                   # blocks of 64: not ListOps' arm
    write_run(tmp_path, "other", model="bigbird", seed=5, acc=0.9, block=8, lr=0.5)   # another lr: never an arm
    write_run(tmp_path, "text", "lra_text", model="bigbird", seed=0, acc=0.6)         # Text: its preset
    found, records = ernie_claims(tmp_path)
    listops_vs_bigbird, evidence = found["ListOps, CPU preset with blocks of 8 | ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA"]
    assert sorted(evidence.treatment) == pytest.approx([46.0, 46.5, 47.0])
    assert sorted(evidence.baseline) == pytest.approx([44.0, 44.5, 45.0])
    assert evidence.difference == pytest.approx(2.0) and evidence.verdict == HELD
    robust = found["ListOps, CPU preset with blocks of 8, shifted by 3 | SAR makes the model robust to a shifted topology (accuracy change under the shift)"][1]
    assert robust.treatment == pytest.approx([-1.0] * 3) and robust.baseline == pytest.approx([-3.0] * 3)
    # no spread in either arm (but float rounding): no interval, whatever the difference
    assert robust.verdict == INCONCLUSIVE and robust.low is None and robust.difference == pytest.approx(2.0)
    assert robust.note == "no interval: every seed of the treatment and of the baseline gave the same value"
    assert found["ListOps, CPU preset with blocks of 8 | Removing HST (BigBird + SAR) costs accuracy"][1].verdict == NOT_RUN
    text = found["Text, CPU preset | ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA"][1]
    assert text.verdict == NOT_RUN and text.baseline == pytest.approx([60.0])

    table = all_claims.tables(records)[0]
    assert table.slug == "claims" and table.headers[-2:] == ["verdict", "compute"]
    first = next(dict(zip(table.headers, r)) for r in table.rows if r[0].startswith("ERNIE-Sparse (HST + SAR) is more"))
    assert first["result"].startswith("+2.00 [") and first["verdict"] == HELD
    assert first["treatment"] == "ERNIE-Sparse: 46.50 ± 0.50 (n=3)"
    notes = "\n".join(table.notes)
    assert ("`sparse-run -m experiment=lra_listops_cpu model=bigbird_sar model.pattern_options.block_size=8 "
            "trainer.test_topology_shift=3 seed=0,1,2`") in notes
    assert "`sparse-run -m experiment=lra_text_cpu model=ernie_sparse trainer.test_topology_shift=1 seed=0,1,2`" in notes


def test_one_seed_gives_a_difference_without_a_verdict(tmp_path: Path):
    write_run(tmp_path, "e", model="ernie_sparse", acc=0.46, block=8)
    write_run(tmp_path, "b", model="bigbird", acc=0.44, block=8)
    found, records = ernie_claims(tmp_path)
    evidence = found["ListOps, CPU preset with blocks of 8 | ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA"][1]
    assert evidence.verdict == INCONCLUSIVE and evidence.low is None and evidence.difference == pytest.approx(2.0)
    table = claims_table(ernie_sparse.CLAIMS, records)
    assert table.rows[0][6] == "+2.00 (too few seeds for an interval)"


@pytest.mark.parametrize("ernie, bigbird, constant", [
    ((0.46, 0.46), (0.44, 0.44), "the treatment and of the baseline"),   # two arms of identical numbers
    ((0.46, 0.46, 0.46), (0.40, 0.41, 0.40), "the treatment"),          # the other arm alone: [+4.2, +7.1]
    ((0.46, 0.47, 0.46), (0.40, 0.40, 0.40), "the baseline"),
])
def test_an_arm_without_spread_is_inconclusive(tmp_path: Path, ernie, bigbird, constant):
    """Welch's interval over seeds that all gave one value has zero width: it would call any difference certain."""
    for seed, (e, b) in enumerate(zip(ernie, bigbird)):
        write_run(tmp_path, f"e{seed}", model="ernie_sparse", seed=seed, acc=e, block=8)
        write_run(tmp_path, f"b{seed}", model="bigbird", seed=seed, acc=b, block=8)
    found, records = ernie_claims(tmp_path)
    evidence = found["ListOps, CPU preset with blocks of 8 | ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA"][1]
    assert evidence.verdict == INCONCLUSIVE and evidence.low is None and evidence.difference > 0
    note = f"no interval: every seed of {constant} gave the same value"
    assert evidence.note == note
    row = claims_table(ernie_sparse.CLAIMS, records).rows[0]
    assert row[6] == f"{evidence.difference:+.2f} ({note})" and row[8] == INCONCLUSIVE


@pytest.mark.parametrize("differences, expected", [((0.2, 0.2, 0.2), INCONCLUSIVE), ((0.2, 0.3, 0.25), HELD)])
def test_a_paired_claim_without_spread_is_inconclusive(differences, expected):
    """Correia's paired claims (one number of a run against another) follow the same rule."""
    from types import SimpleNamespace as Run

    from sparse_runner.reporting.papers.correia2019.claims import PairedClaim

    runs = [Run(data={}, first=0.5 + d, second=0.5) for d in differences]
    claim = PairedClaim("paper", "statement", "1.0", "task", Arm("x", lambda records: records, "sparse-run"),
                        ("first", lambda rec: rec.first), ("second", lambda rec: rec.second))
    row = claim.row(runs)
    assert row.verdict == expected
    if expected == INCONCLUSIVE:
        assert row.difference == "+0.20 (no interval: every seed gave the same difference)"


def test_seeds_executed_another_way_stay_one_arm(tmp_path: Path):
    """A seed whose run took another attention path threshold (model.memory_efficient_from, an execution key like
    precision) is still a seed of its arm: three seeds, not the best of two groups."""
    for seed, acc in enumerate((0.45, 0.46, 0.47)):
        for name, model in (("e", "ernie_sparse"), ("b", "bigbird")):
            run_dir = write_run(tmp_path, f"{name}{seed}", model=model, seed=seed, acc=acc, block=8)
            if seed == 2:
                metrics = json.loads((run_dir / "metrics.json").read_text())
                metrics["config"]["model"]["memory_efficient_from"] = 1024
                (run_dir / "metrics.json").write_text(json.dumps(metrics))
    found, _ = ernie_claims(tmp_path)
    evidence = found["ListOps, CPU preset with blocks of 8 | ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA"][1]
    assert len(evidence.treatment) == len(evidence.baseline) == 3
    assert evidence.difference == pytest.approx(0.0) and evidence.low is not None


def test_kept_results_give_the_same_claims(tmp_path: Path):
    """scripts/keep_results.py: the committed evidence regenerates the verdicts without the run folders."""
    import subprocess
    import sys

    runs = tmp_path / "outputs"
    for seed, acc in enumerate([0.46, 0.47, 0.465]):
        write_run(runs, f"e{seed}", model="ernie_sparse", seed=seed, acc=acc, block=8)
        write_run(runs, f"b{seed}", model="bigbird", seed=seed, acc=acc - 0.02, block=8)
    write_run(runs, "failed", model="bigbird", seed=7, status="failed")
    kept = tmp_path / "kept"
    script = Path(__file__).parent.parent / "scripts" / "keep_results.py"
    done = subprocess.run([sys.executable, str(script), str(kept), *map(str, sorted(runs.iterdir()))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "kept 6 run(s)" in done.stdout and "failed: status 'failed', not completed" in done.stderr
    assert sorted(p.parent.name for p in kept.glob("*/metrics.json")) == ["b0", "b1", "b2", "e0", "e1", "e2"]
    before = claims_table(ernie_sparse.CLAIMS, collect_runs([runs]))
    after = claims_table(ernie_sparse.CLAIMS, collect_runs([kept]))
    assert after.rows == before.rows and after.rows[0][8] == HELD


def test_kept_results_with_log(tmp_path: Path):
    """--with-log keeps log.jsonl and figures/*.png beside metrics.json, never checkpoints; without it, neither."""
    import subprocess
    import sys

    run = write_run(tmp_path / "outputs", "e0", model="ernie_sparse", seed=0, acc=0.46, block=8)
    (run / "log.jsonl").write_text('{"step": 20, "alpha/encoder_self/0": [1.4, 1.6]}\n')
    (run / "figures").mkdir()
    (run / "figures" / "alpha_trajectories.png").write_bytes(b"\x89PNG fake")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"weights")
    script = Path(__file__).parent.parent / "scripts" / "keep_results.py"
    for flag, kept in (([], tmp_path / "plain"), (["--with-log"], tmp_path / "logged")):
        done = subprocess.run([sys.executable, str(script), *flag, str(kept), str(run)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    files = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())  # noqa: E731
    assert files(tmp_path / "plain") == [f"{run.name}/metrics.json"]
    assert files(tmp_path / "logged") == [f"{run.name}/figures/alpha_trajectories.png", f"{run.name}/log.jsonl",
                                          f"{run.name}/metrics.json"]
    kept_run = tmp_path / "logged" / run.name
    assert (kept_run / "log.jsonl").read_bytes() == (run / "log.jsonl").read_bytes()
    assert (kept_run / "figures" / "alpha_trajectories.png").read_bytes() == b"\x89PNG fake"


# ----------------------------------------------------------------------------- Theorem 1's cliff
def lowrank_runs(root: Path, at_cliff: list[tuple[float, float]]):
    """One lowrank run per seed (n = 4): KL(d_p = n - 2) and the worst KL at d_p >= n - 1 as given."""
    import json

    from test_report_bhojanapalli2020 import N, write_lowrank_run

    for seed, (below, above) in enumerate(at_cliff):
        run_dir = write_lowrank_run(root / f"s{seed}")
        data = json.loads((run_dir / "metrics.json").read_text())
        data["seed"], data["config"]["seed"] = seed, seed
        data["metrics"][f"test/kl/dp_{N - 2}"] = below
        data["metrics"][f"test/kl/dp_{N + 1}"] = above
        (run_dir / "metrics.json").write_text(json.dumps(data))
    return collect_runs([root])


@pytest.mark.parametrize("at_cliff, expected", [
    ([(1e-3, 1e-9), (2e-3, 1e-7), (1e-3, 1e-12)], HELD),       # every seed drops >= 100x
    ([(1e-3, 1e-9), (2e-3, 1e-4)], INCONCLUSIVE),                # one seed drops 20x only
    ([(1e-3, 5e-4), (1e-3, 2e-4)], NOT_HELD),                    # no cliff in any seed
    ([(1e-3, 1e-9)], INCONCLUSIVE),                              # one seed
])
def test_the_low_rank_cliff(tmp_path: Path, at_cliff, expected):
    from sparse_runner.reporting.papers import bhojanapalli2020

    row = bhojanapalli2020.LowRankCliff().row(lowrank_runs(tmp_path, at_cliff))
    assert row.verdict == expected
    ratio = min(below / above for below, above in at_cliff)
    assert row.difference == f"cliff ratio >= {ratio:.3g} (every seed)"
    assert bool(row.commands) == (len(at_cliff) < 3)
    assert bhojanapalli2020.LowRankCliff().row([]).verdict == NOT_RUN
