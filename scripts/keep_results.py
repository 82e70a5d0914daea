#!/usr/bin/env python
"""Keep the evidence of a study: copy the metrics.json of completed runs into a folder that is committed, so
that `sparse-report <folder>` regenerates its tables and claims without rerunning anything.

    python scripts/keep_results.py docs/evidence/ernie_sparse_listops_cpu outputs/runs/listops_*

Each run's metrics.json (its resolved config, metrics and analysis, ~10 kB; not its checkpoints, logs or
figures) goes to <dest>/<run folder name>/metrics.json, written atomically; a run kept before is replaced.
Runs that did not complete are listed and skipped: the report never averages them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparse_runner.io import atomic_write_text


def keep(dest: Path, run_dirs: list[Path]) -> tuple[list[Path], list[str]]:
    """(files written, one line per run skipped)."""
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
        atomic_write_text(target, json.dumps(data, indent=1, sort_keys=True) + "\n")
        written.append(target)
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder to keep them in (e.g. docs/evidence/<study>)")
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each holding metrics.json)")
    args = parser.parse_args(argv)
    written, skipped = keep(args.dest, args.runs)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    print(f"kept {len(written)} run(s) in {args.dest}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
