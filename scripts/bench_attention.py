#!/usr/bin/env python
"""Sparse attention in context: a whole attention layer, and whole training steps.

1. Layer: MultiHeadAttention (d_model 512, 8 heads of 64: projections, scores, normaliser, weighted
   sum), forward+backward, at 128 / 512 / 1024 tokens, for each normaliser; ratios against the same
   layer with softmax computed the same explicit way, and against PyTorch's fused SDPA.
2. Training: tokens/s of the same model (the runner's default, or overrides) trained with each
   normaliser, as ratios against the softmax model (rounds alternate; medians).

    python scripts/bench_attention.py                 # both parts
    python scripts/bench_attention.py --part layer --quick

Writes <out>/attention.json and .md (default out: outputs/benchmarks). Large tensors are allocated:
the script re-executes itself with glibc's MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ fixed so
that freed blocks are reused instead of returned to the OS (page faults would dominate otherwise).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**31)}
if any(os.environ.get(k) != v for k, v in ALLOCATOR.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **ALLOCATOR})

import torch  # noqa: E402
from torch.utils import benchmark  # noqa: E402

from sparse_runner.attention import AttentionSpec, MultiHeadAttention  # noqa: E402
from sparse_runner.attention import entmax  # noqa: E402
from benchmarking import training_markdown, training_throughput, write_benchmark  # noqa: E402

NORMALISERS = ["softmax", "sparsemax", "entmax15", "alpha_entmax"]


def layer_case(normaliser: str, n: int, batch: int, explicit: bool, threads: int):
    torch.manual_seed(0)
    layer = MultiHeadAttention(512, AttentionSpec(num_heads=8, head_size=64, normaliser=normaliser))
    if explicit:
        layer.normaliser.fused_sdpa = False  # softmax through the same explicit path as the others
    x = torch.randn(batch, n, 512, requires_grad=True)
    grad = torch.randn(batch, n, 512)

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(grad)

    step()  # warm-up: first-call allocations, kernel builds
    return benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=threads)


def bench_layers(lengths, tokens_per_batch: int, rounds: int, threads: int) -> list[dict]:
    rows = []
    for n in lengths:
        batch = max(1, tokens_per_batch // n)
        cases = {"softmax (SDPA)": ("softmax", False), "softmax (explicit)": ("softmax", True)}
        cases.update({name: (name, True) for name in NORMALISERS[1:]})
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(rounds):  # round-robin: every case sees the same machine state
            for name, (normaliser, explicit) in cases.items():
                times[name].append(layer_case(normaliser, n, batch, explicit, threads).blocked_autorange(min_run_time=1.0).median)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        for name in cases:
            rows.append(
                {
                    "tokens": n,
                    "batch": batch,
                    "layer": name,
                    "fwd_bwd_ms": 1e3 * med[name],
                    "x_explicit_softmax": med[name] / med["softmax (explicit)"],
                    "x_sdpa": med[name] / med["softmax (SDPA)"],
                }
            )
            print(f"layer n={n} {name}: {1e3 * med[name]:.1f} ms", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--part", choices=["layer", "training", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="one short length, one round: a smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150, help="training steps per measurement")
    parser.add_argument("--out", default="outputs/benchmarks")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the trained model (training part)")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    rounds = 1 if args.quick else args.rounds
    result = {
        "benchmark": "attention",
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": threads,
        "allocator": ALLOCATOR,
        "entmax_backend": entmax.active_backend(torch.device("cpu")),
    }
    md = []
    if args.part in ("layer", "both"):
        lengths = [128] if args.quick else [128, 512, 1024]
        rows = bench_layers(lengths, tokens_per_batch=4096, rounds=rounds, threads=threads)
        result["layer"] = rows
        md += ["## Attention layer, forward+backward (d_model 512, 8 heads x 64, 4096 tokens per batch)", "",
               "| tokens | layer | ms | x explicit softmax | x SDPA |", "|---:|---|---:|---:|---:|"]
        md += [f"| {r['tokens']} | {r['layer']} | {r['fwd_bwd_ms']:.1f} | {r['x_explicit_softmax']:.2f} | {r['x_sdpa']:.2f} |" for r in rows]
        md.append("")
    if args.part in ("training", "both"):
        models = ["softmax", "entmax15", "sparsemax", "entmax"]
        steps = 20 if args.quick else args.steps
        rows = training_throughput(models, steps, rounds, args.overrides)
        result["training"] = {"steps": steps, "overrides": args.overrides, "rows": rows}
        md += training_markdown(rows, steps, rounds, args.overrides)
    md.append(f"torch {torch.__version__}, {threads} threads, entmax backend {result['entmax_backend']}, allocator {ALLOCATOR}")
    write_benchmark(args.out, "attention", result, md)


if __name__ == "__main__":
    main()
