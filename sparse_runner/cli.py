"""`sparse-run`: the Hydra command line.

Before Hydra starts anything, every job of the command (one, or each point of a `-m` sweep) is
composed and validated, and the directories it needs are checked; a bad group option, key or value
ends in ONE line naming the problem and the valid choices, with exit status 2 and nothing written.
Then Hydra runs the jobs. A run that fails says so in one line (its traceback goes to the run's log
file). In a multirun a job that fails is recorded as failed (metrics.json, its log) and the sweep goes
on; the command exits 1 at the end if any job failed.

Under torchrun (or a multi-task SLURM step) every process runs this same command; rank 0 alone writes
the run directory and Hydra's files.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sparse_runner.checks import ConfigError, one_line
from sparse_runner.config import CONF_DIR, describe_omegaconf_error, group_options, validate
from sparse_runner.identity import register_resolvers
from sparse_runner.run_metrics import NON_RESULT_KEYS

log = logging.getLogger("sparse_runner")

EXIT_CONFIG = 2
# The config groups of conf/ (Hydra's own, hydra/launcher ..., aside). A run takes one option of each: Hydra
# would silently keep the last of two (`model=entmax model=fixed_head` dropped entmax), so a second is refused.
GROUPS = ("model", "normaliser", "pattern", "geometry", "regulariser", "task", "trainer", "experiment", "pretrain", "finetune")
AXES_HINT = "combine attention axes by name instead: normaliser=, pattern=, geometry=, regulariser="


register_resolvers()


class _Failures:
    """Jobs of this process that failed (multirun keeps going; the exit status reports them)."""

    dirs: list[str] = []


def _error(message: str) -> None:
    print(f"sparse-run: error: {message}", file=sys.stderr)


# ------------------------------------------------------------------------------------ pre-flight
def describe_composition_error(exc: BaseException) -> str:
    """One line for an exception raised while Hydra composes a config."""
    msg = str(exc)
    needs = re.search(r"In '([\w/]+)': Could not load '[\w/]+/(submitit_\w+|optuna)'", msg)
    if needs:  # a preset of ours on top of a Hydra plugin that is not installed
        preset, plugin = needs.groups()
        extra = "optuna" if plugin == "optuna" else "slurm"
        group, _, name = preset.rpartition("/")
        return f"{group}={name}: needs the {extra} extra (pip install -e '.[{extra}]' -c constraints.txt)"
    missing = re.search(r"Could not find '([\w/]+)/([^']+)'", msg)
    if missing:
        group, option = missing.groups()
        if group in GROUPS:
            options = group_options(group)
        else:  # Hydra's own groups (hydra/launcher ...): the options it listed
            listed = re.search(r"Available options in '[^']+':\n((?:\t\S+\n?)*)", msg)
            options = listed.group(1).split() if listed else []
        hint = " (SLURM: pip install -e '.[slurm]')" if "submitit" in option else ""
        return f"{group}={option}: no such {group} option; valid: {', '.join(options) or '(none)'}{hint}"
    cause = exc.__cause__
    if isinstance(cause, OmegaConfBaseException):
        return describe_omegaconf_error(cause)
    override = re.match(r"Could not override '([^']+)'", msg)
    if override:
        return f"{override.group(1)}: {msg.splitlines()[-1].strip()}"
    lines = [line.strip() for line in msg.splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(exc).__name__


def _parse_overrides(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except Exception as exc:
            key, _, value = text.partition("=")
            if any(c in value for c in "=,") and value[:1] not in "'\"":  # e.g. a run directory's name as a value
                raise ConfigError(f"cannot parse override {text!r}: a value holding '=' or ',' must be quoted: {key}='{value}'") from None
            raise ConfigError(f"cannot parse override {text!r}: {one_line(exc)} (see Hydra's override grammar)") from None
    return parsed


def job_override_lists(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override list of every job the command would launch (sweeps expanded, as Hydra's basic
    sweeper does: the cartesian product of the swept values, a later override of a key replacing an
    earlier one)."""
    parsed = _parse_overrides(overrides)
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if sweeps and not multirun:
        raise ConfigError(f"{sweeps[0].input_line!r} is a sweep; add -m (--multirun) to run one job per value")
    choices: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if key in GROUPS and key in choices:
            given = ", ".join(c.split("=", 1)[1] for c in choices[key])
            hint = f"; {AXES_HINT}" if key == "model" else ""
            raise ConfigError(f"{key}= is given twice ({given}, {o.get_value_element_as_str()}): a run takes one {key} option{hint}")
        if not o.is_sweep_override():
            choices[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        elif o.is_interval_sweep():
            # An optimising sweeper's range (Optuna ...): its lower bound stands for it, so a mistyped key or a
            # value out of bounds is refused now, not once per trial.
            choices[key] = [f"{key}={o.value().start}"]
    return [list(job) for job in itertools.product(*choices.values())]


def _config_sweeps(overrides: list[str], compose: Any) -> list[str]:
    """The sweeps a config adds to a multirun (`hydra.sweeper.params`, e.g. an experiment sweeping its
    fine-tuning tasks), as overrides, for the keys the command line does not sweep itself."""
    fixed = [o.input_line for o in _parse_overrides(overrides) if not o.is_sweep_override()]
    try:
        params = compose(config_name="config", overrides=fixed, return_hydra_config=True).hydra.sweeper.get("params") or {}
    except Exception:  # the checks below name the problem
        return []
    given = {o.get_key_element() for o in _parse_overrides(overrides)}
    return [f"{key}={value}" for key, value in params.items() if key not in given]


def preflight(overrides: list[str], multirun: bool, *, check_resources: bool = True) -> None:
    """Compose and validate every job; raise ConfigError (one line) on the first bad one.

    check_resources: also check what the jobs need of this machine (a CUDA device, writable directories);
    off for `--cfg`, which only prints a config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sparse_run"):
            try:
                jobs = job_override_lists(overrides + (_config_sweeps(overrides, compose) if multirun else []), multirun)
            except ConfigError:
                raise
            except Exception as exc:  # Hydra's override grammar errors
                raise ConfigError(describe_composition_error(exc)) from None
            for job in jobs:
                try:
                    cfg = compose(config_name="config", overrides=job, return_hydra_config=True)
                except Exception as exc:
                    raise ConfigError(describe_composition_error(exc)) from None
                typed = validate(cfg)
                if check_resources:
                    check_job_resources(typed, cfg.hydra, job)
                    if not multirun:
                        check_run_dir(cfg)
            if multirun:
                # Hydra first composes a multirun's base config from the defaults and the fixed overrides
                # alone (a swept group at its default); an override that only exists under some swept
                # choice fails there, after every job above composed fine.
                fixed = [o.input_line for o in _parse_overrides(overrides) if not o.is_sweep_override()]
                try:
                    compose(config_name="config", overrides=fixed)
                except Exception as exc:
                    key = describe_composition_error(exc).split(":")[0]
                    raise ConfigError(
                        f"{key}: a multirun first composes its config without the swept values, where this key does not "
                        f"exist; write it as ++{key}=VALUE (adds the key or overrides it)"
                    ) from None
    finally:
        GlobalHydra.instance().clear()


def _local_launcher(hydra_cfg: Any) -> bool:
    """True when the jobs run on this machine (Hydra's basic launcher), not on cluster nodes (submitit)."""
    target = str(OmegaConf.select(hydra_cfg, "launcher._target_", default="") or "")
    return target == "" or target.endswith("BasicLauncher")


def check_job_resources(cfg: DictConfig, hydra_cfg: Any, job: list[str]) -> None:
    """Refuse, before Hydra writes anything, a job this machine cannot run: a CUDA device it lacks, or a
    directory it cannot write (the outputs, an explicit hydra.run.dir / hydra.sweep.dir).

    The cache is refused only when it cannot be a directory at all (a file): a read-only one (a shared,
    populated cache mounted read-only) serves every run that finds its data and tokenizer there, and a run
    that has to add to it stops at that write, naming the file (run.py, `CacheNotWritable`)."""
    sweeper = str(OmegaConf.select(hydra_cfg, "sweeper._target_", default="") or "")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and sweeper and not sweeper.endswith("BasicSweeper"):
        # Every rank would run its own search and train with its own suggestions inside one process group.
        raise ConfigError(f"hydra/sweeper: {sweeper.rsplit('.', 1)[-1]} cannot run under torchrun (each process would search on its own); run the search on one process per job, or with hydra/launcher=slurm")
    if _local_launcher(hydra_cfg) and cfg.trainer.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"trainer.device: {cfg.trainer.device!r} requested but CUDA is not available on this machine; valid: auto, cpu")
    if not _local_launcher(hydra_cfg):
        return  # the cluster's file systems are not this machine's
    explicit = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in job if "=" in o}
    places = [("paths.cache_dir", cfg.paths.cache_dir), ("paths.output_dir", cfg.paths.output_dir)]
    places += [(key, explicit[key]) for key in ("hydra.run.dir", "hydra.sweep.dir") if key in explicit and "$" not in explicit[key]]
    for key, value in places:
        problem = unusable_directory(Path(os.path.expanduser(value)), writable=key != "paths.cache_dir")
        if problem:
            hint = "; set SPARSE_RUNNER_CACHE or paths.cache_dir to a directory" if key == "paths.cache_dir" else ""
            raise ConfigError(f"{key}: {value} {problem}{hint}")


