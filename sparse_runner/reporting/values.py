"""JSON values of metrics.json into numbers, and numbers and config values into table cells."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable


def as_float(value: Any) -> float | None:
    """A number from a JSON value, or None (booleans and non-numeric strings are not numbers)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def as_str(value: Any) -> str | None:
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def fmt_number(value: Any, spec: str) -> str:
    number = as_float(value)
    if number is None:
        return ""
    if not math.isfinite(number):
        return str(number)
    return format(number, spec)


def number_format(spec: str) -> Callable[[Any], str]:
    """fmt_number with its format fixed: how a column writes its numbers, and a mean ± std of them."""
    return lambda value: fmt_number(value, spec)


def pct(value: float | None) -> str:
    """An accuracy in [0, 1] as a percentage with 2 decimals."""
    return "" if value is None else f"{100.0 * value:.2f}"


def score(value: Any) -> str:
    """BLEU or chrF: 2 decimals, so a perfect score's float noise (100.00000000000004) reads 100.00."""
    return fmt_number(value, ".2f")


def fmt_value(value: Any) -> str:
    """A config value as shown in a cell (and compared when deciding whether it varies)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def slug(text: str) -> str:
    """A file-name stem from any text."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "unknown"
