#!/usr/bin/env python
"""sparse-report over many runs: how long a report takes and how large report.html is.

Generates N run directories as the trainer writes them (metrics.json with a real preset's resolved config,
log.jsonl with the training loss every 20 steps and the validation metric every 500), spread over LRA
ListOps CPU presets (four models), three learning rates and seeds, with some failed, diverged and unfinished
runs; then times `sparse-report` on them (all formats) and each of its phases.

    python scripts/bench_report.py                    # 1,000 runs
    python scripts/bench_report.py --runs 200 --out /tmp/bench

Writes <out>/report_scaling.json and .md (default out: outputs/benchmarks); the generated runs go to a
temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparse_runner.io import atomic_write_json, atomic_write_text
from sparse_runner.reporting import collect_runs
from sparse_runner.reporting.curves import task_curves
from sparse_runner.reporting.presets import compose
from sparse_runner.reporting.report import _paper_parts
from sparse_runner.reporting.runs_table import runs_tables

MODELS = ("softmax", "bigbird", "local", "entmax")
LEARNING_RATES = (1e-3, 5e-4, 2e-4)
MAX_STEPS, LOG_EVERY, EVAL_EVERY = 4000, 20, 500
# One run in twenty fails, one in forty diverges, one in forty is still running.
STATUSES = ["completed"] * 36 + ["failed"] * 2 + ["diverged", "unfinished"]


def write_runs(root: Path, count: int, seed: int = 0) -> None:
    """`count` run directories under `root`, configurations first, then seeds, so every group has seeds."""
    rng = random.Random(seed)
    configs = {model: compose(("experiment=lra_listops_cpu", f"model={model}")) for model in MODELS}
    combos = [(model, lr) for model in MODELS for lr in LEARNING_RATES]
    for index in range(count):
        model, lr = combos[index % len(combos)]
        run_seed = index // len(combos)
        status = rng.choice(STATUSES)
        config = copy.deepcopy(configs[model])
        config["seed"], config["trainer"]["lr"] = run_seed, lr
        run_dir = root / "multirun" / f"{model}_lr{lr:g}_seed{run_seed}"
        run_dir.mkdir(parents=True)
        skill = 0.35 + 0.1 * MODELS.index(model) / len(MODELS) + rng.uniform(-0.02, 0.02)
        steps = MAX_STEPS if status == "completed" else rng.randrange(LOG_EVERY, MAX_STEPS, LOG_EVERY)
        lines = []
        for step in range(LOG_EVERY, steps + 1, LOG_EVERY):
            loss = 2.3 - 0.8 * step / MAX_STEPS + rng.uniform(-0.05, 0.05)
            if status == "diverged" and step == steps:
                loss = float("nan")
            lines.append({"step": step, "train/loss": loss, "train/lr": lr, "train/tokens_per_s": 16000.0})
            if step % EVAL_EVERY == 0:
                lines.append({"step": step, "val/loss": loss, "val/accuracy": skill * step / MAX_STEPS})
        (run_dir / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        done = status == "completed"
        metrics = {
            "schema": 2, "status": status, "error": "RuntimeError: CUDA out of memory" if status == "failed" else None,
            "run_dir": str(run_dir), "task": "listops", "task_family": "listops", "model": model,
            "experiment": "lra_listops_cpu", "config": config, "seed": run_seed, "primary_metric": "test/accuracy",
            "overrides": ["experiment=lra_listops_cpu", f"model={model}", f"trainer.lr={lr:g}", f"seed={run_seed}"],
            "metrics": {"val/accuracy": skill, "test/accuracy": skill + 0.01} if done else {},
            "selection": {"metric": "val/accuracy", "mode": "max", "best_value": skill, "best_step": MAX_STEPS},
            "step": steps, "max_steps": MAX_STEPS, "num_parameters": 285194,
            "tokens_per_second": 16000.0 + rng.uniform(-500, 500), "wall_time_s": 235.0 + rng.uniform(-20, 20),
        }
        (run_dir / "metrics.json").write_text(json.dumps(metrics))


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--out", default="outputs/benchmarks")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_report_") as tmp:
        root = Path(tmp) / "outputs"
        _, generate_s = timed(write_runs, root, args.runs)
        # The command as a user runs it (a new process: imports included), all formats written; then its
        # phases, each on its own in this process.
        command = [str(Path(sys.executable).with_name("sparse-report")), str(root), "--print", "none"]
        proc, total_s = timed(subprocess.run, command)
        if proc.returncode != 0:
            print(f"bench_report: sparse-report exited {proc.returncode}", file=sys.stderr)
            return 1
        records, collect_s = timed(collect_runs, [root])
        _, papers_s = timed(_paper_parts, records, Path(tmp) / "phases")
        _, runs_s = timed(runs_tables, records)
        curves, curves_s = timed(task_curves, records)
        report = root / "report"
        html_bytes, md_bytes = (report / "report.html").stat().st_size, (report / "report.md").stat().st_size

    result = {
        "runs": args.runs, "machine": platform.platform(), "python": platform.python_version(),
        "report_s": round(total_s, 2), "report_html_bytes": html_bytes, "report_md_bytes": md_bytes,
        "phases_s": {"collect_runs": round(collect_s, 2), "paper_tables_and_figures": round(papers_s, 2),
                     "runs_tables": round(runs_s, 2), "learning_curves": round(curves_s, 2)},
        "curve_figures": len(curves), "generate_s": round(generate_s, 2),
    }
    out = Path(args.out)
    atomic_write_json(out / "report_scaling.json", result)
    phases = "\n".join(f"| {name} | {seconds:.2f} |" for name, seconds in result["phases_s"].items())
    table = (f"# sparse-report over {args.runs} generated runs\n\n"
             f"`sparse-report` (md, csv, tex, html): **{total_s:.1f} s**; report.html {html_bytes / 1e6:.2f} MB, "
             f"report.md {md_bytes / 1e6:.2f} MB ({platform.platform()}).\n\n"
             f"| phase (alone, in one process after the command) | seconds |\n|---|---:|\n{phases}\n")
    atomic_write_text(out / "report_scaling.md", table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
