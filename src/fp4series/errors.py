"""One exception type for every failure a user can act on."""

from __future__ import annotations


class SeriesError(Exception):
    """A failure with a message that says what is wrong and a hint that says what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint
