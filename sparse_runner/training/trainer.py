"""The training, evaluation and analysis loops: plain PyTorch, driven by `cfg.trainer`, resumable to
the exact step. Tasks supply the steps (`tasks/base.py`); the loops, the regulariser, the step log
and the process-group seam (`distributed.py`) are here, once for every task.

What makes resume exact: a checkpoint holds model, optimiser, scheduler, grad scaler, every RNG state,
the data position (epoch, batch index: batch plans are a pure function of seed and epoch), the step,
the best metric and the early-stopping counter; it is written only at step boundaries, after the
evaluation of that step. Evaluation uses no randomness.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from sparse_runner.analysis.collect import alpha_log_values, analyse
from sparse_runner.attention import attention_layers
from sparse_runner.attention.layout import shifted_blocks
from sparse_runner.checks import ConfigError, fail
from sparse_runner import example_scores
from sparse_runner.models.encoder import set_activation_checkpointing
from sparse_runner.run_metrics import LABEL_KEYS, NON_RESULT_KEYS, UNKNOWN_CODE, lower_is_better
from sparse_runner.tasks.base import EvalSums, StepOutput, Task
from sparse_runner import checkpoint as ckpt
from sparse_runner.training import distributed
from sparse_runner.training.regularisers import build_regulariser
from sparse_runner.training.run_log import NullLog, ProgressLines, RunLog
from sparse_runner.training.schedules import build_scheduler
from sparse_runner.training.stopping import Preempted, StopSignals

__all__ = ["Trainer", "Preempted", "Diverged", "fingerprint_difference"]

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1


class Diverged(Exception):
    """The training loss, a validation loss or the monitored metric, or the weights became non-finite.
    Nothing non-finite was saved: the last checkpoint is the last good state."""


@dataclass
class Progress:
    """Everything besides tensors that a resumed run must get back."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_value: float | None = None
    best_step: int | None = None
    bad_evals: int = 0
    tokens_seen: int = 0
    train_time_s: float = 0.0
    data_time_s: float = 0.0  # of train_time_s, the time spent making batches (the step waits for it)
    # The log window since the last step-log line (kept here so a resumed run logs the same lines).
    window_loss: float = 0.0
    window_stats: dict[str, float] = field(default_factory=dict)  # sums of the task's / regulariser's stats
    window_steps: int = 0
    window_tokens: int = 0
    window_time_s: float = 0.0
    window_data_s: float = 0.0
    stopped_early: bool = False
    completed: bool = False
    # Seconds (wall, CPU) the run had taken when this state was saved, its earlier processes included, so that a
    # resumed run's metrics.json counts them (Trainer.run_time). Not the work a killed process did after it.
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    final_metrics: dict[str, float] = field(default_factory=dict)
    last_eval: dict[str, float] = field(default_factory=dict)
    analysis: dict[str, Any] = field(default_factory=dict)
    test_examples: dict[str, Any] = field(default_factory=dict)  # example_scores.describe of test_examples.npz

    def state_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def optimizer_groups(model: torch.nn.Module, lr: float, weight_decay: float, alpha_lr_scale: float = 1.0) -> list[dict[str, Any]]:
    """Parameter groups: weight decay on matrices only (biases, norms, positions, CLS and the learned
    alphas are exempt); the alphas of alpha-entmax get lr x alpha_lr_scale (1 = same as the rest, as
    Correia et al. 2019)."""
    decay, no_decay, alphas = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("alpha_logit"):
            alphas.append(p)
        elif p.dim() >= 2 and "positions" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "lr": lr, "weight_decay": weight_decay}, {"params": no_decay, "lr": lr, "weight_decay": 0.0}]
    if alphas:
        groups.append({"params": alphas, "lr": lr * alpha_lr_scale, "weight_decay": 0.0})
    return groups


# trainer.precision -> the dtype autocast computes in (None: fp32, no autocast).
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


# trainer.compile: false, true (Inductor's default mode) or one of torch.compile's modes.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_step(model: torch.nn.Module, setting: bool | str):
    """What the training step calls: `model` itself (setting false), or a `CompiledStep` that runs it through
    `torch.compile` in the mode trainer.compile names (true: the default mode; reduce-overhead also records CUDA
    graphs, which replay a step's kernels without launching each: for models bound by launches, such as the block
    patterns' small kernels)."""
    if setting is False:
        return model
    return CompiledStep(model, torch.compile(model, mode=None if setting is True else str(setting)))