def hydra_run_dir(cfg: DictConfig) -> Path | None:
    """The directory Hydra will run a single job of `cfg` (composed with its hydra node) in: hydra.run.dir
    resolved as Hydra resolves it (hydra.core.utils.run_job); None if it does not resolve (Hydra then says why)."""
    instance = HydraConfig.instance()
    saved = instance.cfg
    try:
        instance.set_config(cfg)
        return Path(str(OmegaConf.select(cfg, "hydra.run.dir")))
    except Exception:
        return None
    finally:
        instance.cfg = saved


def check_run_dir(cfg: DictConfig) -> None:
    """Refuse, before Hydra writes its files there, a run directory that is a folder of the user's, not a
    run directory of sparse-run (run.check_run_directory: ForeignDirectory)."""
    run_dir = hydra_run_dir(cfg)
    if run_dir is not None:
        from sparse_runner.run import check_run_directory

        check_run_directory(run_dir)


def unusable_directory(path: Path, *, writable: bool = True) -> str | None:
    """Why `path` cannot be a directory this process writes (None if it can): it is a file, it lies under a
    file, or the nearest existing directory is not writable (permissions, a read-only file system).
    writable=False: only whether it can be a directory (read-only is fine)."""
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        return "is a file, not a directory" if existing == path else f"lies under {existing}, which is a file"
    if not writable:
        return None
    try:  # a real write, not os.access: that says yes to root on a read-only file system's mount options
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return f"is not writable ({reason})" if existing == path else f"cannot be created: {existing} is not writable ({reason})"
    return None


