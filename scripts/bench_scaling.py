#!/usr/bin/env python
"""Data-parallel scaling: training tokens/s of one config at 1, 2, ... processes, side by side in one run.

For each process count N of --nprocs, the real CLI trains the same config (1 process: plain
`python -m sparse_runner.cli`; N > 1: `torchrun --standalone --nproc_per_node=N -m sparse_runner.cli`)
on the same GLOBAL batches (trainer.batch_size / batch_tokens are split across the ranks), with
--threads torch threads per process (default: max(1, cores // N), so every point uses the same cores).
Repeats go round-robin over the process counts (a change of machine load hits every N alike); per N the
median over repeats of
  - `tokens_per_second` from metrics.json (tokens of all ranks / training time; the number compared), and
  - the median of log.jsonl's `train/tokens_per_s` windows with the first window left out (warm-up).
Speed-up = tokens/s at N / tokens/s at 1 process (or at the smallest N given), efficiency = speed-up / N
(relative to the baseline's process count). Evaluation only at the end and no attention analysis; neither
is in the training time anyway.

    python scripts/bench_scaling.py                                    # CPU, --nprocs 1,2, ListOps (CPU size), 1500 steps: ~2.5 min
    python scripts/bench_scaling.py --repeats 3 --max-steps 2000
    python scripts/bench_scaling.py --device cuda --nprocs 1,2,4,8      # one process per GPU (NCCL)
    python scripts/bench_scaling.py --overrides model=entmax15 trainer.batch_size=64

Writes <out>/bench_scaling.json and bench_scaling.md (default out: outputs/bench/scaling); each run's
directory and console log stay under <out>/runs/. Exit status: 0, 1 when a run failed (recorded in
the table), 2 for an impossible request (more processes than GPUs, no CUDA, bad --nprocs).

Timings on a shared machine are noisy: the 1-minute load average before/after each run is recorded.
On a 2-core CPU, 2 processes x 1 thread against 1 process x 2 threads measures what DDP costs (gradient
all-reduce over gloo, per-process overheads), not a speed-up: the cores are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The embedded default (LRA ListOps at CPU size: 2 layers, d 128, batch 32); --max-steps shortens it.
DEFAULT_CONFIG = ["experiment=lra_listops_cpu"]
DEFAULT_STEPS = 1500  # ~1 min per point on a quiet 2-core CPU (~24k tokens/s, ~890 tokens a step)


class Refused(Exception):
    """An impossible request: one line, exit status 2."""


def parse_nprocs(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise Refused(f"--nprocs {text!r}: expected comma-separated process counts, e.g. 1,2") from None
    if not counts or any(n < 1 for n in counts):
        raise Refused(f"--nprocs {text!r}: process counts must be >= 1")
    if len(set(counts)) != len(counts):
        raise Refused(f"--nprocs {text!r}: a process count is repeated")
    return sorted(counts)


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_devices(device: str, nprocs: list[int]) -> dict:
    """What the run needs from the machine; Refused when it cannot have it. Returns the device facts."""
    import torch

    facts = {"cpu": cpu_model(), "cores": cpu_cores(), "torch": torch.__version__, "machine": platform.machine()}
    if device == "cuda":
        if not torch.cuda.is_available():
            raise Refused(f"--device cuda: torch {torch.__version__} sees no CUDA device (a CPU build, or no driver)")
        count = torch.cuda.device_count()
        if max(nprocs) > count:
            raise Refused(f"--nprocs {','.join(map(str, nprocs))}: {max(nprocs)} processes need {max(nprocs)} GPUs (one each), this machine has {count}")
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
        facts["cuda"] = torch.version.cuda
    return facts


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def threads_per_process(nproc: int, cores: int, given: int | None) -> int:
    return given if given else max(1, cores // nproc)


def launcher(nproc: int) -> list[str]:
    """The command prefix that starts `-m sparse_runner.cli` on nproc processes."""
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def run_overrides(config: list[str], device: str, max_steps: int, threads: int, output_dir: Path, extra: list[str]) -> list[str]:
    """The CLI overrides of one point: the benchmark's settings first, the user's last (Hydra: the last wins)."""
    return [
        *config,
        f"trainer.max_steps={max_steps}",
        f"trainer.eval_every={max_steps}",  # one evaluation, at the end (never in the training time)
        f"trainer.log_every={max(1, max_steps // 20)}",
        "trainer.analysis=false",
        "trainer.progress=false",
        "trainer.resume=false",
        f"trainer.device={device}",
        f"trainer.num_threads={threads}",
        f"paths.output_dir={output_dir}",
        *extra,
    ]


def window_median(log_path: Path) -> float | None:
    """Median of the step log's train/tokens_per_s, its first window (warm-up) left out when there are others."""
    if not log_path.exists():
        return None
    windows = []
    for line in log_path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "train/tokens_per_s" in row:
            windows.append(float(row["train/tokens_per_s"]))
    if not windows:
        return None
    return statistics.median(windows[1:] or windows)