class CompiledStep:
    """A compiled model whose first call runs eagerly.

    A model does some host-side work once, on its first call: the C++ extension is built or loaded, the device's
    memory size read, a kernel's module imported, the first length's block tables built. Traced by Dynamo, each
    of those splits the graph, and some make it give up on a whole function and run it eagerly for good (measured
    on a CPU run of model=entmax with trainer.compile=true: 9 graph breaks, every one of them such a first-call
    step). Run eagerly once, they are done before the first trace. Attributes are the model's (`model.encode`).
    """

    def __init__(self, model: torch.nn.Module, compiled: torch.nn.Module):
        self.model, self.compiled, self.calls = model, compiled, 0

    def __call__(self, *args, **kwargs):
        module = self.compiled if self.calls else self.model
        self.calls += 1
        return module(*args, **kwargs)

    def __getattr__(self, name: str):
        if name in ("model", "compiled", "calls"):  # not set yet (copy and pickle skip __init__): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)


def warn_graphs_per_block_count(model: torch.nn.Module, longest: int) -> list[str]:
    """Under trainer.compile, one warning per block pattern of `model` that traces a graph per number of blocks
    (BigBird, HST with local: bigbird: their random blocks are drawn for each count; windows are traced for every
    count, `BlockPattern._attend_table`) when the longest training sequence (`longest` tokens) allows more counts
    than Dynamo compiles graphs of one function: batches padded to their longest sequence then run the later
    counts eagerly, and nothing else says so. Returns the warnings."""
    from torch._dynamo import config as dynamo_config

    from sparse_runner.attention.block_patterns import BlockPattern

    limit = dynamo_config.recompile_limit
    patterns = {layer.pattern.name: layer.pattern for layer in attention_layers(model)
                if isinstance(layer.pattern, BlockPattern) and layer.pattern.window_side() is None}
    warnings = []
    for name, pattern in patterns.items():
        counts = math.ceil(longest / pattern.options.block_size)
        if counts > limit:
            warnings.append(
                f"trainer.compile: pattern {name} traces one graph per number of blocks (its random blocks are drawn for "
                f"each count), and training sequences of up to {longest} tokens allow up to {counts} counts of "
                f"{pattern.options.block_size}: Dynamo compiles {limit} graphs, then runs a new count eagerly")
            log.warning(warnings[-1])
    return warnings


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of trainer.precision on `device` (None: fp32, no autocast).

    bf16 autocasts on GPU and on CPU (matmuls in bf16 via oneDNN, AVX-512-BF16 / AMX where the CPU has
    them; no gradient scaler: its exponent range is fp32's). fp32 is the default on CPU too (docs/benchmarks.md,
    "Precision on CPU", measures bf16 against it). fp16 is GPU-only:
    it needs the gradient scaler, which is CUDA's here, and CPUs without AVX-512-FP16 emulate it."""
    dtype = PRECISIONS[precision]
    if dtype == torch.float16 and device.type != "cuda":
        fail("trainer.precision", f"fp16 runs on GPU only, and this run is on {device}", "fp32, bf16")
    return dtype


