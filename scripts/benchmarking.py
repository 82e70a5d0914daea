"""Helpers shared by the benchmark scripts beside it (timing only; no run uses them, so the package does not ship them).

A script run as `python scripts/bench_*.py` has this folder on its path and imports it as `benchmarking`.
Importing it is cheap (no torch at import time): the layer benchmarks call `reexec_with_tuned_allocator` from it
before they import torch.
"""

from __future__ import annotations

import gc
import itertools
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


COMPILE_RESERVE_S = 60.0


def model_overrides(spec: str) -> list[str]:
    """The overrides of a benchmark's model row: "entmax" is model=entmax; "ernie_sparse+trainer.compile=true"
    adds the overrides after each "+" (a row of the same model run another way)."""
    name, *extra = spec.split("+")
    return [f"model={name}", *extra]


def train_minimal(cfg, task, steps: int | None = None, device: str = "cpu") -> tuple[torch.nn.Module, float, int]:
    """The loop of `minimal_training_tokens_per_s`; returns (trained model, tokens/s, tokens)."""
    steps = cfg.trainer.max_steps if steps is None else steps
    loop = MinimalTraining(cfg, task, device)
    seconds, tokens = loop.timed(steps)
    return loop.model, tokens / seconds, tokens


class MinimalTraining:
    """cfg's model, AdamW, clipping and the lr schedule on cfg's task, as a researcher's own loop would have
    them; `step()` trains on the next batch. trainer.precision autocasts as the trainer does (bf16 on any
    device, fp16 with a gradient scaler on CUDA; fp32, every CPU preset's, runs without autocast), and
    trainer.compile=true runs the forward and backward through torch.compile, as the trainer does."""

    def __init__(self, cfg, task, device: str = "cpu") -> None:
        import contextlib

        import torch

        from sparse_runner.run import seed_everything
        from sparse_runner.training.schedules import build_scheduler
        from sparse_runner.training.trainer import autocast_dtype, compile_step, optimizer_groups

        t = self.trainer = cfg.trainer
        self.task, self.seed, self.device = task, cfg.seed, torch.device(device)
        seed_everything(cfg.seed, t.deterministic)
        self.model = task.build_model(cfg.model).to(self.device)
        self.model.train()
        self.step_model = compile_step(self.model, t.compile)
        self.opt = torch.optim.AdamW(optimizer_groups(self.model, t.lr, t.weight_decay, t.alpha_lr_scale), lr=t.lr, betas=tuple(t.betas))
        self.sched = build_scheduler(self.opt, schedule=t.schedule, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio)
        dtype = autocast_dtype(t.precision, self.device)
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=dtype)) if dtype is not None else contextlib.nullcontext
        self.scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
        self.rewind()

    def rewind(self) -> None:
        """Make the next steps train on the first batches again (those a fresh loop trains on)."""
        self.epoch, self.index = 0, 0
        self.plan = self._plan()

    def timed(self, steps: int) -> tuple[float, int]:
        """(seconds, tokens) of `steps` training steps, the device synchronised before and after."""
        synchronize(self.device)
        tokens, start = 0, time.perf_counter()
        for _ in range(steps):
            tokens += self.step()
        synchronize(self.device)
        return time.perf_counter() - start, tokens

    def _plan(self):
        t = self.trainer
        return self.task.plan_epoch(seed=self.seed, epoch=self.epoch, batch_size=t.batch_size, bucket_size=t.bucket_size, max_tokens=t.batch_tokens)

    def step(self) -> int:
        """One training step on the next batch; returns its number of tokens."""
        import torch

        if self.index == len(self.plan):
            self.epoch, self.index = self.epoch + 1, 0
            self.plan = self._plan()
        batch = self.task.make_batch("train", self.plan[self.index], self.device)
        self.index += 1
        with self.autocast():
            loss = self.task.forward_loss(self.step_model, batch).loss  # the task's forward + loss, nothing else
        self.opt.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)
        else:
            loss.backward()
        if self.trainer.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.trainer.clip_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.sched.step()
        return batch["num_tokens"]


def measure_training(cfg, task, device: str, warmup: int, steps: int) -> dict:
    """Seconds per training step of `MinimalTraining` after `warmup` untimed steps (kernel compilation,
    autotuning, allocator growth), the device synchronised around the timed `steps`. Returns
    {"seconds_per_step", "tokens_per_s", "steps", "warmup", "peak_mib"}; peak_mib: the device's peak
    allocated memory from building the model on (weights, optimizer state, activations), None on the CPU."""
    import torch

    cuda = torch.device(device).type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    loop = MinimalTraining(cfg, task, device)
    for _ in range(warmup):
        loop.step()
    seconds, tokens = loop.timed(steps)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
    del loop
    return {"seconds_per_step": seconds / steps, "tokens_per_s": tokens / seconds, "steps": steps, "warmup": warmup, "peak_mib": peak}


