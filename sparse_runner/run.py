"""One run, start to finish: seed, build task -> model -> trainer, train, test, write metrics.json.

The Hydra entry point (cli.py) calls `run(cfg, run_dir, meta)`; tests and scripts may call it
directly with a composed config.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from sparse_runner.attention import attention_backends
from sparse_runner.attention.spec import check_attention_impl_device
from sparse_runner.checks import ConfigError, DataError, one_line
from sparse_runner.io import atomic_write_text, is_temporary, temporary_target
from sparse_runner import run_metrics
from sparse_runner.identity import default_values
from sparse_runner.pretrained import load_encoder
from sparse_runner.run_metrics import NON_RESULT_KEYS, MetricsFile, flatten, now
from sparse_runner.tasks import build_task, task_families
from sparse_runner.training import cpu_block_cache, distributed
from sparse_runner.training.distributed import is_main
from sparse_runner.training.stopping import Preempted, StopSignals
from sparse_runner.training.trainer import Diverged, Trainer

log = logging.getLogger(__name__)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
        torch.use_deterministic_algorithms(True, warn_only=True)
        # Deterministic mode also fills every new tensor with NaN, a debugging aid for reads of uninitialised
        # memory that changes no result of kernels that write every element, at the cost of a full memory
        # pass per allocation: a quarter of an alpha-entmax training step at 512 tokens (n x n scores).
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.benchmark = False


def pick_device(name: str) -> torch.device:
    """The torch device of trainer.device; under a launcher with several processes per node, each process
    takes the GPU of its LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device: {name!r} requested but CUDA is not available; valid: auto, cpu")
    if device.type == "cuda" and distributed.launched():
        if device.index is not None:
            raise ConfigError(f"trainer.device: {name!r} under a multi-process launcher, where each process takes cuda:LOCAL_RANK; valid: auto, cuda")
        # Modulo: a SLURM task bound to its own GPU (--gpus-per-task) sees only that one, as cuda:0.
        device = torch.device("cuda", distributed.local_rank() % torch.cuda.device_count())
    return device


def fingerprint(cfg: DictConfig) -> dict[str, Any]:
    flat = flatten(OmegaConf.to_container(cfg, resolve=True))
    return {k: v for k, v in flat.items() if k not in NON_RESULT_KEYS}


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# What a run directory holds before its run writes metrics.json: Hydra's record of the job and the job's log
# (Hydra writes both before sparse_runner's code runs; the log is named by hydra.job.name), then the run's
# lock. Every other file of a run comes after its metrics.json.
HYDRA_FILES = frozenset({".hydra", "sparse_run.log"})
START_FILES = HYDRA_FILES | {".lock"}


class ForeignDirectory(ConfigError):
    """The run directory holds files that sparse-run did not write: touch nothing."""


def foreign_entries(run_dir: Path) -> list[str]:
    """The names in `run_dir` that show it is not a run directory of sparse-run, sorted; an empty list when
    it is one or does not exist: it holds the metrics.json of a run, or nothing but START_FILES and
    sparse_runner.io's temporaries (a run killed before its metrics.json)."""
    if not run_dir.is_dir():
        return []
    try:
        metrics = run_metrics.read(run_dir / "metrics.json")
    except (OSError, ValueError):
        metrics = {}
    if "status" in metrics and "config" in metrics:
        return []
    return sorted(name for name in os.listdir(run_dir) if name not in START_FILES and not is_temporary(name))


def check_run_directory(run_dir: Path) -> None:
    """Refuse (ForeignDirectory, one line) a `run_dir` that is not a run directory of sparse-run
    (`foreign_entries`): a run neither writes into nor cleans up a folder of the user's."""
    foreign = foreign_entries(run_dir)
    if foreign:
        shown = ", ".join(repr(name) for name in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ForeignDirectory(
            f"{run_dir.absolute()} is not a run directory of sparse-run: it holds {shown}, which sparse-run did not write, and no "
            "run's metrics.json; a run writes only into a new or empty directory or its own earlier run: run elsewhere "
            "(hydra.run.dir=..., paths.output_dir=...)"
        )


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete the temporary files that a killed run left in `run_dir` and its folders: only the names
    sparse_runner.io gives them (`is_temporary`). For a run directory of ours that this process holds."""
    folders = [run_dir, *(p for p in run_dir.iterdir() if p.is_dir() and not p.is_symlink())]
    for folder in folders:
        for stale in folder.iterdir():
            if is_temporary(stale.name) and stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)


# The terminal's INFO lines held back while a run starts (None: none held); see `terminal_info_held`.
_held_info: list[tuple[logging.Handler, logging.LogRecord]] | None = None


class _HoldInfo(logging.Filter):
    """Keeps a terminal handler's records below WARNING in `_held_info` while a hold is on."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        if _held_info is None or record.levelno >= logging.WARNING:
            return True
        _held_info.append((self.handler, record))
        return False


def _writes_to_terminal(handler: logging.Handler) -> bool:
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and handler.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__))


