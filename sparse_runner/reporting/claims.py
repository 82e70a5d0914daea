"""Claims: a paper's statement, the runs that test it, a design declared with it, and a verdict computed from them.

A paper module declares its claims beside its tables (`CLAIMS`, a list of `Testable`); `claims_table` gathers
them from every registered paper into one table. Every claim carries its `Design`, fixed where the claim is
declared: the primary metric, the test (Welch t, paired t, a trend, or a rule of the claim's own), the hypothesis
(superiority, non-inferiority, equivalence) with its margin, the smallest effect of interest (SESOI) in the
claim's unit, the family Holm's adjustment runs over, and whether the paper's own number is comparable with ours.
A `Claim` compares two arms (the paper's model and its baseline), each a set of completed runs that differ only in
their seed, on one number per run (`read`); a `TrendClaim` compares two slopes over runs at several x. An arm may be
pinned to declared seeds (`preset_arm(..., seeds=...)`): a pilot study's claims then read its own seeds only, and a
confirmatory study declared after it reads only the fresh seeds it was registered with, however many other runs of
the same configuration exist; with its size fixed in advance (`planned`), it has no test before all of them have run.

The rule, stated once (`RULE`), uses one-sided tests at ALPHA = 0.025 in the claimed direction, which is the side
of a two-sided 95 % interval: a claim alone in its family is held exactly when its 95 % interval excludes 0 on the
claimed side. With three seeds an arm has two degrees of freedom; a bootstrap percentile interval over three
values is far too narrow (it never leaves the range of the 3^3 resamples), which is why the intervals are t's.
An arm with fewer than two runs gives no interval (inconclusive); nor does an arm whose seeds all gave the same
value, to 12 significant digits (inconclusive: with no spread to measure, the interval has zero width and would
call any difference certain); an arm without runs, "not run". A value that is not finite (NaN, ±inf) is shown in
its arm and left out of the rule. The table lists the commands that bring each arm to three seeds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Literal, Protocol, Sequence

from sparse_runner.reporting.bootstrap import hierarchical_interval
from sparse_runner.reporting.presets import Preset, match
from sparse_runner.reporting.provenance import commit_notes
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, completed
from sparse_runner.reporting.seeds import best_group, cell_seed_groups
from sparse_runner.reporting.values import as_float, as_int, finite, mean, number_text, stdev

HELD, NOT_HELD, INCONCLUSIVE, NOT_RUN = "held", "not held", "inconclusive", "not run"
CONFIDENCE = 0.95
ALPHA = (1 - CONFIDENCE) / 2   # one-sided, in the claimed direction: the claimed side of the 95 % interval
POWER = 0.80                   # what `n needed` asks of a study at the SESOI
MIN_RUNS = 2
MAX_N = 10_000                 # `n needed` beyond this reads "> 10000"

RULE = (
    "Verdict, by the design in each claim's `test` column, declared with the claim. The effect is treatment minus "
    "baseline in the claim's unit (a trend claim: the difference of the two slopes), with a 95 % t interval: "
    "Welch's for two arms, a paired t where the design pairs, the OLS slopes' t for a trend. "
    "p: one-sided, in the claimed direction (superiority: effect > 0; non-inferiority: effect > -margin; "
    "equivalence: inside ±margin, the larger of the two one-sided p). Holm p: Holm's step-down adjustment over "
    "the claims of the design's family (a claim of the family without a p counts as p = 1). "
    "**held**: Holm p < 0.025, i.e. for a claim alone in its family the 95 % interval excludes 0 on the claimed "
    "side (lies above -margin; inside ±margin). **not held**: the 95 % interval excludes the smallest effect of "
    "interest (SESOI) on the claimed side: it lies below the SESOI (non-inferiority: below -margin; equivalence: "
    "outside ±margin). **inconclusive**: neither. `n needed`, for an inconclusive claim: the runs per arm (a trend: "
    "seeds per cell; a paired claim: runs) that give 80 % power at the SESOI (non-inferiority and equivalence: at the "
    "margin, true effect 0) to a one-sided test at 0.025 / m, m the claims of its family (Holm's first step, enough "
    "whatever the others give), at the observed variance; the claim was underpowered when that exceeds the runs it "
    "has. An arm needs at least 2 completed runs for an interval, and a spread: seeds that all "
    "gave the same value give none (inconclusive). A confirmatory claim, its runs fixed in advance (pre-registered), "
    "has no test before all of them have run: until then it shows the difference alone (inconclusive). Values that "
    "are not finite (nan, inf) are shown in their arm and left out. `vs published`: the size against the paper's "
    "number only where the design says our setting matches the paper's; elsewhere the direction alone is comparable. "
    "`shared arm`: runs that feed more than one claim "
    "(their verdicts are not independent). `commits`: the code the claim's runs ran, from each run's record of the "
    "commit of every process (a resumed run's too) and of its pre-training stage: **mixed** where they span more "
    "than one commit (one run resumed on another commit, the runs of an arm, or the two arms), so a difference may "
    "come from the code as well as from the models; **unknown** where at most one commit is recorded but a run "
    "does not record every process's (runs written without that record name only the commit of their last process; "
    "a run outside a git checkout names none); empty where every run ran one recorded commit. It changes no verdict. "
    "`seeds × examples`: where every run of a two-arm claim kept its per-example test record (test_examples.npz), "
    "the 95 % interval of a hierarchical bootstrap that resamples each arm's seeds and the test examples together "
    "(4000 resamples; the examples drawn once per resample for both arms, so the comparison stays paired over "
    "examples): the honest width where the test set is small. It changes no verdict either: with 3 seeds its seed "
    "level is too narrow to decide on, and the designs were fixed with the t tests.")

Hypothesis = Literal["superiority", "non-inferiority", "equivalence"]
TestName = Literal["Welch t", "paired t", "trend", "own rule"]
HYPOTHESES: tuple[str, ...] = ("superiority", "non-inferiority", "equivalence")
TESTS: tuple[str, ...] = ("Welch t", "paired t", "trend", "own rule")


@dataclass(frozen=True)
class Design:
    """A claim's pre-registered design, declared with the claim before its runs exist."""

    metric: str                               # the primary metric and its split, as text
    test: TestName
    sesoi: float                              # the smallest effect of interest, in the claim's unit (> 0)
    family: str                               # the claims Holm's adjustment runs over
    hypothesis: Hypothesis = "superiority"
    margin: float = 0.0                       # non-inferiority / equivalence: the allowed loss / |difference|
    pairing: str = ""                         # `paired t`: what pairs two values (the seed, or one run)
    published_comparable: bool = False        # whether our setting matches the paper's for `published_effect`
    published_effect: float | None = None     # the paper's effect for this comparison, in the claim's unit
    published_source: str = ""                # where that number is from; or why the size is not comparable
    rule: str = ""                            # `own rule`: the rule, as text

    def __post_init__(self) -> None:
        problems = []
        if self.test not in TESTS:
            problems.append(f"test {self.test!r} is not one of {', '.join(TESTS)}")
        if self.hypothesis not in HYPOTHESES:
            problems.append(f"hypothesis {self.hypothesis!r} is not one of {', '.join(HYPOTHESES)}")
        if not (math.isfinite(self.sesoi) and self.sesoi > 0):
            problems.append(f"sesoi must be a positive number, got {self.sesoi!r}")
        if (self.hypothesis == "superiority") != (self.margin == 0):
            problems.append(f"a {self.hypothesis} claim needs {'no' if self.hypothesis == 'superiority' else 'a positive'} "
                            f"margin, got {self.margin!r}")
        if (self.test == "paired t") != bool(self.pairing):
            problems.append("`pairing` says what pairs the values of a paired t, and only of a paired t")
        if (self.test == "own rule") != bool(self.rule):
            problems.append("`rule` states the rule of an `own rule` test, and only of one")
        if self.published_comparable and self.published_effect is None:
            problems.append("published_comparable needs the published_effect it compares")
        if not self.family:
            problems.append("a claim needs a family")
        if problems:
            raise ValueError("claim design: " + "; ".join(problems))

    def text(self, unit: str) -> str:
        """The design in one cell: metric, test, hypothesis, SESOI, family."""
        test = {"Welch t": "Welch t, unpaired", "paired t": f"paired t ({self.pairing})",
                "trend": "trend: OLS slopes, their difference with Welch's degrees of freedom",
                "own rule": self.rule}[self.test]
        claimed = {"superiority": "effect > 0", "non-inferiority": f"effect > -{self.margin:g} (non-inferiority)",
                   "equivalence": f"|effect| < {self.margin:g} (equivalence)"}[self.hypothesis]
        sesoi = "" if self.test == "own rule" else f"; SESOI {self.sesoi:g} {unit}"
        return f"{self.metric}; {test}; {claimed}{sesoi}; family: {self.family}"