def excluded_sweeps(overrides: list[str]) -> list[str]:
    """Keys a multirun sweeps that run-directory names leave out (NON_RESULT_KEYS: trainer.device ...).
    Such jobs would share one directory; the command line then names them after those keys too."""
    swept = {o.get_key_element() for o in _parse_overrides(overrides) if o.is_sweep_override()}
    return sorted(swept & set(NON_RESULT_KEYS))


def _hydra_args(argv: list[str]) -> Any:
    # Hydra has no public API for its command-line parser; reading the flags with the very parser
    # hydra.main uses keeps -m, --cfg, --help ... meaning exactly what they mean there. This private
    # import is why pyproject.toml pins hydra-core below 1.4 (tested: 1.3.x).
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(argv)


def _rank_from_env() -> int:
    return int(os.environ.get("RANK", "0"))


def run_main() -> None:
    """Console entry point of `sparse-run`."""
    from sparse_runner.cluster import export_distributed_env

    export_distributed_env()  # a multi-task SLURM step: RANK, WORLD_SIZE ... as torchrun would set them
    args = _hydra_args(sys.argv[1:])  # Hydra's own parser: --help, -m, --cfg ... mean what they mean there
    informational = any(
        getattr(args, name, None) for name in ("help", "hydra_help", "version", "cfg", "shell_completion", "info", "experimental_rerun")
    )
    custom_config = any(getattr(args, name, None) for name in ("config_path", "config_name", "config_dir"))
    if (not informational or args.cfg) and not custom_config:
        try:
            preflight(list(args.overrides), bool(args.multirun), check_resources=not informational)
        except ConfigError as exc:
            _error(str(exc))
            sys.exit(EXIT_CONFIG)
    extra = []
    if args.multirun and not informational:
        shared = excluded_sweeps(list(args.overrides))
        if shared:  # name the jobs after the swept keys too, so that each has its own directory
            kept = [key for key in (*NON_RESULT_KEYS, "hydra.launcher", "hydra/launcher") if key not in shared]
            extra.append(f"hydra.job.config.override_dirname.exclude_keys=[{','.join(kept)}]")
    if _rank_from_env() > 0:  # one writer of Hydra's files and the log: rank 0
        extra += ["hydra.output_subdir=null", "hydra/job_logging=stdout", "hydra.job_logging.root.level=WARNING"]
    sys.argv += extra
    _hydra_main()
    if _Failures.dirs:
        _error(f"{len(_Failures.dirs)} job(s) failed: " + ", ".join(_Failures.dirs))
        sys.exit(1)


# -------------------------------------------------------------------------------------- the job
@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


