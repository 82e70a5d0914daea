#!/usr/bin/env python
"""Keep the evidence of a study: copy the metrics.json of completed runs into a folder that is committed, so
that `sparse-report <folder>` regenerates its tables and claims without rerunning anything.

    python scripts/keep_results.py docs/evidence/ernie_sparse_listops_cpu outputs/runs/listops_*

Each run's metrics.json (its resolved config, metrics and analysis, ~10 kB; not its checkpoints) goes to
<dest>/<run folder name>/metrics.json, with its test_examples.npz (the per-example record of its test metric, a
few kB, which the claims' seeds × examples intervals read) where it has one. With --with-log the run's log.jsonl (the report's learning curves, the
alpha trajectories; ~0.2 MB for 6,000 steps) and its figures/*.png (regular files of the run only) come along.
Runs that did not complete are listed and skipped: the report never averages them.

A run kept before is replaced as a whole: its new folder is built beside the old one under a temporary name
and swapped in, so nothing of an earlier keep (a log, a figure) outlives it. Runs are named by their folder,
so two runs whose folders share a name are refused, as is a destination that is a file or cannot be written,
or a name in it taken by something that is not a kept run: one line each, exit status 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from sparse_runner import example_scores, run_metrics
from sparse_runner.cli import unusable_directory
from sparse_runner.io import atomic_directory, atomic_open, atomic_write_text

EXIT_REFUSED = 2


class Refused(ValueError):
    """A command that would lose or mix up kept results, in one line."""


def completed_runs(run_dirs: list[Path]) -> tuple[list[tuple[Path, dict]], list[str]]:
    """([(run folder, its metrics)] of the completed runs, each folder once; one line per run skipped)."""
    chosen, skipped, seen = [], [], set()
    for run_dir in run_dirs:
        if run_dir.resolve() in seen:
            continue
        seen.add(run_dir.resolve())
        try:
            data = run_metrics.read(run_dir / "metrics.json")
        except ValueError as exc:   # run_metrics.UnreadableFile: its message says why
            skipped.append(f"{run_dir}: metrics.json {exc}")
            continue
        if data.get("status") != "completed":
            skipped.append(f"{run_dir}: status {data.get('status')!r}, not completed")
            continue
        chosen.append((run_dir, data))
    return chosen, skipped


def check_destination(dest: Path, run_dirs: list[Path]) -> None:
    """Raise Refused unless every run can be kept in `dest` under its folder's name without replacing
    another run or anything that is not a kept run."""
    by_name: dict[str, Path] = {}
    for run_dir in run_dirs:
        name = run_dir.resolve().name
        if name in by_name:
            raise Refused(f"{by_name[name]} and {run_dir} share the folder name {name!r}, which names a run in {dest}; "
                          "keep them in separate destinations, or rename one of the folders")
        by_name[name] = run_dir
    problem = unusable_directory(dest)
    if problem:
        raise Refused(f"{dest} {problem}")
    for name in by_name:
        target = dest / name
        if (target.exists() or target.is_symlink()) and not (target.is_dir() and not target.is_symlink() and (target / "metrics.json").is_file()):
            raise Refused(f"{target} exists and is not a kept run (no metrics.json in a folder); move it away, or keep the runs elsewhere")


def keep(dest: Path, run_dirs: list[Path], *, with_log: bool = False) -> tuple[list[Path], list[str]]:
    """Keep the completed runs of `run_dirs` in `dest`; returns (metrics files written, one line per run
    skipped). Raises Refused before writing anything, and OSError if a write fails (a kept folder is then as
    it was)."""
    chosen, skipped = completed_runs(run_dirs)
    check_destination(dest, [run_dir for run_dir, _ in chosen])
    written = []
    for run_dir, data in chosen:
        target = dest / run_dir.resolve().name
        with atomic_directory(target, replace=True) as folder:
            # the per-example record of the test metric always comes (a few kB): the claims' bootstrap intervals read it
            extras = [run_dir / example_scores.FILE]
            if with_log:
                extras += [run_dir / "log.jsonl", *sorted((run_dir / "figures").glob("*.png"))]
            for source in extras:
                if source.is_file() and not source.is_symlink():  # not a link to a file outside the run
                    with atomic_open(folder / source.relative_to(run_dir), "wb", encoding=None) as out, source.open("rb") as src:
                        shutil.copyfileobj(src, out)
            atomic_write_text(folder / "metrics.json", json.dumps(data, indent=1, sort_keys=True) + "\n")
        written.append(target / "metrics.json")
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder to keep them in (e.g. docs/evidence/<study>)")
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each holding metrics.json)")
    parser.add_argument("--with-log", action="store_true",
                        help="also keep each run's log.jsonl and figures/*.png (learning curves, alpha trajectories)")
    args = parser.parse_args(argv)
    try:
        written, skipped = keep(args.dest, args.runs, with_log=args.with_log)
    except Refused as exc:
        print(f"keep_results: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"keep_results: error: could not write {exc.filename or args.dest}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    print(f"kept {len(written)} run(s) in {args.dest}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
