#!/usr/bin/env python
"""Long dense attention on CPU: PyTorch SDPA softmax vs explicit vs memory-efficient entmax attention.

The targets, measured side by side in one run (2-core CPU):
  - memory-efficient alpha-entmax (learned alpha per head), one layer forward+backward, at 4096 and
    8192 tokens: time <= 2x SDPA softmax and peak memory <= 2x SDPA softmax's;
  - the fused C++ kernel's alpha-entmax at 512, 1024 and 4096 tokens: time <= 2x SDPA softmax;
  - at 16384 tokens it runs (peak memory reported), where the explicit path cannot: explicit
    alpha-entmax is attempted under an address-space limit (--memory-limit-gib, default 20 GiB, so a
    24 GiB machine never reaches the OOM killer) and its allocation failure is the cell's result.

    python scripts/bench_long_attention.py                  # full run (not timed yet on a quiet machine)
    python scripts/bench_long_attention.py --quick          # lengths 128,256, one round (smoke run)
    python scripts/bench_long_attention.py --profile memeff_alpha_entmax:4096   # torch.profiler table, no benchmark

Writes <out-dir>/long_attention.json and .md (default out-dir: outputs/bench/long_attention).

On a GPU (--device cuda) it measures the GPU layer table instead (`device_table`; GPU_ROWS): SDPA
softmax, the Triton kernel (alpha-entmax with a learned alpha, 1.5-entmax; and each of its levers turned off
in a row of its own, KERNEL_SETTINGS: 1.5-entmax on the general formulas, every tile, in the forward's passes and the backward,
1.5-entmax with every threshold confirmed by a pass (not in gpu_check.sh's rows)), AdaSplash's 1.5-entmax, the
memory-efficient and explicit torch paths, the `entmax` package's entmax_bisect on explicit scores, our HST
and BigBird layers, HF's BigBird and the projections alone, at N = 1k, 4k, 16k, 64k with batch 16, 4, 1, 1
(--shapes), one layer on x (B, N, 512) under bf16 autocast, forward + backward:

    python scripts/bench_long_attention.py --device cuda                 # the table, ~1.5 min on one GPU
    python scripts/bench_long_attention.py --device cuda --rows sdpa_softmax,triton_alpha_entmax --shapes 4096:4

Writes <out-dir>/long_attention_cuda.json and .md. Every cell is the median of up to --repeats calls
(at least 3; fewer once --cell-seconds are spent), each between two torch.cuda.synchronize(), after two
warm-up calls (compilation, autotuning; one where it took --cell-seconds); peak memory = torch.cuda.max_memory_allocated over one more call
minus the memory allocated before it. A peer that is not installed, a length a row is not run at, an
out-of-memory error or any other failure is a cell "n/a (reason)"; cells left when --time-budget is spent
are "n/a (time budget spent)". The JSON and markdown are rewritten after every shape.

Method (that of scripts/bench_block_sparse.py; helpers in scripts/benchmarking.py):
* Every row is one whole attention layer on x (1, N, 512) float32: Q/K/V projections, attention, output
  projection: `MultiHeadAttention(512, AttentionSpec(8 heads x 64, normaliser, pattern "dense", impl))`.
  sdpa_softmax: softmax, which the dense pattern sends to F.scaled_dot_product_attention (the baseline of
  every ratio). explicit_*: impl "explicit", the (8, N, N) scores and weights materialised.
  memeff_*: impl "memory_efficient" (sparse_runner/attention/memory_efficient.py: query blocks, one
  threshold per row, backward recomputes the weights; O(N) memory); memeff_softmax sets the normaliser's
  `fused_sdpa` off so that softmax takes that path too instead of SDPA (as scripts/bench_attention.py does).
  cpp_*: impl "cpp", the fused C++ kernel (sparse_runner/attention/kernels/entmax_attention_cpu.cpp: the same
  algorithm, each query block's scores in cache).
  alpha_entmax learns one alpha per head (AttentionSpec alpha None, alpha_init "random", seed 0).
* The "projections" row times the projections alone (no attention), so that each row splits into
  projections + attention.
* One step = forward, then backward of <out, g> (g ~ N(0, 1) fixed), into x and every parameter, the
  learned alpha included (grads set to None before each step, no accumulation; the warm-up step checks
  that every one of them received a gradient). Steps cycle through --inputs different (x, g) draws.
* The warm-up step runs inside `memory_efficient.count_skipped_blocks()`: memory-efficient rows report the
  fraction of key blocks (64 keys) skipped in its forward (random inputs: not a trained model's sparsity),
  and the count also checks the path: > 0 blocks for memeff rows, none for the others.
* Explicit rows are not timed above --max-explicit-length (default 8192).
* Timer: torch.utils.benchmark.Timer with num_threads set explicitly, blocked_autorange(min_run_time).
  Per length, every case is built and warmed up once, then all cases are measured in --rounds round-robin
  rounds; a number is the median of the per-round medians; ratios are to SDPA softmax in the same rounds.
* Allocator: the timing process re-executes itself with glibc's MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_
  fixed (freed blocks are reused instead of page-faulted again; see docs/benchmarks.md), and records them.
* Peak memory: one fresh subprocess per row and length, after all the timings (`memory_child`; method in
  `peak_step_memory` in scripts/benchmarking.py), each under resource.setrlimit(RLIMIT_AS,
  --memory-limit-gib). Untimed explicit cells are not measured, except the rows of --attempt-memory
  (default explicit_alpha_entmax), whose child is run anyway: at 16384 it is expected to fail to allocate.
* Load average (1 min) is recorded before and after each length: another process on the 2 cores halves
  every number.
"""

