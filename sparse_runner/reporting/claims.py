"""Claims: a paper's statement, the two groups of runs that test it, and a verdict computed from them.

A paper module declares its claims beside its tables (`CLAIMS`, a list of `Testable`); `claims_table` gathers
them from every registered paper into one table. A `Claim` compares two arms (the paper's model and its
baseline), each a set of completed runs that differ only in their seed, on one number per run (`read`); a
paper may state a rule of its own for a claim of another shape (`Testable`).

The rule for two arms, stated once (`RULE`): the difference of the arms' means, treatment minus baseline, in the claim's
units, with a Welch t 95 % confidence interval (unequal variances). With three seeds an arm has two degrees
of freedom; a bootstrap percentile interval over three values is far too narrow (it never leaves the range of
the 3^3 resamples), which is why the interval is Student's.
- `greater` (the paper says the treatment is better): held when the whole interval is above zero; not held
  when it is below zero, or when it lies below the paper's own effect (a published number for this very
  comparison) without reaching zero from above; otherwise inconclusive.
- `within` (the paper says the two are about equal, within `margin`): held when the interval lies inside
  ±margin; not held when it lies outside; otherwise inconclusive.
An arm with fewer than two runs gives no interval (inconclusive); nor does an arm whose seeds all gave the same
value, to 12 significant digits (inconclusive: with no spread to measure, Welch's interval has zero width and would call any difference
certain); an arm without runs, "not run". A value that is not finite (NaN, ±inf) is shown in its arm and left
out of the rule. The table lists the commands that bring each arm to three seeds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, Sequence

from sparse_runner.reporting.presets import Preset, match
from sparse_runner.reporting.render import Table
from sparse_runner.reporting.runs import RunRecord, completed
from sparse_runner.reporting.seeds import best_group, cell_seed_groups
from sparse_runner.reporting.values import as_float, finite, mean, number_text, stdev

RULE = ("Verdict: the difference of the two arms' means (treatment minus baseline) with a Welch t 95 % interval "
        "over their seeds. `greater`: held when the interval lies above 0; not held when it lies below 0, or below "
        "a published effect for the same comparison; else inconclusive. `within ±m`: held inside ±m, not held "
        "outside, else inconclusive. An arm needs at least 2 completed runs for an interval, and a spread: seeds that "
        "all gave the same value give none (inconclusive). Values that are not finite (nan, inf) are shown in their "
        "arm and left out.")
HELD, NOT_HELD, INCONCLUSIVE, NOT_RUN = "held", "not held", "inconclusive", "not run"
CONFIDENCE = 0.95
MIN_RUNS = 2


@dataclass(frozen=True)
class ClaimRow:
    """A claim's row of the table: what each side measured, the comparison, the test, the verdict."""

    treatment: str
    baseline: str
    difference: str
    test: str
    verdict: str
    compute_s: float
    commands: list[str] = field(default_factory=list)   # what brings the evidence to three seeds


class Testable(Protocol):
    """Anything the claims table shows: a statement and a row computed from the runs. `Claim` (two arms) is
    the usual one; a paper may define its own rule (the low-rank cliff of Bhojanapalli et al.)."""

    paper: str
    statement: str
    published: str
    setting: str

    def row(self, records: list[RunRecord]) -> ClaimRow: ...


@dataclass(frozen=True)
class Arm:
    """One side of a claim: a label, how to find its runs among the report's, and the command that makes them."""

    label: str
    runs: Callable[[list[RunRecord]], list[RunRecord]]   # the arm's completed runs, one per seed
    command: str                                          # sparse-run ... seed=0,1,2


def preset_arm(label: str, overrides: tuple[str, ...], family: str, metric: str, command: str) -> Arm:
    """A claim's arm (reporting/claims.py): the completed runs of `family` scored on `metric` whose resolved config
    is the preset `overrides` in every result-changing key but the seed (presets.py, however the command line
    spelled it), one per seed; among several such groups (other data), the best on validation."""
    preset = Preset(overrides)

    def runs(records: list[RunRecord]) -> list[RunRecord]:
        mine = [rec for rec in completed(records, family, metric)
                if (found := match(rec.keys, [preset], primary_metric=rec.primary_metric)) is not None and found.exact]
        group = best_group(cell_seed_groups(mine))
        return group.runs if group else []

    return Arm(label, runs, command)



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
    unit: str = "points"
    kind: Literal["greater", "within"] = "greater"
    margin: float = 0.0                        # `within`: the allowed |difference|
    published_effect: float | None = None      # `greater`: the paper's difference for this same comparison

    def row(self, records: list[RunRecord]) -> ClaimRow:
        found = evaluate(self, records)
        difference = format_difference(found.difference, found.low, found.high, found.note)
        sides = [(self.treatment, found.treatment), (self.baseline, found.baseline)]
        arms = [f"{arm.label}: {mean_std(values) or 'no runs'}" for arm, values in sides]
        if self.kind == "within":
            test = f"|difference| <= {self.margin:g}"
        else:
            test = "> 0" + (f" (published {self.published_effect:+.2f})" if self.published_effect is not None else "")
        commands = [arm.command for arm, values in sides if len(finite(values)) < 3]
        return ClaimRow(*arms, difference, test, found.verdict, found.compute_s, commands)