@dataclass(frozen=True)
class ClaimRow:
    """A claim's row of the table: what each side measured, the comparison, its design, the verdict as if the claim
    were alone in its family (claims_table applies Holm's adjustment), and what the rule read to reach it."""

    treatment: str
    baseline: str
    difference: str
    test: str
    verdict: str
    compute_s: float
    commands: list[str] = field(default_factory=list)   # what brings the evidence to three seeds
    p: float | None = None                  # one-sided, in the claimed direction; None: no test (verdict fixed)
    excludes_sesoi: bool = False            # the interval excludes the SESOI on the claimed side
    estimate: float | None = None           # the effect, for the published comparison
    found: Estimate | None = None           # the test's estimate: how its se scales with the runs (n needed)
    runs_unit: str = "per arm"              # what `n needed` counts
    arms: tuple[tuple[str, frozenset[str]], ...] = ()   # each arm's label and its runs' folders
    examples: str = ""                      # the hierarchical bootstrap interval, or why there is none
    setting: str = ""                       # the claim's setting as its runs measured it, where that varies ("": its own)


class Testable(Protocol):
    """Anything the claims table shows: a statement, its design, and a row computed from the runs. `Claim` (two
    arms) is the usual one; a trend over runs is a `TrendClaim`; a paper may define its own rule (the low-rank cliff
    of Bhojanapalli et al.)."""

    paper: str
    statement: str
    published: str
    setting: str
    design: Design

    def row(self, records: list[RunRecord]) -> ClaimRow: ...


