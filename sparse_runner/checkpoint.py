"""Checkpoints: atomic writes, safe loading, and a fallback when the newest file is damaged.

`last.pt` is rotated to `last.prev.pt` before a new one is written, so a damaged `last.pt` (a disk
problem, a file truncated by hand) costs one checkpoint interval, not the run. Files are loaded with
`weights_only=True`: a checkpoint can never execute code.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from sparse_runner.checks import ConfigError, one_line
from sparse_runner.io import atomic_open

log = logging.getLogger(__name__)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, most often); the checkpoints written before are intact."""


# Below this much free space a failed write is put down to a full disk: torch.save reports ENOSPC as a
# RuntimeError ("enforce fail at inline_container.cc ... file write failed") without an errno.
_NEARLY_FULL_BYTES = 64 * 2**20


def kept(step: int | None) -> str:
    """What a run that could not write a checkpoint still has, and what the same command then does."""
    if step is None:
        return "nothing is kept yet (this run had written no checkpoint before), so free space and run the same command again to start it over"
    return f"the previous checkpoint (step {step}) is kept, so free space and run the same command again to resume from it"


def save(path: Path, state: dict[str, Any], kept_step: int | None = None) -> None:
    """Write `state` to `path` atomically. kept_step: the step of the run's newest checkpoint already on
    disk (None: none), which a failed write names as what is kept."""
    try:
        with atomic_open(path, "wb") as handle:
            torch.save(state, handle)
    except (OSError, RuntimeError) as exc:
        try:
            full = getattr(exc, "errno", None) == errno.ENOSPC or shutil.disk_usage(path.parent).free < _NEARLY_FULL_BYTES
        except OSError:
            full = False
        reason = "no space left on device" if full else one_line(exc)
        raise CheckpointWriteError(
            f"cannot write checkpoint {path}: {reason}; {kept(kept_step)}"
        ) from None


def load(path: Path | IO[bytes]) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


class CheckpointDir:
    """`last.pt` (+ `last.prev.pt`) for resuming and `best.pt` for the selected model."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.last, self.prev, self.best = (self.dir / n for n in ("last.pt", "last.prev.pt", "best.pt"))

    def save_last(self, state: dict[str, Any], kept_step: int | None = None) -> None:
        """kept_step: the step of the newest checkpoint on disk (None: none), named if this write fails
        (it stays readable: as last.prev.pt, which a resume falls back to)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.last.exists():
            os.replace(self.last, self.prev)
        save(self.last, state, kept_step)

    def save_best(self, state: dict[str, Any], kept_step: int | None = None) -> None:
        save(self.best, state, kept_step)

    def load_latest(self) -> dict[str, Any] | None:
        """The newest readable resume state, or None if there is no checkpoint at all.

        Raises ConfigError (one line) when there are checkpoints but none is readable: starting again from
        step 0 without a word would silently discard the run's training."""
        unreadable = []
        for path in (self.last, self.prev):
            if not path.exists():
                continue
            try:
                return load(path)
            except Exception as exc:  # any unreadable file: report in one line and fall back
                log.warning("checkpoint %s is unreadable (%s); trying the previous one", path, _first_line(exc))
                unreadable.append(path.name)
        if unreadable:
            raise ConfigError(
                f"{self.dir}: no checkpoint to resume from is readable ({', '.join(unreadable)}); "
                "add trainer.resume=false to start over (it deletes them)"
            )
        return None

    def load_best(self) -> dict[str, Any] | None:
        if not self.best.exists():
            return None
        try:
            return load(self.best)
        except Exception as exc:
            log.warning("best checkpoint %s is unreadable (%s); testing the last model instead", self.best, _first_line(exc))
            return None

    def clear(self) -> None:
        for path in (self.last, self.prev, self.best):
            path.unlink(missing_ok=True)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"


# ---------------------------------------------------------------------------- random-number state
def rng_state() -> dict[str, Any]:
    """Python, numpy and torch generator states in a form `weights_only` loading accepts."""
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        # This process's GPU only (under DDP, cuda:LOCAL_RANK): a resume may see fewer GPUs.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # a state per visible GPU: take this process's
            cuda = cuda[torch.cuda.current_device()] if torch.cuda.current_device() < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)
