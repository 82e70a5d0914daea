#!/usr/bin/env python
"""Runner overhead: the trainer's training tokens/s against a minimal hand-written PyTorch loop.

Both train the same model (same initial weights) on the same batches with the same optimiser,
gradient clipping and lr schedule; the runner adds its bookkeeping (progress, step log, TensorBoard,
checkpoints, metrics). Evaluation, the end-of-run attention analysis and the task's outputs (a
generated sample) are taken out of the runner's wall time, since the minimal loop does none of them. Rounds alternate runner / minimal and the medians are compared.

    python scripts/bench_trainer_overhead.py                       # embedded default, 300 steps x 3 rounds
    python scripts/bench_trainer_overhead.py --steps 500 --rounds 5 model.num_layers=4

Writes <out>/trainer_overhead.json and .md (default out: outputs/benchmarks).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from benchmarking import minimal_training_tokens_per_s
from sparse_runner.config import CONF_DIR, validate
from sparse_runner.io import atomic_write_json, atomic_write_text
from sparse_runner.run import fingerprint, seed_everything
from sparse_runner.tasks import build_task
from sparse_runner.training.trainer import Trainer


def runner_tokens_per_s(cfg, task, run_dir: Path) -> tuple[float, int]:
    seed_everything(cfg.seed, cfg.trainer.deterministic)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, run_dir, torch.device("cpu"), fingerprint=fingerprint(cfg))
    # Work the minimal loop does not do at all: evaluation, the end-of-run attention analysis and the
    # task's outputs (an LM's generated sample). Their time is taken out; everything else stays in.
    not_training = 0.0

    def timed(method):
        def run(*args, **kwargs):
            nonlocal not_training
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                not_training += time.perf_counter() - start

        return run

    for name in ("evaluate", "analysis_pass", "_write_outputs"):
        setattr(trainer, name, timed(getattr(trainer, name)))
    start = time.perf_counter()
    trainer.fit()
    elapsed = time.perf_counter() - start - not_training
    return trainer.progress.tokens_seen / elapsed, trainer.progress.tokens_seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="outputs/benchmarks")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the benchmarked config")
    args = parser.parse_args()

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose(
            config_name="config",
            overrides=[f"trainer.max_steps={args.steps}", f"trainer.eval_every={args.steps}", "trainer.progress=false", "trainer.device=cpu", *args.overrides],
        )
    cfg = validate(composed)
    task = build_task(cfg)
    threads = torch.get_num_threads()
    runner, minimal = [], []
    with tempfile.TemporaryDirectory() as tmp:
        minimal_training_tokens_per_s(cfg, task)  # warm-up: allocator, kernels, page cache
        for r in range(args.rounds):
            tps, runner_tokens = runner_tokens_per_s(cfg, task, Path(tmp) / f"run{r}")
            runner.append(tps)
            tps, minimal_tokens = minimal_training_tokens_per_s(cfg, task)
            minimal.append(tps)
            print(f"round {r}: runner {runner[-1]:.0f} tok/s, minimal loop {minimal[-1]:.0f} tok/s", file=sys.stderr)
    assert runner_tokens == minimal_tokens, "the two loops must see the same tokens"
    med_runner, med_minimal = statistics.median(runner), statistics.median(minimal)
    overhead = 1.0 - med_runner / med_minimal
    result = {
        "benchmark": "trainer_overhead",
        "config_overrides": args.overrides,
        "steps": args.steps,
        "rounds": args.rounds,
        "tokens_per_run": runner_tokens,
        "torch_threads": threads,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "runner_tokens_per_s": runner,
        "minimal_tokens_per_s": minimal,
        "median_runner_tokens_per_s": med_runner,
        "median_minimal_tokens_per_s": med_minimal,
        "runner_over_minimal": med_runner / med_minimal,
        "overhead": overhead,
    }
    out = Path(args.out)
    atomic_write_json(out / "trainer_overhead.json", result)
    table = (
        "| loop | median tokens/s | rounds (tokens/s) | ratio |\n|---|---:|---|---:|\n"
        f"| sparse-run trainer | {med_runner:.0f} | {', '.join(f'{x:.0f}' for x in runner)} | {med_runner / med_minimal:.3f} |\n"
        f"| minimal PyTorch loop | {med_minimal:.0f} | {', '.join(f'{x:.0f}' for x in minimal)} | 1.000 |\n\n"
        f"Overhead of the runner: {100 * overhead:.1f}% ({args.steps} steps x {args.rounds} rounds, {threads} threads, overrides: {' '.join(args.overrides) or 'none'})\n"
    )
    atomic_write_text(out / "trainer_overhead.md", table)
    print(table)


if __name__ == "__main__":
    main()
