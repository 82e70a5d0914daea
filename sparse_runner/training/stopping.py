"""Stop signals: SIGTERM, SIGINT (Ctrl-C), SIGUSR1 and SIGUSR2 (SLURM's warning before a time limit or a
preemption, `--signal=USR1@120`; submitit's own) all mean "stop now, keep what you have".

`run.py` holds them for a whole run. Inside the training loop a signal is only *noted*: the loop finishes
its step, saves a checkpoint and raises `Preempted` (`deferred`); anywhere else (data preparation, the
final test) there is nothing to save yet or nothing lost by redoing it, so `Preempted` is raised at once.
Either way the run records status `preempted`, and the same command resumes it.

`Preempted` derives from BaseException, like KeyboardInterrupt, so an `except Exception` that tolerates a
damaged file or a plotting problem can never swallow a stop.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class Preempted(BaseException):
    """A stop signal ended the run; `step` is the step of the saved checkpoint (None: stopped outside the
    training loop, where the last checkpoint, if any, is the one to resume from)."""

    def __init__(self, signum: int, step: int | None) -> None:
        where = f"at step {step}; checkpoint saved" if step is not None else "before training or after its last step; nothing lost"
        super().__init__(f"stopped by {signal.Signals(signum).name} {where}")
        self.signum, self.step = signum, step


class StopSignals:
    """The stop signals' handler for one run: `received` is the first signal that arrived (or None)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._deferred = False

    def _handle(self, signum, _frame) -> None:
        if self.received is None:
            self.received = signum
        if not self._deferred:
            raise Preempted(signum, None)

    @contextlib.contextmanager
    def installed(self) -> Iterator["StopSignals"]:
        """Handle the stop signals for the duration of the block (only the main thread can; elsewhere, as in
        a test runner's worker thread, the handlers are left alone)."""
        previous = {}
        with contextlib.suppress(ValueError):
            for sig in STOP_SIGNALS:
                previous[sig] = signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside the block a signal is only noted in `received`; the training loop acts on it at a step boundary.
        A signal that arrived before the block is acted on at its first check."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False


@contextlib.contextmanager
def blocked_in_new_threads() -> Iterator[None]:
    """Threads started inside the block (gloo's workers and its network loop, started by
    `init_process_group`) never receive a stop signal: a process-directed signal goes to any thread that
    does not block it, and one landing on a gloo thread interrupts its network call, after which the rank
    could die of SIGABRT at exit ("terminate called without an active exception") instead of stopping. The
    calling thread's own mask is restored on leaving, so the signals reach the main thread's handlers."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