@dataclass(frozen=True)
class Arm:
    """One side of a claim: a label, how to find its runs among the report's, and the command that makes them."""

    label: str
    runs: Callable[[list[RunRecord]], list[RunRecord]]   # the arm's completed runs, one per seed
    command: str                                          # sparse-run ... seed=0,1,2
    seeds: frozenset[int] | None = None                   # the seeds it is pinned to (preset_arm); None: any


def preset_arm(label: str, overrides: tuple[str, ...], family: str, metric: str, command: str,
               seeds: Iterable[int] | None = None) -> Arm:
    """A claim's arm (reporting/claims.py): the completed runs of `family` scored on `metric` whose resolved config
    is the preset `overrides` in every result-changing key but the seed (presets.py, however the command line
    spelled it), one per seed; among several such groups (other data), the best on validation.

    `seeds`: the seeds the arm is pinned to, declared with the claim; a run of any other seed (or of none it
    records) is never the arm's. A pilot's claims keep reading the pilot's runs, and a confirmatory study's claim
    only its own fresh seeds, whatever other seeds of the configuration are run later. None: every seed."""
    preset = Preset(overrides)
    pinned = None if seeds is None else frozenset(seeds)
    if pinned is not None and not pinned:
        raise ValueError(f"arm {label!r}: pinned to no seed")

    def runs(records: list[RunRecord]) -> list[RunRecord]:
        mine = [rec for rec in completed(records, family, metric)
                if (pinned is None or _seed(rec) in pinned)
                and (found := match(rec.keys, [preset], primary_metric=rec.primary_metric)) is not None and found.exact]
        group = best_group(cell_seed_groups(mine))
        return group.runs if group else []

    return Arm(label, runs, command, pinned)


def union_arm(label: str, arms: Sequence[Arm], command: str) -> Arm:
    """An arm of every run of `arms` (a trend's runs at each of its x), in their order; pinned to the seeds of
    `arms` when every one of them is pinned."""
    seeds = None if any(arm.seeds is None for arm in arms) else frozenset().union(*(arm.seeds for arm in arms))
    return Arm(label, lambda records: [rec for arm in arms for rec in arm.runs(records)], command, seeds)


def _folders(runs: Sequence[RunRecord]) -> frozenset[str]:
    return frozenset(str(rec.path) for rec in runs)


# ----------------------------------------------------------------------------------------- the statistics
@dataclass(frozen=True)
class Estimate:
    """An effect with its standard error and degrees of freedom, and how both scale with the runs: `at(n)` gives
    (se, df) with n runs per arm (a trend: seeds per cell) at the observed variance."""

    effect: float
    se: float
    df: float
    n: int
    at: Callable[[int], tuple[float, float]]

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The two-sided t interval (low, high) of the effect."""
        half = _t_quantile(0.5 + confidence / 2, self.df) * self.se
        return self.effect - half, self.effect + half


def _t_quantile(q: float, df: float) -> float:
    from scipy import stats  # scipy: Student's t at fractional degrees of freedom

    return float(stats.t.ppf(q, df))


def _t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom."""
    from scipy import stats

    return float(stats.t.sf(t, df))


def _variance(values: Sequence[float]) -> float:
    """The sample variance of finite values; inf beyond a float's range (the interval then says nothing)."""
    try:
        return statistics.variance(values)
    except OverflowError:
        return math.inf


def _welch_df(va: float, vb: float, dfa: float, dfb: float) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of two variances of means with dfa and dfb."""
    # products, not `** 2`: a float power raises where a product gives inf (the interval then says nothing)
    return (va + vb) * (va + vb) / (va * va / dfa + vb * vb / dfb)


def welch(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """mean(a) - mean(b) with Welch's standard error and Welch-Satterthwaite degrees of freedom; both samples need
    at least 2 values and one of them a spread."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's interval needs at least 2 values per arm, got {len(a)} and {len(b)}")
    sa, sb = _variance(a), _variance(b)

    def at(n: int) -> tuple[float, float]:
        return math.sqrt((sa + sb) / n), _welch_df(sa / n, sb / n, n - 1, n - 1)

    va, vb = sa / len(a), sb / len(b)
    se = math.sqrt(va + vb)
    df = _welch_df(va, vb, len(a) - 1, len(b) - 1) if se > 0 else math.inf
    return Estimate(mean(a) - mean(b), se, df, min(len(a), len(b)), at)