from __future__ import annotations

import os
import sys

from benchmarking import MEMORY_ALLOCATOR, reexec_with_tuned_allocator

_CHILD_FLAG = "--memory-child"

if __name__ == "__main__":
    reexec_with_tuned_allocator(sys.argv, unless=(_CHILD_FLAG, "--default-allocator"))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from sparse_runner.attention import AttentionSpec, MultiHeadAttention  # noqa: E402
from sparse_runner.attention import entmax  # noqa: E402
from sparse_runner.attention.memory_efficient import count_skipped_blocks  # noqa: E402
from benchmarking import (  # noqa: E402
    add_device_table_arguments,
    chosen_rows,
    cpu_lengths,
    device_footer,
    allocator_description,
    device_description,
    failed_cell,
    peak_device_memory_mib,
    require_device,
    timed_calls_ms,
    cpu_model,
    git_state,
    layer_benchmark_parser,
    layer_step,
    loadavg,
    peak_step_memory,
    profile_step,
    projections_only,
    run_memory_child,
    status_kib,
    time_rows,
    write_benchmark,
)

D_MODEL, HEADS, HEAD_SIZE = 512, 8, 64
BASELINE = "sdpa_softmax"
TARGET_ROW, EXPLICIT_TARGET_ROW = "memeff_alpha_entmax", "explicit_alpha_entmax"
KERNEL_TARGET_ROW = "cpp_alpha_entmax"
KERNEL_TARGET_LENGTHS = (512, 1024, 4096)  # the fused kernel: <= 2x SDPA softmax, forward + backward

# name -> (label, normaliser, impl); impl "sdpa" = AttentionSpec impl "auto" with softmax (SDPA), "proj" = no attention.
ROWS = {
    "sdpa_softmax": ("softmax, PyTorch SDPA (baseline)", "softmax", "sdpa"),
    "explicit_sparsemax": ("sparsemax, explicit (H, N, N)", "sparsemax", "explicit"),
    "explicit_entmax15": ("entmax15, explicit (H, N, N)", "entmax15", "explicit"),
    "explicit_alpha_entmax": ("alpha_entmax (learned alpha/head), explicit (H, N, N)", "alpha_entmax", "explicit"),
    "memeff_softmax": ("softmax, memory-efficient", "softmax", "memory_efficient"),
    "memeff_sparsemax": ("sparsemax, memory-efficient", "sparsemax", "memory_efficient"),
    "memeff_entmax15": ("entmax15, memory-efficient", "entmax15", "memory_efficient"),
    "memeff_alpha_entmax": ("alpha_entmax (learned alpha/head), memory-efficient", "alpha_entmax", "memory_efficient"),
    "cpp_sparsemax": ("sparsemax, fused C++ kernel", "sparsemax", "cpp"),
    "cpp_entmax15": ("entmax15, fused C++ kernel", "entmax15", "cpp"),
    "cpp_alpha_entmax": ("alpha_entmax (learned alpha/head), fused C++ kernel", "alpha_entmax", "cpp"),
    # Not attention: the layer's Q/K/V and output projections alone, to split every row's time into
    # projections + attention (the projections are the same matmuls in every row).
    "projections": ("projections only (Q/K/V + output, no attention)", None, "proj"),
}
DEFAULT_LENGTHS = "512,1024,2048,4096,8192,16384"
QUICK_LENGTHS = "128,256"
# A memory child's failure that means "the step did not fit under the address-space limit".
_ALLOCATION_FAILURE = re.compile(r"alloc|out of memory|not enough memory", re.IGNORECASE)


# ----------------------------------------------------------------------------- cases
def skip_reason(row: str, n: int, max_explicit: int) -> str | None:
    """Why (row, n) is not timed, or None."""
    if ROWS[row][2] == "explicit" and n > max_explicit:
        gib = HEADS * n * n * 4 / 2**30
        return (f"N > --max-explicit-length {max_explicit}: the explicit path materialises ({HEADS}, N, N) float32 "
                f"scores and weights, {gib:.3g} GiB each at N = {n}")
    return None