def compose_run_config(overrides: list[str]):
    """conf/config.yaml composed with `overrides` and validated, as `sparse-run` would run it."""
    from hydra import compose, initialize_config_dir

    from sparse_runner.config import CONF_DIR, validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


def device_training_rows(models: list[str], overrides: list[str], device: str, warmup: int, steps: int, deadline: float | None = None) -> list[dict]:
    """One `measure_training` per model= option of the same config on `device`: tokens/s, seconds per step
    and peak memory, with ratios to the first model's. A model that fails (out of memory, a kernel error)
    or that the deadline (time.monotonic()) leaves no time for is a row with "failed": its cell text."""
    from sparse_runner.tasks import build_task

    configs = {m: compose_run_config([*model_overrides(m), f"trainer.device={device}", *overrides]) for m in models}
    task = build_task(configs[models[0]])
    rows = []
    for model in models:
        # A compiled row's first steps compile for a minute or so: it starts only with COMPILE_RESERVE_S left.
        reserve = COMPILE_RESERVE_S if configs[model].trainer.compile is not False else 0.0
        if deadline is not None and time.monotonic() + reserve > deadline:
            rows.append({"model": model, "failed": "n/a (time budget spent)"})
            continue
        try:
            rows.append({"model": model, **measure_training(configs[model], task, device, warmup, steps)})
        except Exception as error:  # noqa: BLE001 -- a cell of the table, never the end of the run
            rows.append({"model": model, "failed": failed_cell(error, device)})
        print(f"training {model} on {device}: {rows[-1]}", file=sys.stderr, flush=True)
    base = rows[0] if "failed" not in rows[0] else None
    for row in rows:
        if base and "failed" not in row:
            row["x_first"] = row["tokens_per_s"] / base["tokens_per_s"]
            if base["peak_mib"] and row["peak_mib"] is not None:
                row["memory_x_first"] = row["peak_mib"] / base["peak_mib"]
    return rows


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
            configs[model] = validate(compose(config_name="config", overrides=[*model_overrides(model), "trainer.device=cpu", *overrides]))
    if configs[models[0]].trainer.cpu_block_cache_mb:  # as `sparse-run` does on a CPU (sparse_runner/run.py)
        from sparse_runner.training import cpu_block_cache

        cpu_block_cache.install(configs[models[0]].trainer.cpu_block_cache_mb)
    task = build_task(configs[models[0]])
    tps: dict[str, list[float]] = {m: [] for m in models}
    minimal_training_tokens_per_s(configs[models[0]], task, steps=min(steps, 20))  # warm-up
    # A compiled row keeps one loop, and with it its compiled graphs, across rounds: a fresh torch.compile every
    # round would trace and compile again inside the timing (and hit Dynamo's recompile limit). Its first pass
    # over the round's batches, untimed, compiles every shape they have; each round then replays those batches.
    compiled = {m: MinimalTraining(configs[m], task) for m in models if configs[m].trainer.compile is not False}
    for loop in compiled.values():
        loop.timed(steps)
    for _ in range(rounds):
        for model in models:
            if model in compiled:
                compiled[model].rewind()
                seconds, tokens = compiled[model].timed(steps)
                tps[model].append(tokens / seconds)
            else:
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


def write_benchmark(out_dir, name: str, result: dict, markdown: list[str], echo: bool = True) -> None:
    """<out_dir>/<name>.json and .md, written atomically; the markdown is also printed when `echo`."""
    from sparse_runner.io import atomic_write_json, atomic_write_text

    out = Path(out_dir)
    atomic_write_json(out / f"{name}.json", result)
    atomic_write_text(out / f"{name}.md", "\n".join(markdown) + "\n")
    if echo:
        print("\n".join(markdown))


# ----------------------------------------------------------------------------- device (--device cpu|cuda)
DEVICES = ("cpu", "cuda")


def add_device_argument(parser, help_extra: str = "") -> None:
    """--device cpu|cuda (default cpu: the CPU method and its numbers)."""
    parser.add_argument("--device", default="cpu", choices=DEVICES,
                        help="where to measure: cpu (default) or cuda (the first CUDA device)" + (f"; {help_extra}" if help_extra else ""))


