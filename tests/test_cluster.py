"""SLURM and submitit (sparse_runner/cluster.py, conf/hydra/launcher/): torchrun's variables from a SLURM
step, the requeue decision after a stop signal, the sbatch script of the SLURM preset, and real jobs run
through submitit's local executor (a sweep; a job preempted, requeued and resumed)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sparse_runner import cluster
from sparse_runner.config import CONF_DIR
from tests.conftest import TINY

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher at all: no torchrun, SLURM or submitit variables (monkeypatch restores them, and removes
    what export_distributed_env adds)."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SUBMITIT_")) or key in TORCHRUN_VARS:
            monkeypatch.delenv(key)
    for key in TORCHRUN_VARS:  # set, then deleted: monkeypatch then also removes what export adds
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)  # no scontrol: our node-list parser
    return monkeypatch


def srun_step(monkeypatch, **extra: str) -> None:
    """The environment srun gives task 5 of an 8-task step on two nodes (4 tasks, one per GPU, on each)."""
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]", **extra,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def exported() -> dict[str, str | None]:
    return {key: os.environ.get(key) for key in TORCHRUN_VARS}


# --------------------------------------------------------------------------------- torchrun's variables
def test_node_lists_expand_like_scontrol_show_hostnames():
    assert cluster.expand_nodelist("gpu[01-03,7],cpu5") == ["gpu01", "gpu02", "gpu03", "gpu7", "cpu5"]
    assert cluster.expand_nodelist("node1") == ["node1"]
    assert cluster.expand_nodelist("rack[1-2]-n[08-09]") == ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]


def test_a_task_of_an_srun_step_gets_torchruns_variables(clean_env):
    srun_step(clean_env)
    cluster.export_distributed_env()
    port = cluster.master_port("4242")
    assert exported() == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "gpu07", "MASTER_PORT": str(port),
    }
    assert 20000 <= port <= 60000 and port != cluster.master_port("4243")


def test_an_array_task_derives_its_port_from_its_own_id(clean_env):
    srun_step(clean_env, SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="2")
    cluster.export_distributed_env()
    assert os.environ["MASTER_PORT"] == str(cluster.master_port("4240_2"))


def test_what_is_set_already_is_kept(clean_env):
    srun_step(clean_env, MASTER_ADDR="login3", MASTER_PORT="29500")  # the sbatch script exported them
    cluster.export_distributed_env()
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], os.environ["RANK"]) == ("login3", "29500", "5")


@pytest.mark.parametrize(
    "case",
    ["torchrun", "batch script", "one task", "no slurm"],
)
def test_no_op_outside_a_multi_task_step(clean_env, case):
    if case == "torchrun":  # srun torchrun ...: torchrun has said who is who
        srun_step(clean_env)
        clean_env.setenv("RANK", "3")
        clean_env.setenv("WORLD_SIZE", "16")
    elif case == "batch script":  # sbatch --ntasks=8 without srun: one process that sees the allocation's counts
        clean_env.setenv("SLURM_JOB_ID", "1")
        clean_env.setenv("SLURM_NTASKS", "8")
        clean_env.setenv("SLURM_PROCID", "0")
    elif case == "one task":
        srun_step(clean_env, SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1", SLURM_PROCID="0")
    before = exported()
    cluster.export_distributed_env()
    assert exported() == before


def test_submitits_helper_and_the_plain_path_agree(clean_env):
    pytest.importorskip("submitit")
    srun_step(clean_env)
    cluster.export_distributed_env()  # plain SLURM
    plain = exported()
    for key in TORCHRUN_VARS:
        clean_env.delenv(key)
    clean_env.setenv("SUBMITIT_EXECUTOR", "slurm")  # the same task started by submitit's sbatch script
    cluster.export_distributed_env()
    assert exported() == plain


# ------------------------------------------------------------------------------------------ requeueing
class Job:
    """Stands for Hydra's submitit launcher: a callable whose `checkpoint` resubmits the same call."""

    def __call__(self, overrides: list[str]) -> str:
        return "done"

    def checkpoint(self, overrides: list[str]):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, overrides)