@contextlib.contextmanager
def terminal_info_held():
    """Hold a run's INFO lines back from the terminal until `show_terminal_info()`, which the run calls once
    it is accepted (its directory, device, data and checkpoint checked): a run refused at start prints its one
    error line alone. The log file gets every line as it comes. Inside another hold (a pre-training stage
    within a run's start) the outer hold serves both."""
    global _held_info
    if _held_info is not None:
        yield
        return
    holds = [(handler, _HoldInfo(handler)) for handler in logging.getLogger().handlers if _writes_to_terminal(handler)]
    for handler, hold in holds:
        handler.addFilter(hold)
    _held_info = []
    try:
        yield
    finally:
        _held_info = None
        for handler, hold in holds:
            handler.removeFilter(hold)


def show_terminal_info() -> None:
    """End the hold of `terminal_info_held`: print the lines held back, and every later one as it comes."""
    global _held_info
    held, _held_info = _held_info or [], None
    for handler, record in held:
        handler.handle(record)


class CacheNotWritable(ConfigError):
    """The run had to add a file to a cache (paths.cache_dir) that cannot be written (a shared, read-only cache)."""


def cache_not_writable(exc: BaseException, cache_dir: str) -> CacheNotWritable | None:
    """`exc` as a one-line CacheNotWritable if it is a failure to write under `cache_dir` (None if not)."""
    if not isinstance(exc, OSError) or exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not exc.filename:
        return None
    cache, target = Path(cache_dir).expanduser().absolute(), Path(os.fsdecode(exc.filename)).absolute()
    if target != cache and cache not in target.parents:
        return None
    temporary = temporary_target(target.name)  # a sibling an atomic write goes through
    if temporary:
        target = target.with_name(temporary)
    elif target.name.startswith(".download-"):  # data/fetch.py downloads into the cache
        target = target.parent
    return CacheNotWritable(
        f"paths.cache_dir: this run must write {target}, which the cache {cache_dir} lacks, and cannot "
        f"({exc.strerror or type(exc).__name__}); set SPARSE_RUNNER_CACHE or paths.cache_dir to a writable directory "
        "(or run it once where this cache is writable: runs that find everything there need no write)"
    )


class DirectoryInUse(ConfigError):
    """Another process holds the run directory (its files are that process's: touch nothing)."""


@contextlib.contextmanager
def directory_lock(run_dir: Path):
    """Hold `run_dir` for this process: a second sparse-run on the same directory is refused while the first
    runs. An flock dies with its process, so a run killed with -9 leaves no stale lock. Under a launcher
    rank 0 holds it for all ranks."""
    if not is_main():
        yield
        return
    path = run_dir / ".lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if _held_shared(handle):  # by fine-tuning runs reading it (pretrained.resolve), for seconds
                raise DirectoryInUse(
                    f"{run_dir} is being read by a sparse-run that starts from it (model.init_from); run this again "
                    "once that one has loaded it, or run elsewhere (hydra.run.dir=..., paths.output_dir=...)"
                ) from None
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise DirectoryInUse(
                f"{run_dir} is in use by another sparse-run (pid {holder}); wait for it to finish, or run elsewhere "
                "(hydra.run.dir=..., paths.output_dir=...)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def _held_shared(handle: Any) -> bool:
    """Whether the flock that refused us is shared (readers) rather than a sparse-run's exclusive one."""
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(handle, fcntl.LOCK_UN)
    return True


def check_splits_not_empty(task: Any) -> None:
    """Every split must hold examples: an empty test split would report a metric over nothing."""
    empty = [split for split, n in task.sizes().items() if n == 0]
    if empty:
        raise DataError(f"task {task.name}: the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty (0 examples); check the task's data (task.*) and its files")


def _status(run_dir: Path) -> str | None:
    try:
        return run_metrics.read(run_dir / "metrics.json").get("status")
    except (OSError, ValueError):
        return None


def _figures(run_dir: Path, analysis: dict[str, Any]) -> list[str]:
    """The analysis figures; a plotting problem is logged, never fatal to a finished run."""
    if not analysis:
        return []
    from sparse_runner.analysis.collect import alpha_trajectory, write_figures

    try:
        return write_figures(run_dir, analysis, alpha_trajectory(run_dir / "log.jsonl"))
    except Exception as exc:
        log.warning("could not draw the analysis figures: %s", one_line(exc))
        return []


def pretrain_dir(cfg: DictConfig) -> Path:
    """Where the pre-training stage of `cfg` runs: one directory per pre-training config (model, task,
    trainer, seed), named by what it computes (identity.run_name) and shared by every fine-tuning run
    that needs it, under `paths.output_dir/pretrain/`."""
    from sparse_runner.config import pretrain_config
    from sparse_runner.identity import run_name

    pre = pretrain_config(cfg)
    return Path(cfg.paths.output_dir).expanduser() / "pretrain" / run_name(OmegaConf.to_container(pre, resolve=True))


def pretrain_stage(cfg: DictConfig, meta: dict[str, Any]) -> Path:
    """Run (or resume, or find finished) the pre-training run of `cfg` and return its directory.

    Jobs of one sweep that share it wait for each other on a lock file, so it is trained once."""
    from sparse_runner.config import pretrain_config, validate

    directory = pretrain_dir(cfg)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(directory.name + ".lock"), "w") as lock:
        # Released when the file closes, also if this process is killed. Under a launcher rank 0 alone
        # takes it, then all ranks train the stage together.
        _wait_for_lock(lock)
        needed = distributed.broadcast_object(_status(directory) != "completed")
        if needed:
            log.info("pre-training stage: %s", directory)
            run(validate(pretrain_config(cfg)), directory, {"experiment": meta.get("experiment"), "overrides": [], "stage": "pretrain"})
        distributed.barrier()
    return directory


