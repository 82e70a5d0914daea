"""One-line errors: `ConfigError` and the small checks every config section (model, task, trainer) uses.

Every configuration problem becomes a `ConfigError` whose message is ONE line naming the key, what is
wrong and the valid choices; the CLI prints it and exits with status 2. `one_line` turns any other
exception into a line fit for a log or a metrics.json `error` field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable


class ConfigError(ValueError):
    """A configuration problem, described in one line."""


class DataError(ConfigError):
    """Input data the run cannot use (a malformed file, an empty split), described in one line that names
    the file (and line) and what is wrong. Refused like a configuration problem: exit status 2."""


def one_line(exc: BaseException | str) -> str:
    """The first non-empty line of an exception's message (its type name if it has none)."""
    text = str(exc).strip()
    if text:
        return text.splitlines()[0].strip()
    return type(exc).__name__ if isinstance(exc, BaseException) else ""


def fail(key: str, problem: str, valid: str | None = None) -> None:
    raise ConfigError(f"{key}: {problem}" + (f"; valid: {valid}" if valid else ""))


def choice(key: str, value: Any, choices: Iterable) -> None:
    choices = list(choices)
    if value not in choices:
        fail(key, f"unknown value {value!r}", ", ".join(map(str, choices)))


def positive(key: str, value: Any, allow_none: bool = False, allow_zero: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value < 0 or (value == 0 and not allow_zero):
        fail(key, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def in_unit_interval(key: str, value: float, *, closed: bool = False) -> None:
    """value in [0, 1) (or [0, 1] with closed=True)."""
    if not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):
        fail(key, f"must be in [0, 1{']' if closed else ')'}, got {value}")


def existing_dir(key: str, value: str, valid: str) -> Path:
    path = Path(os.path.expanduser(value))
    if not path.is_dir():
        fail(key, f"{value} is not a directory", valid)
    return path
