"""The claims table: Welch's interval against scipy's t-test, the verdict rule on every side of its
thresholds, and ERNIE-Sparse's claims filled from fake LRA runs (arms = the LRA table's cells)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
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
    Design,
    Estimate,
    TrendClaim,
    claims_table,
    compute_time,
    decide,
    evaluate,
    excludes_sesoi,
    holm,
    ols_slope,
    p_value,
    published_text,
    runs_needed,
    welch,
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


def design(hypothesis="superiority", margin=0.0, sesoi=1.0, family="f", test="Welch t", **more) -> Design:
    return Design("test accuracy", test, sesoi=sesoi, family=family, hypothesis=hypothesis, margin=margin,
                  pairing="the seed" if test == "paired t" else "", **more)


def fake_runs(values, name: str) -> list:
    """Runs of one arm, one per seed, reading `value`."""
    from types import SimpleNamespace as Run

    return [Run(path=Path(f"/runs/{name}{seed}"), data={"seed": seed}, config={}, value=value,
                test_examples="no per-example record") for seed, value in enumerate(values)]


def arms_claim(treatment, baseline, the_design: Design, statement="statement") -> Claim:
    ours, theirs = fake_runs(treatment, "t"), fake_runs(baseline, "b")
    return Claim("paper", statement, "1.0", "task", Arm("treatment", lambda records: ours, "cmd-t"),
                 Arm("baseline", lambda records: theirs, "cmd-b"), lambda rec: rec.value, the_design)


TIGHT = [0.0, 0.1, -0.1]   # sd 0.1: with three seeds on each side the interval is +-0.23


def test_a_planned_claim_is_tested_only_once_every_arm_has_its_runs():
    """`planned`: a confirmatory study's runs per arm, fixed in advance. Short of them in either arm, the claim shows
    the difference without a test, an interval or a seeds × examples cell, and keeps asking for its command."""
    def planned(treatment, baseline) -> Claim:
        claim = arms_claim(treatment, baseline, design())
        return Claim(claim.paper, claim.statement, claim.published, claim.setting, claim.treatment,
                     Arm("baseline", claim.baseline.runs, "cmd-t"), claim.read, claim.design, planned=4)

    early = planned([v + 2.0 for v in TIGHT], TIGHT)                    # held at 3 runs, were it a pilot
    assert evaluate(arms_claim([v + 2.0 for v in TIGHT], TIGHT, design()), []).verdict == HELD
    found = evaluate(early, [])
    assert found.verdict == INCONCLUSIVE and found.p is None and found.low is None and found.found is None
    assert found.difference == pytest.approx(2.0)
    assert found.note == "3 of 4 pre-registered runs per arm: no test before all have run"
    row = early.row([])
    assert row.difference == "+2.00 (3 of 4 pre-registered runs per arm: no test before all have run)"
    assert row.commands == ["cmd-t"] and row.examples == ""             # one command for both arms, asked once
    lopsided = evaluate(planned([v + 2.0 for v in [*TIGHT, 0.05]], TIGHT), [])
    assert lopsided.note == "4 and 3 of 4 pre-registered runs per arm: no test before all have run"
    complete = planned([v + 2.0 for v in [*TIGHT, 0.05]], [*TIGHT, 0.05])
    assert evaluate(complete, []).verdict == HELD and complete.row([]).commands == []


@pytest.mark.parametrize("shift, expected", [
    (2.0, HELD),                # [+1.77, +2.23]: above 0
    (0.1, NOT_HELD),            # [-0.13, +0.33]: below the SESOI of 1
    (-2.0, NOT_HELD),           # below 0, so below the SESOI too
    (0.9, HELD),                # [+0.67, +1.13]: a positive effect, held though it may be below the SESOI
])
def test_superiority_on_constructed_arms(shift, expected):
    found = evaluate(arms_claim([v + shift for v in TIGHT], TIGHT, design()), [])
    assert found.verdict == expected
    treatment = [v + shift for v in TIGHT]
    assert found.p == pytest.approx(stats.ttest_ind(treatment, TIGHT, equal_var=False, alternative="greater").pvalue)


def test_a_wide_interval_is_inconclusive_and_says_how_many_seeds_would_decide_it():
    wide = arms_claim([1.0, 3.0, 2.0], [0.0, 2.0, 1.0], design())   # +1 [-1.27, +3.27]: reaches 0 and the SESOI
    found = evaluate(wide, [])
    assert found.verdict == INCONCLUSIVE and found.low < 0 < 1 < found.high
    row = claims_table([wide], []).rows[0]
    cells = dict(zip(claims_table([wide], []).headers, row))
    assert cells["verdict"] == INCONCLUSIVE
    assert cells["n needed"] == "underpowered: 17 per arm would decide it (has 3)"   # sd 1 per arm, SESOI 1


@pytest.mark.parametrize("low, high, excluded", [
    (-1.0, 0.999, True), (-1.0, 1.0, False), (-1.0, 1.001, False),
])
def test_not_held_is_an_interval_below_the_sesoi(low, high, excluded):
    assert excludes_sesoi(design(sesoi=1.0), low, high) is excluded
    assert decide(0.5, excludes_sesoi(design(sesoi=1.0), low, high)) == (NOT_HELD if excluded else INCONCLUSIVE)


def test_held_is_p_below_0025_exactly_where_the_95_interval_leaves_zero():
    """One-sided p < 0.025 in the claimed direction and a 95 % interval above 0 are the same statement."""
    df = 4.0
    edge = float(stats.t.ppf(0.975, df))
    for effect, expected in ((edge * 1.001, HELD), (edge * 0.999, INCONCLUSIVE)):
        found = Estimate(effect, 1.0, df, 3, lambda n: (1.0, df))
        low, _ = found.interval()
        assert (low > 0) == (expected == HELD)
        assert decide(p_value(design(sesoi=100.0), found), False) == expected


@pytest.mark.parametrize("shift, spread, expected", [
    (0.1, TIGHT, HELD),                        # [-0.13, +0.33]: inside +-1
    (3.0, TIGHT, NOT_HELD),                    # [+2.77, +3.23]: outside
    (-3.0, TIGHT, NOT_HELD),
    (0.0, [0.0, 2.0, -2.0], INCONCLUSIVE),     # [-4.5, +4.5]: reaches both sides
])
def test_equivalence_on_constructed_arms(shift, spread, expected):
    found = evaluate(arms_claim([v + shift for v in spread], TIGHT, design("equivalence", margin=1.0)), [])
    assert found.verdict == expected
    treatment = [v + shift for v in spread]
    tost = max(stats.ttest_ind([v + 1.0 for v in treatment], TIGHT, equal_var=False, alternative="greater").pvalue,
               stats.ttest_ind([v - 1.0 for v in treatment], TIGHT, equal_var=False, alternative="less").pvalue)
    assert found.p == pytest.approx(tost)


@pytest.mark.parametrize("shift, spread, expected", [
    (-0.5, TIGHT, HELD),                       # [-0.73, -0.27]: above -1
    (3.0, TIGHT, HELD),                        # better by far: not inferior
    (-3.0, TIGHT, NOT_HELD),                   # [-3.23, -2.77]: below -1
    (-1.0, [0.0, 2.0, -2.0], INCONCLUSIVE),
])
def test_non_inferiority_on_constructed_arms(shift, spread, expected):
    found = evaluate(arms_claim([v + shift for v in spread], TIGHT, design("non-inferiority", margin=1.0)), [])
    assert found.verdict == expected
    treatment = [v + shift + 1.0 for v in spread]
    assert found.p == pytest.approx(stats.ttest_ind(treatment, TIGHT, equal_var=False, alternative="greater").pvalue)


def test_a_paired_design_pairs_by_seed():
    treatment, baseline = [5.0, 3.0, 4.1, 9.0], [4.0, 2.1, 3.0]   # seed 3 has no partner: left out
    found = evaluate(arms_claim(treatment, baseline, design(test="paired t")), [])
    assert found.p == pytest.approx(stats.ttest_rel(treatment[:3], baseline, alternative="greater").pvalue)
    assert found.difference == pytest.approx(1.0) and found.verdict == HELD
    one_pair = evaluate(arms_claim([5.0, 3.0], [4.0], design(test="paired t")), [])
    assert one_pair.verdict == INCONCLUSIVE and one_pair.note == "1 seed(s) in both arms: too few pairs for an interval"


def test_holm_by_hand():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (never below the step before)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])   # capped at 1
    assert holm([0.02]) == [0.02]


def test_the_table_holds_a_claim_by_its_holm_p_within_its_family():
    """A claim held alone (p 0.017) but not after Holm's adjustment over its family of three (second smallest p,
    times 2: 0.035): inconclusive; the same claim in a family of its own stays held."""
    borderline = [0.35, 0.5, 0.2]
    a = arms_claim([v + 0.75 for v in TIGHT], TIGHT, design(sesoi=0.5, family="one"), "a")
    b = arms_claim(borderline, TIGHT, design(sesoi=0.05, family="one"), "b")
    c = arms_claim([v + 5.0 for v in [0.0, 3.0, -3.0]], TIGHT, design(sesoi=100.0, family="one"), "c")
    p_a, p_b, p_c = (evaluate(claim, []).p for claim in (a, b, c))
    assert p_b == pytest.approx(0.0174, abs=1e-4) and evaluate(b, []).verdict == HELD
    assert holm([p_a, p_b, p_c])[1] == pytest.approx(2 * p_b)
    table = claims_table([a, b, c], [])
    rows = {r[0]: dict(zip(table.headers, r)) for r in table.rows}
    assert rows["b"]["verdict"] == INCONCLUSIVE and rows["b"]["p"] == f"{p_b:.3g}" and rows["b"]["Holm p"] == f"{2 * p_b:.3g}"
    assert rows["b"]["n needed"].startswith("held alone (p < 0.025), not after Holm's adjustment")
    assert rows["a"]["verdict"] == HELD
    alone = arms_claim(borderline, TIGHT, design(sesoi=0.05, family="its own"), "b")
    assert claims_table([a, alone, c], []).rows[1][8] == HELD


def test_a_claim_without_a_p_counts_as_p_1_in_its_family():
    a = arms_claim([v + 0.75 for v in TIGHT], TIGHT, design(family="one"), "a")
    none = arms_claim([], TIGHT, design(family="one"), "not run")
    table = claims_table([a, none], [])
    assert table.rows[0][11] == f"{holm([evaluate(a, []).p, 1.0])[0]:.3g}" and table.rows[1][8] == NOT_RUN


def test_runs_needed_by_hand():
    """sd 1 in both arms, SESOI 1, one-sided 0.025, 80 % power: (t(0.975, df) + t(0.8, df)) * sqrt(2 / n) <= 1 first at
    n = 17 (df 32: 2.037 + 0.853 = 2.890, times 0.343 = 0.991; n = 16, df 30: 2.896 * 0.354 = 1.024)."""
    found = welch([1.0, 3.0, 2.0], [0.0, 2.0, 1.0])
    assert runs_needed(design(sesoi=1.0), found) == 17
    se, df = found.at(17)
    assert (se, df) == pytest.approx((math.sqrt(2 / 17), 32.0))
    power = 1 - stats.nct.cdf(stats.t.ppf(0.975, df), df, 1.0 / se)   # the noncentral t's power at the SESOI
    assert 0.80 <= power < 0.82
    assert runs_needed(design(sesoi=1.0), found, alpha=0.025 / 5) > 17    # a family of five asks for more
    assert runs_needed(design(sesoi=1e-4), found) is None                 # beyond MAX_N


def test_a_design_refuses_what_it_cannot_mean():
    with pytest.raises(ValueError, match=r"^claim design: a non-inferiority claim needs a positive margin, got 0.0$"):
        design("non-inferiority")
    with pytest.raises(ValueError, match="sesoi must be a positive number"):
        design(sesoi=0.0)
    with pytest.raises(ValueError, match="test 'z' is not one of Welch t, paired t, trend, own rule"):
        Design("m", "z", sesoi=1.0, family="f")   # type: ignore[arg-type]
    with pytest.raises(ValueError, match="published_comparable needs the published_effect"):
        design(published_comparable=True)


def test_the_published_size_is_compared_only_where_the_settings_match():
    comparable = design(published_comparable=True, published_effect=1.78, published_source="Table 3")
    assert published_text(comparable, 0.9) == "ours +0.90 against published +1.78 (Table 3)"
    other = design(published_effect=3.6, published_source="en→de")
    assert published_text(other, 24.5) == "direction only, the setting differs: published +3.60 (en→de); ours is 6.8× it"
    assert published_text(design(), 1.0) == "no single published effect"


# ----------------------------------------------------------------------------- the trend test
def trend_runs(points: dict[str, list[tuple[float, float]]]) -> list:
    from types import SimpleNamespace as Run

    return [Run(path=Path(f"/runs/{name}{i}"), data={"ppl": y}, config={"log2_heads": x})
            for name, pts in points.items() for i, (x, y) in enumerate(pts)]


STANDARD = [(1, 10.0), (1, 11.0), (3, 12.0), (3, 12.5), (5, 14.0), (5, 15.0)]
FIXED = [(1, 10.0), (1, 11.0), (3, 10.5), (3, 10.0), (5, 10.0), (5, 11.0)]


def test_the_slope_by_hand():
    """x 1, 1, 3, 3, 5, 5 (mean 3, Sxx 16); y 10, 11, 12, 12.5, 14, 15 (mean 74.5 / 6): Sxy 16, so the slope is
    1 and the intercept 9.4167; the residuals are -5/12, 7/12, -5/12, 1/12, -5/12, 7/12 (SSE 174/144), so the
    slope's se is sqrt(174/144 / 4 / 16)."""
    fit = ols_slope([x for x, _ in STANDARD], [y for _, y in STANDARD])
    assert fit.slope == pytest.approx(1.0) and fit.intercept == pytest.approx(74.5 / 6 - 3)
    assert fit.se == pytest.approx(math.sqrt(174 / 144 / 4 / 16))
    assert fit.se == pytest.approx(stats.linregress([x for x, _ in STANDARD], [y for _, y in STANDARD]).stderr)


