"""How sparse-report talks to its user: one line per message on stderr, named after the program."""

from __future__ import annotations

import sys

PROG = "sparse-report"


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def warn(message: str) -> None:
    say(f"warning: {message}")
