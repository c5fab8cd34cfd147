"""One exception type for every failure a user can act on."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class SeriesError(Exception):
    """A failure with a message that says what is wrong and a hint that says what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def run_reporting_errors(func: Callable[[Any], int], args: Any) -> int:
    """Run a subcommand; a SeriesError becomes its message, its hint and its exit code."""
    try:
        return int(func(args))
    except SeriesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"  what to do: {exc.hint}", file=sys.stderr)
        return exc.exit_code