def test_the_trend_claim_compares_the_slopes():
    """Both fits have SSE 174/144 (FIXED: slope 0), so the difference 1 has se sqrt(2) * 0.1374 and
    Welch-Satterthwaite df (2v)^2 / (v^2 / 4 + v^2 / 4) = 8."""
    runs = trend_runs({"s": STANDARD, "f": FIXED})
    arm = lambda name: Arm(name, lambda records: [r for r in records if r.path.name.startswith(name)], f"cmd {name}")  # noqa: E731
    claim = TrendClaim("paper", "standard degrades faster", "plots", "task", arm("s"), arm("f"),
                       lambda rec: rec.config["log2_heads"], "per doubling", lambda rec: rec.data["ppl"],
                       design(test="trend", sesoi=0.25))
    row = claim.row(runs)
    se = math.sqrt(2 * 174 / 144 / 4 / 16)
    half = stats.t.ppf(0.975, 8) * se
    assert row.difference == f"+1.00 [{1 - half:+.2f}, {1 + half:+.2f}] per doubling"
    assert row.p == pytest.approx(stats.t.sf(1.0 / se, 8)) and row.verdict == HELD
    assert row.treatment.startswith("s: +1.00 per doubling [") and row.treatment.endswith("(n=6)")
    assert row.found is not None and row.found.n == 2 and row.commands == ["cmd s", "cmd f"]   # 2 seeds per x
    assert row.found.at(2) == pytest.approx((se, 8.0))   # n needed scales the observed slopes' se by seeds per x
    assert row.found.at(8) == pytest.approx((se / 2, 2 * (3 * 8 - 2)))
    assert claim.row([]).verdict == NOT_RUN