@dataclass(frozen=True)
class Evidence:
    """What the runs say about a claim: the arms' values (NaN and ±inf included, never used), the difference and
    its interval, the verdict, and why there is no interval where the number of seeds does not say it."""

    treatment: list[float]
    baseline: list[float]
    difference: float | None
    low: float | None
    high: float | None
    verdict: str
    compute_s: float
    note: str | None = None


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): Welch's t interval for the difference of two means (unequal variances,
    Welch-Satterthwaite degrees of freedom); both samples need at least 2 values. Two samples without any
    spread give the difference itself as the interval."""
    from scipy import stats  # scipy: Student's t quantile at fractional degrees of freedom

    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's interval needs at least 2 values per arm, got {len(a)} and {len(b)}")
    diff = mean(a) - mean(b)
    va, vb = _variance(a) / len(a), _variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return diff, diff, diff
    # products, not `** 2`: a float power raises where a product gives inf (the interval then says nothing)
    df = (va + vb) * (va + vb) / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return diff, diff - half, diff + half


def _variance(values: Sequence[float]) -> float:
    """The sample variance of finite values; inf beyond a float's range (the interval then says nothing)."""
    try:
        return statistics.variance(values)
    except OverflowError:
        return math.inf


def verdict(claim: Claim, low: float, high: float) -> str:
    """The module docstring's rule for an interval [low, high] of the difference."""
    if claim.kind == "within":
        if -claim.margin <= low and high <= claim.margin:
            return HELD
        if low > claim.margin or high < -claim.margin:
            return NOT_HELD
        return INCONCLUSIVE
    if low > 0:
        return HELD
    if high < 0 or (claim.published_effect is not None and claim.published_effect > 0 and high < claim.published_effect):
        return NOT_HELD
    return INCONCLUSIVE


def without_spread(values: Sequence[float]) -> bool:
    """Whether `values` are one value but for float rounding (equal to 12 significant digits: differences of two
    metrics differ by 1e-15): Welch's interval over them is as wide as the rounding, and calls any difference
    certain."""
    return len({f"{value:.12g}" for value in values}) == 1


def no_spread(names: Sequence[str]) -> str:
    """Why seeds that all gave one value give no interval, naming the arms (`treatment`, `baseline`)."""
    return f"no interval: every seed of the {' and of the '.join(names)} gave the same value"


def evaluate(claim: Claim, records: list[RunRecord]) -> Evidence:
    """The claim's evidence and verdict by the module docstring's rule."""
    arms = [claim.treatment.runs(records), claim.baseline.runs(records)]
    values = [[v for v in map(claim.read, runs) if v is not None] for runs in arms]
    numbers = [finite(arm) for arm in values]
    compute = compute_time([rec for runs in arms for rec in runs])
    if not all(values):
        return Evidence(*values, None, None, None, NOT_RUN, compute)
    if not all(numbers):
        return Evidence(*values, None, None, None, INCONCLUSIVE, compute, "no finite value in an arm")
    diff = mean(numbers[0]) - mean(numbers[1])
    if min(len(arm) for arm in numbers) < MIN_RUNS:
        return Evidence(*values, diff, None, None, INCONCLUSIVE, compute)
    constant = [name for name, arm in zip(("treatment", "baseline"), numbers) if without_spread(arm)]
    if constant:
        return Evidence(*values, diff, None, None, INCONCLUSIVE, compute, no_spread(constant))
    diff, low, high = welch_interval(*numbers)
    return Evidence(*values, diff, low, high, verdict(claim, low, high), compute)


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


def claims_table(claims: Sequence[Testable], records: list[RunRecord]) -> Table:
    rows, missing = [], []
    for claim in claims:
        row = claim.row(records)
        rows.append([claim.statement, claim.paper, claim.published, claim.setting, row.treatment, row.baseline,
                     row.difference, row.test, row.verdict, _hours(row.compute_s) if row.compute_s else ""])
        missing += [f"`{command}`" for command in row.commands]
    notes = [RULE, "Differences, intervals and the arms' mean ± std (n) are in each claim's unit (accuracy: "
                   "points). Compute: the CPU time (all threads) of the runs the claim used; wall time for GPU runs."]
    if missing:
        notes.append("Claims with fewer than 3 seeds, and the commands that fill them: " + "; ".join(dict.fromkeys(missing)))
    return Table(
        slug="claims",
        title="Claims: does it reproduce? (verdicts computed from the runs)",
        headers=["claim", "paper", "published", "tested on", "treatment", "baseline", "result",
                 "test", "verdict", "compute"],
        rows=rows, numeric={6}, notes=notes,
    )
