"""sparse-report: regenerate the papers' result tables from run directories, published numbers beside ours.

runs: read run directories (metrics.json via sparse_runner.run_metrics) into RunRecords; presets: which paper
preset a run is (its resolved config against the config a cell's fill command composes; a run is filed by
what it computed, never by its model= label); seeds: runs that differ only in their seed, grouped and shown as
mean ± std (n) in every table; papers: one module per paper behind a registry (tables, figures, published
numbers); runs_table: one table per task of every run; render: tables as markdown, CSV and LaTeX; filled:
which paper tables hold runs and which rows of ours fold; curves: learning curves from log.jsonl; html and
page: report.html; console: messages and the terminal's overview; report: the command line.
"""

from sparse_runner.reporting.report import main
from sparse_runner.reporting.runs import collect_runs

__all__ = ["collect_runs", "main"]