def read_run(output_dir: Path) -> dict:
    """The facts of one finished (or failed) run under output_dir/runs/<name>/."""
    dirs = sorted(p for p in (output_dir / "runs").glob("*") if p.is_dir()) if (output_dir / "runs").is_dir() else []
    if len(dirs) != 1:
        return {"status": "missing", "error": f"expected one run directory under {output_dir / 'runs'}, found {len(dirs)}"}
    run_dir = dirs[0]
    try:
        m = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        return {"status": "missing", "run_dir": str(run_dir), "error": f"metrics.json unreadable: {e}"}
    cfg = m.get("config") or {}
    trainer = cfg.get("trainer") or {}
    return {
        "status": m.get("status"),
        "run_dir": str(run_dir),
        "world_size": m.get("world_size"),
        "device": m.get("device"),
        "tokens_per_second": m.get("tokens_per_second"),
        "window_tokens_per_s": window_median(run_dir / "log.jsonl"),
        "train_time_s": m.get("train_time_s"),
        "wall_time_s": m.get("wall_time_s"),
        "tokens_seen": m.get("tokens_seen"),
        "step": m.get("step"),
        "batch_size": trainer.get("batch_size"),
        "batch_tokens": trainer.get("batch_tokens"),
        "error": m.get("error"),
    }