class Trainer:
    def __init__(
        self, cfg: Any, task: Task, model: torch.nn.Module, run_dir: Path, device: torch.device, *,
        fingerprint: dict[str, Any], fingerprint_defaults: dict[str, Any] | None = None, stop: StopSignals | None = None,
        started: tuple[float, float] | None = None, code: dict[str, Any] | None = None,
    ) -> None:
        """fingerprint: the flattened result-changing config a checkpoint must match to be resumed;
        fingerprint_defaults: every key's default (`identity.default_values()`), which a key that the
        checkpoint lacks is taken to hold (`fingerprint_difference`); started: (time.perf_counter(),
        time.process_time()) when this process began the run (default: now), for `run_time`; code: the code
        this process runs (`run_metrics.code_version()`), which `provenance` records (None: nothing)."""
        self.cfg, self.tcfg = cfg, cfg.trainer
        self.task, self.device = task, device
        self.run_dir = Path(run_dir)
        self.model = model.to(device)
        # Training goes through DDP when there is a process group (it also makes every rank start from rank
        # 0's weights); evaluation, checkpoints and analysis use the plain model.
        self.ddp = None
        if distributed.is_distributed():
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=[device] if device.type == "cuda" else None)
        wrapped = self.ddp or self.model
        self.step_model = compile_step(wrapped, self.tcfg.compile)
        if self.tcfg.compile is not False:
            warn_graphs_per_block_count(self.model, min(task.max_length, int(task.train_lengths().max())))
        self.stop = stop or StopSignals()
        self.fingerprint, self.fingerprint_defaults = fingerprint, fingerprint_defaults or {}
        t = self.tcfg
        groups = optimizer_groups(self.model, t.lr, t.weight_decay, t.alpha_lr_scale)
        self.optimizer = torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), fused=device.type == "cuda")
        self.scheduler = build_scheduler(
            self.optimizer, schedule=t.schedule, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio
        )
        self.autocast_dtype = autocast_dtype(t.precision, device)
        if t.activation_checkpointing and not set_activation_checkpointing(self.model, True):
            log.warning("trainer.activation_checkpointing: model %s has no transformer layers; nothing is checkpointed", type(self.model).__name__)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.autocast_dtype == torch.float16)
        self.checkpoints = ckpt.CheckpointDir(self.run_dir / "checkpoints")
        self.regulariser = build_regulariser(cfg.model.regulariser, cfg.model.regulariser_options)
        self.progress = Progress()
        self._started = started or (time.perf_counter(), time.process_time())
        self._earlier = (0.0, 0.0)   # (wall, CPU) of the run's earlier processes, from the restored checkpoint
        # The code each process of the run ran, in order, with the step it began at (metrics.json's
        # `provenance`). Checkpoints carry it, so that a process resuming on another commit adds to it.
        self.code = code
        self.provenance: list[dict[str, Any]] = [{**code, "from_step": 0}] if code is not None else []
        self.is_main = distributed.is_main()
        self.saved_step: int | None = None  # the step of the newest checkpoint on disk (the last good state)

    # ------------------------------------------------------------------------------ state
    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def run_time(self) -> tuple[float, float]:
        """(wall, CPU) seconds the run has taken: its earlier processes up to the checkpoint this one resumed
        from, and this process since it began the run (CPU: all its threads)."""
        return (self._earlier[0] + time.perf_counter() - self._started[0],
                self._earlier[1] + time.process_time() - self._started[1])

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs. Under DDP a collective (every rank's RNG state is gathered): every rank
        calls it, rank 0 writes it."""
        self.progress.wall_time_s, self.progress.cpu_time_s = self.run_time()
        rng_ranks = distributed.gather_objects(ckpt.rng_state())
        return {
            "format": CHECKPOINT_FORMAT,
            "fingerprint": self.fingerprint,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_ranks[0],  # what a single process resumes from
            "rng_ranks": rng_ranks,
            "progress": self.progress.state_dict(),
            "provenance": self.provenance,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        self._earlier = (self.progress.wall_time_s, self.progress.cpu_time_s)
        # A checkpoint without the record: the code of the processes that wrote it is unknown.
        earlier = state.get("provenance") or [{**UNKNOWN_CODE, "from_step": 0}]
        resumed = [{**self.code, "from_step": self.progress.step}] if self.code is not None else []
        self.provenance = [*earlier, *resumed]
        ranks = state.get("rng_ranks") or [state["rng"]]
        if len(ranks) == distributed.world_size():
            ckpt.set_rng_state(ranks[distributed.rank()])
        else:
            # Another number of processes: the data order is that of the global plan, unchanged, but each
            # rank's random stream (dropout, masking) starts afresh from (seed, rank, step).
            log.warning("resuming on %d process(es) from a checkpoint of %d: random streams are re-seeded", distributed.world_size(), len(ranks))
            ckpt.set_rng_state(ranks[0])
            torch.manual_seed(hash((self.cfg.seed, distributed.rank(), self.progress.step)) % 2**63)

    def _check_finite(self) -> None:
        """Refuse to save a non-finite state (it could only be resumed into the same failure)."""
        finite = torch.stack([torch.isfinite(param).all() for param in self.model.parameters()]).all()
        if not math.isfinite(self.progress.window_loss):
            raise self._diverged(f"the training loss is {self.progress.window_loss}")
        if not bool(finite):
            raise self._diverged("a weight is not finite")

    def _diverged(self, what: str) -> Diverged:
        t, p = self.tcfg, self.progress
        kept = f"the last good checkpoint (step {self.saved_step}) is kept" if self.saved_step is not None else "no checkpoint was saved"
        fix = f"lower trainer.lr (now {t.lr:g})" + (" or set trainer.clip_grad_norm" if t.clip_grad_norm is None else "")
        # A resume is exact: the same command would only diverge again.
        return Diverged(f"training diverged at step {p.step}: {what}; {kept}; the same command would diverge again: {fix}")

    def _check_finite_eval(self, metrics: dict[str, float]) -> None:
        """A validation loss or the monitored metric that is not finite is a divergence too: nothing of
        this step may be saved (best.pt, last.pt), or a resume would start from it."""
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and (name == self.tcfg.monitor or "loss" in name.rsplit("/", 1)[-1]) and not math.isfinite(value):
                raise self._diverged(f"{name} is {value}")

    def _save_last(self) -> None:
        self._check_finite()
        state = self.state_dict()
        if self.is_main:
            self.checkpoints.save_last(state, kept_step=self.saved_step)
        self.saved_step = self.progress.step

    def restore(self) -> dict[str, Any] | None:
        """Load the run directory's newest checkpoint if resuming; returns it (or None)."""
        if not self.tcfg.resume:
            if self.is_main:
                self.checkpoints.clear()
            distributed.barrier()  # no rank may find the checkpoints rank 0 is deleting
            return None
        state = self.checkpoints.load_latest()
        if state is None:
            return None
        self.saved_step = state["progress"]["step"]
        mismatch = fingerprint_difference(state.get("fingerprint", {}), self.fingerprint, self.fingerprint_defaults)
        if mismatch:
            raise ConfigError(
                f"{self.run_dir} holds a checkpoint of a different config ({mismatch}); "
                "add trainer.resume=false to start over, or use another run directory"
            )
        self.load_state_dict(state)
        log.info("resuming %s at step %d", self.run_dir, self.progress.step)
        return state

    # ------------------------------------------------------------------------------ loop
    def _plan(self, epoch: int) -> list:
        t = self.tcfg
        # Global batches: every rank takes its part of each (distributed.split_batch).
        return self.task.plan_epoch(seed=self.cfg.seed, epoch=epoch, batch_size=t.batch_size, bucket_size=t.bucket_size, max_tokens=t.batch_tokens)

    def training_step(self, batch: dict[str, Any]) -> StepOutput:
        """The task's forward pass and loss, plus the regulariser's term. A regulariser that returns the task
        loss of its own pass over the batch (R-Drop's second pass) makes the task loss the mean over the
        passes: loss = mean(task losses) + the regulariser's (weighted) term."""
        out = self.task.forward_loss(self.step_model, batch)
        result = self.regulariser(self.task, self.step_model, batch, out)
        if result is None:
            return out
        out.stats = {**out.stats, **result.stats}
        # The passes share the batch, so each task loss is a mean over the same `loss_count`: their mean
        # keeps the token weighting of `fit` across processes.
        loss = out.loss if result.task_loss is None else (out.loss + result.task_loss) / 2
        out.loss = loss + result.loss
        return out

    def fit(self) -> dict[str, float]:
        """Train to max_steps (or early stop), then test the best checkpoint. Returns final metrics.

        Call `restore()` first to continue from the run directory's checkpoint. Stop signals (see
        `stopping.py`) are acted on at step boundaries while `self.stop` is installed (run.py does that).
        """
        t, p = self.tcfg, self.progress
        if p.completed:
            return p.final_metrics
        run_log = RunLog(self.run_dir, resume_step=p.step if p.step > 0 else None) if self.is_main else NullLog()
        show = self.is_main and {"auto": sys.stderr.isatty(), "true": True, "false": False}[str(t.progress).lower()]
        bar = tqdm(total=t.max_steps, initial=p.step, disable=not show, dynamic_ncols=True, desc=self.task.name, unit="step")
        # Without a bar (a SLURM log, nohup) a plain progress line every trainer.progress_every_s instead.
        lines = ProgressLines(t.progress_every_s, t.max_steps, p.step) if self.is_main and not show else None
        self.model.train()
        plan = self._plan(p.epoch)
        # Loss and stats are summed on the device and read back only when logged or checkpointed: no
        # per-step host sync. A checkpoint carries the sums exactly (a float32 read as a float64), so a
        # resumed run goes on adding to the very same values.
        if not self.is_main:  # a checkpoint's window holds the sums of all ranks (_snapshot_window): rank 0 carries them
            p.window_loss, p.window_stats, p.window_tokens = 0.0, {}, 0
        window_loss = torch.tensor(p.window_loss, dtype=torch.float32, device=self.device)
        window_stats = {name: torch.tensor(v, dtype=torch.float32, device=self.device) for name, v in p.window_stats.items()}
        try:
            with self.stop.deferred():
                while p.step < t.max_steps and not p.stopped_early:
                    started = time.perf_counter()
                    self.optimizer.zero_grad(set_to_none=True)
                    for micro in range(t.accumulate):
                        if p.batch_in_epoch >= len(plan):
                            p.epoch, p.batch_in_epoch = p.epoch + 1, 0
                            plan = self._plan(p.epoch)
                        batch_started = time.perf_counter()
                        indices, counts = distributed.split_batch(plan[p.batch_in_epoch])
                        batch = self.task.make_batch("train", indices, self.device)
                        p.window_data_s += time.perf_counter() - batch_started
                        p.batch_in_epoch += 1
                        # DDP: gradients are averaged across ranks once per step, on the last micro-batch.
                        last = micro == t.accumulate - 1
                        with contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync():
                            with self.autocast():
                                out = self.training_step(batch)
                            count = (len(indices) if out.loss_count is None else out.loss_count) if counts else 0
                            weight = distributed.loss_weight(count)
                            loss = out.loss if weight == 1.0 else out.loss * weight
                            self.scaler.scale(loss / t.accumulate).backward()
                        window_loss += loss.detach().float() / t.accumulate
                        for name, value in out.stats.items():
                            window_stats[name] = window_stats.get(name, 0.0) + torch.as_tensor(value, device=self.device).detach().float() / t.accumulate
                        p.window_tokens += out.tokens if counts else 0
                        del out, loss  # its logits (large for an LM) would otherwise live on through the next forward pass
                    if t.clip_grad_norm is not None:
                        self.scaler.unscale_(self.optimizer)
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_grad_norm)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.scheduler.step()
                    p.step += 1
                    p.window_steps += 1
                    p.window_time_s += time.perf_counter() - started
                    bar.update(1)
                    # The largest signal number any rank received (0: none): all ranks stop at this step.
                    stop_signal = distributed.max_over_ranks(self.stop.received or 0)
                    stop = stop_signal != 0

                    if p.step % t.log_every == 0 or p.step == t.max_steps:
                        values = self._log_window(window_loss, window_stats)  # the only host sync of the step loop
                        run_log.write(p.step, values)
                        bar.set_postfix(loss=f"{values['train/loss']:.3f}", lr=f"{values['train/lr']:.2e}", tok_s=f"{values['train/tokens_per_s']:.0f}")
                        if lines is not None:
                            lines.maybe_show(p.step, values)

                    evaluate = p.step % t.eval_every == 0 or p.step == t.max_steps
                    if evaluate or stop:
                        self._snapshot_window(window_loss, window_stats)  # into the checkpointed state
                    if evaluate:
                        self._evaluate_and_select(run_log)
                        self._save_last()
                        run_log.flush()
                    if stop:
                        self._save_last()
                        run_log.flush()
                        raise Preempted(stop_signal, p.step)
        finally:
            bar.close()
            run_log.close()
        return self._final_test()

    def _log_window(self, window_loss: torch.Tensor, window_stats: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The step-log line of the window since the last one (all ranks' batches), then a new window."""
        p = self.progress
        loss_sum, stat_sums, tokens = self._window_totals(window_loss, window_stats)
        ranks = distributed.world_size()
        loss = loss_sum / ranks / p.window_steps
        if not math.isfinite(loss):
            raise self._diverged(f"the training loss is {loss}")
        p.tokens_seen += tokens
        p.train_time_s += p.window_time_s
        p.data_time_s += p.window_data_s
        values = {
            "train/loss": loss,
            **{f"train/{name}": total / ranks / p.window_steps for name, total in stat_sums.items()},
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/tokens_per_s": tokens / max(p.window_time_s, 1e-9),
            # Batches are made in the training process: this is the share of step time the model waits for data.
            "train/data_wait_fraction": p.window_data_s / max(p.window_time_s, 1e-9),
            "epoch": p.epoch,
            **alpha_log_values(self.model),
        }
        window_loss.zero_()
        window_stats.clear()
        p.window_loss, p.window_stats, p.window_steps, p.window_tokens, p.window_time_s, p.window_data_s = 0.0, {}, 0, 0, 0.0, 0.0
        return values

    def _window_totals(self, window_loss: torch.Tensor, window_stats: dict[str, torch.Tensor]) -> tuple[float, dict[str, float], int]:
        """The window's loss sum, stat sums and tokens, added over ranks (each rank's sums are already
        weighted by its share of the batch)."""
        names = sorted(window_stats)
        totals = distributed.sum_over_ranks([float(window_loss), *(float(window_stats[n]) for n in names), float(self.progress.window_tokens)])
        return totals[0], dict(zip(names, totals[1:-1])), int(totals[-1])

    def _snapshot_window(self, window_loss: torch.Tensor, window_stats: dict[str, torch.Tensor]) -> None:
        """Copy the device-side window sums into Progress (host floats), so a checkpoint carries them.

        With several processes the sums of all ranks are added up into rank 0's window (the others start
        again from zero): what a checkpoint holds is then the whole window, whatever number of processes
        resumes from it."""
        p = self.progress
        p.window_loss, p.window_stats, p.window_tokens = self._window_totals(window_loss, window_stats)
        if distributed.world_size() > 1:
            keep = 1.0 if self.is_main else 0.0
            window_loss.fill_(p.window_loss * keep)
            for name in window_stats:
                window_stats[name].fill_(p.window_stats[name] * keep)
            p.window_tokens = p.window_tokens if self.is_main else 0

    # ------------------------------------------------------------------------------ evaluation
    def _eval_batches(self, split: str, max_batches: int | None = None):
        """(batch) for this rank's share of a split's evaluation plan, model-ready on the device."""
        for indices in distributed.shard(self.task.eval_plan(split)[:max_batches]):
            yield self.task.make_batch(split, indices, self.device)

    @torch.no_grad()
    def evaluate(self, split: str, *, max_batches: int | None = None, output_dir: Path | None = None) -> dict[str, float]:
        """Metrics of the (unwrapped) model on a split: the task's sums over every batch, added up
        across processes, then finalised. Only the main process gets `output_dir`."""
        return self.task.finalise(split, self._eval_sums(split, max_batches), output_dir if self.is_main else None)

    @torch.no_grad()
    def _eval_sums(self, split: str, max_batches: int | None = None) -> EvalSums:
        """The task's evaluation sums over a split, added up across processes."""
        was_training = self.model.training
        self.model.eval()
        sums: EvalSums = {}
        for batch in self._eval_batches(split, max_batches):
            with self.autocast():
                distributed.add_sums(sums, self.task.eval_step(self.model, batch, split))
        self.model.train(was_training)
        return distributed.all_reduce_sums(sums)

    @torch.no_grad()
    def _write_outputs(self) -> None:
        was_training = self.model.training
        self.model.eval()
        with self.autocast():
            self.task.write_outputs(self.model, self.run_dir / "outputs")
        self.model.train(was_training)

    @torch.no_grad()
    def analysis_pass(self, split: str = "val") -> None:
        """One pass over `split` during which the analysis observes every attention layer."""
        was_training = self.model.training
        self.model.eval()
        for indices in self.task.eval_plan(split)[: self.tcfg.analysis_max_batches]:
            with self.autocast():
                self.task.analysis_step(self.model, self.task.make_batch(split, indices, self.device))
        self.model.train(was_training)

    def _evaluate_and_select(self, run_log: RunLog) -> None:
        t, p = self.tcfg, self.progress
        metrics = self.evaluate("val", max_batches=t.eval_max_batches)
        self._check_finite_eval(metrics)
        p.last_eval = metrics
        value = metrics[t.monitor]
        better = p.best_value is None or (value > p.best_value if t.monitor_mode == "max" else value < p.best_value)
        if better:
            p.best_value, p.best_step, p.bad_evals = value, p.step, 0
            self._check_finite()
            if self.is_main:
                self.checkpoints.save_best({"model": self.model.state_dict(), "step": p.step, t.monitor: value}, kept_step=self.saved_step)
        else:
            p.bad_evals += 1
            if t.patience is not None and p.bad_evals >= t.patience:
                p.stopped_early = True
                log.info("early stop at step %d: %s has not improved for %d evaluations", p.step, t.monitor, p.bad_evals)
        run_log.write(p.step, {**metrics, f"best/{t.monitor}": p.best_value})
        shown = " | ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        log.info("step %d/%d | %s | best %s %.4f @ %d", p.step, t.max_steps, shown, t.monitor, p.best_value, p.best_step)

    def _final_test(self) -> dict[str, float]:
        """Test the best checkpoint; record completion in the last checkpoint."""
        p = self.progress
        distributed.barrier()  # best.pt is written by the main process
        best = self.checkpoints.load_best()
        if best is not None:
            current = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.model.load_state_dict(best["model"])
        sums = self._eval_sums("test")
        test = self.task.finalise("test", sums, self.run_dir / "outputs" if self.is_main else None)
        if self.is_main:  # what the test metric is made of, per example: intervals can resample the test set
            scores = self.task.example_scores("test", sums)
            p.test_examples = example_scores.write(scores, self.run_dir) if scores is not None else {}
        if self.tcfg.test_topology_shift:  # robustness: the same test with every block boundary moved
            test.update(self._shifted_test(self.tcfg.test_topology_shift))
        if self.is_main:
            self._write_outputs()
        # A model without attention has nothing to analyse. The analysis observes the attention of the whole
        # split, so it runs on rank 0 alone (the statistics are not sums that ranks could add up).
        if self.tcfg.analysis and attention_layers(self.model) and self.is_main:
            p.analysis = analyse(self.model, self.analysis_pass)
        if best is not None:
            self.model.load_state_dict(current)
        p.final_metrics = {**p.last_eval, **test, f"best/{self.tcfg.monitor}": p.best_value}
        p.completed = True
        self._save_last()
        log.info("test (best checkpoint, step %s) | %s", p.best_step, " | ".join(f"{k} {v:.4f}" for k, v in test.items()))
        return p.final_metrics

    def _shifted_test(self, shifts: int | Sequence[int]) -> dict[str, float]:
        """The test split again with every block boundary moved. One shift: `test_shifted/*`. A list: each
        shift's `test_shifted@<k>/*`, their mean as `test_shifted/*` (what one shift records, so readers of it
        need no change) and the worst shift's as `test_shifted_worst/*`: the lowest value, the highest for a
        loss or perplexity."""
        per_shift = {}
        for shift in [shifts] if isinstance(shifts, int) else list(shifts):
            with shifted_blocks(self.model, shift):
                per_shift[shift] = {name.replace("test/", "", 1): value for name, value in self.evaluate("test").items()}
        if isinstance(shifts, int):
            return {f"test_shifted/{name}": value for name, value in per_shift[shifts].items()}
        out = {f"test_shifted@{shift}/{name}": value for shift, metrics in per_shift.items() for name, value in metrics.items()}
        for name in next(iter(per_shift.values())):
            values = [metrics[name] for metrics in per_shift.values()]
            out[f"test_shifted/{name}"] = sum(values) / len(values)
            out[f"test_shifted_worst/{name}"] = (max if lower_is_better(name) else min)(values)
        return out


def fingerprint_difference(saved: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any] | None = None) -> str:
    """'' if two flattened configs agree, else a short description of the first differences.

    A key that `saved` lacks counts as its schema default (`defaults`): a checkpoint whose schema had no
    such key ran as that default. A result-neutral key (run_metrics.NON_RESULT_KEYS) or a label
    (LABEL_KEYS: a recipe's name) is ignored on both sides."""
    defaults = defaults or {}
    keys = sorted((set(saved) | set(current)) - set(NON_RESULT_KEYS) - set(LABEL_KEYS))
    diffs = [k for k in keys if (saved[k] if k in saved else defaults.get(k)) != current.get(k)]
    if not diffs:
        return ""
    shown = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in diffs[:3])
    return shown + (f" and {len(diffs) - 3} more" if len(diffs) > 3 else "")