def build_case(row: str, n: int, inputs: int, seed: int = 0):
    """(module, forward fn, xs, gs, positions): the layer of `row` for N tokens, ready for `step`."""
    _, normaliser, impl = ROWS[row]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    xs = [torch.randn(1, n, D_MODEL, generator=gen) for _ in range(inputs)]
    if impl == "proj":
        module, forward = projections_only(D_MODEL, HEADS, HEAD_SIZE)

    else:
        spec = AttentionSpec(num_heads=HEADS, head_size=HEAD_SIZE, normaliser=normaliser, pattern="dense",
                             impl="auto" if impl == "sdpa" else impl)
        module = MultiHeadAttention(D_MODEL, spec)
        if impl == "memory_efficient" and normaliser == "softmax":
            module.normaliser.fused_sdpa = False  # softmax through memory_efficient.py, not SDPA

        def forward(x):
            return module(x)

    module.train()
    xs = [x.detach().clone().requires_grad_() for x in xs]
    gs = [torch.randn(x.shape, generator=gen) for x in xs]
    return module, forward, xs, gs, n


def warm_up(row: str, module, step, xs) -> dict:
    """The first step (not timed), counting skipped key blocks; checks the path and the gradients."""
    t0 = time.perf_counter()
    with count_skipped_blocks() as counts:
        step()
    info = {"warmup_s": round(time.perf_counter() - t0, 3)}
    total, skipped = counts
    memeff = ROWS[row][2] == "memory_efficient"
    if memeff != (total > 0):
        raise RuntimeError(f"{row}: the memory-efficient path {'did not run' if memeff else 'ran'} ({total} key blocks counted)")
    if memeff:
        info["key_blocks"] = {"total": total, "skipped": skipped, "fraction_skipped": skipped / total}
    missing = [name for name, p in module.named_parameters() if p.grad is None]
    if missing or xs[0].grad is None:
        raise RuntimeError(f"{row}: no gradient for {missing or ['x']}")
    return info


# ----------------------------------------------------------------------------- peak memory
def memory_child(row: str, n: int) -> dict:
    """Peak extra resident memory of one forward+backward step, in this (fresh) process (see
    `peak_step_memory` in scripts/benchmarking.py)."""

    def make():
        module, forward, xs, gs, _ = build_case(row, n, 1)
        return layer_step(module, forward, xs, gs)

    peak_mib, method = peak_step_memory(make)
    return {"peak_mib": peak_mib, "positions": n, "method": method}


def child_main(argv: list[str]) -> None:
    """<flag> ROW N [--threads T] [--memory-limit-gib L]: one JSON line, the peak or the allocation failure."""
    row, n = argv[1], int(argv[2])
    if "--threads" in argv:
        torch.set_num_threads(int(argv[argv.index("--threads") + 1]))
    limit_gib = float(argv[argv.index("--memory-limit-gib") + 1]) if "--memory-limit-gib" in argv else None
    info: dict = {}
    if limit_gib is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = int(limit_gib * 2**30)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        info = {"limit_gib": limit_gib, "vm_size_mib_at_start": (status_kib("VmSize") or 0) / 1024}
    try:
        result = memory_child(row, n)
    except (RuntimeError, MemoryError) as e:
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if not isinstance(e, MemoryError) and not _ALLOCATION_FAILURE.search(message):
            raise
        gc.collect()
        result = {"failed": f"cannot allocate: {message}", "positions": n, "rss_hwm_mib": (status_kib("VmHWM") or 0) / 1024}
        requested = re.search(r"allocate (\d+) bytes", message)
        if requested:
            result["requested_mib"] = int(requested.group(1)) / 2**20
    print(json.dumps({**result, **info}))


def measure_memory(row: str, n: int, threads: int, limit_gib: float, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), _CHILD_FLAG, row, str(n), "--threads", str(threads),
           "--memory-limit-gib", str(limit_gib)]
    out = run_memory_child(cmd, timeout)
    # A child killed inside a kernel (std::bad_alloc in a C++ thread aborts the process) is a failure to
    # allocate too; anything else stays an error.
    if "error" in out and _ALLOCATION_FAILURE.search(out["error"]) and "timed out" not in out["error"]:
        out = {"failed": f"cannot allocate (child aborted): {out['error']}", "positions": n, "limit_gib": limit_gib}
    return out


# ----------------------------------------------------------------------------- timing
def time_length(n: int, rows: list[str], args, threads: int) -> dict[str, dict]:
    """Round-robin timings of every measurable row at length n (`time_rows`), ratios to SDPA softmax."""
    return time_rows(n, rows, build=build_case, skip_reason=lambda row: skip_reason(row, n, args.max_explicit_length), warm_up=warm_up,
                     baseline=BASELINE, ratio_key="x_sdpa", rounds=args.rounds, min_run_time=args.min_run_time, inputs=args.inputs, threads=threads)


def _target(name: str, value, ok, detail: str | None = None) -> dict:
    entry = {"name": name, "value": value, "met": None if value is None else bool(ok(value))}
    if detail is not None:
        entry["detail"] = detail
    return entry


