"""The optional C++ extensions (the entmax kernels, the CPU block cache) are built on first use with
`torch.utils.cpp_extension.load`; a failed build raises with the whole compiler log. `failure_reason` keeps
the one line of it that a log or a status string can carry."""

from __future__ import annotations

# Words that mark the line of a build log saying what went wrong.
_TELLING = ("error:", "not found", "fatal", "no such file", "undefined reference", "permission denied")


def failure_reason(exc: Exception) -> str:
    """One line out of a (possibly long) build log: the exception's type, the head of its first line and the
    first later line that says what went wrong (its first line alone when none does), at most 240 characters."""
    lines = [" ".join(line.split()) for line in str(exc).splitlines() if line.strip()]
    pick = next((line for line in lines[1:] if any(t in line.lower() for t in _TELLING) and " -isystem " not in line), None)
    head = lines[0].split(":")[0] if lines else ""
    text = f"{head}: {pick}" if pick else (lines[0] if lines else "")
    return f"{type(exc).__name__}: {text[:240]}"
