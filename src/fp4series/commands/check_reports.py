"""The ``check-reports`` command: the committed GPU reports (the pin's in reports/h200, a line's
in reports/h200/<V>) checked against their schema and gates (fp4series.report)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.report import (
    DEFAULT_REPORT_DIR,
    REPORT_FILES,
    check_report_dir,
    line_of_report_dir,
    summarize,
)


def _cmd_check(args: argparse.Namespace) -> int:
    line = getattr(args, "line", None)
    if args.dir is None:
        if line is None:
            report_dir = DEFAULT_REPORT_DIR
        else:
            from fp4series.line import resolve_line

            report_dir = resolve_line(line).reports_dir
    else:
        report_dir = Path(args.dir)
        line = line or line_of_report_dir(report_dir)
    what = f"the {line} line's GPU reports" if line else "GPU reports"
    rerun = f"scripts/gpu-proof.sh{f' --line {line}' if line else ''}"
    if not report_dir.is_dir():
        raise SeriesError(
            f"report directory {report_dir} does not exist",
            hint=f"run {rerun} on a GPU machine and commit its reports",
        )
    if args.allow_none and not any((report_dir / name).exists() for name in REPORT_FILES):
        # Nothing committed yet is a state of its own (GPU proof pending); any report that
        # is committed must pass every check below.
        whose = f" of the {line} line" if line else ""
        print(f"no GPU reports{whose} in {report_dir} yet: nothing to check (GPU proof pending)")
        return 0
    pending: list[str] = []
    problems = check_report_dir(report_dir, line, pending)
    notes = "".join(f"\npending: {part}" for part in pending)
    if problems:
        print(f"{len(problems)} problem(s) in {report_dir}:\n{summarize(problems)}{notes}")
        raise SeriesError(
            f"{what} in {report_dir} fail the schema/threshold checks",
            hint=f"rerun {rerun} with the current series and commit the new reports",
        )
    print(f"{what} in {report_dir}: OK{notes}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "check-reports",
        help="check reports/h200 (numerics, turing_ptx, conformance, bench, and e2e where "
        "present) for schema and thresholds",
    )
    p.add_argument("--dir", help="report directory (default reports/h200, a line's "
                   "reports/h200/<V>)")  # fmt: skip
    p.add_argument("--line", metavar="VERSION", help="check as the reports of that series line "
                   "(default: found from --dir, reports/h200/<V>; else the pin's)")  # fmt: skip
    p.add_argument(
        "--allow-none",
        action="store_true",
        help="pass when the directory holds none of the report files yet (CI before the "
        "first GPU proof); any report that is present is still checked in full",
    )
    p.set_defaults(func=_cmd_check)
