"""JSON values of metrics.json into numbers, and numbers and config values into table cells.

A run's numbers may be anything JSON holds: NaN, ±Infinity, an integer of 400 digits. `as_float` reads each one
without raising (an integer beyond a float's range reads as ±inf, as JSON's `1e400` does); `finite` keeps what an
average may take, and `mean` and `stdev` never overflow. A cell shows a value that is not finite as `nan`, `inf`
or `-inf` (NOT_FINITE_NOTE says so under a table).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from typing import Any, Callable, Iterable, Sequence

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")   # what Hydra's override grammar reads as a plain string
NOT_FINITE_NOTE = ("`nan`, `inf`, `-inf`: a value the run recorded as not a number or infinite, or too large for a "
                   "float; shown as it reads, never averaged.")


def as_float(value: Any) -> float | None:
    """A number from a JSON value, or None (booleans and non-numeric strings are not numbers). NaN and ±inf
    are returned as they are; an integer beyond a float's range is ±inf."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def as_int(value: Any) -> int | None:
    """A whole number from a JSON value (`4`, `4.0`, `"4"`), or None (not a number, not whole, not finite)."""
    number = as_float(value)
    return int(number) if number is not None and math.isfinite(number) and number.is_integer() else None


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite numbers among `values`: what an average may take."""
    return [value for value in values if value is not None and math.isfinite(value)]


def mean(values: Sequence[float]) -> float:
    """The mean of `values` (at least one; an average takes finite ones) without raising: where their sum
    overflows a float, summed in shares; NaN for inf and -inf together."""
    try:
        return statistics.fmean(values)
    except OverflowError:   # 1e308 + 1e308: each value's share of the mean is finite
        return math.fsum(value / len(values) for value in values)
    except ValueError:      # math.fsum refuses inf + -inf
        return math.nan


def stdev(values: Sequence[float]) -> float:
    """The sample standard deviation (ddof=1) of finite `values` (at least two); inf beyond a float's range."""
    try:
        return statistics.stdev(values)
    except OverflowError:
        return math.inf


def number_text(value: float) -> str:
    """A value that is not finite as a cell shows it: `nan`, `inf`, `-inf`."""
    return str(value)


def override_value(value: Any) -> str | None:
    """`value` as the value of a Hydra override when Hydra can read it only as itself: a number, a boolean,
    null or a name (`4`, `0.5`, `true`, `null`, `rdrop`); None for anything else. A run's string may be an
    interpolation (`${oc.env:...}`) that composing the override would resolve, reading the reader's environment,
    or a sweep (`a,b`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return str(value)
    if isinstance(value, str) and _NAME.fullmatch(value):
        return value
    return None


def as_str(value: Any) -> str | None:
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def fmt_number(value: Any, spec: str) -> str:
    """`value` in format `spec`; `nan`, `inf` or `-inf` when it is not finite; "" when it is no number."""
    number = as_float(value)
    if number is None:
        return ""
    if not math.isfinite(number):
        return number_text(number)
    return format(number, spec)


def number_format(spec: str) -> Callable[[Any], str]:
    """fmt_number with its format fixed: how a column writes its numbers, and a mean ± std of them."""
    return lambda value: fmt_number(value, spec)


def pct(value: float | None) -> str:
    """An accuracy in [0, 1] as a percentage with 2 decimals (`nan`, `inf` as they are)."""
    return "" if value is None else fmt_number(100.0 * value, ".2f")


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