def device_unavailable(device: str) -> str | None:
    """Why `device` cannot run here (one line), or None when it can."""
    if device != "cuda":
        return None
    import torch

    if not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"a CUDA {torch.version.cuda} build that sees no GPU (driver? CUDA_VISIBLE_DEVICES?)"
        return f"--device cuda: torch {torch.__version__} is {build}; valid here: --device cpu"
    return None


def require_device(device: str):
    """The torch.device of `device`; exits with a one-line message (status 2) where it cannot run here."""
    import torch

    why = device_unavailable(device)
    if why:
        print(f"error: {why}", file=sys.stderr)
        raise SystemExit(2)
    return torch.device(device)


def device_description(device) -> dict:
    """What a benchmark ran on: the GPU's name, memory, CUDA and torch versions (CUDA), or the CPU's model."""
    import torch

    facts = {"device": str(device), "torch": torch.__version__}
    if getattr(device, "type", device) == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            import triton

            facts["triton"] = triton.__version__
        except ImportError:
            facts["triton"] = None
    else:
        facts["cpu"] = cpu_model()
    return facts


def synchronize(device) -> None:
    """Wait for the device's queued kernels (CUDA); nothing on the CPU."""
    if getattr(device, "type", device) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def timed_calls_ms(step: Callable[[], None], device, repeats: int, max_seconds: float) -> list[float]:
    """Wall times (ms) of up to `repeats` calls of `step`, each between two synchronisations of `device`;
    at least 3 calls, fewer than `repeats` once `max_seconds` have been spent. Warm up before calling."""
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats and (len(times) < 3 or spent < max_seconds):
        synchronize(device)
        t0 = time.perf_counter()
        step()
        synchronize(device)
        times.append(1e3 * (time.perf_counter() - t0))
        spent += times[-1] / 1e3
    return times


