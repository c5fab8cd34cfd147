"""One exception type for every failure a user can act on, and the one place that turns the
machine's failures (full disk, read-only files, a git command that failed) into it.

Stdlib-only: the bootstrap (``python -m fp4series.commands.venv venv``) imports it before
gitpython exists.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn


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
    except BaseException as exc:
        if not interrupted(exc):
            return _reported(exc)
        command = getattr(args, "command", None) or "the command"
        hint = getattr(args, "on_interrupt", None) or "run the same command again"
        report(SeriesError(f"{command} was interrupted", hint=hint))
        return INTERRUPTED


def _reported(exc: BaseException) -> int:
    error = as_series_error(exc) if isinstance(exc, Exception) else None
    if error is None:
        raise exc
    report(error)
    return error.exit_code


def interrupted(exc: BaseException) -> bool:
    """Did a Ctrl-C cause EXC? Python wraps a KeyboardInterrupt that strikes inside some of
    its own machinery (a class's __set_name__ while a module loads: RuntimeError) instead of
    letting it through. A SeriesError stands for itself (it says what the interrupt left), as
    does SystemExit. True also marks the interrupt handled (below)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, SeriesError | SystemExit):
            return False
        if isinstance(cause, KeyboardInterrupt):
            _mark_handled()
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _mark_handled() -> None:
    """CPython notes a KeyboardInterrupt that leaves code run by exec() of a string (dataclasses
    build their methods so, while a module loads) as unhandled, and then ends the process by
    SIGINT after our clean exit 130 although we caught it. Each exec() of a string clears that
    note before it runs."""
    exec("")  # noqa: S102


def report(error: SeriesError) -> None:
    print(f"error: {error}", file=sys.stderr)
    if error.hint:
        print(f"  what to do: {error.hint}", file=sys.stderr)


# scripts/*.sh start python with SIGINT blocked and this variable set (scripts/lib/sigint.sh).
SIGINT_BLOCKED_ENV = "FP4SERIES_SIGINT_BLOCKED"


def release_sigint() -> None:
    """Let in a Ctrl-C that came while the interpreter started.

    SIGINT before the program's first line (the interpreter's start-up, site, runpy) raises
    where no code can catch it: Python prints a traceback. scripts/*.sh therefore start python
    with SIGINT blocked: it waits, pending, until this call, made first inside each entry
    point's try, where it becomes one line and exit status 130. Only a block the scripts made
    is lifted (the variable says so); a signal the caller ignores stays ignored."""
    if os.environ.pop(SIGINT_BLOCKED_ENV, None) and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _ignore_sigint() -> None:
    """The command has ended and said so: a Ctrl-C during the interpreter's shutdown could only
    add a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_main(main: Callable[[], int]) -> NoReturn:
    """The ``if __name__ == "__main__"`` of a module run as ``python -m fp4series.X``: SIGINT at
    any moment is one line and exit status 130 (release_sigint, run_reporting_errors)."""
    code = None
    try:
        release_sigint()
        code = main()
        _ignore_sigint()
    except BaseException as exc:
        if not interrupted(exc):
            raise
        _ignore_sigint()
        if code is None:
            report(SeriesError(STARTING, hint="run the same command again"))
            code = INTERRUPTED
    sys.exit(code)


STARTING = "interrupted while starting; nothing was done"
