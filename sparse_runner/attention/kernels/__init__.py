"""Optional C++ kernels, compiled on first use with `torch.utils.cpp_extension.load`.

`load_entmax_cpu()` returns the compiled `entmax_cpu.cpp` module, or None when it cannot be built
(no compiler, no ninja, an unsupported platform); the reason is logged once and kept in
`entmax_cpu_status()`.  The build happens at most once per process (guarded by a lock, so threads
that ask at the same time wait for one build), and is cached across processes in torch's extension
directory (`TORCH_EXTENSIONS_DIR`, default `~/.cache/torch_extensions`).

Instruction set: the float32 kernels are written for AVX-512 and AVX2+FMA.  The variant is chosen from
PyTorch's own CPU detection (`torch.backends.cpu.get_cpu_capability()`) and is part of the extension
name (`sparse_runner_entmax_<isa>`), so a cache shared between machines never hands an AVX-512
build to a CPU without AVX-512 (`-march=native` would).  `SPARSE_RUNNER_ENTMAX_ISA=avx512|avx2|generic`
forces a variant (tests use it to check the portable paths).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

from sparse_runner.cpp_build import failure_reason

log = logging.getLogger(__name__)

ENTMAX_SOURCE = Path(__file__).with_name("entmax_cpu.cpp")
# The fused attention kernel, built into the same extension (it calls entmax_cpu.cpp's row solvers,
# declared in ROWS_HEADER).
ATTENTION_SOURCE = Path(__file__).with_name("entmax_attention_cpu.cpp")
ROWS_HEADER = Path(__file__).with_name("entmax_rows.h")
ISA_ENV = "SPARSE_RUNNER_ENTMAX_ISA"

# Flags per variant.  -fno-math-errno lets sqrt vectorise; -fopenmp makes at::parallel_for parallel
# (it links the libgomp.so.1 that torch already loaded, so there is one OpenMP runtime).
_ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mpopcnt"],
    "avx2": ["-mavx2", "-mfma", "-mpopcnt"],
    "generic": [],
}
_COMMON_FLAGS = ["-O3", "-fno-math-errno", "-fopenmp"]

_lock = threading.Lock()
_module: ModuleType | None = None
_status: str | None = None  # None = not tried yet; "ok (...)" or the failure reason
_build_seconds: float | None = None


def cpu_isa() -> str:
    """Kernel variant for this CPU: 'avx512', 'avx2' or 'generic' (env override first)."""
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    if forced:
        if forced not in _ISA_FLAGS:
            raise ValueError(f"{ISA_ENV}={forced!r}: expected one of {sorted(_ISA_FLAGS)}")
        return forced
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # very old or exotic builds
        return "generic"
    return {"AVX512": "avx512", "AVX2": "avx2"}.get(capability, "generic")


def load_entmax_cpu() -> ModuleType | None:
    """The compiled entmax kernels, building them on the first call; None if they cannot be built."""
    global _module, _status, _build_seconds
    if _status is not None:
        return _module
    with _lock:
        if _status is not None:  # another thread finished the build while we waited
            return _module
        isa = cpu_isa()
        start = time.perf_counter()
        try:
            from torch.utils.cpp_extension import load

            module = load(
                name=f"sparse_runner_entmax_{isa}",
                sources=[str(ENTMAX_SOURCE), str(ATTENTION_SOURCE)],
                extra_cflags=_COMMON_FLAGS + _ISA_FLAGS[isa] + [_header_stamp()],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
            compiled = module.isa()
            _build_seconds = time.perf_counter() - start
            _module = module
            _status = f"ok ({compiled})"
        except Exception as exc:  # compiler missing, headers missing, link error, ...
            reason = failure_reason(exc)
            _status = f"unavailable: {reason}"
            log.warning("sparse_runner: C++ entmax kernels unavailable, using the PyTorch backend (%s)", reason)
        return _module


def _header_stamp() -> str:
    """A define that carries the header's hash: torch rebuilds an extension when its sources or flags
    change, and it does not read the headers they include."""
    digest = hashlib.sha256(ROWS_HEADER.read_bytes()).hexdigest()[:16]
    return f"-DSPARSE_RUNNER_ROWS_HEADER={digest}"


def entmax_cpu_status() -> str:
    """'not built yet', 'ok (<isa>)' or 'unavailable: <reason>'."""
    return _status or "not built yet"


def entmax_cpu_load_seconds() -> float | None:
    """Wall time of the load in this process (compilation or cache hit), None before it."""
    return _build_seconds
