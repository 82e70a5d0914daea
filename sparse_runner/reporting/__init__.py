"""Paper reference numbers and table regeneration from run directories (`sparse-report`)."""

from sparse_runner.reporting.report import collect_runs, main

__all__ = ["collect_runs", "main"]
