"""A tiny step reporter on stderr, so long commands say what they are doing and for how long.

Public API (stable):
    Progress(stream=None, tty=None)
    Progress.step(name)            context manager: "==> name" ... "    ok name (1.2 s)" / "failed"
    Progress.info(msg)             an indented line, always shown
    Progress.percent(label, done, total)   a live "label  42%" line, only on a TTY
    Progress.done_percent()        end a live percent line
Step lines are printed even when stderr is not a TTY (CI logs); live percentages are not.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._live = False
        self._last_pct = -1

    def _line(self, text: str) -> None:
        self.done_percent()
        print(text, file=self.stream, flush=True)

    def info(self, msg: str) -> None:
        self._line(f"    {msg}")

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._line(f"==> {name}")
        start = time.monotonic()
        try:
            yield
        except BaseException:
            self._line(f"    failed: {name} ({time.monotonic() - start:.1f} s)")
            raise
        self._line(f"    ok: {name} ({time.monotonic() - start:.1f} s)")

    def percent(self, label: str, done: int, total: int) -> None:
        if not self.tty or total <= 0:
            return
        pct = min(100, int(done * 100 / total))
        if pct == self._last_pct:
            return
        self._last_pct = pct
        mib = done / 2**20
        self.stream.write(f"\r    {label} {pct:3d}% ({mib:.1f} of {total / 2**20:.1f} MiB)")
        self.stream.flush()
        self._live = True

    def done_percent(self) -> None:
        if self._live:
            self.stream.write("\n")
            self.stream.flush()
            self._live = False
            self._last_pct = -1


def quiet() -> Progress:
    """A reporter that discards everything (library callers that print their own output)."""
    import io

    return Progress(io.StringIO(), tty=False)
