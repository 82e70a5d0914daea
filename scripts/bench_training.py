#!/usr/bin/env python
"""End-to-end training speed of alpha-entmax against softmax, per CPU preset, side by side in one run.

For each experiment of --experiments, the same model is trained with `model=softmax` and with each model of
--models (default `entmax`: alpha-entmax with a learned alpha per head); rounds alternate between them so
that a change of machine load hits all alike, and the medians of training tokens/s are compared as
ratios to softmax. The loop is `train_minimal` in scripts/benchmarking.py: forward, backward, clipping,
AdamW and the schedule of the experiment's config, no evaluation, logging or checkpoints, so the ratio
is the models' and not the trainer's (scripts/bench_trainer_overhead.py measures the trainer's cost).

Targets (x softmax, training tokens/s): lra_text_4k_cpu >= 0.5; lra_text_cpu and mt_cpu >= 0.8.

    python scripts/bench_training.py                                   # the three presets, ~12 min on 2 cores
    python scripts/bench_training.py --experiments mt_cpu --steps 5 --rounds 1 --threads 2
    python scripts/bench_training.py --overrides trainer.cpu_block_cache_mb=0   # PyTorch's allocator alone

Writes <out>/training.json and training.md (default out: outputs/bench/training). The 1-minute load
average before and after each experiment is recorded: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from benchmarking import training_throughput, write_benchmark
from sparse_runner.training import cpu_block_cache

TARGETS = {"lra_text_4k_cpu": 0.5, "lra_text_cpu": 0.8, "mt_cpu": 0.8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", default=",".join(TARGETS), help="comma-separated experiment= presets")
    parser.add_argument("--models", default="entmax", help="comma-separated model= options compared with softmax")
    parser.add_argument("--steps", type=int, default=10, help="training steps per round and model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default="outputs/bench/training")
    parser.add_argument("--overrides", nargs="*", default=[], help="config overrides after experiment= (e.g. a smaller model)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = ["softmax", *(m for m in args.models.split(",") if m != "softmax")]
    result = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "steps": args.steps, "rounds": args.rounds, "overrides": args.overrides, "experiments": []}
    md = [f"# Training tokens/s against softmax ({args.steps} steps x {args.rounds} alternating rounds, medians; "
          f"{torch.get_num_threads()} threads, torch {torch.__version__})", "",
          "| experiment | model | tokens/s | x softmax | target | met | load before/after |", "|---|---|---:|---:|---:|---|---|"]
    for experiment in args.experiments.split(","):
        before = os.getloadavg()[0]
        rows = training_throughput(models, args.steps, args.rounds, [f"experiment={experiment}", *args.overrides])
        load = [round(before, 2), round(os.getloadavg()[0], 2)]
        target = TARGETS.get(experiment)
        result["experiments"].append({"experiment": experiment, "rows": rows, "target_x_softmax": target, "load_average": load})
        for row in rows:
            is_peer = row["model"] == "softmax"
            met = "" if is_peer or target is None else ("yes" if row["x_softmax"] >= target else "**NO**")
            md.append(f"| {experiment} | {row['model']} | {row['tokens_per_s']:.0f} | {row['x_softmax']:.2f} | "
                      f"{'' if is_peer or target is None else f'>= {target}'} | {met} | {load[0]}/{load[1]} |")
    result["cpu_block_cache"] = cpu_block_cache.status()  # trainer.cpu_block_cache_mb, as in `sparse-run`
    md += ["", f"CPU block cache (trainer.cpu_block_cache_mb): {result['cpu_block_cache']}."]
    write_benchmark(args.out, "training", result, md)


if __name__ == "__main__":
    main()