def one_sample(differences: Sequence[float]) -> Estimate:
    """The mean of paired differences with its one-sample t standard error (n - 1 degrees of freedom)."""
    if len(differences) < 2:
        raise ValueError(f"a paired t needs at least 2 pairs, got {len(differences)}")
    sd = math.sqrt(_variance(differences))
    return Estimate(mean(differences), sd / math.sqrt(len(differences)), len(differences) - 1, len(differences),
                    lambda n: (sd / math.sqrt(n), n - 1))


@dataclass(frozen=True)
class Slope:
    """An ordinary least-squares fit y = intercept + slope * x, with the slope's standard error (n - 2 df)."""

    slope: float
    intercept: float
    se: float
    n: int
    residual_variance: float
    sxx_per_point: float   # sum of squared x deviations over n: how the slope's se scales with the runs

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        half = _t_quantile(0.5 + confidence / 2, self.n - 2) * self.se
        return self.slope - half, self.slope + half


def ols_slope(xs: Sequence[float], ys: Sequence[float]) -> Slope:
    """The least-squares line of ys on xs; needs 3 points at 2 or more distinct xs."""
    if len(xs) != len(ys) or len(xs) < 3 or len(set(xs)) < 2:
        raise ValueError(f"a slope needs 3 or more points at 2 or more distinct x, got {len(xs)} at {len(set(xs))}")
    mx, my = mean(xs), mean(ys)
    sxx = math.fsum((x - mx) * (x - mx) for x in xs)
    slope = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    sse = math.fsum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    residual = sse / (len(xs) - 2)
    return Slope(slope, intercept, math.sqrt(residual / sxx), len(xs), residual, sxx / len(xs))


