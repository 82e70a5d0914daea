"""The per-step log of a run: JSON lines (for scripts) and TensorBoard events (for people).

On resume both are cut back to the checkpoint's step, so a resumed run's log reads as if it had never
stopped.
"""

from __future__ import annotations

import json
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
