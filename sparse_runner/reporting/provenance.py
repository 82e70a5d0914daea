"""Which code a run ran, as its metrics.json tells, and the claims table's `commits` cell.

run.py records the code of every process of a run in `provenance` (one entry per process: its commit and the
step it began at; the checkpoint carries the list across a resume), and a fine-tuning run copies its
pre-training stage's record into `pretraining`. A run without `provenance` records only `git_commit`, the commit
of the process that wrote its metrics.json last: what its earlier processes ran is unknown. Such a run reads as
"unknown", never as one commit; runs that recorded different commits are "mixed" whatever else is unknown.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sparse_runner.reporting.runs import RunRecord

SHORT = 7   # hex digits of a commit shown (git's short form)
MIXED, UNKNOWN = "mixed", "unknown"


@dataclass(frozen=True)
class RunCode:
    """The code one run ran, as far as its metrics.json tells."""

    commits: tuple[str, ...]   # the distinct commits recorded, in the order the run first ran each
    complete: bool             # every process, of the run and of its pre-training stage, recorded its commit
    dirty: bool                # a process ran with tracked files that differed from its commit


def _commit(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def run_code(data: Mapping[str, Any]) -> RunCode:
    """The RunCode of a metrics.json: its pre-training stage's processes (`pretraining`), then its own."""
    commits: list[str] = []
    complete, dirty = True, False
    stage = data.get("pretraining")
    for record in ([stage] if isinstance(stage, dict) else []) + [data]:
        entries = record.get("provenance")
        if isinstance(entries, list) and entries and all(isinstance(entry, dict) for entry in entries):
            for entry in entries:
                commit = _commit(entry.get("commit"))
                complete = complete and commit is not None
                dirty = dirty or entry.get("dirty") is True
                commits += [commit] if commit else []
        else:
            complete = False
            commit = _commit(record.get("git_commit"))
            commits += [commit] if commit else []
    return RunCode(tuple(dict.fromkeys(commits)), complete, dirty)


def _runs(count: int) -> str:
    return f"{count} run{'s' if count != 1 else ''}"


def _arm_commits(label: str, codes: list[RunCode]) -> str:
    """`label: 0b4be0f (2 runs), 12dd2f8 (1 run), 1 run across 2 commits`: the runs under each commit (a run
    resumed on another commit counts under each), most runs first."""
    counts = Counter(commit for code in codes for commit in code.commits)
    most_first = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = [f"{commit[:SHORT]} ({_runs(n)})" for commit, n in most_first]
    across = [len(code.commits) for code in codes if len(code.commits) > 1]
    if across:   # resumed on another commit, or fine-tuned on another commit than its pre-training stage's
        shown.append(f"1 run across {across[0]} commits" if len(across) == 1
                     else f"{_runs(len(across))} each across 2 or more commits")
    unrecorded = sum(not code.commits for code in codes)
    if unrecorded:
        shown.append(f"{_runs(unrecorded)} without a commit")
    return f"{label}: {', '.join(shown)}"


def commits_cell(arms: Sequence[tuple[str, Sequence[RunRecord]]]) -> str:
    """A claim's `commits` cell from its arms (label, runs): `mixed: ...` where the runs span more than one commit
    (a run resumed on another commit, the runs of one arm, or the two arms), naming each arm's commits;
    `unknown: ...` where at most one commit is recorded but a run does not record every process's; empty where
    every run ran one recorded commit. Runs from a checkout with uncommitted changes are named after it."""
    codes = [(label, [run_code(rec.data) for rec in runs]) for label, runs in arms if runs]
    every = {commit for _, runs in codes for code in runs for commit in code.commits}
    parts = []
    if len(every) > 1:
        parts.append(f"{MIXED}: " + "; ".join(_arm_commits(label, runs) for label, runs in codes))
        partial = sum(not code.complete for _, runs in codes for code in runs)
        if partial:   # their other processes may have run yet other commits
            parts.append(f"not every process's commit recorded by {partial} of {_runs(sum(len(runs) for _, runs in codes))}")
    else:
        partial = [(label, sum(not code.complete for code in runs), len(runs)) for label, runs in codes]
        partial = [f"{label} {k} of {_runs(n)}" for label, k, n in partial if k]
        if partial:
            recorded = (f"one commit recorded ({next(iter(every))[:SHORT]}), not every process's" if every
                        else "no commit recorded")
            parts.append(f"{UNKNOWN}: {recorded}: " + ", ".join(partial))
    dirty = [f"{label}: {_runs(k)}" for label, runs in codes if (k := sum(code.dirty for code in runs))]
    if dirty:
        parts.append("uncommitted changes in " + "; ".join(dirty))
    return ". ".join(part[:1].upper() + part[1:] if index else part for index, part in enumerate(parts))


def commit_notes(arms_per_row: Sequence[Sequence[tuple[str, frozenset[str]]]], records: Sequence[RunRecord]) -> list[str]:
    """Per claim row, given each arm's label and run folders, its `commits_cell`."""
    by_folder = {str(rec.path): rec for rec in records}
    return [commits_cell([(label, [by_folder[folder] for folder in sorted(folders) if folder in by_folder])
                          for label, folders in arms]) for arms in arms_per_row]
