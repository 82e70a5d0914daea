"""Keep PyTorch's freed large CPU blocks and reuse them (trainer.cpu_block_cache_mb).

PyTorch's CPU allocator caches nothing, and glibc serves every block above 32 MiB with a fresh mapping that the
kernel page-faults in and zeroes on first touch. Training allocates its largest tensors anew every layer and step:
the explicit attention path's n x n scores, weights, dropout masks and their gradients are 134 MB each at
32 sequences x 4 heads x 512 x 512, and one matrix product into a fresh such tensor took 116 ms against 44 ms into
a reused one (one thread). Raising glibc's mmap threshold (MALLOC_MMAP_THRESHOLD_) helps only partly: PyTorch's
64-byte-aligned allocations need a little more than a freed block of the same size, so its heap fragments and
keeps growing. `install` therefore makes a small caching allocator PyTorch's CPU allocator
(cpu_block_cache.cpp, built on first use like the entmax kernels): blocks of 1 MiB and more go back to a
free list when freed, up to a limit, and the next allocation of about that size takes one.

What it costs: up to the limit of freed memory stays with the process, and torch.profiler's profile_memory does
not see CPU tensors while it is set. Without a C++ compiler the runner logs why and runs without it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import ModuleType

from sparse_runner.cpp_build import failure_reason

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_block_cache.cpp")

_lock = threading.Lock()
_module: ModuleType | None = None
_status: str | None = None  # None: not tried; "installed (limit N MiB)", "off" or "unavailable: <reason>"


def install(limit_mb: int) -> str:
    """Make the cache PyTorch's CPU allocator for the rest of the process, keeping at most `limit_mb` MiB of
    freed blocks (0 releases them all and caches nothing more). Returns the status in words; a failed build is
    logged once and leaves PyTorch's allocator in place."""
    global _status
    if limit_mb < 0:
        raise ValueError(f"cpu block cache: limit_mb must be >= 0, got {limit_mb}")
    module = _load()
    if module is None:
        return status()
    module.install(int(limit_mb) * 2**20)
    _status = f"installed (limit {limit_mb} MiB)"
    return _status


def _load() -> ModuleType | None:
    global _module, _status
    with _lock:
        if _module is not None or (_status or "").startswith("unavailable"):
            return _module
        try:
            from torch.utils.cpp_extension import load

            _module = load(name="sparse_runner_cpu_block_cache", sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=False)
        except Exception as exc:  # no compiler, no ninja, headers missing, ...
            _status = f"unavailable: {failure_reason(exc)}"
            log.warning("sparse_runner: CPU block cache unavailable, PyTorch's allocator stays (%s)", _status)
        return _module


def status() -> str:
    """'installed (limit N MiB)', 'off' (never installed in this process) or 'unavailable: <reason>'."""
    return _status or "off"


def stats() -> dict[str, int] | None:
    """hits, misses, released blocks and cached bytes since the process started; None if never loaded."""
    return None if _module is None else dict(_module.stats())
