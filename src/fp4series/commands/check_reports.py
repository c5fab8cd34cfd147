"""The ``check-reports`` command: the committed GPU reports checked against their schema and
gates (fp4series.report; its options are defined there until that module moves here)."""

from fp4series.report import register  # noqa: F401
