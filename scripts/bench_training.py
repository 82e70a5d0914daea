#!/usr/bin/env python
"""End-to-end training speed of alpha-entmax against softmax, per CPU preset, side by side in one run.

For each experiment of --experiments, the same model is trained with `model=softmax` and with each model of
--models (default `entmax`: alpha-entmax with a learned alpha per head); rounds alternate between them so
that a change of machine load hits all alike, and the medians of training tokens/s are compared as
ratios to softmax. The loop is `train_minimal` in scripts/benchmarking.py: forward, backward, clipping,
AdamW and the schedule of the experiment's config, no evaluation, logging or checkpoints, so the ratio
is the models' and not the trainer's (scripts/bench_trainer_overhead.py measures the trainer's cost).

Targets (x softmax, training tokens/s): lra_text_4k_cpu >= 0.6; lra_text_cpu >= 0.8; mt_cpu >= 0.9. Peak memory:
lra_text_4k_cpu <= 1.3x softmax's. Peak memory is measured per experiment and model in a fresh subprocess
(`--memory-child`), as the resident-set high-water mark of one training step after a warm-up step
(`peak_step_memory` in scripts/benchmarking.py: activations kept for backward, transient buffers and
gradients, not the weights or the data); --no-memory skips it.

    python scripts/bench_training.py                                   # the three presets, ~12 min on 2 cores
    python scripts/bench_training.py --experiments mt_cpu --steps 5 --rounds 1 --threads 2
    python scripts/bench_training.py --overrides trainer.cpu_block_cache_mb=0   # PyTorch's allocator alone

Writes <out>/training.json and training.md (default out: outputs/bench/training). The 1-minute load
average before and after each experiment is recorded: run it on an otherwise idle machine.
On a GPU (--device cuda) the table is the GPU training table: tokens/s and peak GPU memory of each model on
the experiment=lra_listops GPU preset (2k tokens, 4 layers, d 512, batch 32) in bf16, one short run per
model after a warm-up (Triton compilation and autotuning), with ratios to softmax; a model that runs out of
memory or fails is a cell "n/a (...)". The training data are cut to 3000 generated examples (the step's
shapes do not depend on their number).

    python scripts/bench_training.py --device cuda                       # ~1 min on one GPU
    python scripts/bench_training.py --device cuda --models entmax --steps 50 --overrides trainer.precision=fp32

"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

from benchmarking import (
    add_device_argument,
    device_description,
    device_training_rows,
    require_device,
    run_memory_child,
    training_throughput,
    write_benchmark,
)
from sparse_runner.training import cpu_block_cache

TARGETS = {"lra_text_4k_cpu": 0.6, "lra_text_cpu": 0.8, "mt_cpu": 0.9}
MEMORY_TARGETS = {"lra_text_4k_cpu": 1.3}  # peak memory, x softmax's
_CHILD_FLAG = "--memory-child"
# --device cuda: the GPU training table (docs/benchmarks.md, GPU).
GPU_EXPERIMENT = "lra_listops"
# A "+" adds overrides to a row: ERNIE-Sparse compiled (trainer.compile=true), against its launch-bound eager step,
# and alpha-entmax compiled (the Triton kernel an operator inside the graph).
GPU_MODELS = "softmax,bigbird,ernie_sparse,entmax15,entmax,ernie_sparse+trainer.compile=true,entmax+trainer.compile=true"
GPU_OVERRIDES = ["trainer.precision=bf16", "task.generator.num_train=3000", "task.generator.num_val=64", "task.generator.num_test=64"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_device_argument(parser, "cuda: the GPU table (tokens/s and peak memory per model, lra_listops in bf16)")
    parser.add_argument("--experiments", default=None, help=f"comma-separated experiment= presets (default: {','.join(TARGETS)}; cuda: {GPU_EXPERIMENT})")
    parser.add_argument("--models", default=None, help=f"comma-separated model= options compared with softmax, each with overrides after a + "
                        f"(default: entmax; cuda: {GPU_MODELS})")
    parser.add_argument("--steps", type=int, default=None, help="training steps per round and model (default 10; cuda: 20 timed steps)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (cpu)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per model before its timed steps (cuda)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds; models not started by then are n/a (cuda)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default="outputs/bench/training")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses (cpu)")
    parser.add_argument(_CHILD_FLAG, nargs=2, metavar=("EXPERIMENT", "MODEL"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--overrides", nargs="*", default=None,
                        help=f"config overrides after experiment= (e.g. a smaller model; default: none; cuda: {' '.join(GPU_OVERRIDES)})")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    args.experiments = args.experiments or (GPU_EXPERIMENT if gpu else ",".join(TARGETS))
    args.models = args.models or (GPU_MODELS if gpu else "entmax")
    args.steps = args.steps or (20 if gpu else 10)
    args.overrides = args.overrides if args.overrides is not None else (GPU_OVERRIDES if gpu else [])
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = require_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(*args.memory_child, args.overrides)
        return
    models = ["softmax", *(m for m in args.models.split(",") if m != "softmax")]
    if args.device == "cuda":
        device_table(args, models, device)
        return
    result = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "steps": args.steps, "rounds": args.rounds, "overrides": args.overrides, "experiments": []}
    md = [f"# Training tokens/s against softmax ({args.steps} steps x {args.rounds} alternating rounds, medians; "
          f"{torch.get_num_threads()} threads, torch {torch.__version__})", "",
          "| experiment | model | tokens/s | x softmax | target | met | peak MiB | x softmax | target | met | load before/after |",
          "|---|---|---:|---:|---:|---|---:|---:|---:|---|---|"]
    for experiment in args.experiments.split(","):
        before = os.getloadavg()[0]
        overrides = [f"experiment={experiment}", *args.overrides]
        rows = training_throughput(models, args.steps, args.rounds, overrides)
        load = [round(before, 2), round(os.getloadavg()[0], 2)]
        if not args.no_memory:  # after the timings, one fresh process per model
            for row in rows:
                row["memory"] = run_memory_child([sys.executable, __file__, _CHILD_FLAG, experiment, row["model"], "--threads",
                                                  str(torch.get_num_threads()), "--overrides", *args.overrides], timeout=1800)
            base = rows[0]["memory"].get("peak_mib")
            for row in rows:
                peak = row["memory"].get("peak_mib")
                row["memory_x_softmax"] = peak / base if peak is not None and base else None
        target, memory_target = TARGETS.get(experiment), MEMORY_TARGETS.get(experiment)
        result["experiments"].append({"experiment": experiment, "rows": rows, "target_x_softmax": target,
                                      "memory_target_x_softmax": memory_target, "load_average": load})
        for row in rows:
            is_peer = row["model"] == "softmax"
            met = "" if is_peer or target is None else ("yes" if row["x_softmax"] >= target else "**NO**")
            memory = row.get("memory", {})
            peak = f"{memory['peak_mib']:.0f}" if "peak_mib" in memory else ("-" if not memory else f"n/a ({memory.get('error', '?')})")
            mx = row.get("memory_x_softmax")
            mmet = "" if is_peer or memory_target is None or mx is None else ("yes" if mx <= memory_target else "**NO**")
            md.append(f"| {experiment} | {row['model']} | {row['tokens_per_s']:.0f} | {row['x_softmax']:.2f} | "
                      f"{'' if is_peer or target is None else f'>= {target}'} | {met} | {peak} | {_num(mx)} | "
                      f"{'' if is_peer or memory_target is None else f'<= {memory_target}'} | {mmet} | {load[0]}/{load[1]} |")
    result["cpu_block_cache"] = cpu_block_cache.status()  # trainer.cpu_block_cache_mb, as in `sparse-run`
    md += ["", f"CPU block cache (trainer.cpu_block_cache_mb): {result['cpu_block_cache']}."]
    if not args.no_memory:
        md += [f"Peak memory: {rows[0].get('memory', {}).get('method', 'see the script')}, one fresh process per experiment and model."]
    write_benchmark(args.out, "training", result, md)


def device_table(args, models: list[str], device: torch.device) -> dict:
    """The GPU table (it runs on any device): tokens/s and peak memory per model, one short run each.
    Writes <out>/training_<device>.json and .md; returns the result."""
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    start = time.time()
    result = {"benchmark": "training", "meta": {**device_description(device), "warmup": args.warmup, "steps": args.steps, "overrides": args.overrides},
              "experiments": []}
    md = [f"# Training on {result['meta'].get('gpu', device.type)}: tokens/s and peak memory per model", "",
          f"`MinimalTraining` (scripts/benchmarking.py: the preset's model, AdamW, clipping and schedule; no evaluation or logging), "
          f"{args.warmup} warm-up steps then {args.steps} timed steps per model; overrides: {' '.join(args.overrides) or 'none'}; "
          f"peak memory = torch.cuda.max_memory_allocated from building the model on.", "",
          "| experiment | model | tokens/s | x softmax | s/step | peak memory GiB | x softmax memory |", "|---|---|---:|---:|---:|---:|---:|"]
    for experiment in args.experiments.split(","):
        rows = device_training_rows(models, [f"experiment={experiment}", *args.overrides], str(device), args.warmup, args.steps, deadline)
        result["experiments"].append({"experiment": experiment, "rows": rows})
        for row in rows:
            if "failed" in row:
                md.append(f"| {experiment} | {row['model']} | {row['failed']} | | | | |")
                continue
            peak = "-" if row["peak_mib"] is None else f"{row['peak_mib'] / 1024:.1f}"
            md.append(f"| {experiment} | {row['model']} | {row['tokens_per_s']:,.0f} | {_num(row.get('x_first'))} | "
                      f"{row['seconds_per_step']:.3f} | {peak} | {_num(row.get('memory_x_first'))} |")
    result["meta"]["seconds"] = round(time.time() - start, 1)
    md += ["", f"torch {torch.__version__}; {result['meta'].get('gpu') or result['meta'].get('cpu')}; run time {result['meta']['seconds']} s."]
    write_benchmark(args.out, f"training_{device.type}", result, md)
    return result


def memory_child(experiment: str, model: str, overrides: list[str]) -> None:
    """Prints, as one JSON line, the peak extra resident memory of one training step of `model` on `experiment`."""
    from benchmarking import MinimalTraining, compose_run_config, model_overrides, peak_step_memory
    from sparse_runner.tasks import build_task

    cfg = compose_run_config([*model_overrides(model), "trainer.device=cpu", f"experiment={experiment}", *overrides])
    task = build_task(cfg)
    loop = MinimalTraining(cfg, task)
    peak, method = peak_step_memory(lambda: loop.step)
    print(json.dumps({"peak_mib": round(peak, 1), "method": method}))


def _num(value) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