def test_claims_sharing_an_arm_are_marked():
    shared = fake_runs([1.0, 1.1, 0.9], "shared")
    other, third = fake_runs([0.0, 0.1, -0.1], "o"), fake_runs([2.0, 2.1, 1.9], "x")

    def claim(statement, treatment, baseline):
        return Claim("paper", statement, "", "task", Arm("softmax", lambda records: treatment, "c"),
                     Arm(statement + " arm", lambda records: baseline, "c"), lambda rec: rec.value, design())

    table = claims_table([claim("one", shared, other), claim("two", shared, third), claim("three", other, third)], [])
    marks = [dict(zip(table.headers, row))["shared arm"] for row in table.rows]
    assert marks[0] == "softmax: also claim 2; one arm: also claim 3"
    assert marks[1] == "softmax: also claim 1; two arm: also claim 3"
    assert marks[2] == "softmax: also claim 1; three arm: also claim 2"


def process(commit, from_step=0, dirty=False) -> dict:
    """A `provenance` entry of metrics.json: one process of a run."""
    return {"commit": commit, "dirty": dirty, "version": "0.1.0", "from_step": from_step}


A, B = "a" * 40, "b" * 40


def commits_of(treatment: list[dict], baseline: list[dict]) -> tuple[str, str]:
    """(commits cell, verdict) of a held claim whose arms' runs carry these metrics.json fields."""
    ours, theirs = fake_runs([1.0, 1.1, 0.9], "t"), fake_runs([0.0, 0.1, -0.1], "b")
    for run, fields in zip(ours + theirs, treatment + baseline):
        run.data.update(fields)
    claim = Claim("paper", "statement", "", "task", Arm("treatment", lambda records: ours, "c"),
                  Arm("baseline", lambda records: theirs, "c"), lambda rec: rec.value, design())
    table = claims_table([claim], ours + theirs)
    row = dict(zip(table.headers, table.rows[0]))
    return row["commits"], row["verdict"]


def full(*processes: dict) -> dict:
    return {"provenance": list(processes), "git_commit": processes[-1]["commit"]}


def test_runs_of_one_commit_are_not_flagged():
    cell, verdict = commits_of([full(process(A))] * 3, [full(process(A), process(A, 20))] * 3)
    assert cell == "" and verdict == HELD


def test_a_run_resumed_on_another_commit_flags_its_arm_mixed():
    cell, verdict = commits_of([full(process(A)), full(process(A)), full(process(A), process(B, 20))],
                               [full(process(A))] * 3)
    assert cell == "mixed: treatment: aaaaaaa (3 runs), bbbbbbb (1 run), 1 run across 2 commits; baseline: aaaaaaa (3 runs)"
    assert verdict == HELD   # a note: the verdict is the rule's


def test_runs_of_one_arm_or_the_two_arms_under_different_commits_are_mixed():
    within, _ = commits_of([full(process(A)), full(process(B)), full(process(B))], [full(process(A))] * 3)
    assert within == "mixed: treatment: bbbbbbb (2 runs), aaaaaaa (1 run); baseline: aaaaaaa (3 runs)"
    between, _ = commits_of([full(process(A))] * 3, [full(process(B))] * 3)
    assert between == "mixed: treatment: aaaaaaa (3 runs); baseline: bbbbbbb (3 runs)"
    # runs that record only their last process's commit are mixed too where those commits differ
    recorded, _ = commits_of([{"git_commit": A}] * 3, [{"git_commit": B}] * 3)
    assert recorded == "mixed: treatment: aaaaaaa (3 runs); baseline: bbbbbbb (3 runs). Not every process's commit recorded by 6 of 6 runs"


def test_runs_without_a_record_of_every_process_read_unknown_not_mixed():
    """Evidence written before runs kept `provenance`: one commit recorded is not one commit run; no commit is
    unknown too. Neither is flagged mixed, and the verdict stays the rule's."""
    cell, verdict = commits_of([{"git_commit": A}] * 3, [{"git_commit": A}] * 2 + [full(process(A))])
    assert cell == "unknown: one commit recorded (aaaaaaa), not every process's: treatment 3 of 3 runs, baseline 2 of 3 runs"
    assert verdict == HELD
    nothing, verdict = commits_of([{}] * 3, [{}] * 3)
    assert nothing == "unknown: no commit recorded: treatment 3 of 3 runs, baseline 3 of 3 runs" and verdict == HELD
    outside_git, _ = commits_of([full(process(None, dirty=None))] * 3, [full(process(A))] * 3)
    assert outside_git.startswith("unknown: one commit recorded (aaaaaaa), not every process's: treatment 3 of 3 runs")
    # a checkpoint without the record: an unknown first entry, then the process that resumed it
    resumed, _ = commits_of([full(process(None, dirty=None), process(A, 20))] * 3, [full(process(A))] * 3)
    assert resumed == "unknown: one commit recorded (aaaaaaa), not every process's: treatment 3 of 3 runs"