def targets(results: dict, memory: dict, limit_gib: float) -> list[dict]:
    t = []
    for n in (4096, 8192):
        a = results.get(str(n), {}).get(TARGET_ROW, {}).get("fwd_bwd_ms")
        b = results.get(str(n), {}).get(BASELINE, {}).get("fwd_bwd_ms")
        t.append(_target(f"time: memory-efficient alpha_entmax / SDPA softmax at {n} (target <= 2)", a / b if a is not None and b else None, lambda v: v <= 2))
        a = memory.get(str(n), {}).get(TARGET_ROW, {}).get("peak_mib")
        b = memory.get(str(n), {}).get(BASELINE, {}).get("peak_mib")
        t.append(_target(f"peak memory: memory-efficient alpha_entmax / SDPA softmax at {n} (target <= 2)", a / b if a is not None and b else None, lambda v: v <= 2))
    # At 16384: the memory-efficient layer runs (its peak MiB), the explicit one fails under the limit.
    m = memory.get("16384", {}).get(TARGET_ROW, {})
    entry = _target("memory-efficient alpha_entmax at 16384 runs (value: peak MiB)", m.get("peak_mib"), lambda v: True)
    if "peak_mib" not in m and m:
        entry.update(met=False, detail=m.get("failed") or m.get("error"))
    t.append(entry)
    m = memory.get("16384", {}).get(EXPLICIT_TARGET_ROW, {})
    entry = {"name": f"explicit alpha_entmax at 16384 cannot allocate under RLIMIT_AS {limit_gib:g} GiB", "value": None, "met": None}
    if "failed" in m:
        entry.update(met=True, detail=m["failed"])
    elif "peak_mib" in m:
        entry.update(met=False, detail=f"ran: peak {m['peak_mib']:.0f} MiB")
    elif "error" in m:
        entry["detail"] = m["error"]  # neither ran nor failed to allocate (e.g. timed out): not decided
    t.append(entry)
    for n in KERNEL_TARGET_LENGTHS:
        a = results.get(str(n), {}).get(KERNEL_TARGET_ROW, {}).get("fwd_bwd_ms")
        b = results.get(str(n), {}).get(BASELINE, {}).get("fwd_bwd_ms")
        t.append(_target(f"time: fused C++ alpha_entmax / SDPA softmax at {n} (target <= 2)", a / b if a is not None and b else None, lambda v: v <= 2))
    return t


# ----------------------------------------------------------------------------- report
def markdown(meta: dict, results: dict, memory: dict, rows: list[str], lengths: list[int], target_rows: list[dict]) -> list[str]:
    notes: list[str] = []

    def note(text: str) -> str:
        if text not in notes:
            notes.append(text)
        return f"({notes.index(text) + 1})"

    head = "| row |" + "".join(f" {n} ms | x SDPA | MiB |" for n in lengths)
    rule = "|---|" + "---:|---:|---:|" * len(lengths)
    lines = [
        "# Long dense attention on CPU (forward+backward): SDPA softmax vs explicit vs memory-efficient",
        "",
        f"One attention layer: d_model {D_MODEL}, {HEADS} heads x {HEAD_SIZE}, pattern dense, batch 1, float32; "
        "timings include the Q/K/V and output projections. fwd+bwd = forward, then backward into the input and all "
        "parameters (alpha_entmax: one learned alpha per head, random init, included). "
        f"Medians of {meta['rounds']} round-robin rounds (blocked_autorange, min_run_time {meta['min_run_time']} s); "
        "x SDPA = ratio to SDPA softmax in the same rounds; MiB = peak extra resident memory of one step, "
        f"measured in a fresh process per cell under RLIMIT_AS {meta['memory_limit_gib']:g} GiB "
        "(VmHWM - VmRSS, see peak_step_memory in scripts/benchmarking.py).",
        "",
        "## Time, ratio to SDPA softmax, peak memory",
        "",
        head,
        rule,
    ]
    for row in rows:
        cells = []
        for n in lengths:
            r = results.get(str(n), {}).get(row, {})
            m = memory.get(str(n), {}).get(row, {})
            skipped = f"skipped {note(r['skipped'])}" if "skipped" in r else None  # notes numbered left to right
            if "peak_mib" in m:
                mib = f"{m['peak_mib']:.0f}"
            elif "failed" in m:
                limit = m.get("limit_gib", meta["memory_limit_gib"])
                mib = f"fails {note(f'memory child under RLIMIT_AS {limit:g} GiB: ' + m['failed'])}"
            elif "error" in m:
                mib = f"err {note('memory child: ' + m['error'])}"
            else:
                mib = "-"
            if skipped:
                cells.append(f" {skipped} | | {mib if m else ''} |")
                continue
            ms = f"{r['fwd_bwd_ms']:.1f}" if "fwd_bwd_ms" in r else "-"
            x = f"{r['x_sdpa']:.3g}" if "x_sdpa" in r else "-"
            cells.append(f" {ms} | {x} | {mib} |")
        lines.append(f"| {ROWS[row][0]} |" + "".join(cells))
    lines.append("")
    lines += [f"{note_id}. {text}" for note_id, text in enumerate(notes, 1)] + [""] if notes else []

    memeff = [row for row in rows if ROWS[row][2] == "memory_efficient"]
    if memeff:
        lines += [
            "## Key blocks skipped by the memory-efficient path",
            "",
            "Fraction of (head, query block, 64-key block) tiles without any weight, skipped exactly, in the forward "
            "of the warm-up step (random inputs and initial weights, so not a trained model's sparsity; softmax never "
            "leaves a tile empty and does not look).",
            "",
            "| row |" + "".join(f" {n} |" for n in lengths),
            "|---|" + "---:|" * len(lengths),
        ]
        for row in memeff:
            cells = []
            for n in lengths:
                kb = results.get(str(n), {}).get(row, {}).get("key_blocks")
                cells.append(f" {100 * kb['fraction_skipped']:.1f}% |" if kb else " - |")
            lines.append(f"| {ROWS[row][0]} |" + "".join(cells))
        lines.append("")

    lines += ["## Targets", "", "| target | value | met |", "|---|---:|---|"]
    for t in target_rows:
        if t["value"] is not None:
            v = f"{t['value']:.0f} MiB" if "MiB" in t["name"] else f"{t['value']:.2f}"
        else:
            v = "n/a"
        if t.get("detail") and t["value"] is None:
            v = t["detail"].replace("|", "/")
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**NO**")
        lines.append(f"| {t['name']} | {v} | {met} |")
    lines.append("")

    scaling = []
    for row in rows:
        steps = []
        for a, b in zip(lengths, lengths[1:]):
            ta = results.get(str(a), {}).get(row, {}).get("fwd_bwd_ms")
            tb = results.get(str(b), {}).get(row, {}).get("fwd_bwd_ms")
            if ta and tb:
                steps.append(f"{a}->{b}: {tb / ta:.2f}")
        if steps:
            scaling.append(f"- {ROWS[row][0]}: " + ", ".join(steps))
    if scaling:
        lines += ["## Time ratio per doubling of N (linear = 2.0, quadratic = 4.0)", "", *scaling, ""]

    lines += [
        "## Meta",
        "",
        f"- CPU: {meta['cpu']}; {meta['threads']} threads; torch {meta['torch']}; entmax backend {meta['entmax_backend']}",
        f"- allocator (timings): {meta['allocator']}; memory children: "
        + ", ".join(f"{k}={v}" for k, v in meta["memory_allocator"].items())
        + f", RLIMIT_AS {meta['memory_limit_gib']:g} GiB",
        f"- load average (1 min) before/after each length: {meta['loadavg']}; run time {meta['seconds']} s",
        f"- code: HEAD {meta['git']['head'][:12] or '?'}; attention files differing from it: "
        f"{', '.join(meta['git']['attention_files_modified']) or 'none'}",
        f"- command: `{meta['command']}`",
        "",
    ]
    return lines


