#!/usr/bin/env python
"""Translation speed: decoding with the key/value cache vs recomputing the prefix, and training tokens/s.

1. Decoding: sentences/s of greedy and beam search on real embedded es->en validation sentences, with
   `use_cache=True` (each step feeds one token; keys/values of earlier steps are kept) against
   `use_cache=False` (each step re-runs the decoder over the whole prefix). The model is the
   experiment's architecture (default: experiment=mt_cpu), trained for `--train-steps` steps first so
   that it stops at sensible lengths; both variants decode exactly the same hypotheses (checked).
2. Training: tokens/s of the same model with each normaliser as ratios to softmax (alternating rounds,
   medians), next to Correia et al. (2019)'s reported 90 % (1.5-entmax) and 75 % (alpha-entmax).

    python scripts/bench_translation.py                     # both parts, CPU
    python scripts/bench_translation.py --part decoding --sentences 200

Writes <out>/translation.json and .md (default out: outputs/benchmarks). Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch
from hydra import compose, initialize_config_dir

from benchmarking import train_minimal, training_markdown, training_throughput, write_benchmark
from sparse_runner.config import CONF_DIR, validate
from sparse_runner.decoding import beam_search, greedy_search
from sparse_runner.tasks import build_task
from sparse_runner.tasks.batching import plan_eval
from sparse_runner.tokenization import BOS_ID, EOS_ID

MODELS = ["softmax", "sparsemax", "entmax15", "entmax"]
PAPER_SPEED = {"softmax": 1.0, "entmax15": 0.90, "entmax": 0.75}  # Correia et al. 2019 (docs/papers.md)


def decode_all(task, model, batches, *, beam: int, use_cache: bool) -> tuple[list[list[int]], float]:
    d = task.cfg.decoding
    out: list[list[int]] = []
    start = time.perf_counter()
    for indices in batches:
        batch = task.make_batch("val", indices, torch.device("cpu"))
        common = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=d.max_len_a, max_len_b=d.max_len_b, use_cache=use_cache)
        if beam == 1:
            out += greedy_search(model, batch["src"], batch["src_lengths"], **common)
        else:
            out += beam_search(model, batch["src"], batch["src_lengths"], beam_size=beam, length_penalty=d.length_penalty, **common)
    return out, time.perf_counter() - start


def bench_decoding(cfg, sentences: int, batch_size: int, beams: list[int], rounds: int, train_steps: int) -> list[dict]:
    task = build_task(cfg)
    model = train_minimal(cfg, task, steps=train_steps)[0]  # trained a little, so it stops at sensible lengths
    model.eval()
    lengths = task.lengths("val")[:sentences]
    batches = plan_eval(lengths, batch_size)
    rows = []
    for beam in beams:
        times = {True: [], False: []}
        outputs = {}
        for _ in range(rounds):
            for use_cache in (True, False):
                outputs[use_cache], seconds = decode_all(task, model, batches, beam=beam, use_cache=use_cache)
                times[use_cache].append(seconds)
                print(f"beam {beam} cache={use_cache}: {len(lengths) / seconds:.1f} sentences/s", file=sys.stderr)
        cached, uncached = statistics.median(times[True]), statistics.median(times[False])
        rows.append({
            "beam": beam,
            "sentences": len(lengths),
            "mean_output_tokens": statistics.mean(len(o) + 1 for o in outputs[True]),
            "cached_sentences_per_s": len(lengths) / cached,
            "recompute_sentences_per_s": len(lengths) / uncached,
            "speedup": uncached / cached,
            "same_output": outputs[True] == outputs[False],
            "rounds_s": {"cached": times[True], "recompute": times[False]},
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["both", "decoding", "training"], default="both")
    parser.add_argument("--sentences", type=int, default=300, help="validation sentences decoded per round")
    parser.add_argument("--batch-size", type=int, default=50, help="sentences per decoding batch")
    parser.add_argument("--beams", default="1,4", help="comma-separated beam sizes (1 = greedy)")
    parser.add_argument("--train-steps", type=int, default=150, help="training steps before decoding (0 = untrained model)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per round (training part)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default="outputs/benchmarks")
    parser.add_argument("overrides", nargs="*", default=["experiment=mt_cpu"], help="config overrides (default experiment=mt_cpu)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = ["trainer.device=cpu", *args.overrides]
    result = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "torch": torch.__version__, "overrides": overrides}
    md = []
    if args.part in ("both", "decoding"):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = validate(compose(config_name="config", overrides=overrides))
        rows = bench_decoding(cfg, args.sentences, args.batch_size, [int(b) for b in args.beams.split(",")], args.rounds, args.train_steps)
        result["decoding"] = rows
        md += [f"## Decoding, {rows[0]['sentences']} es->en validation sentences, batches of {args.batch_size} "
               f"(model trained {args.train_steps} steps; medians of {args.rounds} rounds)", "",
               "| search | output tokens (mean) | KV cache sent/s | recompute prefix sent/s | speed-up | same output |", "|---|---:|---:|---:|---:|---|"]
        md += [f"| {'greedy' if r['beam'] == 1 else 'beam ' + str(r['beam'])} | {r['mean_output_tokens']:.1f} | {r['cached_sentences_per_s']:.1f} | "
               f"{r['recompute_sentences_per_s']:.1f} | {r['speedup']:.2f}x | {r['same_output']} |" for r in rows]
        md.append("")
    if args.part in ("both", "training"):
        rows = training_throughput(MODELS, args.steps, args.rounds, args.overrides)
        result["training"] = rows
        md += training_markdown(rows, args.steps, args.rounds, args.overrides, paper=PAPER_SPEED)
    md.append(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    write_benchmark(args.out, "translation", result, md)


if __name__ == "__main__":
    main()