def test_a_pre_training_stage_on_another_commit_mixes_the_run():
    stage = {"pretraining": {"run_dir": "/stage", **full(process(B))}}
    cell, _ = commits_of([{**full(process(A)), **stage}] * 3, [{**full(process(A)), **stage}] * 3)
    assert cell.startswith("mixed: treatment: aaaaaaa (3 runs), bbbbbbb (3 runs), 3 runs each across 2 or more commits")
    old_stage = {"pretraining": {"run_dir": "/stage"}}   # a stage record that names no code
    unknown, _ = commits_of([{**full(process(A)), **old_stage}] * 3, [full(process(A))] * 3)
    assert unknown == "unknown: one commit recorded (aaaaaaa), not every process's: treatment 3 of 3 runs"


def test_uncommitted_changes_are_named_and_junk_records_read_unknown():
    cell, _ = commits_of([full(process(A, dirty=True))] + [full(process(A))] * 2, [full(process(A))] * 3)
    assert cell == "uncommitted changes in treatment: 1 run"
    both, _ = commits_of([full(process(A, dirty=True))] * 3, [full(process(B))] * 3)
    assert both == "mixed: treatment: aaaaaaa (3 runs); baseline: bbbbbbb (3 runs). Uncommitted changes in treatment: 3 runs"
    junk = [{"provenance": "x"}, {"provenance": [1, 2]}, {"provenance": [{"commit": 5}], "git_commit": ["a"]}]
    cell, _ = commits_of(junk, [full(process(A))] * 3)
    assert cell == "unknown: one commit recorded (aaaaaaa), not every process's: treatment 3 of 3 runs"


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
SAR_CLAIM = "SAR makes the model robust to a shifted topology (accuracy change under the shift)"
SAR_CLAIM_SETTING = "ListOps, CPU preset with blocks of 8, shifted by 3"   # the pilot's: what its commands ask for


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
    robust = found[f"{SAR_CLAIM_SETTING} | {SAR_CLAIM}"][1]
    assert robust.treatment == pytest.approx([-1.0] * 3) and robust.baseline == pytest.approx([-3.0] * 3)
    # no spread in either arm (but float rounding): no interval, whatever the difference
    assert robust.verdict == INCONCLUSIVE and robust.low is None and robust.difference == pytest.approx(2.0)
    assert robust.note == "no interval: every seed of the treatment and of the baseline gave the same value"
    assert found["ListOps, CPU preset with blocks of 8 | Removing HST (BigBird + SAR) costs accuracy"][1].verdict == NOT_RUN
    text = found["Text, CPU preset | ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA"][1]
    assert text.verdict == NOT_RUN and text.baseline == pytest.approx([60.0])

    table = all_claims.tables(records)[0]
    assert table.slug == "claims" and table.headers[8:10] == ["verdict", "compute"]
    first = next(dict(zip(table.headers, r)) for r in table.rows if r[0].startswith("ERNIE-Sparse (HST + SAR) is more"))
    assert first["result"].startswith("+2.00 [") and first["verdict"] == HELD
    assert first["treatment"] == "ERNIE-Sparse: 46.50 ± 0.50 (n=3)"
    # The runs were tested at one shift, 3 (as the kept evidence was): the claim says so, as it always did.
    sar = next(dict(zip(table.headers, r)) for r in table.rows if r[0] == SAR_CLAIM)
    assert sar["tested on"] == "ListOps, CPU preset with blocks of 8, shifted by 3"
    notes = "\n".join(table.notes)
    # The pilot's arms are filled by the pilot's command (one shift, 3; its seeds); the confirmatory study's runs
    # (every shift, fresh seeds) by its own.
    assert ("`sparse-run -m experiment=lra_listops_cpu model=bigbird_sar model.pattern_options.block_size=8 "
            "trainer.test_topology_shift=3 seed=0,1,2`") in notes
    assert f"`{ernie_sparse.CONFIRM_COMMAND}`" in notes
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

    runs = [Run(path=Path(f"/runs/{i}"), data={}, first=0.5 + d, second=0.5) for i, d in enumerate(differences)]
    claim = PairedClaim("paper", "statement", "1.0", "task", Arm("x", lambda records: records, "sparse-run"),
                        ("first", lambda rec: rec.first), ("second", lambda rec: rec.second),
                        design(test="paired t", sesoi=0.01))
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
    from tests.test_keep_results import keep   # the script's main() in-process (test_keep_results runs the script itself)

    run = write_run(tmp_path / "outputs", "e0", model="ernie_sparse", seed=0, acc=0.46, block=8)
    (run / "log.jsonl").write_text('{"step": 20, "alpha/encoder_self/0": [1.4, 1.6]}\n')
    (run / "figures").mkdir()
    (run / "figures" / "alpha_trajectories.png").write_bytes(b"\x89PNG fake")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"weights")
    for flag, kept in (([], tmp_path / "plain"), (["--with-log"], tmp_path / "logged")):
        done = keep(*flag, kept, run)
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


# ----------------------------------------------------------------------------- the kept evidence
EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "evidence"
# The verdicts of docs/evidence by the pre-registered rule, in table order (docs/reproduction.md lists them).
EVIDENCE_VERDICTS = [
    INCONCLUSIVE, INCONCLUSIVE, HELD, HELD, INCONCLUSIVE, INCONCLUSIVE,   # Correia: BLEU x2, JS x2, density x2
    HELD,                                                                 # Correia: the confirmatory density study (5 runs)
    HELD, HELD,                                                           # Theorem 1's cliff, the LM trend
    HELD, INCONCLUSIVE,                                                   # pre-training, head size
    INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE,  # ERNIE-Sparse
    HELD,                                                                 # ERNIE-Sparse: the confirmatory SAR study (24 runs)
]