# ----------------------------------------------------------------------------- the device table (--device cuda)
# name -> (label, kind, normaliser, impl). kind: "ours" = MultiHeadAttention(pattern dense, impl), "hst" /
# "bigbird" = our block patterns (block 64), "bisect" = the entmax package, "hf" = HF BigBird, "proj".
GPU_ROWS = {
    "sdpa_softmax": ("SDPA softmax (flash)", "ours", "softmax", "auto"),
    "triton_alpha_entmax": ("Triton alpha-entmax, learned alpha", "ours", "alpha_entmax", "triton"),
    "triton_entmax15": ("Triton 1.5-entmax", "ours", "entmax15", "triton"),
    "triton_entmax15_general": ("Triton 1.5-entmax, general formulas (log, exp per score)", "ours", "entmax15", "triton"),
    "triton_alpha_entmax_all_tiles": ("Triton alpha-entmax, learned alpha, every tile (no skipping, forward or backward)", "ours", "alpha_entmax", "triton"),
    "triton_entmax15_confirmed": ("Triton 1.5-entmax, every threshold confirmed by a pass", "ours", "entmax15", "triton"),
    "adasplash_entmax15": ("AdaSplash 1.5-entmax (the published peer)", "ours", "entmax15", "adasplash"),
    "memeff_alpha_entmax": ("memory-efficient torch path, alpha-entmax", "ours", "alpha_entmax", "memory_efficient"),
    "explicit_alpha_entmax": ("explicit alpha-entmax", "ours", "alpha_entmax", "explicit"),
    "entmax_bisect": ("the entmax package's entmax_bisect on explicit scores (learned alpha)", "bisect", "alpha_entmax", "explicit"),
    "hst_softmax": ("HST softmax", "hst", "softmax", "auto"),
    "hst_alpha_entmax": ("HST alpha-entmax", "hst", "alpha_entmax", "auto"),
    "bigbird_softmax": ("our BigBird softmax", "bigbird", "softmax", "auto"),
    "hf_bigbird": ("HF BigBird", "hf", "softmax", "auto"),
    "projections": ("projections alone", "proj", None, "auto"),
}
# The Triton kernel's settings (module constants of kernels/entmax_attention_triton.py) that a row changes
# for its calls: each lever against the kernel's default, in the same run.
KERNEL_SETTINGS = {
    "triton_entmax15_general": {"SPECIALISE_ALPHA": False},
    "triton_alpha_entmax_all_tiles": {"SKIP_EMPTY_TILES": False},
    "triton_entmax15_confirmed": {"EXACT_ON_SUPPORT": False},
}
GPU_SHAPES = "1024:16,4096:4,16384:1,65536:1"
# Rows whose (B, H, N, N) scores make them the slowest by far: not run above --max-explicit-length.
QUADRATIC_ROWS = ("memeff_alpha_entmax", "explicit_alpha_entmax", "entmax_bisect")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"N:B,N:B" -> [(N, B), ...]; ValueError with the expected form otherwise."""
    shapes = []
    for item in text.split(","):
        n, sep, b = item.strip().partition(":")
        if not (sep and n.isdigit() and b.isdigit() and int(n) > 0 and int(b) > 0):
            raise ValueError(f"--shapes {text!r}: expected comma-separated N:B with positive ints, e.g. {GPU_SHAPES}")
        shapes.append((int(n), int(b)))
    return shapes


def peer_unavailable(row: str, n: int, device: torch.device, max_explicit: int) -> str | None:
    """Why `row` is not run at N on `device` (the cell reads "n/a (<this>)"), or None."""
    from bench_block_sparse import BLOCK, HF_RANDOM_BLOCKS, hf_unavailable

    _, kind, _, impl = GPU_ROWS[row]
    if row in QUADRATIC_ROWS and n > max_explicit:
        return f"N > --max-explicit-length {max_explicit}"
    if impl in ("triton", "adasplash"):
        if device.type != "cuda":
            return "needs CUDA"
        from sparse_runner.attention.memory_efficient import gpu_backend

        if not gpu_backend(impl).available():
            return "triton not installed" if impl == "triton" else "adasplash not installed"
    if kind == "bisect" and importlib.util.find_spec("entmax") is None:
        return "entmax not installed"
    if kind == "hf":
        if hf_unavailable():
            return "transformers not installed"
        smallest = (5 + 2 * HF_RANDOM_BLOCKS) * BLOCK
        if n <= smallest or n % BLOCK:
            return f"HF block-sparse needs N > {smallest}, a multiple of {BLOCK}"
    if kind in ("hst", "bigbird") and n % 64:
        return "N not a multiple of the block size 64"
    return None


def build_device_case(row: str, n: int, batch: int, device: torch.device, seed: int = 0):
    """(module, forward, x, g): the layer of GPU row `row` on `device` for x (batch, N, 512) float32
    (autocast decides the compute dtype), g the gradient the step sends back."""
    from bench_block_sparse import BLOCK, HF_RANDOM_BLOCKS
    from sparse_runner.attention.layout import SequenceLayout

    _, kind, normaliser, impl = GPU_ROWS[row]
    torch.manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(batch, n, D_MODEL, generator=gen, device=device)
    mask = None
    if kind == "hf":
        from transformers import BigBirdConfig
        from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdModel

        config = BigBirdConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, attention_type="block_sparse", block_size=BLOCK,
                               num_random_blocks=HF_RANDOM_BLOCKS, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
                               max_position_embeddings=max(4096, n))
        module = torch.nn.ModuleDict({"attn": BigBirdBlockSparseAttention(config), "out_proj": torch.nn.Linear(D_MODEL, D_MODEL)})
        masks = BigBirdModel.create_masks_for_block_sparse_attn(torch.ones(batch, n, device=device), BLOCK)

        def forward(x):
            blocked, band, from_mask, to_mask = masks
            return module["out_proj"](module["attn"](x, band_mask=band, from_mask=from_mask, to_mask=to_mask,
                                                     from_blocked_mask=blocked, to_blocked_mask=blocked)[0])

    elif kind == "proj":
        module, forward = projections_only(D_MODEL, HEADS, HEAD_SIZE)

    elif kind == "bisect":
        from entmax import entmax_bisect

        module = MultiHeadAttention(D_MODEL, AttentionSpec(num_heads=HEADS, head_size=HEAD_SIZE, normaliser=normaliser, impl="explicit"))
        scale = HEAD_SIZE ** -0.5

        def forward(x):  # the layer's projections and learned alphas; the weights from the entmax package
            q, (k, v) = module._project_q(x), module._project_kv(x)
            alpha = module.normaliser.alphas().view(1, HEADS, 1, 1)
            p = entmax_bisect((scale * q @ k.transpose(-1, -2)).float(), alpha, dim=-1)
            return module._project_out(p.to(v.dtype) @ v)

    else:
        pattern = "dense" if kind == "ours" else kind
        options = {} if pattern == "dense" else {"block_size": BLOCK}
        module = MultiHeadAttention(D_MODEL, AttentionSpec(num_heads=HEADS, head_size=HEAD_SIZE, normaliser=normaliser,
                                                           pattern=pattern, pattern_options=options, impl=impl))
        if kind == "hst":
            layout = SequenceLayout(BLOCK, 0, D_MODEL, "both").to(device)
            with torch.no_grad():
                x, mask, _ = layout.enter(x, None)

        def forward(x):
            with kernel_settings(KERNEL_SETTINGS.get(row, {})):
                return module(x, key_padding_mask=mask)

    module.to(device).train()
    x = x.detach().requires_grad_()
    return module, forward, x, torch.randn(x.shape, generator=gen, device=device)


@contextlib.contextmanager
def kernel_settings(values: dict):
    """The Triton kernel's module constants set to `values` inside the block (its forward and the backward
    that autograd runs for it read them at the call), restored after."""
    if not values:
        yield
        return
    from sparse_runner.attention.kernels import entmax_attention_triton as kernel

    saved = {name: getattr(kernel, name) for name in values}
    for name, value in values.items():
        setattr(kernel, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(kernel, name, value)


def make_device_step(module, forward, x, g, device: torch.device):
    """One forward + backward of <out, g> under bf16 autocast, into x and every parameter."""
    params = list(module.parameters())
    grads: dict[torch.dtype, torch.Tensor] = {}

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = forward(x)
        if out.dtype not in grads:
            grads[out.dtype] = g.to(out.dtype)
        out.backward(grads[out.dtype])

    return step


def measure_device_cell(row: str, n: int, batch: int, device: torch.device, args) -> dict:
    """{"fwd_bwd_ms", "calls_ms", "peak_mib"} of one row at (N, B), or {"na": reason}."""
    reason = peer_unavailable(row, n, device, args.max_explicit_length)
    if reason:
        return {"na": reason}
    case = None
    try:
        case = build_device_case(row, n, batch, device)
        step = make_device_step(*case, device)
        t0 = time.perf_counter()
        step()  # warm-up: Triton compilation and autotuning, allocator growth
        if time.perf_counter() - t0 < args.cell_seconds:  # a second one, unless one call already takes the cell's time
            step()
        calls = timed_calls_ms(step, device, args.repeats, args.cell_seconds)
        cell = {"fwd_bwd_ms": statistics.median(calls), "calls_ms": calls, "peak_mib": peak_device_memory_mib(step, device)}
    except Exception as error:  # noqa: BLE001 -- a cell of the table, never the end of the run
        del case
        return {"na": failed_cell(error, device)[len("n/a ("):-1]}
    del case, step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return cell


def device_table(args, device: torch.device) -> dict:
    """The layer table on `device` (meant for CUDA; it runs on the CPU at small shapes too): every row of
    args.rows at every (N, B) of args.shapes. Writes <out-dir>/long_attention_<device>.json and .md after
    every shape; returns the result."""
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    start = time.time()
    meta = {**device_description(device), "shapes": args.shapes, "rows": {r: GPU_ROWS[r][0] for r in args.rows}, "baseline": BASELINE,
            "autocast": "bf16", "repeats": args.repeats, "cell_seconds": args.cell_seconds, "max_explicit_length": args.max_explicit_length,
            "command": " ".join(["python", "scripts/bench_long_attention.py", *args.argv]), "git": git_state()}
    cells: dict[str, dict] = {}
    name = f"long_attention_{device.type}"
    for n, batch in args.shapes:
        key = f"{n}x{batch}"
        cells[key] = {}
        for row in args.rows:
            if deadline is not None and time.monotonic() > deadline:
                cells[key][row] = {"na": "time budget spent"}
                continue
            cells[key][row] = measure_device_cell(row, n, batch, device, args)
            print(f"  N={n} B={batch} {row}: {cells[key][row].get('fwd_bwd_ms', cells[key][row].get('na'))}", file=sys.stderr, flush=True)
        base = cells[key].get(BASELINE, {}).get("fwd_bwd_ms")
        for cell in cells[key].values():
            if base and "fwd_bwd_ms" in cell:
                cell["x_sdpa"] = cell["fwd_bwd_ms"] / base
        meta["seconds"] = round(time.time() - start, 1)
        result = {"benchmark": "long_attention", "meta": meta, "cells": cells}
        write_benchmark(args.out_dir, name, result, device_markdown(meta, cells, args.rows, args.shapes), echo=(n, batch) == args.shapes[-1])
    return result


def device_markdown(meta: dict, cells: dict, rows: list[str], shapes: list[tuple[int, int]]) -> list[str]:
    """The layer table: per row and (N, B), 'ms (x SDPA)' and the peak memory, or 'n/a (reason)'."""
    where = meta.get("gpu") or meta.get("cpu") or meta["device"]
    lines = [
        f"# One attention layer, forward + backward, on {where}",
        "",
        f"x (B, N, {D_MODEL}), {HEADS} heads x {HEAD_SIZE}, bf16 autocast; milliseconds, median of up to {meta['repeats']} "
        "synchronised calls after two warm-up calls (one for a row slower than the cell's time); (x SDPA) = ratio to SDPA softmax at the same N; memory = peak "
        "allocated during one call minus what was allocated before it (CUDA only).",
        "",
        "| row |" + "".join(f" N={n}, B={b} | memory |" for n, b in shapes),
        "|---|" + "---:|---:|" * len(shapes),
    ]
    for row in rows:
        out = []
        for n, b in shapes:
            cell = cells.get(f"{n}x{b}", {}).get(row)
            if cell is None:
                out.append(" | |")
            elif "na" in cell:
                out.append(f" n/a ({cell['na'].replace('|', '/')}) | |")
            else:
                x = f" ({cell['x_sdpa']:.3g}x)" if "x_sdpa" in cell and row != BASELINE else ""
                mem = "-" if cell.get("peak_mib") is None else f"{cell['peak_mib'] / 1024:.2f} GiB"
                ms = cell["fwd_bwd_ms"]
                out.append(f" {ms:.3g}{x} | {mem} |" if ms < 1000 else f" {ms:.0f}{x} | {mem} |")
        lines.append(f"| {GPU_ROWS[row][0]} |" + "".join(out))
    return lines + device_footer(meta)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = layer_benchmark_parser(__doc__.splitlines()[1], ROWS, f"comma-separated N (default {DEFAULT_LENGTHS}; --quick: {QUICK_LENGTHS})",
                               "outputs/bench/long_attention", memory_timeout=900.0)
    p.add_argument("--max-explicit-length", type=int, default=8192, help="explicit rows are not timed above this N (n^2 memory)")
    p.add_argument("--memory-limit-gib", type=float, default=20.0, help="RLIMIT_AS of every memory subprocess")
    p.add_argument("--attempt-memory", default=EXPLICIT_TARGET_ROW,
                   help="comma-separated rows whose memory child runs even where they are not timed (expected to fail to allocate)")
    add_device_table_arguments(p, "cuda: the GPU layer table (GPU_ROWS at --shapes, bf16 autocast)")
    p.add_argument("--shapes", default=GPU_SHAPES, help=f"device table: comma-separated N:B (default {GPU_SHAPES})")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.device != "cpu":
        if args.max_explicit_length == p.get_default("max_explicit_length"):
            args.max_explicit_length = 4096
        rows = args.rows if args.rows != p.get_default("rows") else ",".join(GPU_ROWS)
        try:
            args.shapes = parse_shapes(args.shapes)
        except ValueError as e:
            p.error(str(e))
        args.rows = chosen_rows(p, rows, GPU_ROWS, f" for --device {args.device}")
        return args
    args.lengths = cpu_lengths(args, DEFAULT_LENGTHS, QUICK_LENGTHS)
    args.rows = chosen_rows(p, args.rows, ROWS)
    args.attempt_memory = chosen_rows(p, args.attempt_memory, ROWS)
    if args.profile and (args.profile.split(":")[0] not in ROWS or not args.profile.partition(":")[2].isdigit()):
        p.error(f"--profile ROW:N with ROW from: {', '.join(ROWS)}")
    return args


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == _CHILD_FLAG:  # memory subprocess: <flag> ROW N [--threads T] [--memory-limit-gib L]
        child_main(argv)
        return {}
    args = parse_args(argv)
    device = require_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type != "cpu":
        return device_table(args, device)
    threads = torch.get_num_threads()
    if args.profile:
        row, n = args.profile.split(":")
        module, forward, xs, gs, positions = build_case(row, int(n), 1)
        profile_step(layer_step(module, forward, xs, gs), f"# {row} at N={n}, {threads} threads, 3 steps")
        return {}
    backend = entmax.active_backend(torch.device("cpu"))  # loads / builds the C++ kernels before any timing

    start = time.time()
    results, memory, loads = {}, {}, {}
    for n in args.lengths:
        before = loadavg()
        print(f"N={n} ...", file=sys.stderr, flush=True)
        results[str(n)] = time_length(n, args.rows, args, threads)
        loads[str(n)] = [before, loadavg()]
        gc.collect()
    if not args.no_memory:  # after every timing: never two processes on the 2 cores at once
        for n in args.lengths:
            memory[str(n)] = {}
            for row in args.rows:
                if "skipped" in results[str(n)].get(row, {}) and row not in args.attempt_memory:
                    continue
                memory[str(n)][row] = measure_memory(row, n, threads, args.memory_limit_gib, args.memory_timeout)
                print(f"  memory n={n} {row}: {memory[str(n)][row]}", file=sys.stderr, flush=True)
    meta = {
        "cpu": cpu_model(),
        "threads": threads,
        "torch": torch.__version__,
        "entmax_backend": backend,
        "allocator": allocator_description(),
        "memory_allocator": MEMORY_ALLOCATOR,
        "memory_limit_gib": args.memory_limit_gib,
        "attempt_memory": args.attempt_memory,
        "rounds": args.rounds,
        "min_run_time": args.min_run_time,
        "inputs_cycled": args.inputs,
        "lengths": args.lengths,
        "rows": {r: ROWS[r][0] for r in args.rows},
        "baseline": BASELINE,
        "max_explicit_length": args.max_explicit_length,
        "loadavg": loads,
        "seconds": round(time.time() - start, 1),
        "command": " ".join(["python", "scripts/bench_long_attention.py", *argv]),
        "git": git_state(),
    }
    target_rows = targets(results, memory, args.memory_limit_gib)
    result = {"benchmark": "long_attention", "meta": meta, "timings": results, "memory": memory, "targets": target_rows}
    write_benchmark(args.out_dir, "long_attention", result, markdown(meta, results, memory, args.rows, args.lengths, target_rows))
    return result


if __name__ == "__main__":
    main()