def run_job(cfg: DictConfig) -> float | None:
    """Hydra's task function: validate, run, and turn failures into recorded, one-line outcomes."""
    from sparse_runner.cluster import REQUEUED_EXIT_STATUS, export_distributed_env, requeue_after_preemption
    from sparse_runner.run import DirectoryInUse, run
    from sparse_runner.training.distributed import is_main, launched, teardown
    from sparse_runner.training.stopping import Preempted
    from sparse_runner.training.trainer import Diverged

    export_distributed_env()  # a submitit job runs this function, not run_main
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    # Under a launcher the ranks must stay in step: a job that fails ends the process (torchrun then ends
    # every rank), where a sweep on one process records it and goes on.
    goes_on = hc.mode == RunMode.MULTIRUN and not launched()
    meta = {"experiment": hc.runtime.choices.get("experiment"), "overrides": list(hc.overrides.task)}
    typed = None
    status = None  # the process's exit status, when the job ends it; set inside the handlers, used after
    try:
        typed = validate(cfg)
        return run(typed, run_dir, meta)
    except Preempted as exc:
        log.warning("%s; run the same command again to resume", exc)
        if requeue_after_preemption(exc.signum):
            log.warning("requeued: the job resumes in %s", run_dir)
            status = REQUEUED_EXIT_STATUS  # submitit's local executor restarts the job on it
        else:
            status = 128 + signal.SIGINT if exc.signum == signal.SIGINT else 0
    except ConfigError as exc:
        if not goes_on:
            _error(str(exc))
            if not isinstance(exc, DirectoryInUse) and is_main():
                _forget_refused_run(run_dir)
            status = EXIT_CONFIG
        else:
            log.error("%s: %s", run_dir, exc)
            if not isinstance(exc, DirectoryInUse) and is_main():
                _record_refused_job(typed, run_dir, meta, exc)
            _Failures.dirs.append(str(run_dir))
            return None
    except Exception as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        expected = isinstance(exc, (Diverged, OSError))  # a diverged run, a full disk: no traceback needed
        if not expected:
            _traceback_to_log_file(exc)
        _Failures.dirs.append(str(run_dir))
        if not goes_on:  # the console gets the error line below, once; the log file gets it too
            _log_to_file_only(logging.ERROR, f"run failed in {run_dir}: {one_line(exc)}")
            where = "" if expected else f" (traceback in {run_dir / 'sparse_run.log'})"
            _error(f"run failed: {one_line(exc)}{where}")
            status = 1
        else:
            log.error("run failed in %s: %s", run_dir, one_line(exc))
            return None
    # Exit here, not inside a handler: there the exception's traceback would still hold the trainer (and
    # DDP's process group) alive through the SystemExit, and teardown could not free it before gloo's
    # threads are destroyed at interpreter exit (a rank stopped by SIGTERM then died of SIGABRT).
    teardown()
    sys.exit(status)


def _file_handlers() -> list[logging.FileHandler]:
    return [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]


def _log_to_file_only(level: int, message: str) -> None:
    """Log `message` to the run's log file alone (the console gets its own line)."""
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in _file_handlers():
        handler.handle(record)


def _traceback_to_log_file(exc: BaseException) -> None:
    """The traceback of a failed run, for the run's log file only: the console gets one line."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    for handler in _file_handlers():
        handler.stream.write(text + "\n")
        handler.flush()


def _only_hydra_files(run_dir: Path) -> bool:
    """Whether `run_dir` holds nothing but what Hydra and the run's lock put there before the run started."""
    from sparse_runner.run import HYDRA_FILES

    return {p.name for p in run_dir.iterdir()} <= HYDRA_FILES | {".lock"}


def _forget_refused_run(run_dir: Path) -> None:
    """A run refused at start leaves no directory behind unless the directory holds more than Hydra's own
    files (another run's results, a folder of the user's: those stay untouched)."""
    try:
        if run_dir.is_dir() and _only_hydra_files(run_dir):
            shutil.rmtree(run_dir)
    except OSError:
        pass


def _record_refused_job(cfg: DictConfig | None, run_dir: Path, meta: dict[str, Any], exc: BaseException) -> None:
    """In a multirun, a job refused at start gets a metrics.json with status `failed`, so that the report
    lists it; unless its directory holds another run's files, which stay untouched."""
    from sparse_runner.run_metrics import MetricsFile, now

    if cfg is None or not run_dir.is_dir() or not _only_hydra_files(run_dir):
        return
    try:
        MetricsFile(run_dir, cfg, meta).write(status="failed", error=one_line(exc), finished_at=now())
    except Exception as write_error:  # noqa: BLE001 - recording a failure must not raise a second one
        log.warning("could not record the failure in %s: %s", run_dir, one_line(write_error))


if __name__ == "__main__":
    run_main()
