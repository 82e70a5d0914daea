"""Runs that differ only in their seed (`sparse-run -m seed=0,1,2 ...`): grouped, and shown in every table of
the report the same way, `41.23 ± 0.52 (n=3)` = mean ± sample standard deviation over n runs; one run shows
its value alone. A value that is not finite (NaN, ±inf, an integer beyond a float) is shown after them, never
averaged: `41.23 ± 0.52 (n=3; not averaged: nan)`.

Only completed runs are grouped: a failed, diverged or unfinished run has no result to average, so the
tables that list every run show it on a row of its own, and the paper tables leave it out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from sparse_runner.reporting.presets import EXECUTION_KEYS, STAGE_INIT_FROM, pretrains
from sparse_runner.reporting.runs import RunRecord, is_noise, pick_best, ranking
from sparse_runner.reporting.values import as_float, as_str, finite, fmt_value, mean, number_text, stdev

SEED_KEY = "seed"

# The legend of every table whose cells may summarise several runs.
NOTE = ("`mean ± std (n=k)`: the mean and the sample standard deviation (ddof=1) over k completed runs that differ "
        "only in their seed; one run shows its value alone. A seed run twice counts once (its best run on "
        "validation). Failed, diverged and unfinished runs are never averaged in.")

# What a cell reads from a run: a metric name (`test/bleu`) or a function of the run.
Read = str | Callable[[RunRecord], Any]


def summary(values: Sequence[float], fmt: Callable[[float], str], spread: Callable[[float], str] | None = None) -> str:
    """`fmt(mean) ± spread(std) (n=k)` over the finite values, or `fmt(value)` for a single one, "" for none;
    the values that are not finite follow, never averaged (`41.23 (not averaged: nan)`), or stand alone
    (`nan, inf`). `spread` defaults to `fmt`; a signed difference (`+1.20`) needs an unsigned one."""
    numbers = finite(values)
    others = ", ".join(number_text(value) for value in values if not math.isfinite(value))
    if not numbers:
        return others
    if len(numbers) == 1:
        return fmt(numbers[0]) + (f" (not averaged: {others})" if others else "")
    counted = f"n={len(numbers)}" + (f"; not averaged: {others}" if others else "")
    return f"{fmt(mean(numbers))} ± {(spread or fmt)(stdev(numbers))} ({counted})"


def distinct(texts: Iterable[str], sep: str = " / ") -> str:
    """The different non-empty texts in first-seen order: for what the config fixes (parameters, scale), which
    runs of one group share, so that it shows once."""
    return sep.join(dict.fromkeys(text for text in texts if text))


def _reader(read: Read) -> Callable[[RunRecord], float | None]:
    if isinstance(read, str):
        return lambda rec: rec.metric(read)
    return lambda rec: as_float(read(rec))


@dataclass
class SeedGroup:
    """Completed runs that differ only in their seed, one per seed, by run name."""

    runs: list[RunRecord]
    repeats: list[RunRecord] = field(default_factory=list)   # a seed run again: listed, never counted

    @property
    def first(self) -> RunRecord:
        """The run to read what the group shares from: task, axes, config but the seed."""
        return self.runs[0]

    @property
    def display(self) -> str:
        """The run names (`;`-separated: Hydra's job names hold commas)."""
        text = "; ".join(rec.display for rec in self.runs)
        if self.repeats:
            text += " (not counted, a seed run again: " + "; ".join(rec.display for rec in self.repeats) + ")"
        return text

    @property
    def best(self) -> RunRecord:
        """The one run that stands for the group where one must (a figure): its best on validation."""
        return pick_best(self.runs)

    @property
    def substitute(self) -> bool:
        """Measured on substitute data (metrics.json task_info.data source): the runs of a group share it."""
        info = self.first.data.get("task_info")
        data = info.get("data") if isinstance(info, dict) else None
        return isinstance(data, dict) and data.get("source") == "substitute"

    def values(self, read: Read) -> list[float]:
        """Each run's number, NaN and ±inf included (what a cell shows); runs without one left out."""
        reader = _reader(read)
        return [value for value in map(reader, self.runs) if value is not None]

    def mean(self, read: Read) -> float | None:
        """The mean of the runs' finite numbers, None without any."""
        numbers = finite(self.values(read))
        return mean(numbers) if numbers else None

    def text(self, read: Read, fmt: Callable[[float], str], spread: Callable[[float], str] | None = None) -> str:
        return summary(self.values(read), fmt, spread)

    def config_text(self, key: str) -> str:
        """A config value as a cell: the seed key lists every seed (`0,1,2`), any other key is shared."""
        return distinct((fmt_value(rec.config[key]) for rec in self.runs if key in rec.config), sep=",")

    @property
    def overrides(self) -> list[str]:
        """The group's overrides as the multirun that makes it gives them, its seeds last (`seed=0,1,2`)."""
        others = [item for item in self.first.overrides if item.lstrip("+~").partition("=")[0] != SEED_KEY]
        seeded = len(self.runs) > 1 or len(others) < len(self.first.overrides)
        return others + ([f"{SEED_KEY}={self.config_text(SEED_KEY)}"] if seeded else [])

    def rank(self) -> tuple[float, float, int]:
        """runs.ranking of the means, then more seeds."""
        validation = self.mean(lambda rec: rec.validation_value)
        return (*ranking(self.first.minimises, validation, self.mean(lambda rec: rec.primary_value)), len(self.runs))


def signature(rec: RunRecord, ignore: Iterable[str] = ()) -> tuple:
    """What the runs of one group share: task, data, the metric they are scored on, and every config value that
    may change a result (runs.is_noise) but the seed, `ignore` and the path of a pre-training stage's weights
    (presets.STAGE_INIT_FROM). Not the model= label or the experiment= a run was spelled with:
    `model=softmax normaliser=alpha_entmax` and `model=entmax` are seeds of one group."""
    ignored = {SEED_KEY, *ignore, *((STAGE_INIT_FROM,) if pretrains(rec.keys) else ())}
    config = sorted((key, fmt_value(value)) for key, value in rec.config.items()
                    if key not in ignored and not is_noise(key))
    info = rec.data.get("task_info")
    data = info.get("data") if isinstance(info, dict) else None
    data = (as_str(data.get("source")), as_str(data.get("name"))) if isinstance(data, dict) else None
    return (rec.task, data, rec.primary_metric, tuple(config))


def seed_groups(runs: Iterable[RunRecord], ignore: Iterable[str] = ()) -> list[SeedGroup]:
    """Completed `runs` split into groups that differ only in their seed (and `ignore`), by first run name.
    Runs that did not complete are left out: callers that list every run show them on their own."""
    ignore = tuple(ignore)
    by_signature: dict[tuple, dict[str, list[RunRecord]]] = {}
    for rec in sorted(runs, key=lambda r: r.display):
        if rec.status == "completed":
            seed = fmt_value(rec.config.get(SEED_KEY, rec.data.get(SEED_KEY)))
            by_signature.setdefault(signature(rec, ignore), {}).setdefault(seed, []).append(rec)
    groups = []
    for by_seed in by_signature.values():
        counted, repeats = [], []
        for same in by_seed.values():
            best = pick_best(same)
            counted.append(best)
            repeats += [rec for rec in same if rec is not best]
        groups.append(SeedGroup(sorted(counted, key=lambda r: r.display), repeats))
    return sorted(groups, key=lambda group: group.first.display)


def cell_seed_groups(runs: Iterable[RunRecord], ignore: Iterable[str] = ()) -> list[SeedGroup]:
    """seed_groups for a paper cell or a claim's arm: they take a preset's runs however each was executed
    (presets.EXECUTION_KEYS: precision, compiled or not, attention kernel and where it switches), so those
    keys do not split the seeds either (a seed run with another default attention path still counts)."""
    return seed_groups(runs, ignore=(*EXECUTION_KEYS, *ignore))


def best_group(groups: list[SeedGroup]) -> SeedGroup | None:
    """The group a paper cell shows when several configurations compete for it: one on the official data
    before any on substitute data (validation scores on two datasets say nothing about which is better),
    then the best by SeedGroup.rank. Chosen on validation, so that the test number shown is not itself
    chosen on the test set."""
    official = [group for group in groups if not group.substitute] or groups
    return max(official, key=SeedGroup.rank, default=None)