def test_every_claim_has_a_full_design_and_the_kept_runs_regenerate_the_table(tmp_path: Path):
    from sparse_runner.reporting.report import main
    from sparse_runner.reporting.papers import papers

    claims = [claim for paper in papers() for claim in getattr(paper, "CLAIMS", ())]
    assert len(claims) == len(EVIDENCE_VERDICTS)
    for claim in claims:
        design = claim.design
        assert isinstance(design, Design) and design.metric and design.family and design.sesoi > 0, claim.statement
        assert design.published_source, claim.statement   # where the paper's number is, or why there is none
    assert main([str(EVIDENCE), "--out", str(tmp_path / "report"), "--print", "none", "--formats", "csv"]) == 0
    import csv

    with open(tmp_path / "report" / "claims.csv", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert [row["verdict"] for row in table] == EVIDENCE_VERDICTS
    assert [row["claim"] for row in table] == [claim.statement for claim in claims]
    lm = next(row for row in table if row["claim"].startswith("As the heads grow"))
    assert lm["result"].lstrip("'") == "+0.74 [+0.38, +1.10] per doubling"    # the trend replaces three rows
    density = next(row for row in table if row["claim"].startswith("1.5-entmax: the decoder"))
    assert density["p"] == "0.0134" and density["Holm p"] == "0.0536"          # held alone, not in its family of 6
    sar = next(row for row in table if row["claim"] == SAR_CLAIM)              # the pilot's: its runs, shift 3
    assert (sar["tested on"], sar["result"].lstrip("'"), sar["p"], sar["Holm p"]) == (
        SAR_CLAIM_SETTING, "+0.50 [-0.58, +1.58]", "0.111", "0.442")
    assert sar["treatment"] == "ERNIE-Sparse: 1.47 ± 0.50 (n=3)" and sar["baseline"] == "w/o SAR: 0.97 ± 0.21 (n=3)"
    softmax_arms = [row["shared arm"] for row in table[:4]]
    assert all("softmax: also claims" in mark for mark in softmax_arms)        # the softmax arm feeds 4 claims
    # The pilot runs record only the commit of their last process: none reads as one commit run throughout. The
    # confirmatory studies' runs record every process, each study's on one commit (the density study's on its
    # pre-registration commit, the SAR study's on a later one, 99d0f04, from a clean checkout).
    confirmatory, sar_confirmatory = table[6], table[16]
    assert confirmatory["claim"].endswith("confirmatory study, fresh seeds") and confirmatory["commits"] == ""
    assert (confirmatory["result"].lstrip("'"), confirmatory["p"], confirmatory["Holm p"]) == ("+3.04 [+0.94, +5.14]", "0.00797", "0.00797")
    assert sar_confirmatory["claim"].endswith("mean over shifts 1–7, fresh seeds") and sar_confirmatory["commits"] == ""
    assert (sar_confirmatory["treatment"], sar_confirmatory["baseline"]) == ("ERNIE-Sparse: 0.23 ± 0.77 (n=12)", "w/o SAR: -0.75 ± 0.76 (n=12)")
    assert (sar_confirmatory["result"].lstrip("'"), sar_confirmatory["p"], sar_confirmatory["Holm p"]) == ("+0.98 [+0.33, +1.63]", "0.00237", "0.00237")
    ran = [row for row in table if row["verdict"] != NOT_RUN and row not in (confirmatory, sar_confirmatory)]
    assert all(row["commits"].startswith(("unknown: ", "mixed: ")) for row in ran), [row["commits"] for row in ran]
    assert all(not row["commits"] for row in table if row["verdict"] == NOT_RUN)
    assert all(row["test"] for row in table)


def _keep_record(run_dir: Path, right: list[int], metric: str = "test/accuracy") -> None:
    """Give a written run a per-example record whose accuracy is its metrics.json's."""
    from sparse_runner import example_scores
    from sparse_runner.example_scores import ExampleScores

    described = example_scores.write(ExampleScores(metric, "mean", np.array(right, dtype=float)[:, None],
                                                   np.arange(len(right))), run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["metrics"][metric] = sum(right) / len(right)
    metrics["test_examples"] = described
    (run_dir / "metrics.json").write_text(json.dumps(metrics))


def test_runs_with_per_example_records_get_an_interval_over_seeds_and_test_examples(tmp_path: Path):
    """The `seeds × examples` cell: the hierarchical bootstrap where every run of the claim kept its record, else
    why not; it never changes the verdict."""
    rng = np.random.default_rng(0)
    truth = rng.random(200)
    runs = {}
    for seed in range(3):
        for model, skill in (("ernie_sparse", 0.50 + 0.01 * seed), ("bigbird", 0.44 + 0.01 * seed)):
            right = [int(t < skill) for t in truth]
            runs[model, seed] = write_run(tmp_path, f"{model}{seed}", model=model, seed=seed, block=8, acc=sum(right) / 200)
            _keep_record(runs[model, seed], right)
    ernie_vs_bigbird = lambda: dict(zip(*[(t := claims_table(ernie_sparse.CLAIMS, collect_runs([tmp_path]))).headers,  # noqa: E731
                                          t.rows[0]]))
    cells = ernie_vs_bigbird()
    difference = cells["result"].split(" [")[0]
    assert float(difference) > 2 and cells["verdict"] == HELD
    found = cells["seeds × examples"]
    assert found.startswith(f"{difference} [") and found.endswith("(4000 resamples of seeds and of 200 test examples)"), found
    low, high = (float(x) for x in found.split("[")[1].split("]")[0].split(", "))
    t_low, t_high = (float(x) for x in cells["result"].split("[")[1].split("]")[0].split(", "))
    # 200 test examples: their sampling error makes this interval wider than the t interval over seeds alone
    assert low < t_low < float(difference) < t_high < high
    # a record that does not give back its run's metric is not used
    metrics = json.loads((runs["bigbird", 1] / "metrics.json").read_text())
    metrics["metrics"]["test/accuracy"] += 0.01
    (runs["bigbird", 1] / "metrics.json").write_text(json.dumps(metrics))
    tampered = ernie_vs_bigbird()
    assert tampered["seeds × examples"] == "test_examples.npz does not give back the run's test/accuracy (1 of 6 runs)"
    # a link out of the run folder is refused; a run without a record says so
    (runs["bigbird", 1] / "test_examples.npz").unlink()
    (runs["bigbird", 1] / "test_examples.npz").symlink_to(runs["bigbird", 2] / "test_examples.npz")
    assert "test_examples.npz a link to a file outside the run folder (1 of 6 runs)" == ernie_vs_bigbird()["seeds × examples"]
    metrics = json.loads((runs["ernie_sparse", 0] / "metrics.json").read_text())
    del metrics["test_examples"]
    (runs["ernie_sparse", 0] / "metrics.json").write_text(json.dumps(metrics))
    assert ernie_vs_bigbird()["seeds × examples"].startswith("no per-example record (1 of 6 runs); ")
    # the records change no verdict: the t interval over seeds decides, with or without them
    assert {k: v for k, v in ernie_vs_bigbird().items() if k != "seeds × examples"} == {
        k: v for k, v in tampered.items() if k != "seeds × examples"}


# ----------------------------------------------------------------------------- the confirmatory density study
def correia_density_runs(root: Path, densities: dict[int, tuple[float, float]]) -> list:
    """1.5-entmax runs of correia2019_study_cpu, one per seed, with (decoder self, context) mean densities."""
    from test_studies import analysis, write_run as write_study_run

    from sparse_runner.reporting.papers.correia2019 import claims as correia

    for seed, (decoder_self, context) in densities.items():
        write_study_run(root, f"entmax15_{seed}", (f"experiment={correia.STUDY}", "model=entmax15"), seed,
                        "translation", {"test/bleu": 13.0 + 0.1 * seed}, analysis=analysis(0.5, decoder_self, context))
    return collect_runs([root])


PILOT = {0: (0.180, 0.150), 1: (0.189, 0.134), 2: (0.186, 0.138)}   # the kept pilot's densities, rounded


def test_the_confirmatory_claim_reads_its_own_seeds_and_the_pilot_its_own(tmp_path: Path):
    from sparse_runner.reporting.papers.correia2019 import claims as correia

    confirm, pilot = correia.CONFIRMATORY_CLAIM, correia.PILOT_CLAIMS[5]
    assert pilot.statement.startswith("1.5-entmax: the decoder") and confirm.statement.startswith(pilot.statement)
    assert confirm.arm.seeds == frozenset(range(3, 8)) and pilot.arm.seeds == frozenset({0, 1, 2})
    assert all(arm.seeds == frozenset({0, 1, 2}) for claim in correia.PILOT_CLAIMS
               for arm in ((claim.arm,) if hasattr(claim, "arm") else (claim.treatment, claim.baseline)))
    assert confirm.design.family != pilot.design.family and confirm.design.sesoi == pilot.design.sesoi == 5.0
    assert (confirm.design.metric, confirm.design.test) == (pilot.design.metric, pilot.design.test)
    # only the pilot's seeds: the confirmatory claim is not run, and shows its command
    records = correia_density_runs(tmp_path / "pilot", PILOT)
    before = pilot.row(records)
    assert before.difference.startswith("+4.43 [") and before.treatment.endswith("(n=3)")
    row = confirm.row(records)
    assert row.verdict == NOT_RUN and row.commands == [correia.CONFIRM_COMMAND] and row.p is None
    assert correia.CONFIRM_COMMAND == "sparse-run -m experiment=correia2019_study_cpu model=entmax15 seed=3,4,5,6,7"
    # fresh seeds 3-7 (and an undeclared seed 8), far from the pilot's values: neither claim reads the other's
    fresh = {seed: (0.40, 0.10 + 0.01 * seed) for seed in range(3, 9)}
    records = correia_density_runs(tmp_path / "all", {**PILOT, **fresh})
    after = pilot.row(records)
    assert (after.difference, after.treatment, after.baseline, after.p) == (before.difference, before.treatment,
                                                                          before.baseline, before.p)
    assert all(int(Path(folder).name.split("_")[1]) in (0, 1, 2) for folder in after.arms[0][1])
    bleu = correia.PILOT_CLAIMS[1].treatment.runs(records)   # the pilot's BLEU arm of 1.5-entmax: seeds 0-2 too
    assert sorted(rec.data["seed"] for rec in bleu) == [0, 1, 2]
    row = confirm.row(records)
    assert sorted(int(Path(folder).name.split("_")[1]) for folder in row.arms[0][1]) == [3, 4, 5, 6, 7]
    assert row.treatment == "1.5-entmax, decoder self: 40.00 ± 0.00 (n=5)" and row.baseline.endswith("(n=5)")
    assert row.difference.startswith("+25.00 [") and row.verdict == HELD and not row.commands


def test_the_confirmatory_claim_waits_for_all_its_runs(tmp_path: Path):
    """No test at an interim look: with 2 or 4 of its 5 pre-registered runs the claim shows the difference only."""
    from sparse_runner.reporting.papers.correia2019 import claims as correia

    for done in (2, 4):
        records = correia_density_runs(tmp_path / str(done), {seed: (0.40, 0.10 + 0.01 * seed)
                                                              for seed in range(3, 3 + done)})
        row = correia.CONFIRMATORY_CLAIM.row(records)
        assert row.verdict == INCONCLUSIVE and row.p is None and row.found is None
        assert row.difference.endswith(f"({done} of 5 pre-registered runs: no test before all have run)")
        assert row.commands == [correia.CONFIRM_COMMAND]


@pytest.mark.parametrize("differences, expected", [
    ((10.0, 11.0, 12.0, 10.5, 11.5), HELD),            # far above 0
    ((0.5, -0.4, 0.2, -0.3, 0.1), NOT_HELD),           # around 0, tight: below the SESOI of 5
    ((-5.0, 12.0, 0.0, 10.0, 3.0), INCONCLUSIVE),      # [-4.6, +12.6]: reaches both 0 and 5
])
def test_the_confirmatory_verdict_follows_the_rule(tmp_path: Path, differences, expected):
    """At its 5 runs the claim takes the rule as every claim does, alone in its family (Holm p = p)."""
    from sparse_runner.reporting.claims import one_sample, tested

    from sparse_runner.reporting.papers.correia2019 import claims as correia

    densities = {seed: (0.20 + difference / 100, 0.20) for seed, difference in zip(range(3, 8), differences)}
    records = correia_density_runs(tmp_path, {**PILOT, **densities})
    claim = correia.CONFIRMATORY_CLAIM
    by_hand = tested(claim.design, ([], []), one_sample(differences), 0.0)
    assert by_hand.verdict == expected
    row = claim.row(records)
    assert row.verdict == expected and row.p == pytest.approx(by_hand.p)
    table = claims_table(correia.CLAIMS, records)
    cells = dict(zip(table.headers, table.rows[-1]))
    assert cells["claim"] == claim.statement and cells["verdict"] == expected
    assert cells["Holm p"] == cells["p"]                                   # a family of one: no adjustment
    assert "family: Correia et al. 2019, confirmatory density study (1 claim)" in cells["test"]
    pilot = dict(zip(table.headers, table.rows[5]))                        # the pilot keeps its family of 6
    assert pilot["verdict"] == INCONCLUSIVE and "(6 claims)" in pilot["test"]


# ----------------------------------------------------------------------------- the confirmatory SAR study
SHIFTS = [1, 2, 3, 4, 5, 6, 7]
PILOT_SAR = {0: (0.451, 0.471, 0.445, 0.454), 1: (0.457, 0.471, 0.452, 0.460),   # (ERNIE-Sparse acc, shifted,
             2: (0.464, 0.474, 0.466, 0.478)}                                    # HST acc, shifted): the kept runs'


def sar_runs(root: Path, changes: dict[int, tuple[float, float]], shift=SHIFTS, acc: float = 0.46, val: float = 0.46,
             models=("ernie_sparse", "hst")) -> None:
    """ListOps runs with blocks of 8 of ERNIE-Sparse and HST, one per seed, tested at `shift`, whose shifted accuracy
    is their test accuracy plus (ERNIE-Sparse, HST) `changes` points."""
    tag = "x".join(map(str, shift)) if isinstance(shift, list) else str(shift)
    for seed, pair in changes.items():
        for model, change in zip(models, pair):
            write_run(root, f"{model}_{tag}_{seed}", model=model, seed=seed, acc=acc, val=val, block=8, shift=shift,
                      shifted=acc + change / 100)


def pilot_sar_runs(root: Path) -> None:
    for seed, (e, e_shifted, h, h_shifted) in PILOT_SAR.items():
        write_run(root, f"pilot_e{seed}", model="ernie_sparse", seed=seed, acc=e, block=8, shift=3, shifted=e_shifted)
        write_run(root, f"pilot_h{seed}", model="hst", seed=seed, acc=h, block=8, shift=3, shifted=h_shifted)
        write_run(root, f"pilot_b{seed}", model="bigbird", seed=seed, acc=e - 0.005, block=8, shift=3)
        write_run(root, f"pilot_bs{seed}", model="bigbird_sar", seed=seed, acc=e - 0.01, block=8, shift=3)


def seeds_of(runs) -> list[int]:
    return sorted(rec.data["seed"] for rec in runs)


def pilot_listops_claims():
    return [claim for claim in ernie_sparse.PILOT_CLAIMS if claim.setting.startswith("ListOps")]


def test_the_pilot_reads_its_seeds_at_one_shift_and_the_confirmatory_study_its_own_list_runs(tmp_path: Path):
    confirm = ernie_sparse.CONFIRMATORY_CLAIM
    pilot = next(claim for claim in ernie_sparse.PILOT_CLAIMS if claim.statement == SAR_CLAIM)
    assert confirm.statement.startswith(SAR_CLAIM) and confirm.planned == 12
    assert (confirm.design.test, confirm.design.hypothesis, confirm.design.sesoi) == ("Welch t", "superiority", 1.0)
    assert confirm.design.family == "ERNIE-Sparse, confirmatory robustness study (1 claim)" != pilot.design.family
    assert confirm.treatment.seeds == confirm.baseline.seeds == frozenset(range(3, 15))
    assert all(arm.seeds == frozenset({0, 1, 2}) for claim in pilot_listops_claims()
               for arm in (claim.treatment, claim.baseline))
    # the pilot's runs alone: the pilot's numbers; the confirmatory claim is not run, and shows its command
    pilot_sar_runs(tmp_path / "pilot")
    records = collect_runs([tmp_path / "pilot"])
    before = {claim.statement + claim.setting: claim.row(records) for claim in pilot_listops_claims()}
    assert before[SAR_CLAIM + SAR_CLAIM_SETTING].difference == "+0.50 [-0.58, +1.58]"
    row = confirm.row(records)
    assert row.verdict == NOT_RUN and row.commands == [ernie_sparse.CONFIRM_COMMAND] and row.p is None
    assert row.setting.startswith("ListOps, CPU preset with blocks of 8, mean over shifts 1–7; confirmatory")
    # Beside them, runs that differ from the pilot's in how they were tested or in their seed, far from its values
    # and better on validation (so that they would win a seed's place): none enters the pilot; the confirmatory
    # arms take the list runs of their seeds 3-14 alone, never one shift, another list, seeds 0-2 or seed 15.
    everything = tmp_path / "all"
    pilot_sar_runs(everything)
    sar_runs(everything, {seed: (5.0, -5.0) for seed in (0, 1, 2)}, val=0.9)                  # the list, pilot seeds
    sar_runs(everything, {seed: (-9.0, 9.0) for seed in range(3, 15)}, shift=3, val=0.9)      # one shift, fresh seeds
    sar_runs(everything, {seed: (-8.0, 8.0) for seed in range(3, 15)}, shift=[1, 2, 3], val=0.9)   # another list
    sar_runs(everything, {seed: (1.0 + 0.1 * seed, -1.0) for seed in range(3, 16)}, val=0.5)  # the list, 3-14 and 15
    for seed in range(3, 15):
        write_run(everything, f"bigbird_{seed}", model="bigbird", seed=seed, acc=0.9, block=8, shift=3)
    records = collect_runs([everything])
    after = {claim.statement + claim.setting: claim.row(records) for claim in pilot_listops_claims()}
    for key, row in before.items():
        assert (after[key].difference, after[key].treatment, after[key].baseline, after[key].p) == (
            row.difference, row.treatment, row.baseline, row.p)
        assert all(seeds_of(arm.runs(records)) == [0, 1, 2] for arm in (claim_of(key).treatment, claim_of(key).baseline))
    assert all(ernie_sparse._shift(rec) == 3 for claim in pilot_listops_claims()
               for rec in claim.treatment.runs(records) + claim.baseline.runs(records))
    for arm in (confirm.treatment, confirm.baseline):
        runs = arm.runs(records)
        assert seeds_of(runs) == list(range(3, 15)) and all(ernie_sparse._shift(rec) == tuple(SHIFTS) for rec in runs)
    found = evaluate(confirm, records)
    assert sorted(found.treatment) == pytest.approx([1.0 + 0.1 * seed for seed in range(3, 15)])
    assert found.baseline == pytest.approx([-1.0] * 12)


def claim_of(key: str):
    return next(claim for claim in pilot_listops_claims() if claim.statement + claim.setting == key)


def test_the_confirmatory_sar_claim_waits_for_all_its_runs(tmp_path: Path):
    """No test at an interim look: with 11 or 5 of its 12 pre-registered runs in an arm it shows the difference only
    (its changes here would be held at once)."""
    for done in ((12, 11), (5, 5)):
        root = tmp_path / f"{done[0]}_{done[1]}"
        sar_runs(root, {seed: (2.0 + 0.1 * seed,) for seed in range(3, 3 + done[0])}, models=("ernie_sparse",))
        sar_runs(root, {seed: (-1.0 - 0.1 * seed,) for seed in range(3, 3 + done[1])}, models=("hst",))
        row = ernie_sparse.CONFIRMATORY_CLAIM.row(collect_runs([root]))
        have = f"{done[0]} and {done[1]}" if done[0] != done[1] else str(done[0])
        assert row.verdict == INCONCLUSIVE and row.p is None and row.found is None and row.examples == ""
        assert row.difference.endswith(f"({have} of 12 pre-registered runs per arm: no test before all have run)")
        assert row.commands == [ernie_sparse.CONFIRM_COMMAND]


@pytest.mark.parametrize("ernie, hst, expected", [
    ([2.0, 2.5, 1.5, 2.2, 1.8, 2.1, 1.9, 2.4, 1.6, 2.0, 2.3, 1.7], [-1.0] * 6 + [-0.5] * 6, HELD),   # +2.5 or so
    ([0.1, -0.1, 0.2, -0.2, 0.0, 0.1, -0.1, 0.2, -0.2, 0.0, 0.1, -0.1],
     [0.0, 0.1, -0.1, 0.2, -0.2, 0.0, 0.1, -0.1, 0.2, -0.2, 0.0, 0.1], NOT_HELD),                   # tight around 0
    ([3.0, -2.0, 1.0, -1.0, 2.5, -1.5, 0.5, 2.0, -2.5, 1.5, 0.0, 3.0],
     [0.5, -0.5, 1.0, -1.0, 0.0, 0.2, -0.2, 0.8, -0.8, 0.3, -0.3, 0.0], INCONCLUSIVE),              # reaches 0 and 1
])
def test_the_confirmatory_sar_verdict_follows_the_rule(tmp_path: Path, ernie, hst, expected):
    """At its 12 runs per arm the claim takes the rule as every claim does: Welch t, alone in its family."""
    from sparse_runner.reporting.claims import tested

    pilot_sar_runs(tmp_path)
    sar_runs(tmp_path, {seed: pair for seed, pair in zip(range(3, 15), zip(ernie, hst))})
    records = collect_runs([tmp_path])
    claim = ernie_sparse.CONFIRMATORY_CLAIM
    found = evaluate(claim, records)
    by_hand = tested(claim.design, (ernie, hst), welch(ernie, hst), 0.0)
    assert by_hand.verdict == found.verdict == expected
    assert found.p == pytest.approx(by_hand.p) and found.difference == pytest.approx(by_hand.difference)
    assert found.p == pytest.approx(stats.ttest_ind(ernie, hst, equal_var=False, alternative="greater").pvalue)
    table = claims_table(ernie_sparse.CLAIMS, records)
    cells = dict(zip(table.headers, table.rows[-1]))
    assert cells["claim"] == claim.statement and cells["verdict"] == expected
    assert cells["Holm p"] == cells["p"]                                   # a family of one: no adjustment
    assert "family: ERNIE-Sparse, confirmatory robustness study (1 claim)" in cells["test"]
    assert not any(ernie_sparse.CONFIRM_COMMAND in note for note in table.notes)   # complete: nothing to run
    pilot = next(dict(zip(table.headers, r)) for r in table.rows if r[0] == SAR_CLAIM)   # the pilot: its family of 5
    assert pilot["result"] == "+0.50 [-0.58, +1.58]" and "(5 claims)" in pilot["test"]


def test_the_confirmatory_sar_command_makes_exactly_the_planned_runs(tmp_path: Path):
    """CONFIRM_COMMAND, expanded as sparse-run expands it, is 24 jobs: ERNIE-Sparse and HST at each fresh seed, each
    composing the pilot's config (the kept runs' own overrides) but for the seed, the list of shifts and keys that
    change no result; written as runs, they are the confirmatory arms, and no pilot arm takes them."""
    import shlex

    from sparse_runner import cli
    from sparse_runner.reporting.presets import compose
    from sparse_runner.run_metrics import NON_RESULT_KEYS
    from test_report_lra import write_lra_run

    command = ernie_sparse.CONFIRM_COMMAND
    assert command == ("sparse-run -m experiment=lra_listops_cpu model=ernie_sparse,hst "
                       "++model.pattern_options.block_size=8 'trainer.test_topology_shift=[1,2,3,4,5,6,7]' "
                       "seed=3,4,5,6,7,8,9,10,11,12,13,14")
    argv = shlex.split(command)
    assert argv[:2] == ["sparse-run", "-m"]
    args = cli._hydra_args(argv[1:])
    assert args.multirun
    cli.preflight(list(args.overrides), True, check_resources=False)   # every job composes and validates
    jobs = cli.job_override_lists(list(args.overrides), True)

    def flat(node, prefix=""):
        return ({key: value for k, v in node.items() for key, value in flat(v, f"{prefix}{k}.").items()}
                if isinstance(node, dict) else {prefix[:-1]: node})

    pilot = {}
    for folder in sorted((EVIDENCE / "ernie_sparse_listops_cpu").glob("listops_softmax_hst_h4*_seed0_*")):
        kept = json.loads((folder / "metrics.json").read_text())
        if kept["config"]["model"]["pattern_options"]["block_size"] == 8 and not any(
                "stages" in o or "local=" in o for o in kept["overrides"]):
            pilot[kept["model"]] = flat(compose(tuple(kept["overrides"])))
    assert set(pilot) == {"ernie_sparse", "hst"}
    made = []
    for job in jobs:
        config = compose(tuple(job))
        model, seed = config["model"]["name"], config["seed"]
        made.append((model, seed))
        differs = {key for key, value in flat(config).items() if pilot[model].get(key, "absent") != value}
        assert differs - set(NON_RESULT_KEYS) == {"seed", "trainer.test_topology_shift"}, (job, differs)
        assert config["trainer"]["test_topology_shift"] == SHIFTS
        assert config["model"]["pattern_options"]["block_size"] == 8
        write_lra_run(tmp_path / f"{model}_{seed}", "listops", experiment="lra_listops_cpu", model=model, seed=seed,
                      more=tuple(o for o in job if not o.startswith(("experiment=", "model=", "seed="))))
        run = tmp_path / f"{model}_{seed}" / "metrics.json"
        data = json.loads(run.read_text())
        assert data["config"] == {**config, "seed": seed}
        data["metrics"]["test_shifted/accuracy"] = 0.41
        run.write_text(json.dumps(data))
    assert sorted(made) == sorted((model, seed) for model in ("ernie_sparse", "hst") for seed in range(3, 15))
    records = collect_runs([tmp_path])
    confirm = ernie_sparse.CONFIRMATORY_CLAIM
    assert [seeds_of(arm.runs(records)) for arm in (confirm.treatment, confirm.baseline)] == [list(range(3, 15))] * 2
    found = evaluate(confirm, records)   # all 24 in, so the rule applies: here every run changed by +1.00, no spread
    assert found.verdict == INCONCLUSIVE and found.note.startswith("no interval: every seed of the treatment and")
    assert all(arm.runs(records) == [] for claim in pilot_listops_claims() for arm in (claim.treatment, claim.baseline))


def test_every_two_arm_claim_reads_only_the_seeds_declared_with_it():
    """The kept studies' claims are pinned to the seeds of their runs (0, 1, 2), the confirmatory ones to their own
    fresh seeds: a run added later never changes a verdict that was reached without it (optional stopping)."""
    from sparse_runner.reporting.papers import papers

    for claim in (claim for paper in papers() for claim in getattr(paper, "CLAIMS", ())):
        arms = [getattr(claim, name) for name in ("treatment", "baseline", "arm") if hasattr(claim, name)]
        for arm in arms:
            expected = {0, 1, 2} if "confirmatory" not in claim.design.family else set(arm.seeds or ()) - {0, 1, 2}
            assert arm.seeds and set(arm.seeds) == expected, (claim.statement, arm.label, arm.seeds)


def test_a_later_seed_of_a_kept_study_does_not_enter_its_claim(tmp_path: Path):
    for seed, acc in enumerate((0.74, 0.75, 0.73)):
        write_run(tmp_path, f"e{seed}", "lra_text", model="ernie_sparse", seed=seed, acc=acc)
        write_run(tmp_path, f"b{seed}", "lra_text", model="bigbird", seed=seed, acc=acc - 0.01)
    write_run(tmp_path, "late", "lra_text", model="bigbird", seed=5, acc=0.99)   # a fourth seed, run afterwards
    found, _ = ernie_claims(tmp_path)
    text = found["Text, CPU preset | ERNIE-Sparse (HST + SAR) is more accurate than BigBird on LRA"][1]
    assert sorted(text.baseline) == pytest.approx([72.0, 73.0, 74.0])
