"""One exception type for every failure a user can act on, and the one place that turns the
machine's failures (full disk, read-only files, a git command that failed) into it.

Stdlib-only: the bootstrap (``python -m fp4series.build venv``) imports it before gitpython exists.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any


class SeriesError(Exception):
    """A failure with a message that says what is wrong and a hint that says what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


# (text git or the OS prints, errno, hint)
_MACHINE_FAILURES = (
    ("No space left on device", errno.ENOSPC, "free space on that disk, then run it again"),
    ("Out of diskspace", errno.ENOSPC, "free space on that disk, then run it again"),
    ("Disk quota exceeded", errno.EDQUOT, "free space within your quota, then run it again"),
    (
        "Read-only file system",
        errno.EROFS,
        "that file system is mounted read-only: work on a writable copy",
    ),
    (
        "Permission denied",
        errno.EACCES,
        "you may not write there: run as the owner of those files, or work on a copy you own",
    ),
    (
        "index.lock': File exists",
        errno.EEXIST,
        "another git command is running in that checkout, or one crashed: if none is "
        "running, remove its .git/index.lock and run again",
    ),
)


def machine_hint(text: str) -> str | None:
    """The hint for a failure the machine caused (disk full, read-only, ...) named in TEXT."""
    for needle, _code, hint in _MACHINE_FAILURES:
        if needle in text:
            return hint
    return None


def as_series_error(exc: BaseException) -> SeriesError | None:
    """OSError or gitpython's GitCommandError as a SeriesError with a hint; None for others."""
    if isinstance(exc, SeriesError):
        return exc
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        message = f"{exc.strerror or exc}{where}"
        hint = next((h for _n, code, h in _MACHINE_FAILURES if code == exc.errno), None)
        return SeriesError(message, hint=hint or "check that path, then run the command again")
    if type(exc).__name__ == "GitCommandError":  # gitpython is not importable at bootstrap
        said = (getattr(exc, "stderr", "") or str(exc)).strip()
        said = said.removeprefix("stderr:").strip().strip("'").strip()
        command = " ".join(str(a) for a in (getattr(exc, "command", None) or ["git"])[:2])
        return SeriesError(
            f"{command} failed: {said}",
            hint=machine_hint(said) or "read git's message above; nothing else was run after it",
        )
    return None


INTERRUPTED = 130  # the shell's exit status for a process stopped by SIGINT


def run_reporting_errors(func: Callable[[Any], int], args: Any) -> int:
    """Run a subcommand; its failures become a message, a hint and an exit code (no traceback).
    SIGINT too: one line, the command's ``on_interrupt`` hint (or "run it again"), exit 130."""
    try:
        return int(func(args))
    except KeyboardInterrupt:
        command = getattr(args, "command", None) or "the command"
        hint = getattr(args, "on_interrupt", None) or "run the same command again"
        report(SeriesError(f"{command} was interrupted", hint=hint))
        return INTERRUPTED
    except Exception as exc:
        error = as_series_error(exc)
        if error is None:
            raise
        report(error)
        return error.exit_code


def report(error: SeriesError) -> None:
    print(f"error: {error}", file=sys.stderr)
    if error.hint:
        print(f"  what to do: {error.hint}", file=sys.stderr)