def peak_device_memory_mib(step: Callable[[], None], device) -> float | None:
    """Peak extra GPU memory (MiB) of one call of `step`: torch.cuda.max_memory_allocated after it minus
    the memory allocated before it (the tensors it keeps, transients and gradients; not the weights and
    inputs). None on the CPU (the CPU method is `peak_step_memory`, in a fresh process)."""
    if getattr(device, "type", device) != "cuda":
        return None
    import torch

    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a failure to allocate (torch's OutOfMemoryError, MemoryError, or the message of one)."""
    import torch

    if isinstance(error, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def failed_cell(error: BaseException, device=None) -> str:
    """The table cell of a measurement that raised: "n/a (out of memory)" or "n/a (<Error>: <first line>)".
    Frees the device's cached blocks so that the next cell starts clean."""
    if getattr(device, "type", device) == "cuda":
        import torch

        gc.collect()
        torch.cuda.empty_cache()
    if is_out_of_memory(error):
        return "n/a (out of memory)"
    line = (str(error).strip().splitlines() or [""])[0]
    line = line if len(line) <= 160 else line[:157] + "..."
    return f"n/a ({type(error).__name__}: {line})" if line else f"n/a ({type(error).__name__})"


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


def device_footer(meta: dict) -> list[str]:
    """The last lines of a device table: where it ran, the code measured (`git_state`) and the command."""
    where = meta.get("gpu") or meta.get("cpu") or meta["device"]
    return [
        "",
        f"- {where}; torch {meta['torch']}" + (f", CUDA {meta.get('cuda')}, triton {meta.get('triton')}" if "gpu" in meta else "")
        + f"; run time {meta.get('seconds', '?')} s",
        f"- code: HEAD {meta['git']['head'][:12] or '?'}; attention files differing from it: {', '.join(meta['git']['attention_files_modified']) or 'none'}",
        f"- command: `{meta['command']}`",
        "",
    ]


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


# ----------------------------------------------------------------------------- one attention layer's step (the layer benchmarks)
def projections_only(d_model: int, heads: int, head_size: int):
    """(module, forward): an attention layer's Q/K/V and output projections alone, two adds standing in for
    attention (about 1% of the time): the cost every attention row pays besides attention itself."""
    from sparse_runner.attention import AttentionSpec, MultiHeadAttention

    module = MultiHeadAttention(d_model, AttentionSpec(num_heads=heads, head_size=head_size))
    inner = heads * head_size

    def forward(x):
        kv = module.kv_proj(x)
        return module.out_proj(module.q_proj(x) + kv[..., :inner] + kv[..., inner:])

    return module, forward


def layer_step(module, forward, xs: list, gs: list) -> Callable[[], None]:
    """One forward, then backward of <forward(x), g>, into x and every parameter of `module` (grads set to None
    first: no accumulation); successive calls cycle through the (x, g) pairs."""
    turn = itertools.count()
    params = list(module.parameters())

    def step():
        i = next(turn) % len(xs)
        for p in params:
            p.grad = None
        xs[i].grad = None
        forward(xs[i]).backward(gs[i])

    return step


def time_rows(n: int, rows: list[str], *, build: Callable, skip_reason: Callable[[str], str | None],
              warm_up: Callable[[str, object, Callable[[], None], list], dict], baseline: str, ratio_key: str,
              rounds: int, min_run_time: float, inputs: int, threads: int) -> dict[str, dict]:
    """Round-robin timings (`round_robin_ms`) of every row at length n. build(row, n, inputs) -> (module, forward,
    xs, gs, positions); a row whose skip_reason is not None is {"skipped": reason}; warm_up(row, module, step, xs)
    runs the first, untimed step and returns what it measured ({"warmup_s": ...}). Each timed row gets
    round_medians_ms, fwd_bwd_ms (their median) and ratio_key: its median over the baseline row's, both from the
    same rounds."""
    steps, out = {}, {}
    for row in rows:
        reason = skip_reason(row)
        if reason:
            out[row] = {"skipped": reason}
            continue
        module, forward, xs, gs, positions = build(row, n, inputs)
        steps[row] = layer_step(module, forward, xs, gs)
        out[row] = {"positions": positions, **warm_up(row, module, steps[row], xs), "round_medians_ms": []}
        print(f"  n={n} {row}: warm-up {out[row]['warmup_s']:.2f} s", file=sys.stderr, flush=True)
    for row, medians in round_robin_ms(steps, rounds, min_run_time, threads, f"n={n}").items():
        out[row]["round_medians_ms"] = medians
        out[row]["fwd_bwd_ms"] = statistics.median(medians)
    base = out.get(baseline, {}).get("round_medians_ms")
    for row in steps:
        if base:
            out[row][ratio_key] = out[row]["fwd_bwd_ms"] / statistics.median(base)
    return out


def layer_benchmark_parser(description: str, rows: dict, lengths_help: str, out_dir: str, memory_timeout: float):
    """The arguments the layer benchmarks share (bench_block_sparse.py, bench_long_attention.py): the CPU method's
    (rows, lengths, round-robin timing, memory children, --profile); each script adds its own, then
    `add_device_table_arguments`."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--lengths", default=None, help=lengths_help)
    p.add_argument("--rows", default=",".join(rows), help=f"comma-separated rows from: {', '.join(rows)}")
    p.add_argument("--out-dir", type=Path, default=Path(out_dir))
    p.add_argument("--quick", action="store_true", help="lengths 128,256, one round, short timings, one input (smoke run)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-run-time", type=float, default=0.5, help="seconds per blocked_autorange")
    p.add_argument("--inputs", type=int, default=2, help="different (x, g) draws cycled through by the steps")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--memory-timeout", type=float, default=memory_timeout, help="seconds per memory subprocess")
    p.add_argument("--profile", default=None, metavar="ROW:N", help="print a torch.profiler table of ROW at N and exit")
    p.add_argument("--default-allocator", action="store_true", help="do not re-execute with the tuned glibc settings")
    return p


def add_device_table_arguments(parser, device_help: str) -> None:
    """--device, and the device table's --repeats, --cell-seconds and --time-budget."""
    add_device_argument(parser, device_help)
    parser.add_argument("--repeats", type=int, default=10, help="device table: timed calls per cell (at least 3)")
    parser.add_argument("--cell-seconds", type=float, default=2.0, help="device table: no more calls after these seconds (at least 3)")
    parser.add_argument("--time-budget", type=float, default=None, help="device table: seconds; cells not started by then are n/a")


def chosen_rows(parser, text: str, valid: dict, where: str = "") -> list[str]:
    """The comma-separated rows of `text`; parser.error naming the valid ones for any other."""
    rows = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in rows if r not in valid]
    if unknown:
        parser.error(f"unknown rows {unknown}{where}; valid: {', '.join(valid)}")
    return rows


def cpu_lengths(args, default_lengths: str, quick_lengths: str) -> list[int]:
    """--lengths as ints (default: the script's, or its quick ones); --quick also shortens the timing."""
    if args.quick:
        args.rounds, args.min_run_time, args.inputs = 1, min(args.min_run_time, 0.1), 1
    return [int(v) for v in (args.lengths or (quick_lengths if args.quick else default_lengths)).split(",")]