def _wait_for_lock(lock: Any) -> None:
    """Rank 0 takes `lock`, however long another job holds it. Under a launcher the other ranks hear every
    30 s that it is still waiting, so no collective waits long enough to time out."""
    if not distributed.is_distributed():
        fcntl.flock(lock, fcntl.LOCK_EX)
        return
    while True:
        acquired = False
        if is_main():
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                acquired = True
            except BlockingIOError:
                time.sleep(30.0)
        if distributed.broadcast_object(acquired):
            return


def with_init_from(cfg: DictConfig, path: Path) -> DictConfig:
    """A read-only copy of `cfg` whose model starts from `path`."""
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    out.model.init_from = str(path)
    OmegaConf.set_readonly(out, True)
    return out


def run(cfg: DictConfig, run_dir: Path, meta: dict[str, Any] | None = None) -> float:
    """Train and test one configuration in `run_dir`; return the best validation value of trainer.monitor.

    A `run_dir` that is a folder of the user's (`foreign_entries`) is refused (ForeignDirectory) before anything
    in it is touched. With a pre-training stage (`cfg.pretrain.task`), that run comes first and this one starts
    from it. Stop signals (SIGTERM, SIGINT, SIGUSR1/2) end it as `Preempted`, with status `preempted` recorded.
    """
    run_dir = Path(run_dir)
    if is_main():
        check_run_directory(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stop = StopSignals()
    with terminal_info_held(), directory_lock(run_dir), stop.installed():
        return _run(cfg, run_dir, meta or {}, stop)


def _run(cfg: DictConfig, run_dir: Path, meta: dict[str, Any], stop: StopSignals) -> float:
    t = cfg.trainer
    primary_metric = f"test/{task_families()[cfg.task.family].primary_metric}"
    try:
        device = pick_device(t.device)
        if "attention_impl" in cfg.model:
            check_attention_impl_device(cfg.model, device)
        distributed.setup(device)
        if distributed.world_size() > 1 and not task_families()[cfg.task.family].data_parallel:
            raise ConfigError(f"task.family: {cfg.task.family} cannot split its training across processes; run it as one process (without torchrun)")
        if cfg.pretrain.task is not None:
            cfg = with_init_from(cfg, pretrain_stage(cfg, meta))
        # From here: the stage's time is its own run's (`pretraining.cpu_time_s`), not this one's.
        started = (time.perf_counter(), time.process_time())
        if t.num_threads:
            torch.set_num_threads(t.num_threads)
        if device.type == "cpu" and t.cpu_block_cache_mb:
            log.info("CPU block cache: %s", cpu_block_cache.install(t.cpu_block_cache_mb))
        seed_everything(cfg.seed, t.deterministic)
        task = build_task(cfg)
        check_splits_not_empty(task)
        # Re-seed so the initial weights do not depend on what building the task drew.
        torch.manual_seed(cfg.seed)
        model = task.build_model(cfg.model)
        if distributed.rank() > 0:  # every rank starts from rank 0's weights (DDP); dropout differs per rank
            torch.manual_seed(hash((cfg.seed, distributed.rank())) % 2**63)
        pretrained = getattr(task, "pretrained", None)
        pretraining = load_encoder(model, pretrained, fingerprint(cfg)) if pretrained is not None else None
        trainer = Trainer(cfg, task, model, run_dir, device, fingerprint=fingerprint(cfg), fingerprint_defaults=default_values(), stop=stop,
                          started=started, code=run_metrics.code_version())
        trainer.restore()  # refuses another config's checkpoint; a resumed run's `provenance` gains this process
        if is_main():  # the directory is this config's run, and rank 0 holds it: what a killed run left can go
            remove_stale_temporaries(run_dir)
    except ConfigError:
        raise  # the directory may hold another configuration's run: write nothing
    except BaseException as exc:
        refused = cache_not_writable(exc, cfg.paths.cache_dir)
        if refused is not None:  # like a bad setting: a writable cache is what the run needs
            raise refused from None
        if is_main() and _status(run_dir) != "completed":
            _record_end(MetricsFile(run_dir, cfg, meta).write, status=_end_status(exc), error=one_line(exc), primary_metric=primary_metric, finished_at=now())
        raise
    show_terminal_info()
    if trainer.progress.completed and _status(run_dir) == "completed":
        log.info("run already complete; its metrics are in %s (trainer.resume=false starts over)", run_dir / "metrics.json")
        return float(trainer.progress.best_value)

    num_parameters = sum(p.numel() for p in model.parameters())
    log.info("task %s (%s) | model %s: %.2fM parameters | device %s%s", task.name, task.sizes(), cfg.model.name, num_parameters / 1e6, device,
             f" x {distributed.world_size()} processes" if distributed.world_size() > 1 else "")
    metrics = MetricsFile(run_dir, cfg, meta)
    # Every file of the run directory is written by the main process alone, metrics.json first (START_FILES).
    record = metrics.write if is_main() else (lambda **_: None)
    common = {
        "primary_metric": primary_metric,
        "num_parameters": num_parameters,
        "device": str(device),
        "world_size": distributed.world_size(),
        "max_steps": t.max_steps,
        "dataset_sizes": task.sizes(),
        "pretraining": pretraining,
        "provenance": trainer.provenance,
    }
    record(**common)
    # Which backend runs depends on the lengths the layers meet: it is recorded as they run, logged the
    # first time, and written with the run's end.
    backends = attention_backends(model)
    if is_main():
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    try:
        trainer.fit()
    except BaseException as exc:
        p = trainer.progress
        wall, cpu = trainer.run_time()
        _record_end(record, status=_end_status(exc), error=one_line(exc), step=p.step, wall_time_s=wall, cpu_time_s=cpu, finished_at=now(),
                    **backends.fields())
        raise
    p = trainer.progress
    with stop.deferred():  # trained and tested: a signal now is too late to stop anything, so finish recording
        _record_completed(record, run_dir, task, trainer, device, backends.fields())
    return float(p.best_value) if p.best_value is not None else float("nan")


def _record_completed(record: Any, run_dir: Path, task: Any, trainer: Trainer, device: torch.device, backends: dict[str, Any]) -> None:
    t, p = trainer.tcfg, trainer.progress
    wall, cpu = trainer.run_time()
    final = p.final_metrics
    figures = _figures(run_dir, p.analysis) if is_main() else []
    record(
        status="completed",
        analysis=p.analysis or None,
        figures=figures,
        metrics=final,
        task_info=task.describe() or None,
        test_examples=p.test_examples or None,
        selection={"metric": t.monitor, "mode": t.monitor_mode, "best_value": p.best_value, "best_step": p.best_step},
        step=p.step,
        stopped_early=p.stopped_early,
        tokens_seen=p.tokens_seen,
        train_time_s=p.train_time_s,
        data_wait_fraction=p.data_time_s / p.train_time_s if p.train_time_s > 0 else None,
        tokens_per_second=p.tokens_seen / p.train_time_s if p.train_time_s > 0 else None,
        wall_time_s=wall,
        cpu_time_s=cpu,
        peak_memory_mb=peak_memory_mb(device),
        finished_at=now(),
        **backends,
    )


def _end_status(exc: BaseException) -> str:
    if isinstance(exc, Preempted):
        return "preempted"
    return "diverged" if isinstance(exc, Diverged) else "failed"


def _record_end(record: Any, **values: Any) -> None:
    """Record how a run ended, if the disk lets us: a full disk must not turn the run's own one-line
    error into a second traceback."""
    try:
        record(**values)
    except OSError as exc:
        log.warning("could not record the run's end in metrics.json: %s", one_line(exc))
