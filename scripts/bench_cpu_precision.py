#!/usr/bin/env python
"""fp32 vs bf16 autocast training on CPU, through the real trainer, side by side in one run.

For each preset x normaliser, the same run (same seed, data and steps) trains once per precision;
the runs alternate precisions so that a change of machine load hits both. Per run: the median of the
trainer's own tokens/s over its step-log windows (the first window, warm-up, left out), steps/s over the
whole training time, the final training loss and the preset's test metric.

    python scripts/bench_cpu_precision.py                                 # 3 presets x softmax, entmax15; 300 steps
    python scripts/bench_cpu_precision.py --steps 100 --presets listops   # quick look
    python scripts/bench_cpu_precision.py --fp16                          # also time fp16 autocast (refused by the trainer on CPU)

Writes <out>/cpu_precision.json and .md (default out: outputs/bench/cpu_precision).

Notes:
* Presets: listops = experiment=lra_listops_cpu; mt = experiment=mt_cpu with 200 val/test pairs (test
  decoding would otherwise dominate the wall time; tokens/s never includes evaluation); text =
  experiment=lra_text_cpu (512 bytes, the longer sequences). Every run: eval only at the end, no
  attention analysis, a fresh run directory.
* Timings on a shared 2-core machine are noisy: compare the ratios within one run, and read the load
  average (1 min, before/after each run) recorded beside them.
* --fp16 times `torch.autocast("cpu", torch.float16)` by patching the trainer's refusal out for that
  run (the figures are why it is refused); no gradient scaler runs on CPU, so its metric means little.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sparse_runner.config import CONF_DIR, validate
from sparse_runner.io import atomic_write_json, atomic_write_text
from sparse_runner.run import run
from sparse_runner.training import trainer as trainer_module

PRESETS = {
    "listops": ["experiment=lra_listops_cpu"],
    "mt": ["experiment=mt_cpu", "task.max_eval_pairs=200"],
    "text": ["experiment=lra_text_cpu"],
}


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def compose_run(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate(compose(config_name="config", overrides=overrides))


def train_once(overrides: list[str], precision: str, run_dir: Path) -> dict:
    """One whole run; its throughput, loss and metric from metrics.json and log.jsonl."""
    cfg = compose_run([*overrides, f"trainer.precision={'bf16' if precision == 'fp16' else precision}"])
    patch = mock.patch.object(trainer_module, "autocast_dtype", lambda *_: torch.float16) if precision == "fp16" else contextlib.nullcontext()
    before = loadavg()
    with patch:
        run(cfg, run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    windows = [row["train/tokens_per_s"] for row in rows if "train/tokens_per_s" in row]
    losses = [row["train/loss"] for row in rows if "train/loss" in row]
    primary = metrics["primary_metric"]
    return {
        "precision": precision,
        "median_tokens_per_s": statistics.median(windows[1:] or windows),
        "window_tokens_per_s": [round(w, 1) for w in windows],
        "steps_per_s": metrics["step"] / metrics["train_time_s"],
        "final_train_loss": losses[-1],
        "finite": all(x == x and abs(x) != float("inf") for x in losses),
        "primary_metric": primary,
        "metric": metrics["metrics"].get(primary),
        "val_loss": metrics["metrics"].get("val/loss"),
        "peak_memory_mb": metrics.get("peak_memory_mb"),
        "loadavg": [before, loadavg()],
    }


def machine() -> dict:
    flags = ""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return {
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "amx": "amx_bf16" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "avx512_fp16": "avx512_fp16" in flags,
    }


def markdown(result: dict) -> str:
    precisions = result["precisions"]
    base = precisions[0]
    head = "| preset | normaliser | " + " | ".join(f"{p} tok/s" for p in precisions) + " | " + " | ".join(f"{p}/{base}" for p in precisions[1:])
    head += " | " + " | ".join(f"{p} loss / metric" for p in precisions) + " | load (1 min) |\n"
    head += "|---|---|" + "---:|" * (2 * len(precisions) - 1) + "---|" * len(precisions) + "---|\n"
    lines = []
    for case in result["cases"]:
        runs = {r["precision"]: r for r in case["runs"]}
        speeds = " | ".join(f"{runs[p]['median_tokens_per_s']:.0f}" for p in precisions)
        ratios = " | ".join(f"{runs[p]['median_tokens_per_s'] / runs[base]['median_tokens_per_s']:.2f}" for p in precisions[1:])
        quality = " | ".join(
            f"{runs[p]['final_train_loss']:.3f} / {runs[p]['primary_metric'].split('/')[-1]} {runs[p]['metric']:.4g}" for p in precisions
        )
        loads = ", ".join(f"{r['loadavg'][0]}-{r['loadavg'][1]}" for r in case["runs"])
        lines.append(f"| {case['preset']} | {case['normaliser']} | {speeds} | {ratios} | {quality} | {loads} |")
    m = result["machine"]
    foot = (
        f"\n\n{result['steps']} steps per run, tokens/s = median over step-log windows (first left out); loss = last "
        f"training-loss window; {m['torch_threads']} threads, torch {m['torch']}, CPU capability {m['cpu_capability']}, "
        f"AMX {m['amx']}, AVX512-BF16 {m['avx512_bf16']}, AVX512-FP16 {m['avx512_fp16']}; run time {result['seconds']} s.\n"
    )
    return head + "\n".join(lines) + foot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--presets", default="listops,mt,text", help=f"comma-separated, of {', '.join(PRESETS)}")
    parser.add_argument("--normalisers", default="softmax,entmax15", help="model presets (conf/model)")
    parser.add_argument("--fp16", action="store_true", help="also time fp16 autocast")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", default="outputs/bench/cpu_precision")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides added to every run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    precisions = ["fp32", "bf16"] + (["fp16"] if args.fp16 else [])
    log_every = max(5, args.steps // 15)
    common = [
        f"trainer.max_steps={args.steps}", f"trainer.eval_every={args.steps}", f"trainer.log_every={log_every}",
        "trainer.analysis=false", "trainer.device=cpu", "trainer.progress=false", "trainer.resume=false",
        *([f"trainer.num_threads={args.threads}"] if args.threads else []),
    ]
    started = time.perf_counter()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            for normaliser in args.normalisers.split(","):
                overrides = [*PRESETS[preset], f"model={normaliser}", *common, *args.overrides]
                # Alternate the order from case to case: a load change hits both precisions alike.
                order = precisions if len(cases) % 2 == 0 else precisions[::-1]
                runs = []
                for precision in order:
                    runs.append(train_once(overrides, precision, Path(tmp) / f"{preset}_{normaliser}_{precision}"))
                    r = runs[-1]
                    print(f"{preset} {normaliser} {precision}: {r['median_tokens_per_s']:.0f} tok/s, loss {r['final_train_loss']:.3f}, "
                          f"{r['primary_metric']} {r['metric']:.4g}, load {r['loadavg']}", file=sys.stderr)
                cases.append({"preset": preset, "normaliser": normaliser, "overrides": overrides, "runs": sorted(runs, key=lambda r: precisions.index(r["precision"]))})
    result = {
        "benchmark": "cpu_precision",
        "steps": args.steps,
        "precisions": precisions,
        "machine": machine(),
        "seconds": round(time.perf_counter() - started),
        "cases": cases,
    }
    out = Path(args.out)
    atomic_write_json(out / "cpu_precision.json", result)
    table = markdown(result)
    atomic_write_text(out / "cpu_precision.md", table)
    print(table)


if __name__ == "__main__":
    main()