@pytest.fixture
def submitit_job(clean_env, tmp_path):
    """Factory: this process as rank 0 of a submitit SLURM job, with submitit's own signal handler installed
    (as submitit's job runner installs it) and `scontrol requeue` replaced by a record of the calls."""
    pytest.importorskip("submitit")
    from submitit import JobEnvironment
    from submitit.core.job_environment import SignalHandler
    from submitit.helpers import DelayedSubmission
    from submitit.slurm.slurm import SlurmJobEnvironment

    requeued: list[int] = []
    clean_env.setattr(SlurmJobEnvironment, "_requeue", lambda self, countdown: requeued.append(countdown))
    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_FOLDER": str(tmp_path), "SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}.items():
        clean_env.setenv(key, value)
    installed = []

    def make(*, requeues_left: int, ran_min: float):
        env = JobEnvironment()
        delayed = DelayedSubmission(Job(), ["trainer.lr=0.001"])
        delayed.set_timeout(60, requeues_left)  # timeout_min=60, max_num_timeout
        env.paths.submitted_pickle.parent.mkdir(parents=True, exist_ok=True)
        delayed.dump(env.paths.submitted_pickle)
        handler = SignalHandler(env, env.paths, delayed)
        handler._start_time = time.time() - ran_min * 60  # how long the job has run
        installed.append(signal.signal(JobEnvironment._usr_sig(), handler.checkpoint_and_try_requeue))
        return env.paths.submitted_pickle, requeued

    yield make
    if installed:
        signal.signal(JobEnvironment._usr_sig(), installed[0])


def test_submitit_warns_with_sigusr2():
    """The signal the SLURM preset's docs and `--signal=USR2@120` name is the one this submitit sends."""
    pytest.importorskip("submitit")
    if os.environ.get("SUBMITIT_PREEMPT_SIGNAL"):
        pytest.skip("SUBMITIT_PREEMPT_SIGNAL chooses another signal here")
    from submitit import JobEnvironment

    assert JobEnvironment._usr_sig() == signal.SIGUSR2


def test_outside_submitit_nothing_is_requeued(clean_env):
    assert cluster.requeue_after_preemption(signal.SIGUSR2) is False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_cancel_or_another_signal_is_not_requeued(submitit_job, signum):
    _, requeued = submitit_job(requeues_left=3, ran_min=1)
    assert cluster.requeue_after_preemption(signum) is False
    assert requeued == []


@pytest.mark.parametrize("rank_var", ["SLURM_PROCID", "RANK"])
def test_only_rank_0_requeues(submitit_job, clean_env, rank_var):
    _, requeued = submitit_job(requeues_left=3, ran_min=1)
    clean_env.setenv(rank_var, "1")
    assert cluster.requeue_after_preemption(signal.SIGUSR2) is False
    assert requeued == []


def test_preemption_requeues_the_same_job_without_using_up_a_timeout(submitit_job):
    from submitit.helpers import DelayedSubmission

    pickle, requeued = submitit_job(requeues_left=0, ran_min=1)  # 1 of 60 minutes: preempted, not timed out
    assert cluster.requeue_after_preemption(signal.SIGUSR2) is True
    assert requeued == [0]
    resubmitted = DelayedSubmission.load(pickle)  # what the requeued job will run: the same call
    assert isinstance(resubmitted.function, Job) and resubmitted.args == (["trainer.lr=0.001"],)
    assert resubmitted._timeout_countdown == 0


def test_a_time_limit_uses_up_one_requeue_of_max_num_timeout(submitit_job):
    from submitit.helpers import DelayedSubmission

    pickle, requeued = submitit_job(requeues_left=2, ran_min=58)  # 2 minutes before the limit
    assert cluster.requeue_after_preemption(signal.SIGUSR2) is True
    assert requeued == [1] and DelayedSubmission.load(pickle)._timeout_countdown == 1


def test_no_requeue_left_after_max_num_timeout(submitit_job):
    _, requeued = submitit_job(requeues_left=0, ran_min=58)
    assert cluster.requeue_after_preemption(signal.SIGUSR2) is False
    assert requeued == []


def test_without_submitits_handler_nothing_is_requeued(submitit_job):
    _, requeued = submitit_job(requeues_left=3, ran_min=1)
    previous = signal.signal(signal.SIGUSR2, signal.SIG_DFL)  # e.g. still the run's own handler
    try:
        assert cluster.requeue_after_preemption(signal.SIGUSR2) is False
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert requeued == []


