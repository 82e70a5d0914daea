#!/usr/bin/env python
"""Pathfinder generation speed: images/s for each difficulty, bytes per cached image, and what 200k
images (LRA's 160k/20k/20k) would take.

Each round generates --count images with a new seed (`generate_pathfinder`, --workers processes);
medians over --rounds are reported, per second of wall-clock time and per second of this process's CPU
time (which other processes on a loaded machine disturb less). Bytes per image are those of the cache file (`ImageSplit.save`,
an uncompressed .npz) of the last round's images. The load average at the start is recorded, since
other processes on the machine slow the generator down.

    python scripts/bench_pathfinder.py                          # 5,000 images x 3 rounds, 1 worker
    python scripts/bench_pathfinder.py --count 2000 --rounds 5 --workers 2

Writes <out>/pathfinder.json and .md (default out: outputs/benchmarks).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarking import write_benchmark
from sparse_runner.data.pathfinder_generator import CHUNK_SIZE, generate_pathfinder
from sparse_runner.data.pathfinder_params import DIFFICULTIES

PROJECTED_IMAGES = 200_000


def cached_bytes_per_image(split) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "split.npz"
        split.save(path)
        return path.stat().st_size / len(split)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000, help="images per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--difficulties", default=",".join(DIFFICULTIES), help="comma-separated")
    parser.add_argument("--out", default="outputs/benchmarks")
    args = parser.parse_args()
    names = args.difficulties.split(",")
    load = os.getloadavg()[0]

    rows = []
    for name in names:
        contour_length = DIFFICULTIES[name]
        generate_pathfinder(CHUNK_SIZE, contour_length=contour_length, seed=10**6)  # warm-up
        speeds, cpu_speeds = [], []
        for r in range(args.rounds):
            start, cpu_start = time.perf_counter(), time.process_time()
            split = generate_pathfinder(args.count, contour_length=contour_length, seed=r, workers=args.workers)
            speeds.append(args.count / (time.perf_counter() - start))
            cpu_speeds.append(args.count / (time.process_time() - cpu_start))
            print(f"{name} round {r}: {speeds[-1]:.0f} images/s ({cpu_speeds[-1]:.0f} per CPU second)", file=sys.stderr)
        speed = statistics.median(speeds)
        per_image = cached_bytes_per_image(split)
        rows.append({
            "difficulty": name,
            "contour_length": contour_length,
            "images_per_s": speed,
            "rounds": speeds,
            # With workers > 1 the work is in child processes: this counts only the parent's CPU time.
            "images_per_cpu_s": statistics.median(cpu_speeds) if args.workers == 1 else None,
            "positive_fraction": float(np.mean(split.labels)),
            "cached_bytes_per_image": per_image,
            "projected_bytes": per_image * PROJECTED_IMAGES,
            "projected_seconds": PROJECTED_IMAGES / speed,
        })

    result = {
        "benchmark": "pathfinder", "count": args.count, "rounds": args.rounds, "workers": args.workers,
        "chunk_size": CHUNK_SIZE, "load_average_1min": load, "cpus": os.cpu_count(),
        "machine": platform.machine(), "numpy": np.__version__, "rows": rows,
    }
    md = [
        f"## Pathfinder generation ({args.count} images x {args.rounds} rounds, medians; {args.workers} worker(s), "
        f"load average {load:.1f} on {os.cpu_count()} CPUs)",
        "",
        f"| difficulty | contour length | images/s | images/CPU s | cached bytes/image | {PROJECTED_IMAGES // 1000}k images: size | time |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['difficulty']} | {r['contour_length']} | {r['images_per_s']:.0f} | "
            f"{'-' if r['images_per_cpu_s'] is None else format(r['images_per_cpu_s'], '.0f')} | {r['cached_bytes_per_image']:.0f} | "
            f"{r['projected_bytes'] / 2**20:.0f} MiB | {r['projected_seconds'] / 60:.1f} min |"
        )
    write_benchmark(Path(args.out), "pathfinder", result, md + [""])


if __name__ == "__main__":
    main()
