"""Helpers shared by the benchmark scripts beside it (timing only; no run uses them, so the package does not ship them).

A script run as `python scripts/bench_*.py` has this folder on its path and imports it as `benchmarking`.
Importing it is cheap (no torch at import time): the layer benchmarks call `reexec_with_tuned_allocator` from it
before they import torch.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


def minimal_training_tokens_per_s(cfg, task, steps: int | None = None, device: str = "cpu") -> tuple[float, int]:
    """Train cfg's model on cfg's task with a hand-written loop, as a researcher would write it:
    AdamW, clipping and the lr schedule, no logging, checkpoints or progress. Returns (tokens/s, tokens)."""
    _, tokens_per_s, tokens = train_minimal(cfg, task, steps, device)
    return tokens_per_s, tokens


def train_minimal(cfg, task, steps: int | None = None, device: str = "cpu") -> tuple[torch.nn.Module, float, int]:
    """The loop of `minimal_training_tokens_per_s`; returns (trained model, tokens/s, tokens)."""
    import torch

    from sparse_runner.run import seed_everything
    from sparse_runner.training.schedules import build_scheduler
    from sparse_runner.training.trainer import optimizer_groups

    t = cfg.trainer
    steps = t.max_steps if steps is None else steps
    seed_everything(cfg.seed, t.deterministic)
    model = task.build_model(cfg.model).to(device)
    model.train()
    opt = torch.optim.AdamW(optimizer_groups(model, t.lr, t.weight_decay, t.alpha_lr_scale), lr=t.lr, betas=tuple(t.betas))
    sched = build_scheduler(opt, schedule=t.schedule, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio)
    epoch, index = 0, 0
    plan = task.plan_epoch(seed=cfg.seed, epoch=0, batch_size=t.batch_size, bucket_size=t.bucket_size, max_tokens=t.batch_tokens)
    tokens = 0
    start = time.perf_counter()
    for _ in range(steps):
        if index == len(plan):
            epoch, index = epoch + 1, 0
            plan = task.plan_epoch(seed=cfg.seed, epoch=epoch, batch_size=t.batch_size, bucket_size=t.bucket_size, max_tokens=t.batch_tokens)
        batch = task.make_batch("train", plan[index], torch.device(device))
        index += 1
        loss = task.forward_loss(model, batch).loss  # the task's forward + loss, nothing else
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if t.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_grad_norm)
        opt.step()
        sched.step()
        tokens += batch["num_tokens"]
    return model, tokens / (time.perf_counter() - start), tokens


def training_throughput(models: list[str], steps: int, rounds: int, overrides: list[str]) -> list[dict]:
    """Training tokens/s of the same config with each model= option, as ratios to softmax.

    Rounds alternate between the models so that machine noise hits them alike; medians are reported.
    """
    from hydra import compose, initialize_config_dir

    from sparse_runner.config import CONF_DIR, validate
    from sparse_runner.tasks import build_task

    configs = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for model in models:
            configs[model] = validate(compose(config_name="config", overrides=[f"model={model}", "trainer.device=cpu", *overrides]))
    if configs[models[0]].trainer.cpu_block_cache_mb:  # as `sparse-run` does on a CPU (sparse_runner/run.py)
        from sparse_runner.training import cpu_block_cache

        cpu_block_cache.install(configs[models[0]].trainer.cpu_block_cache_mb)
    task = build_task(configs[models[0]])
    tps: dict[str, list[float]] = {m: [] for m in models}
    minimal_training_tokens_per_s(configs[models[0]], task, steps=min(steps, 20))  # warm-up
    for _ in range(rounds):
        for model in models:
            tps[model].append(minimal_training_tokens_per_s(configs[model], task, steps=steps)[0])
            print(f"training {model}: {tps[model][-1]:.0f} tok/s", file=sys.stderr)
    med = {m: statistics.median(v) for m, v in tps.items()}
    return [{"model": m, "tokens_per_s": med[m], "rounds": tps[m], "x_softmax": med[m] / med["softmax"]} for m in models]


def training_markdown(rows: list[dict], steps: int, rounds: int, overrides: list[str], paper: dict[str, float] | None = None) -> list[str]:
    """Markdown lines for `training_throughput` rows; `paper` adds a column of published ratios."""
    head = f"## Training tokens/s ({steps} steps x {rounds} rounds, medians; overrides: {' '.join(overrides) or 'none'})"
    cols = "| model | tokens/s | x softmax |" + (" paper |" if paper else "")
    rule = "|---|---:|---:|" + ("---:|" if paper else "")
    lines = [head, "", cols, rule]
    for r in rows:
        extra = f" {paper[r['model']]:.2f} |" if paper and r["model"] in paper else (" |" if paper else "")
        lines.append(f"| {r['model']} | {r['tokens_per_s']:.0f} | {r['x_softmax']:.2f} |{extra}")
    return lines + [""]


def write_benchmark(out_dir, name: str, result: dict, markdown: list[str]) -> None:
    """<out_dir>/<name>.json and .md, written atomically; the markdown is also printed."""
    from sparse_runner.io import atomic_write_json, atomic_write_text

    out = Path(out_dir)
    atomic_write_json(out / f"{name}.json", result)
    atomic_write_text(out / f"{name}.md", "\n".join(markdown) + "\n")
    print("\n".join(markdown))


# ----------------------------------------------------------------------------- layer benchmarks on CPU
# The method of scripts/bench_block_sparse.py and bench_long_attention.py (docs/benchmarks.md):
# a tuned glibc allocator for the timings, round-robin Timer medians with explicit num_threads, peak
# memory of one step in a fresh process, the load average and the measured code recorded.

# Timing processes: freed blocks are reused instead of page-faulted again (docs/benchmarks.md).
TUNED_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**31)}
# Memory children want the opposite: every allocation >= 64 KiB its own mmap, unmapped on free, so that
# the resident set follows the live tensors (see `peak_step_memory`).
MEMORY_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(2**16), "MALLOC_TRIM_THRESHOLD_": str(2**17)}
REEXEC_ENV = "SPARSE_RUNNER_BENCH_REEXEC"


def reexec_with_tuned_allocator(argv: list[str], unless: tuple[str, ...] = ()) -> None:
    """Re-execute this script (`argv` = sys.argv) with TUNED_ALLOCATOR in the environment, unless it is
    already there or one of the flags `unless` is in argv. glibc reads these at its first malloc, hence
    the re-exec; call it before importing torch (the first run would import it for nothing)."""
    if any(flag in argv for flag in unless) or all(os.environ.get(k) == v for k, v in TUNED_ALLOCATOR.items()):
        return
    os.execve(sys.executable, [sys.executable, *argv], {**os.environ, **TUNED_ALLOCATOR, REEXEC_ENV: "1"})


def allocator_description() -> str:
    """The allocator this process runs with, in words (recorded in the benchmark's meta)."""
    tuned = all(os.environ.get(k) == v for k, v in TUNED_ALLOCATOR.items())
    return ("glibc with " + ", ".join(f"{k}={v}" for k, v in TUNED_ALLOCATOR.items())) if tuned else "glibc default"


def cpu_model() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return cpu


def loadavg() -> float | None:
    """1-minute load average: another process on a 2-core machine halves every number."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def git_state(paths: tuple[str, ...] = ("sparse_runner/attention",)) -> dict:
    """HEAD and the files under `paths` that differ from it: the code that was measured."""
    root = Path(__file__).resolve().parents[1]

    def git(*cmd):
        try:
            return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"head": git("rev-parse", "HEAD"), "attention_files_modified": git("status", "--porcelain", "--", *paths).splitlines()}


def status_kib(field: str) -> int | None:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM, VmSize, ...), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_step_memory(make_step: Callable[[], Callable[[], None]]) -> tuple[float, str]:
    """(MiB, method): peak extra resident memory of one step of `make_step()`, in this (fresh) process.

    Method: the process runs with MEMORY_ALLOCATOR, i.e. every block >= 64 KiB is its own mmap that is
    unmapped when freed (torch's CPU allocator does not cache), so the resident set tracks the live tensors.
    The step is built and one warm-up step runs (one-time costs: kernel loads, lazy inits); then the
    kernel's high-water mark is reset to the current RSS (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0)
    and one more step runs. Peak = VmHWM after it - VmRSS before it: the activations kept for backward,
    the transient buffers and the gradients, not the weights and inputs. Without clear_refs: no warm-up
    (`make_step` is called again), peak = ru_maxrss after the first step - RSS before it (includes the
    one-time costs; recorded as the method).
    """
    step = make_step()
    method = "VmHWM - VmRSS around the 2nd step (clear_refs reset)"
    try:
        step()
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status_kib("VmRSS")
        step()
        peak = status_kib("VmHWM")
        if before is None or peak is None:
            raise OSError("no /proc/self/status")
    except OSError:
        method = "ru_maxrss after the 1st step - VmRSS before it (no clear_refs: includes one-time costs)"
        step = make_step()
        gc.collect()
        before = status_kib("VmRSS") or 0
        step()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return (peak - before) / 1024, method


def run_memory_child(cmd: list[str], timeout: float) -> dict:
    """Run `cmd` (a memory child: prints one JSON line last) with MEMORY_ALLOCATOR; its JSON, or {"error": ...}."""
    env = {**os.environ, **MEMORY_ALLOCATOR}
    env.pop(REEXEC_ENV, None)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def round_robin_ms(steps: dict[str, Callable[[], None]], rounds: int, min_run_time: float, threads: int, label: str) -> dict[str, list[float]]:
    """Per-round medians (ms) of every step: `rounds` rounds, each timing every step once in turn
    (torch.utils.benchmark.Timer with num_threads=threads, blocked_autorange(min_run_time)), so that
    machine noise hits all steps alike. Progress goes to stderr, prefixed with `label`."""
    from torch.utils.benchmark import Timer

    out: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(rounds):
        for name, step in steps.items():
            t = Timer("step()", globals={"step": step}, num_threads=threads).blocked_autorange(min_run_time=min_run_time)
            out[name].append(1e3 * t.median)
            print(f"  {label} round {r} {name}: {1e3 * t.median:.1f} ms", file=sys.stderr, flush=True)
    return out


def profile_step(step: Callable[[], None], title: str, steps: int = 3) -> None:
    """Two warm-up calls, then torch.profiler tables (by op, and by op and input shape) of `steps` calls."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    step()
    step()
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            step()
    print(title)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25))