def slope_difference(a: Slope, b: Slope, seeds: int) -> Estimate:
    """a.slope - b.slope with the slopes' independent standard errors and Welch-Satterthwaite degrees of freedom;
    `seeds` per cell, for scaling to another number of seeds at the same x."""
    cells_a, cells_b = a.n / seeds, b.n / seeds

    def at(n: int) -> tuple[float, float]:
        va = a.residual_variance / (a.sxx_per_point * cells_a * n)
        vb = b.residual_variance / (b.sxx_per_point * cells_b * n)
        return math.sqrt(va + vb), _welch_df(va, vb, cells_a * n - 2, cells_b * n - 2)

    va, vb = a.se * a.se, b.se * b.se
    se = math.sqrt(va + vb)
    return Estimate(a.slope - b.slope, se, _welch_df(va, vb, a.n - 2, b.n - 2) if se > 0 else math.inf, seeds, at)


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): Welch's t interval for the difference of two means (unequal variances,
    Welch-Satterthwaite degrees of freedom); both samples need at least 2 values. Two samples without any
    spread give the difference itself as the interval."""
    found = welch(a, b)
    if found.se == 0.0:
        return found.effect, found.effect, found.effect
    return (found.effect, *found.interval(confidence))


def p_value(design: Design, found: Estimate) -> float:
    """The one-sided p of the claimed direction: H0 effect <= 0 (superiority), <= -margin (non-inferiority), or
    outside ±margin (equivalence: the larger of its two one-sided p)."""
    if design.hypothesis == "superiority":
        return _t_tail(found.effect / found.se, found.df)
    above = _t_tail((found.effect + design.margin) / found.se, found.df)
    if design.hypothesis == "non-inferiority":
        return above
    return max(above, _t_tail((design.margin - found.effect) / found.se, found.df))


def excludes_sesoi(design: Design, low: float, high: float) -> bool:
    """Whether [low, high] excludes the smallest effect of interest on the claimed side (RULE's not held)."""
    if design.hypothesis == "superiority":
        return high < design.sesoi
    if design.hypothesis == "non-inferiority":
        return high < -design.margin
    return low > design.margin or high < -design.margin


def runs_needed(design: Design, found: Estimate, alpha: float = ALPHA) -> int | None:
    """The smallest n per arm (a trend: seeds per cell) with 80 % power at the SESOI (non-inferiority and
    equivalence: at the margin with a true effect of 0) to a one-sided test at `alpha`, at the observed variance;
    None beyond MAX_N."""
    distance = design.sesoi if design.hypothesis == "superiority" else design.margin
    # equivalence must clear both margins: each side at power 1 - (1 - POWER) / 2
    power = POWER if design.hypothesis != "equivalence" else 1 - (1 - POWER) / 2
    for n in range(2, MAX_N + 1):
        se, df = found.at(n)
        if df > 0 and (_t_quantile(1 - alpha, df) + _t_quantile(power, df)) * se <= distance:
            return n
    return None


def decide(p_adjusted: float | None, sesoi_excluded: bool) -> str:
    """RULE's verdict from a (Holm-adjusted) p and whether the 95 % interval excludes the SESOI."""
    if p_adjusted is not None and p_adjusted < ALPHA:
        return HELD
    return NOT_HELD if sesoi_excluded else INCONCLUSIVE


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times (m - i + 1), made
    non-decreasing along that order, at most 1."""
    m = len(p_values)
    adjusted = [1.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


# ----------------------------------------------------------------------------------------- two arms
@dataclass(frozen=True)
class Evidence:
    """What the runs say about a claim alone in its family: the arms' values (NaN and ±inf included, never used),
    the effect, its interval and one-sided p, the verdict, and why there is no interval where the number of seeds
    does not say it."""

    treatment: list[float]
    baseline: list[float]
    difference: float | None
    low: float | None
    high: float | None
    verdict: str
    compute_s: float
    note: str | None = None
    p: float | None = None
    excludes_sesoi: bool = False
    found: Estimate | None = None   # the test's estimate (claims.runs_needed reads it)


def without_spread(values: Sequence[float]) -> bool:
    """Whether `values` are one value but for float rounding (equal to 12 significant digits: differences of two
    metrics differ by 1e-15): a t interval over them is as wide as the rounding, and calls any difference
    certain."""
    return len({f"{value:.12g}" for value in values}) == 1


def no_spread(names: Sequence[str]) -> str:
    """Why seeds that all gave one value give no interval, naming the arms (`treatment`, `baseline`)."""
    return f"no interval: every seed of the {' and of the '.join(names)} gave the same value"


def tested(design: Design, values: tuple[list[float], list[float]], found: Estimate, compute: float) -> Evidence:
    """The Evidence of an estimate with a spread: its interval, p, verdict alone in its family, and n needed."""
    low, high = found.interval()
    p = p_value(design, found)
    beyond = excludes_sesoi(design, low, high)
    return Evidence(*values, found.effect, low, high, decide(p, beyond), compute, None, p, beyond, found)


def interim(planned: int | None, runs: Sequence[int]) -> str | None:
    """Why a pre-registered claim has no test yet: `runs` (completed runs per arm) short of the `planned` runs per
    arm its design fixed in advance; None once every arm has them, or without a plan. A test at an interim look
    would be optional stopping."""
    if planned is None or min(runs, default=0) >= planned:
        return None
    have = " and ".join(map(str, runs)) if len(set(runs)) > 1 else str(runs[0] if runs else 0)   # `5 and 12`, `5`
    return f"{have} of {planned} pre-registered runs{' per arm' if len(runs) > 1 else ''}: no test before all have run"


def _seed(rec: RunRecord) -> int | None:
    return as_int(rec.data.get("seed", rec.config.get("seed")))


def evaluate(claim: Claim, records: list[RunRecord]) -> Evidence:
    """The claim's evidence and its verdict alone in its family, by RULE."""
    arms = [claim.treatment.runs(records), claim.baseline.runs(records)]
    read = [[(rec, v) for rec in runs if (v := claim.read(rec)) is not None] for runs in arms]
    values = ([v for _, v in read[0]], [v for _, v in read[1]])
    numbers = [finite(arm) for arm in values]
    compute = compute_time([rec for runs in arms for rec in runs])
    if not all(values):
        return Evidence(*values, None, None, None, NOT_RUN, compute)
    if not all(numbers):
        return Evidence(*values, None, None, None, INCONCLUSIVE, compute, "no finite value in an arm")
    diff = mean(numbers[0]) - mean(numbers[1])
    if (waiting := interim(claim.planned, [len(runs) for runs in arms])) is not None:
        return Evidence(*values, diff, None, None, INCONCLUSIVE, compute, waiting)
    if claim.design.test == "paired t":
        by_seed = [{_seed(rec): v for rec, v in arm if math.isfinite(v)} for arm in read]
        shared = sorted(seed for seed in by_seed[0].keys() & by_seed[1].keys() if seed is not None)
        differences = [by_seed[0][seed] - by_seed[1][seed] for seed in shared]
        if len(differences) < MIN_RUNS:
            return Evidence(*values, diff, None, None, INCONCLUSIVE, compute,
                            f"{len(differences)} seed(s) in both arms: too few pairs for an interval")
        if without_spread(differences):
            return Evidence(*values, mean(differences), None, None, INCONCLUSIVE, compute,
                            "no interval: every seed gave the same difference")
        return tested(claim.design, values, one_sample(differences), compute)
    if min(len(arm) for arm in numbers) < MIN_RUNS:
        return Evidence(*values, diff, None, None, INCONCLUSIVE, compute)
    constant = [name for name, arm in zip(("treatment", "baseline"), numbers) if without_spread(arm)]
    if constant:
        return Evidence(*values, diff, None, None, INCONCLUSIVE, compute, no_spread(constant))
    return tested(claim.design, values, welch(*numbers), compute)


def evidence_row(design: Design, evidence: Evidence, treatment: str, baseline: str, unit: str, commands: list[str],
                 arms: tuple[tuple[str, frozenset[str]], ...], runs_unit: str = "per arm") -> ClaimRow:
    """The table row of a claim's Evidence."""
    return ClaimRow(treatment, baseline,
                    format_difference(evidence.difference, evidence.low, evidence.high, evidence.note),
                    design.text(unit), evidence.verdict, evidence.compute_s, commands, evidence.p,
                    evidence.excludes_sesoi, evidence.difference, evidence.found, runs_unit, arms)


@dataclass(frozen=True)
class Claim:
    """A paper's statement tested by two arms on one number per run."""

    paper: str                                 # citation
    statement: str                             # the paper's words, or a faithful summary
    published: str                             # the paper's number(s), as text
    setting: str                               # where we test it (task, preset), as text
    treatment: Arm
    baseline: Arm
    read: Callable[[RunRecord], float | None]  # the number of one run, in `unit`
    design: Design
    unit: str = "points"
    # the setting as the arms' runs measured it, where a config key the arms pool over changes what `read` reads
    # (ERNIE-Sparse's shifted test: one shift, or the mean over several); None: `setting` whatever the runs
    setting_of: Callable[[list[RunRecord]], str] | None = None
    # a confirmatory study's runs per arm, fixed in advance (its arms pinned to as many declared seeds): no test, and
    # no interval, before every arm has them all (`interim`); None: tested at any number of runs, as a pilot is
    planned: int | None = None

    def row(self, records: list[RunRecord]) -> ClaimRow:
        found = evaluate(self, records)
        sides = [(self.treatment, found.treatment), (self.baseline, found.baseline)]
        labels = [f"{arm.label}: {mean_std(values) or 'no runs'}" for arm, values in sides]
        wanted = max(3, self.planned or 0)
        commands = list(dict.fromkeys(arm.command for arm, values in sides if len(finite(values)) < wanted))
        runs = [arm.runs(records) for arm, _ in sides]
        arms = tuple((arm.label, _folders(mine)) for (arm, _), mine in zip(sides, runs))
        row = evidence_row(self.design, found, *labels, self.unit, commands, arms)
        if self.setting_of:
            row = replace(row, setting=self.setting_of([rec for mine in runs for rec in mine]))
        if found.verdict == NOT_RUN or interim(self.planned, [len(mine) for mine in runs]) is not None:
            return row   # no interval of any kind at an interim look
        return replace(row, examples=examples_cell(runs, self.read))


# The claim's number as a multiple of its runs' test metric: as recorded (BLEU, F1, perplexity) or in points (accuracy).
EXAMPLE_SCALES = (1.0, 100.0)


def examples_cell(arms: Sequence[Sequence[RunRecord]], read: Callable[[RunRecord], float | None]) -> str:
    """The `seeds × examples` cell: the hierarchical bootstrap interval of the claim's difference (bootstrap.py)
    where every run kept a per-example record of the metric the claim reads, else why not."""
    runs = [rec for arm in arms for rec in arm]
    records = [rec.test_examples for rec in runs]
    missing = [problem for problem in records if isinstance(problem, str)]
    if missing:
        counts = {problem: missing.count(problem) for problem in missing}
        return "; ".join(f"{problem} ({count} of {len(runs)} runs)" for problem, count in counts.items())
    scale = _scale(runs, records, read)
    if scale is None:
        return "the claim's number is not its runs' test metric"
    split = len(arms[0])
    try:
        found = hierarchical_interval(records[:split], records[split:], scale)
    except ValueError as exc:
        return str(exc)
    return (f"{found.difference:+.2f} [{found.low:+.2f}, {found.high:+.2f}] "
            f"({found.resamples} resamples of seeds and of {found.examples} test examples)")


def _scale(runs: Sequence[RunRecord], records: Sequence, read: Callable[[RunRecord], float | None]) -> float | None:
    """The EXAMPLE_SCALES factor that turns every run's recorded metric into the claim's number, or None."""
    for scale in EXAMPLE_SCALES:
        if all((value := read(rec)) is not None and math.isclose(value, scale * found.value(), rel_tol=1e-5, abs_tol=1e-9)
               for rec, found in zip(runs, records)):
            return scale
    return None


# ----------------------------------------------------------------------------------------- a trend
@dataclass(frozen=True)
class TrendClaim:
    """A claim that a number changes faster with x under the treatment than under the baseline: an OLS slope of
    `read` on `x` per arm over all its runs, and the difference of the slopes (treatment minus baseline) with the
    slopes' independent standard errors. Runs that both arms hold at one x (the same model under two names) make
    the slopes positively correlated, so that interval is, if anything, too wide."""

    paper: str
    statement: str
    published: str
    setting: str
    treatment: Arm                                   # every run of the treatment, at every x
    baseline: Arm
    x: Callable[[RunRecord], float | None]           # the regressor of one run
    x_label: str                                     # what a slope is per ("per doubling of heads")
    read: Callable[[RunRecord], float | None]
    design: Design
    unit: str = "ppl"

    def points(self, runs: list[RunRecord]) -> list[tuple[float, float]]:
        """(x, y) of the runs with a finite x and y."""
        pairs = [(self.x(rec), self.read(rec)) for rec in runs]
        return [(x, y) for x, y in pairs if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]

    def row(self, records: list[RunRecord]) -> ClaimRow:
        arms = [self.treatment.runs(records), self.baseline.runs(records)]
        points = [self.points(runs) for runs in arms]
        compute = compute_time([rec for runs in arms for rec in runs])
        folders = tuple((arm.label, _folders(runs)) for arm, runs in zip((self.treatment, self.baseline), arms))
        commands = [arm.command for arm, pts in zip((self.treatment, self.baseline), points) if _seeds_per_x(pts) < 3]
        fits = [_fit(pts) for pts in points]
        labels = [f"{arm.label}: {self._slope_text(fit, pts)}"
                  for arm, fit, pts in zip((self.treatment, self.baseline), fits, points)]
        design_text = self.design.text(f"{self.unit} {self.x_label}")
        if not all(arms):
            return ClaimRow(*labels, "", design_text, NOT_RUN, compute, commands, arms=folders)
        if not all(fits):
            return ClaimRow(*labels, "no slope: an arm has fewer than 3 runs at 2 values of x", design_text,
                            INCONCLUSIVE, compute, commands, arms=folders)
        a, b = fits
        seeds = min(_seeds_per_x(pts) for pts in points)
        if a.se == 0 and b.se == 0:
            return ClaimRow(*labels, f"{a.slope - b.slope:+.2f} (no interval: every run lies on its arm's line)",
                            design_text, INCONCLUSIVE, compute, commands, arms=folders)
        found = tested(self.design, ([], []), slope_difference(a, b, max(seeds, 1)), compute)
        return ClaimRow(*labels, f"{format_difference(found.difference, found.low, found.high)} {self.x_label}",
                        design_text, found.verdict, compute, commands, found.p, found.excludes_sesoi, found.difference,
                        found.found, "seeds per cell", folders)

    def _slope_text(self, fit: Slope | None, points: list[tuple[float, float]]) -> str:
        if not points:
            return "no runs"
        if fit is None:
            return f"no slope (n={len(points)})"
        low, high = fit.interval()
        return f"{fit.slope:+.2f} {self.x_label} [{low:+.2f}, {high:+.2f}] (n={fit.n})"


def _fit(points: list[tuple[float, float]]) -> Slope | None:
    xs = [x for x, _ in points]
    return ols_slope(xs, [y for _, y in points]) if len(points) >= 3 and len(set(xs)) >= 2 else None


def _seeds_per_x(points: list[tuple[float, float]]) -> int:
    """The fewest runs at any one x (0 without points)."""
    counts: dict[float, int] = {}
    for x, _ in points:
        counts[x] = counts.get(x, 0) + 1
    return min(counts.values(), default=0)


# ----------------------------------------------------------------------------------------- cells
def format_difference(difference: float | None, low: float | None, high: float | None, note: str | None = None) -> str:
    """A claim's result cell: the difference with its interval, or why there is none (`note`, else too few
    seeds)."""
    if difference is None:
        return note or ""
    if low is None or high is None:
        return f"{difference:+.2f} ({note or 'too few seeds for an interval'})"
    return f"{difference:+.2f} [{low:+.2f}, {high:+.2f}]"


def mean_std(values: list[float]) -> str:
    """An arm's values as `46.50 ± 0.50 (n=3)` or `46.00 (n=1)`, over the finite ones; the others follow, never
    averaged (`(n=3; not averaged: nan)`)."""
    if not values:
        return ""
    numbers = finite(values)
    others = ", ".join(number_text(value) for value in values if not math.isfinite(value))
    counted = f"n={len(numbers)}" + (f"; not averaged: {others}" if others else "")
    if not numbers:
        return f"no finite value ({counted})"
    if len(numbers) == 1:
        return f"{numbers[0]:.2f} ({counted})"
    return f"{mean(numbers):.2f} ± {stdev(numbers):.2f} ({counted})"


def p_text(p: float | None) -> str:
    """A p-value cell: 3 significant digits, `< 0.0001` below that."""
    if p is None:
        return ""
    return "< 0.0001" if p < 1e-4 else f"{p:.3g}"


def power_text(design: Design, row: ClaimRow, verdict: str, family_size: int) -> str:
    """The `n needed` cell of an inconclusive claim: the runs that give 80 % power at the SESOI at the level of
    Holm's first step in its family (0.025 / family_size), and whether the claim was underpowered."""
    if verdict != INCONCLUSIVE or row.found is None:
        return ""
    needed = runs_needed(design, row.found, ALPHA / family_size)
    have = row.found.n
    need = f"{needed} {row.runs_unit}" if needed is not None else f"> {MAX_N} {row.runs_unit}"
    if row.p is not None and row.p < ALPHA:
        return f"held alone (p < 0.025), not after Holm's adjustment; {need} would decide it (has {have})"
    if needed is None or needed > have:
        return f"underpowered: {need} would decide it (has {have})"
    return f"{need} (has {have}): powered, yet the interval reaches both 0 and the SESOI"


def published_text(design: Design, estimate: float | None) -> str:
    """The `vs published` cell: the size against the paper's number where the settings match; else what is
    comparable."""
    source = f" ({design.published_source})" if design.published_source else ""
    if design.published_effect is None:
        return f"no single published effect{source}"
    published = f"{design.published_effect:+.2f}"
    if design.published_comparable:
        ours = f"ours {estimate:+.2f} against " if estimate is not None else ""
        return f"{ours}published {published}{source}"
    ratio = ""
    if estimate is not None and design.published_effect != 0:
        ratio = f"; ours is {estimate / design.published_effect:.1f}× it"
    return f"direction only, the setting differs: published {published}{source}{ratio}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 360 else f"{seconds / 60:.0f} min"


def compute_time(records: Sequence[RunRecord]) -> float:
    """Seconds of compute the runs took: a CPU run's CPU time (all threads; its wall time on a shared machine
    counts the other jobs and any pause too), an accelerator run's wall time; plus, once each, the
    pre-training stages they started from (their `pretraining` record)."""
    stages = {str(stage.get("run_dir")): stage for rec in records
              if isinstance(stage := rec.data.get("pretraining"), dict)}
    return sum(_seconds(data) for data in (*(rec.data for rec in records), *stages.values()))


def _seconds(data: dict) -> float:
    """A run's (or stage's) seconds as compute_time counts them; 0 where it recorded no finite number."""
    measured = "cpu_time_s" if data.get("device") == "cpu" else "wall_time_s"
    for key in (measured, "wall_time_s"):
        seconds = as_float(data.get(key))
        if seconds and math.isfinite(seconds):
            return seconds
    return 0.0


# ----------------------------------------------------------------------------------------- the table
def families(claims: Sequence[Testable]) -> dict[str, list[int]]:
    """The indices of the claims of each family that Holm's adjustment runs over (those with a test, not a rule
    of their own)."""
    members: dict[str, list[int]] = {}
    for index, claim in enumerate(claims):
        if claim.design.test != "own rule":
            members.setdefault(claim.design.family, []).append(index)
    return members


def holm_by_family(claims: Sequence[Testable], rows: Sequence[ClaimRow]) -> list[float | None]:
    """Each row's Holm-adjusted p within its claim's family (None for a row without a p); a claim of the family
    whose test gave no p counts as p = 1, a rule of its own (no p by design) not at all."""
    adjusted: list[float | None] = [None] * len(rows)
    for members in families(claims).values():
        for index, value in zip(members, holm([rows[i].p if rows[i].p is not None else 1.0 for i in members])):
            adjusted[index] = value if rows[index].p is not None else None
    return adjusted


def shared_arms(rows: Sequence[ClaimRow]) -> list[str]:
    """Per row, the arms whose runs also feed other claims (numbered from 1 in table order)."""
    notes = []
    for index, row in enumerate(rows):
        shared = []
        for label, folders in row.arms:
            others = [str(other + 1) for other, them in enumerate(rows) if other != index and folders
                      and any(folders == theirs for _, theirs in them.arms)]
            if others:
                shared.append(f"{label}: also claim{'s' if len(others) > 1 else ''} {', '.join(others)}")
        notes.append("; ".join(shared))
    return notes


HEADERS = ["claim", "paper", "published", "tested on", "treatment", "baseline", "result", "test", "verdict",
           "compute", "p", "Holm p", "n needed", "vs published", "shared arm", "commits", "seeds × examples"]


def claims_table(claims: Sequence[Testable], records: list[RunRecord]) -> Table:
    """Every claim's row, Holm's adjustment applied within each family, the rule in the notes."""
    rows = [claim.row(records) for claim in claims]
    adjusted = holm_by_family(claims, rows)
    size = {claims[members[0]].design.family: len(members) for members in families(claims).values()}
    shared = shared_arms(rows)
    commits = commit_notes([row.arms for row in rows], records)
    body, missing = [], []
    for claim, row, holm_p, sharing, code in zip(claims, rows, adjusted, shared, commits):
        verdict = decide(holm_p, row.excludes_sesoi) if row.p is not None and holm_p is not None else row.verdict
        body.append([claim.statement, claim.paper, claim.published, row.setting or claim.setting, row.treatment, row.baseline,
                     row.difference, row.test, verdict, _hours(row.compute_s) if row.compute_s else "",
                     p_text(row.p), p_text(holm_p), power_text(claim.design, row, verdict, size.get(claim.design.family, 1)),
                     published_text(claim.design, row.estimate), sharing, code, row.examples])
        missing += [f"`{command}`" for command in row.commands]
    notes = [RULE, "Differences, intervals and the arms' mean ± std (n) are in each claim's unit (accuracy: "
                   "points). Claims are numbered from 1 in the order of this table. Compute: the CPU time (all "
                   "threads) of the runs the claim used; wall time for GPU runs."]
    if missing:
        notes.append("Claims with fewer than 3 seeds, and the commands that fill them: " + "; ".join(dict.fromkeys(missing)))
    return Table(
        slug="claims",
        title="Claims: does it reproduce? (verdicts computed from the runs)",
        headers=list(HEADERS), rows=body, numeric={6}, notes=notes,
    )
