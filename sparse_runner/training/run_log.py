"""The per-step log of a run: JSON lines (for scripts) and TensorBoard events (for people).

On resume both are cut back to the checkpoint's step, so a resumed run's log reads as if it had never
stopped.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from sparse_runner.io import atomic_write_text


class RunLog:
    def __init__(self, run_dir: Path, *, resume_step: int | None) -> None:
        self.path = Path(run_dir) / "log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    break  # a line cut by a kill: everything after it is newer than the checkpoint anyway
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self._file = self.path.open("a", encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter  # imported here: it is slow to import

        purge = None if resume_step is None else resume_step + 1
        self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"), purge_step=purge)

    def write(self, step: int, values: dict[str, Any]) -> None:
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()  # `tail -f log.jsonl` follows the run (a line per trainer.log_every steps: cheap)
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._tb.add_scalar(key, value, step)
            elif isinstance(value, list):  # one value per head, e.g. learned alphas
                for i, item in enumerate(value):
                    self._tb.add_scalar(f"{key}/h{i}", item, step)

    def flush(self) -> None:
        self._file.flush()
        self._tb.flush()

    def close(self) -> None:
        self._file.close()
        self._tb.close()


class NullLog:
    """The run log of a process that does not write the run directory (every rank but 0)."""

    def write(self, step: int, values: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressLines:
    """A plain progress line (step, loss, tokens/s, ETA) at most every `every_s` seconds (None: at every
    step-log line), for runs that no one watches through a terminal's progress bar: a SLURM log, nohup."""

    def __init__(self, every_s: float | None, max_steps: int, first_step: int, clock=time.monotonic) -> None:
        self.every_s, self.max_steps, self._clock = every_s, max_steps, clock
        self._step, self._time = first_step, clock()
        self._log = logging.getLogger("sparse_runner.progress")

    def maybe_show(self, step: int, values: dict[str, Any]) -> None:
        now = self._clock()
        if self.every_s and now - self._time < self.every_s and step < self.max_steps:
            return
        seconds_per_step = (now - self._time) / max(step - self._step, 1)
        eta = seconds_per_step * (self.max_steps - step)
        self._step, self._time = step, now
        self._log.info(
            "step %d/%d | loss %.4f | lr %.2e | %.0f tokens/s | ETA %s",
            step, self.max_steps, values["train/loss"], values["train/lr"], values["train/tokens_per_s"], _duration(eta),
        )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
