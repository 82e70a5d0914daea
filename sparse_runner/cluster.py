"""SLURM and submitit: what one process of a cluster job needs from the runner.

`export_distributed_env()`: one task of a multi-task SLURM step (`srun sparse-run ...`, or Hydra's submitit
launcher with tasks_per_node > 1) gets the variables torchrun would have given it (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so `training/distributed.py` sees one launcher.

`requeue_after_preemption(signum)`: after a stop signal was handled (checkpoint saved, `Preempted`), a job
that submitit started puts itself back in the queue the way submitit's own signal handler would have,
so that the same command, with the same config, resumes in the same run directory.

`MakeSweepDir`: a Hydra callback of the Optuna preset (conf/hydra/sweeper/optuna_listops.yaml).

Nothing heavy is imported here: submitit (the `slurm` extra) is imported only inside a submitit job, and
Hydra is imported by every sparse-run anyway.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

log = logging.getLogger(__name__)

# The exit status that makes submitit's local executor start a job again (its LOCAL_REQUEUE_RETURN_CODE);
# on SLURM `scontrol requeue` has put the job back in the queue already, whatever the status.
REQUEUED_EXIT_STATUS = 144

# MASTER_PORT is drawn from this range, seeded by the job id, as submitit's TorchDistributedEnvironment does:
# every task of a job gets the same port, and two jobs sharing a node almost never collide.
_PORT_RANGE = (20000, 60000)


# ------------------------------------------------------------------------------------- torch.distributed
def export_distributed_env() -> None:
    """Export torchrun's variables for one task of a multi-task SLURM step or submitit job; a no-op under
    torchrun (RANK or WORLD_SIZE already set), for a single task, and outside a cluster job.

    A MASTER_ADDR or MASTER_PORT that is already set (an sbatch script's `export`) is kept. CUDA_VISIBLE_DEVICES
    is left alone: every task sees the node's GPUs and takes cuda:LOCAL_RANK, as under torchrun.
    """
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    values = _submitit_values() or _slurm_values()
    if values is None:
        return
    for key, value in values.items():
        os.environ.setdefault(key, value)
    log.info("SLURM task %s of %s: exported torchrun's variables (master %s:%s)", os.environ["RANK"], os.environ["WORLD_SIZE"],
             os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])


def _submitit_values() -> dict[str, str] | None:
    """torchrun's variables from submitit's own helper, inside a job that submitit started (SLURM or local)."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):  # submitit's JobEnvironment refuses to work anywhere else
        return None
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        return None
    env = TorchDistributedEnvironment()
    if env.world_size <= 1:
        return None
    return {
        "RANK": str(env.rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_RANK": str(env.local_rank),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
    }


def _slurm_values() -> dict[str, str] | None:
    """torchrun's variables from SLURM's own, for a task that srun started.

    SLURM_STEP_NUM_TASKS is set by srun only: a batch script also sees SLURM_NTASKS and SLURM_PROCID=0, but it
    is a single process, and exporting WORLD_SIZE > 1 there would make it wait for peers that never come.
    """
    ntasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if ntasks <= 1:
        return None
    nnodes = int(os.environ.get("SLURM_STEP_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    return {
        "RANK": os.environ["SLURM_PROCID"],
        "WORLD_SIZE": str(ntasks),
        "LOCAL_RANK": os.environ.get("SLURM_LOCALID", "0"),
        # srun's block distribution with one task per GPU: the same number of tasks on every node
        "LOCAL_WORLD_SIZE": str(ntasks // max(nnodes, 1)),
        # rank 0 runs on the first node of the step
        "MASTER_ADDR": _first_host(nodelist),
        "MASTER_PORT": str(master_port(_slurm_job_id())),
    }


def _slurm_job_id() -> str:
    """The job id as submitit writes it (ARRAYJOB_TASK in a job array), so that both paths derive the same port."""
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID", "0")


def master_port(job_id: str) -> int:
    """A port derived from the job id, the same on every task (submitit's formula: the two paths agree)."""
    return random.Random(job_id).randint(*_PORT_RANGE)


def _first_host(nodelist: str) -> str:
    """The first host name of a SLURM node list: `scontrol show hostnames` where SLURM is installed, else our parser."""
    if not nodelist:
        return "127.0.0.1"
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True)
            if out.stdout.split():
                return out.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass  # the parser below reads the same syntax
    return expand_nodelist(nodelist)[0]


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a SLURM node list: `gpu[01-03,7],cpu5` -> gpu01 gpu02 gpu03 gpu7 cpu5 (zero padding kept,
    several bracket groups in one name expanded left to right)."""
    hosts: list[str] = []
    for name in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):  # commas inside brackets separate ranges, not hosts
        hosts.extend(_expand_name(name))
    return hosts


def _expand_name(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if not match:
        return [name]
    head, tails = name[: match.start()], _expand_name(name[match.end() :])
    expanded = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        numbers = range(int(low), int(high or low) + 1)
        expanded.extend(f"{head}{n:0{len(low)}d}{tail}" for n in numbers for tail in tails)
    return expanded


# ------------------------------------------------------------------------------------------ requeueing
def requeue_after_preemption(signum: int) -> bool:
    """Requeue this submitit job after a stop signal was handled; True when it was requeued.

    Call it after the run's own signal handlers are removed again (once `Preempted` has left the run): it
    needs submitit's handler, which they had replaced. On True the caller exits with REQUEUED_EXIT_STATUS.

    What it does is submitit's `SignalHandler.checkpoint_and_try_requeue`, run by submitit itself: only for
    submitit's warning signal (USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise: SLURM sends it
    `signal_delay_s` before the time limit, or at preemption with PreemptParameters=send_user_signal), only
    on global rank 0, and within max_num_timeout: a signal near the time limit (the job ran for most of
    timeout_min) uses up one requeue, a preemption none. The launcher's `checkpoint` resubmits the same job (same
    overrides, so the same run directory, where the run resumes from its checkpoint).

    False: not a submitit job, SIGTERM / SIGINT (a cancel), another rank, or submitit declined (it says why).
    """
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return False
    try:
        from submitit import JobEnvironment
        from submitit.core.job_environment import SignalHandler
        from submitit.core.utils import UncompletedJobError
    except ImportError:
        return False
    env = JobEnvironment()
    if signum != env._usr_sig():
        return False
    if env.global_rank != 0 or int(os.environ.get("RANK", "0")) != 0:
        return False  # rank 0 requeues the whole job; the other tasks just end
    installed = signal.getsignal(signum)
    handler = getattr(installed, "__self__", None)
    if not isinstance(handler, SignalHandler):
        log.warning("not requeued: submitit's handler for %s is not installed (%r); run the same command again to resume",
                    signal.Signals(signum).name, installed)
        return False
    try:
        handler.checkpoint_and_try_requeue(signum)
    except SystemExit:
        # submitit requeued the job and exits (local executor: with REQUEUED_EXIT_STATUS); the caller does that.
        return True
    except UncompletedJobError as exc:  # e.g. "timed-out too many times": max_num_timeout is used up
        log.warning("not requeued: %s", str(exc).strip())
        return False
    except (OSError, subprocess.SubprocessError) as exc:  # scontrol failed; the checkpoint is there all the same
        log.warning("not requeued: %s; run the same command again to resume", exc)
        return False
    return False


# ------------------------------------------------------------------------------------------ sweeps
class MakeSweepDir(Callback):
    """Creates hydra.sweep.dir when a multirun starts. The Optuna preset keeps its study there (an SQLite
    file), and the Optuna sweeper opens the study before Hydra's launcher would create the directory."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