def launch(nproc: int, threads: int, overrides: list[str], output_dir: Path, timeout: float) -> dict:
    """One run of the real CLI; its console output goes to output_dir/console.log."""
    output_dir.mkdir(parents=True, exist_ok=True)
    cmd = [*launcher(nproc), "-m", "sparse_runner.cli", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    # The package from this checkout, also when it is not installed into the interpreter.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    before, start = loadavg(), time.perf_counter()
    with open(output_dir / "console.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=output_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the launcher and every rank
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            rc = f"timed out after {timeout:.0f} s"
    wall = time.perf_counter() - start
    result = {"returncode": rc, "wall_s": round(wall, 2), "loadavg": [before, loadavg()], "command": shlex.join(cmd), **read_run(output_dir)}
    if result["status"] != "completed":
        tail = (output_dir / "console.log").read_text(errors="replace").strip().splitlines()[-5:]
        result["console_tail"] = tail
    return result


def summarise(points: list[dict]) -> list[dict]:
    """Per process count: medians over its completed runs, speed-up and efficiency against the smallest N."""
    rows = []
    for p in points:
        done = [r for r in p["runs"] if r.get("status") == "completed" and r.get("tokens_per_second")]
        windows = [r["window_tokens_per_s"] for r in done if r.get("window_tokens_per_s")]
        rows.append({
            "nprocs": p["nprocs"],
            "threads": p["threads"],
            "completed": len(done),
            "runs": len(p["runs"]),
            "median_tokens_per_s": statistics.median(r["tokens_per_second"] for r in done) if done else None,
            "median_window_tokens_per_s": statistics.median(windows) if windows else None,
            "device": next((r["device"] for r in done if r.get("device")), None),
        })
    base = rows[0] if rows else None
    for row in rows:
        ok = base and base["median_tokens_per_s"] and row["median_tokens_per_s"]
        row["speedup"] = row["median_tokens_per_s"] / base["median_tokens_per_s"] if ok else None
        row["efficiency"] = row["speedup"] / (row["nprocs"] / base["nprocs"]) if ok else None
    return rows


def _num(x, fmt: str) -> str:
    return format(x, fmt) if x is not None else "—"


def markdown(result: dict) -> list[str]:
    rows = result["summary"]
    base = rows[0]["nprocs"] if rows else 1
    vs = "1 process" if base == 1 else f"{base} processes"
    lines = [
        f"| processes | threads/process | tokens/s (median) | log windows tokens/s (median) | speed-up vs {vs} | scaling efficiency | device | runs completed |",
        "|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nprocs']} | {r['threads']} | {_num(r['median_tokens_per_s'], '.0f')} | {_num(r['median_window_tokens_per_s'], '.0f')} | "
            f"{_num(r['speedup'], '.2f')} | {_num(r['efficiency'], '.2f')} | {r['device'] or result['device']} | {r['completed']}/{r['runs']} |"
        )
    m = result["machine"]
    where = f"{len(m['gpus'])} x {m['gpus'][0]}" if m.get("gpus") else f"{m['cores']} cores ({m['cpu']})"
    loads = "; ".join(f"{p['nprocs']} proc.: " + ", ".join(f"{r['loadavg'][0]}-{r['loadavg'][1]}" for r in p["runs"]) for p in result["points"])
    lines += [
        "",
        f"Config: {' '.join(result['config']) or 'the embedded default'}; {result['max_steps']} steps, global batch "
        f"{result.get('global_batch') or '?'}, the same for every process count; repeats {result['repeats']} (round-robin, medians). "
        f"tokens/s = metrics.json `tokens_per_second` (all ranks); log windows = median of log.jsonl `train/tokens_per_s`, first window left out. "
        f"Efficiency = speed-up / (N / {base}).",
        f"Machine: {where}, torch {m['torch']}; load average (1 min) before-after each run, by repeat: {loads}; "
        f"{result['seconds']:.0f} s in all.",
    ]
    failed = [(p["nprocs"], r) for p in result["points"] for r in p["runs"] if r.get("status") != "completed"]
    for n, r in failed:
        lines.append(f"FAILED: {n} processes ({r.get('status')}, exit {r.get('returncode')}): {r.get('error') or ' / '.join(r.get('console_tail', []))[-300:]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--nprocs", default="1,2", help="comma-separated process counts (default 1,2; cuda: one GPU each)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=1, help="runs per process count (round-robin; medians)")
    parser.add_argument("--max-steps", type=int, default=DEFAULT_STEPS, help=f"training steps per run (default {DEFAULT_STEPS})")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per process (default: max(1, cores // N))")
    parser.add_argument("--config", nargs="*", default=DEFAULT_CONFIG, help=f"the benchmarked config (default: {' '.join(DEFAULT_CONFIG)})")
    parser.add_argument("--overrides", nargs="+", action="extend", default=[], help="extra Hydra overrides (after the benchmark's own)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is stopped")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/scaling"))
    args = parser.parse_args(argv)
    try:
        nprocs = parse_nprocs(args.nprocs)
        if args.repeats < 1 or args.max_steps < 1 or (args.threads is not None and args.threads < 1):
            raise Refused("--repeats, --max-steps and --threads must be >= 1")
        machine = check_devices(args.device, nprocs)
    except Refused as e:
        print(f"bench_scaling: {e}", file=sys.stderr)
        return 2
    cores = machine["cores"]
    if args.device == "cpu" and max(nprocs) > cores:
        print(f"bench_scaling: warning: {max(nprocs)} processes on {cores} cores share cores (1 thread each)", file=sys.stderr)

    out = args.out.resolve()
    points = [{"nprocs": n, "threads": threads_per_process(n, cores, args.threads), "runs": []} for n in nprocs]
    start = time.perf_counter()
    for r in range(args.repeats):
        for p in points:
            output_dir = out / "runs" / f"np{p['nprocs']}-r{r}"
            overrides = run_overrides(args.config, args.device, args.max_steps, p["threads"], output_dir, args.overrides)
            print(f"bench_scaling: {p['nprocs']} process(es) x {p['threads']} thread(s), repeat {r + 1}/{args.repeats} ...", file=sys.stderr, flush=True)
            run = launch(p["nprocs"], p["threads"], overrides, output_dir, args.timeout)
            run["repeat"] = r
            p["runs"].append(run)
            print(f"bench_scaling:   {run['status']}: {_num(run.get('tokens_per_second'), '.0f')} tokens/s "
                  f"(log windows {_num(run.get('window_tokens_per_s'), '.0f')}), {run['wall_s']:.0f} s, load {run['loadavg']}", file=sys.stderr, flush=True)
    batches = {(r.get("batch_size"), r.get("batch_tokens")) for p in points for r in p["runs"] if r.get("status") == "completed"}
    batch = next(iter(batches)) if len(batches) == 1 else None
    result = {
        "benchmark": "scaling",
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["bench_scaling.py", *argv]),
        "device": args.device,
        "nprocs": nprocs,
        "repeats": args.repeats,
        "max_steps": args.max_steps,
        "config": args.config,
        "overrides": args.overrides,
        "global_batch": (f"{batch[1]} tokens" if batch[1] else f"{batch[0]} sequences") if batch else None,
        "machine": machine,
        "points": points,
        "summary": summarise(points),
    }
    result["seconds"] = round(time.perf_counter() - start, 1)
    md = markdown(result)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from sparse_runner.io import atomic_write_json, atomic_write_text

    atomic_write_json(out / "bench_scaling.json", result)
    atomic_write_text(out / "bench_scaling.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 1 if any(r.get("status") != "completed" for p in points for r in p["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