# ------------------------------------------------------------------------------- the SLURM preset
class Submitted(Exception):
    """Stops the launcher where it would call sbatch."""


def test_slurm_preset_writes_the_sbatch_script_it_documents(tmp_path, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra.utils import instantiate
    from submitit.slurm.slurm import SlurmExecutor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # as if srun were installed

    def capture(executor, submissions):
        raise Submitted(executor._make_submission_file_text("python -m submitit.core._submit FOLDER", "uid"), executor.max_num_timeout)

    monkeypatch.setattr(SlurmExecutor, "_internal_process_submissions", capture)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="sparse_run"):
        overrides = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4", "hydra.launcher.partition=gpu", f"paths.output_dir={tmp_path}"]
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    with pytest.raises(Submitted) as submitted:
        launcher.launch([["model.num_heads=8"]], initial_job_idx=0)
    script, max_num_timeout = submitted.value.args
    for line in [
        "#SBATCH --signal=USR2@120", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4", "#SBATCH --cpus-per-task=8",
        "#SBATCH --partition=gpu", "#SBATCH --time=240", "#SBATCH --mem=64GB", "#SBATCH --requeue", "#SBATCH --nodes=1",
    ]:
        assert line in script.splitlines(), f"{line} not in\n{script}"
    assert max_num_timeout == 20


# ----------------------------------------------------------------------------- jobs through submitit
LONGER = TINY + ["trainer.max_steps=120", "trainer.eval_every=10", "trainer.log_every=10"]


def start_sweep(root: Path, cache_dir: Path) -> subprocess.Popen:
    """`sparse-run -m hydra/launcher=local LONGER`: one job, run by submitit's local executor."""
    env = {**os.environ, "SPARSE_RUNNER_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", "-m", "hydra/launcher=local", *LONGER,
         f"paths.output_dir={root / 'out'}"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def run_dirs(root: Path) -> list[Path]:
    return [p for p in (root / "out" / "multirun").iterdir() if p.is_dir() and not p.name.startswith(".")]


def submitit_logs(root: Path) -> str:
    return "".join(Path(f).read_text() for f in sorted(glob.glob(str(root / "out/multirun/.submitit/*/*_log.*"))))


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, cache_dir) -> Path:
    """The run directory of an uninterrupted job through the local launcher."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    root = tmp_path_factory.mktemp("local_launcher")
    proc = start_sweep(root, cache_dir)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    (run_dir,) = run_dirs(root)
    return run_dir


def test_a_job_runs_under_submitits_local_launcher(local_sweep):
    root = local_sweep.parents[2]
    metrics = json.loads((local_sweep / "metrics.json").read_text())
    assert metrics["status"] == "completed" and "test/accuracy" in metrics["metrics"]
    assert "launcher" not in local_sweep.name  # the same run directory as without the launcher
    assert "Starting with JobEnvironment" in submitit_logs(root)  # it ran in a submitit job, not in this process
    assert list(root.glob("out/multirun/.submitit/*/*_result.pkl"))


def _task_pids(root: Path) -> list[int]:
    """Processes of submitit jobs started for `root` (their command line names the job folder under it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in argv and any(str(root).encode() in arg for arg in argv):
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the job's process through /proc")
def test_warning_signal_checkpoints_requeues_and_resumes_to_the_same_metrics(local_sweep, tmp_path, cache_dir):
    proc = start_sweep(tmp_path, cache_dir)
    deadline = time.time() + 300
    while not list(tmp_path.glob("out/multirun/*/checkpoints/last.pt")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    for pid in _task_pids(tmp_path):
        os.kill(pid, signal.SIGUSR2)  # what SLURM sends signal_delay_s before the time limit
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    (run_dir,) = run_dirs(tmp_path)
    logs = submitit_logs(tmp_path)
    if "SIGUSR2" not in logs:
        pytest.skip("the job finished before the signal arrived")  # a very fast machine
    assert "Requeued job" in logs and "resuming" in logs, logs
    assert json.loads((run_dir / "metrics.json").read_text())["metrics"] == json.loads((local_sweep / "metrics.json").read_text())["metrics"]
