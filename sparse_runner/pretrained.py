"""Fine-tuning from a pre-training run: find its checkpoint and tokenizer, check that its encoder fits, load it.

`model.init_from` names a finished run directory (its `checkpoints/best.pt` is used) or a `.pt` file in
one. The checkpoint is read with `weights_only=True` (it can never run code); only its `encoder.*`
tensors are taken, so the pre-training head is dropped and the fine-tuning task's head starts fresh.
The tokenizer comes with the run (`outputs/tokenizer.model`, written by the masked-LM task), so the
fine-tuning task sees the ids the encoder was trained on.

An encoder that does not fit (another width, depth, head geometry, vocabulary ...) is refused in one
line naming the model keys that differ; a learned position table longer than the fine-tuning task's
length is cut to it (BERT pre-trains 512 positions and fine-tunes on shorter inputs), a shorter one
is refused.

The source run must not be running: its directory lock (`run.directory_lock`, an flock on `.lock`) is
taken shared from `resolve` until `load_encoder` has read the weights, so a re-run of the source that is
under way is refused here (it could be rewriting its checkpoints and tokenizer), and one started
meanwhile is refused as that directory is being read (retry in a moment). The record names the checkpoint
loaded by its step and the sha256 of its bytes, the very bytes the weights come from.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from omegaconf import OmegaConf

from sparse_runner import checkpoint as ckpt
from sparse_runner import run_metrics
from sparse_runner.checks import ConfigError, one_line
from sparse_runner.run_metrics import flatten

log = logging.getLogger(__name__)

KEY = "model.init_from"
VALID = "a finished pre-training run directory (sparse-run task=mlm_sotu ...) or a .pt checkpoint inside one"
# Model keys that shape the encoder's tensors: a pre-trained encoder fits only a model that agrees on them.
ARCHITECTURE_KEYS = ("d_model", "num_layers", "num_heads", "head_size", "qkv_dim", "ffn_dim", "normaliser", "normaliser_options", "positions", "norm_first", "pattern", "pattern_options")
TOKENIZER = Path("outputs") / "tokenizer.model"


@dataclass(frozen=True)
class PretrainedRun:
    """A pre-training run to start from: where its weights and tokenizer are, and what it was."""

    run_dir: Path
    checkpoint: Path
    tokenizer: Path
    config: dict[str, Any]  # the run's config.yaml, flattened ("model.d_model": 128, ...)
    metrics: dict[str, Any]  # its metrics.json ({} if it has none)
    # The run directory's lock, held shared until the weights are read (`release`); None: no lock file.
    lock: IO | None = field(default=None, compare=False, repr=False)

    def release(self) -> None:
        """Let the source run directory be written again (a re-run of it may start)."""
        if self.lock is not None:
            self.lock.close()
            object.__setattr__(self, "lock", None)  # frozen: the record keeps no file handle

    def record(self, step: int | None, sha256: str | None = None) -> dict[str, Any]:
        """What a fine-tuning run's metrics.json says about where it started (`pretraining`): the
        checkpoint loaded, its step and the sha256 of its bytes, what the run took (its own
        wall_time_s, cpu_time_s, device: the fine-tuning run's times do not include them), and the code it ran
        (its git_commit and provenance: the report counts them among the fine-tuning run's commits)."""
        return {
            "run_dir": str(self.run_dir),
            "checkpoint": str(self.checkpoint),
            "step": step,
            "sha256": sha256,
            "task": self.config.get("task.name"),
            "num_parameters": self.metrics.get("num_parameters"),
            "metrics": {k: v for k, v in (self.metrics.get("metrics") or {}).items() if k.startswith("test/")},
            **{key: self.metrics.get(key) for key in ("wall_time_s", "cpu_time_s", "device", "git_commit", "provenance")},
        }


def resolve(init_from: str) -> PretrainedRun:
    """The run `init_from` names; ConfigError (one line) when it is not a usable pre-training run or is
    running now. The run directory stays locked (shared) until `load_encoder` (or `release`)."""
    path = Path(init_from).expanduser()
    if not path.exists():
        raise ConfigError(f"{KEY}: no such file or directory: {path}; valid: {VALID}")
    if path.is_dir():
        run_dir = path
    else:
        if path.suffix != ".pt":
            raise ConfigError(f"{KEY}: {path} is neither a run directory nor a .pt checkpoint; valid: {VALID}")
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    lock = _lock_shared(run_dir)
    try:
        return _resolve(path, run_dir, lock)
    except BaseException:
        if lock is not None:
            lock.close()
        raise


def _lock_shared(run_dir: Path) -> IO | None:
    """`run_dir`'s lock file, flock-ed shared: several fine-tuning runs may read one source together, but
    not while a sparse-run holds it (exclusively, `run.directory_lock`). None: the directory has no lock
    file (every sparse-run makes one: none runs there) or it cannot be read."""
    try:
        handle = open(run_dir / ".lock")  # read-only: nothing is written to the source run
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(
            f"{KEY}: {run_dir} is in use by a running sparse-run (pid {holder}), which may be rewriting its checkpoints "
            "and tokenizer; wait for it to finish, or start from a finished run that nothing is running in"
        ) from None
    return handle


def _resolve(path: Path, run_dir: Path, lock: IO | None) -> PretrainedRun:
    if path.is_dir():
        checkpoint = path / "checkpoints" / "best.pt"
        metrics = _metrics(run_dir)
        status = metrics.get("status")
        if status != "completed":
            raise ConfigError(
                f"{KEY}: {run_dir} is not a finished run (status {status or 'unknown: no metrics.json'}); "
                f"finish it (run its command again) or name one of its checkpoints/*.pt"
            )
        if not checkpoint.is_file():
            raise ConfigError(f"{KEY}: {run_dir} has no checkpoints/best.pt; valid: {VALID}")
    else:
        checkpoint = path
        metrics = _metrics(run_dir)
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{KEY}: {run_dir} has no config.yaml, so its architecture is unknown; valid: {VALID}")
    try:
        config = flatten(OmegaConf.to_container(OmegaConf.load(config_file), resolve=False))
    except Exception as exc:
        raise ConfigError(f"{KEY}: cannot read {config_file}: {one_line(exc)}") from None
    tokenizer = run_dir / TOKENIZER
    if not tokenizer.is_file():
        cached = ((metrics.get("task_info") or {}).get("tokenizer") or {}).get("model")
        if cached and Path(cached).is_file():
            tokenizer = Path(cached)
        else:
            raise ConfigError(
                f"{KEY}: {run_dir} has no {TOKENIZER} (written when a masked-LM run finishes), so the ids its encoder "
                f"learned are unknown; valid: {VALID}"
            )
    return PretrainedRun(run_dir=run_dir, checkpoint=checkpoint, tokenizer=tokenizer, config=config, metrics=metrics, lock=lock)


def _metrics(run_dir: Path) -> dict[str, Any]:
    try:
        return run_metrics.read(run_dir / "metrics.json")
    except (OSError, ValueError):
        return {}


def architecture_difference(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """'model.head_size=64 there, 32 here, ...' for the architecture keys that differ ('' if none)."""
    diffs = []
    for key in ARCHITECTURE_KEYS:
        name = f"model.{key}"
        there = {k[len(name) + 1:]: v for k, v in saved.items() if k.startswith(name + ".")} or saved.get(name)
        here = {k[len(name) + 1:]: v for k, v in current.items() if k.startswith(name + ".")} or current.get(name)
        if there != here and any(k == name or k.startswith(name + ".") for k in saved):
            diffs.append(f"{name}={there!r} there, {here!r} here")
    return "; ".join(diffs)


def load_encoder(model: torch.nn.Module, source: PretrainedRun, current_config: dict[str, Any]) -> dict[str, Any]:
    """Copy the pre-trained `encoder.*` weights into `model.encoder`; return the metrics.json record.

    current_config: this run's flattened config, to name the keys that differ when the encoder does not fit.
    Releases the source run's lock (`PretrainedRun.release`), whatever the outcome.
    """
    try:
        return _load_encoder(model, source, current_config)
    finally:
        source.release()


def _load_encoder(model: torch.nn.Module, source: PretrainedRun, current_config: dict[str, Any]) -> dict[str, Any]:
    if not hasattr(model, "encoder"):
        raise ConfigError(f"{KEY}: the {type(model).__name__} model of this task has no encoder to initialise; valid: a BERT-style task (mlm, squad, mnli)")
    try:
        data = source.checkpoint.read_bytes()  # hashed and loaded from the same bytes
        state = ckpt.load(io.BytesIO(data))
    except Exception as exc:  # a truncated file, a pickle that weights_only refuses ...
        raise ConfigError(f"{KEY}: cannot read {source.checkpoint}: {one_line(exc)}") from None
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise ConfigError(f"{KEY}: {source.checkpoint} holds no model weights; valid: {VALID}")
    encoder = {k[len("encoder."):]: v for k, v in weights.items() if k.startswith("encoder.")}
    target = model.encoder.state_dict()
    positions = encoder.get("positions")
    if positions is not None and "positions" in target and positions.shape[0] > target["positions"].shape[0]:
        encoder["positions"] = positions[: target["positions"].shape[0]]  # fine-tuning uses the first positions only
    problem = _mismatch(encoder, target)
    if problem:
        differs = architecture_difference(source.config, current_config)
        raise ConfigError(
            f"{KEY}: the encoder of {source.run_dir} does not fit this model ({differs or problem}); "
            f"pre-train with the same {', '.join('model.' + k for k in ARCHITECTURE_KEYS[:5])} and positions, or drop {KEY}"
        )
    model.encoder.load_state_dict(encoder, strict=True)
    step = state.get("step") if isinstance(state.get("step"), int) else (state.get("progress") or {}).get("step")
    log.info("model: encoder initialised from %s (step %s)", source.checkpoint, step)
    return source.record(step, hashlib.sha256(data).hexdigest())


def _mismatch(saved: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> str:
    """The first difference between two encoder state dicts, in words ('' if they fit)."""
    missing = [k for k in target if k not in saved]
    if missing:
        return f"it has no {missing[0]}" + (f" and {len(missing) - 1} more tensors" if len(missing) > 1 else "")
    extra = [k for k in saved if k not in target]
    if extra:
        return f"it has {extra[0]}, which this model lacks"
    for k, v in target.items():
        if tuple(saved[k].shape) != tuple(v.shape):
            return f"{k} is {tuple(saved[k].shape)} there, {tuple(v.shape)} here"
    return ""
