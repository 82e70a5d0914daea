#!/usr/bin/env python
"""Keep the evidence of a study: copy the metrics.json of completed runs into a folder that is committed, so
that `sparse-report <folder>` regenerates its tables and claims without rerunning anything.

    python scripts/keep_results.py docs/evidence/ernie_sparse_listops_cpu outputs/runs/listops_*

Each run's metrics.json (its resolved config, metrics and analysis, ~10 kB; not its checkpoints) goes to
<dest>/<run folder name>/metrics.json, written atomically; a run kept before is replaced. With --with-log the
run's log.jsonl (the report's learning curves, the alpha trajectories; ~0.2 MB for 6,000 steps) and its
figures/*.png come along. Runs that did not complete are listed and skipped: the report never averages them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from sparse_runner.io import atomic_open, atomic_write_text


def keep(dest: Path, run_dirs: list[Path], *, with_log: bool = False) -> tuple[list[Path], list[str]]:
    """(metrics files written, one line per run skipped)."""
    written, skipped = [], []
    for run_dir in run_dirs:
        source = run_dir / "metrics.json"
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            skipped.append(f"{run_dir}: no readable metrics.json ({type(exc).__name__})")
            continue
        if data.get("status") != "completed":
            skipped.append(f"{run_dir}: status {data.get('status')!r}, not completed")
            continue
        target = dest / run_dir.resolve().name / "metrics.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        if with_log:
            extras = [run_dir / "log.jsonl", *sorted((run_dir / "figures").glob("*.png"))]
            for source in filter(Path.is_file, extras):
                copy = target.parent / source.relative_to(run_dir)
                with atomic_open(copy, "wb", encoding=None) as out, source.open("rb") as src:
                    shutil.copyfileobj(src, out)
        # metrics.json last: a folder that has it holds everything asked for.
        atomic_write_text(target, json.dumps(data, indent=1, sort_keys=True) + "\n")
        written.append(target)
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder to keep them in (e.g. docs/evidence/<study>)")
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each holding metrics.json)")
    parser.add_argument("--with-log", action="store_true",
                        help="also keep each run's log.jsonl and figures/*.png (learning curves, alpha trajectories)")
    args = parser.parse_args(argv)
    written, skipped = keep(args.dest, args.runs, with_log=args.with_log)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    print(f"kept {len(written)} run(s) in {args.dest}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
