#!/usr/bin/env python
"""Head geometry and speed: training tokens/s of fixed head size (d_p) against standard heads (d/h) at the
same d_model, next to the ratio of training FLOPs that the two models should cost.

For each number of heads both models train the same LM batches with the minimal PyTorch loop
(`train_minimal` in scripts/benchmarking.py, no runner bookkeeping); rounds alternate the models so
that machine noise hits them alike, and medians are compared. FLOPs per token are counted from the
model's shapes (`train_flops_per_token`): 6 x (weights touched per token) for the matrix products
plus the attention scores and their weighted sum (2 x 2 x n x h x d_p per layer forward, x3 with the
backward), n = the block size.

    python scripts/bench_heads.py                                 # experiment=bhojanapalli2020_lm_cpu, heads 2..32
    python scripts/bench_heads.py --heads 4,16 --steps 30 --rounds 3 model.num_layers=4

Writes <out>/heads.json and .md (default out: outputs/benchmarks).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from benchmarking import train_minimal, write_benchmark
from sparse_runner.config import CONF_DIR, validate
from sparse_runner.tasks import build_task

EXPERIMENT = "bhojanapalli2020_lm_cpu"


def train_flops_per_token(m, vocab_size: int, block_size: int) -> float:
    """Forward + backward FLOPs per predicted token of a causal LM with the `model` node `m`."""
    head_size = m.head_size if m.head_size is not None else m.d_model // m.num_heads
    inner = m.num_heads * head_size
    weights_per_layer = 4 * m.d_model * inner + 2 * m.d_model * m.ffn_dim  # q, k, v, out + the FFN
    matmuls = m.num_layers * weights_per_layer + m.d_model * vocab_size  # + the (tied) output projection
    # Causal attention: each query sees on average about n / 2 keys, for scores and for the weighted sum.
    attention = m.num_layers * 2 * 2 * (block_size / 2) * inner
    return 3 * (2 * matmuls + attention)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--heads", default="2,4,8,16,32", help="comma-separated numbers of heads")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="outputs/benchmarks")
    parser.add_argument("overrides", nargs="*", help=f"Hydra overrides (on top of experiment={EXPERIMENT})")
    args = parser.parse_args()
    heads = [int(h) for h in args.heads.split(",")]

    configs = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for h in heads:
            for family in ("standard_heads", "fixed_head"):
                overrides = [f"experiment={EXPERIMENT}", f"model={family}", f"model.num_heads={h}", "trainer.device=cpu", *args.overrides]
                configs[family, h] = validate(compose(config_name="config", overrides=overrides))
    task = build_task(configs["standard_heads", heads[0]])
    vocab, block = task.tokenizer.vocab_size, configs["standard_heads", heads[0]].task.block_size
    train_minimal(configs["standard_heads", heads[0]], task, steps=min(args.steps, 10))  # warm-up
    tps: dict[tuple[str, int], list[float]] = {key: [] for key in configs}
    for r in range(args.rounds):
        for key, cfg in configs.items():
            tps[key].append(train_minimal(cfg, task, steps=args.steps)[1])
            print(f"round {r} {key[0]} h={key[1]}: {tps[key][-1]:.0f} tok/s", file=sys.stderr)

    rows = []
    for h in heads:
        std, fix = configs["standard_heads", h].model, configs["fixed_head", h].model
        speed = statistics.median(tps["fixed_head", h]) / statistics.median(tps["standard_heads", h])
        flops = train_flops_per_token(fix, vocab, block) / train_flops_per_token(std, vocab, block)
        rows.append({
            "heads": h,
            "standard_head_size": std.d_model // h,
            "fixed_head_size": fix.head_size,
            "standard_tokens_per_s": statistics.median(tps["standard_heads", h]),
            "fixed_tokens_per_s": statistics.median(tps["fixed_head", h]),
            "fixed_over_standard_speed": speed,
            "standard_over_fixed_flops": 1 / flops,
            "rounds": {"standard": tps["standard_heads", h], "fixed": tps["fixed_head", h]},
        })
    result = {
        "benchmark": "heads", "experiment": EXPERIMENT, "overrides": args.overrides, "steps": args.steps, "rounds": args.rounds,
        "threads": torch.get_num_threads(), "machine": platform.machine(), "torch": torch.__version__, "rows": rows,
    }
    md = [
        f"## Fixed vs standard heads: training tokens/s ({args.steps} steps x {args.rounds} rounds, medians; "
        f"experiment={EXPERIMENT} {' '.join(args.overrides)})",
        "",
        "| heads | standard d/h | fixed d_p | standard tok/s | fixed tok/s | fixed / standard speed | standard / fixed FLOPs |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['heads']} | {r['standard_head_size']} | {r['fixed_head_size']} | {r['standard_tokens_per_s']:.0f} | "
            f"{r['fixed_tokens_per_s']:.0f} | {r['fixed_over_standard_speed']:.2f} | {r['standard_over_fixed_flops']:.2f} |"
        )
    write_benchmark(Path(args.out), "heads", result, md + [""])


if __name__ == "__main__":
    main()
