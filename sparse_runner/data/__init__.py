"""The data layer: every source a task reads or generates, as plain Python and numpy (no torch).

Modules read files (release formats, local text), load Hugging Face datasets (`hub`), fetch packages
from registries (`fetch`), read the corpora shipped with the package (`corpora`) or generate data
(ListOps, Pathfinder, the offline substitutes), and cache prepared splits (`split_cache`). They import
only `sparse_runner.checks`, `sparse_runner.io`, `sparse_runner.tokenization` and each other; the task
families (tasks/) import them. README.md lists what each module reads or generates.
"""
