#!/usr/bin/env python
"""How much work the Triton alpha-entmax kernel does, counted (not timed): passes over the keys and tiles visited.

The kernel's forward makes one pass over the key tiles for the row max, one per solver iteration for the
threshold, and one for p v; from its first solver pass on it drops the tiles that can hold no p > 0 (with
SKIP_EMPTY_TILES). Its backward reads the (query tile, key tile) pairs where the forward saw some p > 0. These
numbers are properties of the algorithm and of the input, not of the machine, so they are counted here on a
CPU with Triton's interpreter running the same kernels (TRITON_INTERPRET=1), with the GPU's bf16 tiles
(64 queries x 32 keys). Times need a GPU (scripts/bench_long_attention.py --device cuda).

Per case (alpha, scores, N), one forward + backward of entmax_attention on q, k, v (1, H, N, 64):
* passes: the forward's passes per query tile (= 2 + solver iterations, averaged over the tiles; a tile's rows
  stop together, so a tile counts its slowest row);
* reads: the key tiles those passes read, per query tile, in whole passes' worth of tiles (= passes without
  skipping; the work that scales with N);
* tiles visited: the fraction of (query tile, key tile) pairs the backward visits (1.0 without skipping).
Scores: "random" q, k ~ N(0, spread^2) (no structure: what an untrained layer sees), "local": q = k with a
bump in a band of 32 positions, so that a sparse normaliser's weights stay near the diagonal.
Rows: 1.5-entmax with its own formulas (MODE 15: Halley's steps) and through the general formulas (Newton's
steps), sparsemax, a learned alpha per head (1.1 ... 1.9; general formulas, Newton).

    python scripts/bench_kernel_passes.py                  # N 256,1024, ~12-15 min on 2 cores
    python scripts/bench_kernel_passes.py --lengths 512 --spreads 1

With --sass it also compiles the kernels for sm_90 (H100/H200; no GPU needed: Triton's own ptxas) and counts,
per kernel and MODE, the special-function (MUFU: exp, log, reciprocal, sqrt) and tensor-core (HMMA/HGMMA)
instructions in the machine code. A static count, not how often each runs, but it shows where per-score
special functions went (bf16, head dim 64, no masks).

Writes <out-dir>/kernel_passes.json and .md (default out-dir: outputs/bench/kernel_passes).
"""

from __future__ import annotations

import os
import sys

# Before triton is imported anywhere: the kernels are decorated for the interpreter at their import (the
# compiling child of --sass needs the compiler instead).
if "--sass-child" not in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from benchmarking import git_state, write_benchmark  # noqa: E402

HEADS, HEAD_DIM, BAND = 4, 64, 32
GPU_TILES = (64, 32)  # _blocks' tiles for 16-bit inputs on a GPU
# name -> (label, alpha ("learned": 1.1 ... 1.9 over the heads), kernel settings)
ROWS = {
    "entmax15": ("1.5-entmax, its own formulas (Halley)", 1.5, {}),
    "entmax15_unconfirmed": ("1.5-entmax, its own formulas, every threshold confirmed by a pass", 1.5, {"EXACT_ON_SUPPORT": False}),
    "entmax15_general": ("1.5-entmax, general formulas (Newton)", 1.5, {"SPECIALISE_ALPHA": False}),
    "sparsemax": ("sparsemax", 2.0, {}),
    "sparsemax_unconfirmed": ("sparsemax, every threshold confirmed by a pass", 2.0, {"EXACT_ON_SUPPORT": False}),
    "learned": ("learned alpha per head, 1.1-1.9", "learned", {}),
}


def kernel_module():
    from sparse_runner.attention.kernels import entmax_attention_triton as kernel

    if not kernel._interpreting():
        sys.exit("bench_kernel_passes.py: triton was imported before TRITON_INTERPRET=1 was set; run it as a script")
    kernel._INTERPRETER_TILES = GPU_TILES
    return kernel


def inputs(scores: str, n: int, spread: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if scores == "random":
        q, k = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g) * spread for _ in range(2))
    else:  # local: position i carries a bump in dimension i // BAND, so q_i . k_j is large within a band
        q = 0.3 * torch.randn(1, HEADS, n, HEAD_DIM, generator=g)
        q[..., torch.arange(n), (torch.arange(n) // BAND) % HEAD_DIM] += spread * math.sqrt(4 * math.sqrt(HEAD_DIM))
        k = q.clone()
    return q, k, torch.randn(1, HEADS, n, HEAD_DIM, generator=g)


def count_case(kernel, row: str, scores: str, n: int, spread: float) -> dict:
    """{"passes", "reads", "tiles_visited", "seconds"} of one forward + backward."""
    _, alpha, settings = ROWS[row]
    q, k, v = (x.requires_grad_() for x in inputs(scores, n, spread))
    if alpha == "learned":
        alpha = torch.linspace(1.1, 1.9, HEADS).requires_grad_()
    # Under the interpreter the kernels' helpers are plain functions, looked up at each call: counted here.
    calls = {"_scores": 0, "_step": 0}  # key tiles read (forward only), solver steps (one per pass and program)
    originals = {name: getattr(kernel, name) for name in calls}

    def counter(name):
        def counted(*args, **kwargs):
            calls[name] += 1
            return originals[name](*args, **kwargs)

        return counted

    saved = {name: getattr(kernel, name) for name in settings}
    start = time.perf_counter()
    try:
        for name, value in settings.items():
            setattr(kernel, name, value)
        for name in calls:
            setattr(kernel, name, counter(name))
        out = kernel.entmax_attention(q, k, v, alpha)
    finally:
        for name, value in {**originals, **saved}.items():
            setattr(kernel, name, value)
    tiles = out.grad_fn.saved_tensors[-3]  # saved last: the tile table, kv_count, kv_index (the kernel's `_save`)
    out.backward(torch.randn_like(out))
    block_m, block_n = GPU_TILES
    programs = math.ceil(n / block_m) * HEADS
    return {
        "passes": 2 + calls["_step"] / programs,
        "reads": calls["_scores"] / (programs * math.ceil(n / block_n)),
        "tiles_visited": tiles.float().mean().item(),
        "seconds": round(time.perf_counter() - start, 2),
    }


# One kernel build per (kernel, MODE), as entmax_attention launches it for bf16 inputs with a backward to follow.
_SASS_CHILD = r"""
import glob, json, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import torch
from sparse_runner.attention.kernels import entmax_attention_triton as T

tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
block_m, block_n, block_d, warps = T._blocks(64, torch.bfloat16)
pointers = {name: "*bf16" for name in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")}
pointers.update({name: "*fp32" for name in ("OS", "M", "U", "FS", "C", "DALPHA", "ALPHA", "KPM", "SEED")})
pointers.update(TILES="*i8", KV_COUNT="*i32", Q_COUNT="*i32", KV_INDEX="*i16", Q_INDEX="*i16")
counts = {}
for mode in (T._MODE_GENERAL, T._MODE_ENTMAX15, T._MODE_SPARSEMAX):
    common = dict(HAS_KPM=False, CAUSAL=False, DROPOUT=False, MODE=mode, SKIP_TILES=T.SKIP_EMPTY_TILES, EXACT_STEP=T.EXACT_ON_SUPPORT, BLOCK_M=block_m,
                  BLOCK_N=block_n, BLOCK_D=block_d, SOFT_THRESHOLD=T.ALPHA_SOFTMAX_THRESHOLD, DOT_PRECISION=T._DOT_PRECISION)
    for fn, extra in ((T._fwd_kernel, dict(TOL_F=T.TOL, STALL=T.STALL, MAX_ITER_N=T.MAX_ITER, BACKWARD=True)),
                      (T._bwd_dq_kernel, dict(NEED_DALPHA=mode == T._MODE_GENERAL, PSI_SWITCH=T._PSI_SWITCH)),
                      (T._bwd_dkdv_kernel, {})):
        consts = {name: value for name, value in dict(common, **extra).items() if name in fn.arg_names}
        signature = {name: "constexpr" if name in consts else pointers.get(name, "fp32" if name in ("scale", "keep_scale") else "i32")
                     for name in fn.arg_names}
        # As the JIT specialises a launch: 16-byte-aligned pointers, strides and D multiples of 16 (without this
        # the loads are not vectorised and the loops not pipelined: another build from the one that runs).
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                   if signature[n].startswith("*") or (signature[n] == "i32" and (n[0] == "s" or n == "D"))}
        source = ASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()}, attrs=aligned)
        cubin = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["cubin"]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        counts.setdefault(fn.__name__, {})[str(mode)] = {
            "mufu": len(re.findall(r"\bMUFU\.", sass)),
            "mma": len(re.findall(r"\b(?:HMMA|HGMMA)\.", sass)),
        }
print(json.dumps(counts))
"""


def sass_counts() -> dict:
    """{kernel: {mode: {"mufu", "mma"}}} from a child process that compiles without the interpreter."""
    import json
    import subprocess

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", _SASS_CHILD, "--sass-child"], env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"compiling the kernels for sm_90 failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sass_markdown(counts: dict) -> list[str]:
    names = {"0": "general", "15": "1.5-entmax", "20": "sparsemax"}
    modes = list(next(iter(counts.values())))
    lines = ["", "## Special-function and tensor-core instructions in the sm_90 machine code (static counts)", "",
             "| kernel |" + "".join(f" {names[m]}: MUFU | MMA |" for m in modes), "|---|" + "---:|---:|" * len(modes)]
    for kernel, by_mode in counts.items():
        lines.append(f"| `{kernel}` |" + "".join(f" {by_mode[m]['mufu']} | {by_mode[m]['mma']} |" for m in modes))
    return lines


def markdown(meta: dict, cells: dict) -> list[str]:
    cases = list(next(iter(cells.values())))
    lines = [
        "# The Triton kernel's work, counted under Triton's interpreter",
        "",
        f"q, k, v (1, {HEADS}, N, {HEAD_DIM}), tiles {GPU_TILES[0]} queries x {GPU_TILES[1]} keys. "
        "passes = the forward's passes over the key tiles per query tile (2 + solver iterations); "
        "reads = the key tiles they read, in whole passes (less than passes where tiles are skipped); "
        "visited = fraction of (query tile, key tile) pairs the backward visits.",
        "",
        "| row |" + "".join(f" {c}: passes | reads | visited |" for c in cases),
        "|---|" + "---:|---:|---:|" * len(cases),
    ]
    for row, by_case in cells.items():
        lines.append(f"| {ROWS[row][0]} |" + "".join(
            f" {by_case[c]['passes']:.2f} | {by_case[c]['reads']:.2f} | {by_case[c]['tiles_visited']:.2f} |" for c in cases))
    lines += ["", f"- code: HEAD {meta['git']['head'][:12] or '?'}; attention files differing from it: "
              f"{', '.join(meta['git']['attention_files_modified']) or 'none'}; run time {meta['seconds']} s",
              f"- command: `{meta['command']}`", ""]
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="256,1024", help="comma-separated N")
    p.add_argument("--spreads", default="1,2", help="comma-separated score spreads")
    p.add_argument("--scores", default="random,local", help="comma-separated from: random, local")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated from: {', '.join(ROWS)}")
    p.add_argument("--out-dir", type=Path, default=Path("outputs/bench/kernel_passes"))
    p.add_argument("--sass", action="store_true", help="also count MUFU and MMA instructions of the sm_90 builds (~1 min)")
    args = p.parse_args(argv)
    rows = args.rows.split(",")
    bad = [r for r in rows if r not in ROWS] + [s for s in args.scores.split(",") if s not in ("random", "local")]
    if bad:
        p.error(f"unknown rows or scores {bad}; rows: {', '.join(ROWS)}; scores: random, local")
    torch.set_num_threads(1)
    kernel = kernel_module()
    start = time.time()
    cells: dict[str, dict] = {row: {} for row in rows}
    for scores in args.scores.split(","):
        for spread in (float(s) for s in args.spreads.split(",")):
            for n in (int(x) for x in args.lengths.split(",")):
                case = f"{scores} x{spread:g} N={n}"
                for row in rows:
                    cells[row][case] = count_case(kernel, row, scores, n, spread)
                    print(f"  {case} {row}: {cells[row][case]}", file=sys.stderr, flush=True)
    meta = {"heads": HEADS, "head_dim": HEAD_DIM, "tiles": GPU_TILES, "seconds": round(time.time() - start, 1),
            "command": " ".join(["python", "scripts/bench_kernel_passes.py", *(argv if argv is not None else sys.argv[1:])]),
            "git": git_state()}
    result = {"benchmark": "kernel_passes", "meta": meta, "cells": cells}
    lines = markdown(meta, cells)
    if args.sass:
        result["sass"] = sass_counts()
        lines += sass_markdown(result["sass"])
    write_benchmark(args.out_dir, "kernel_passes", result, lines)


if __name__ == "__main__":
    main()
