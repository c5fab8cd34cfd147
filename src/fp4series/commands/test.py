"""The ``test`` command (scripts/test.sh): a line's CPU suites, its GPU reports checked, and each
prefix of its series passing its own tests; one closing tally (fp4series.prefix)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.line import Line, add_line_option, resolve_line
from fp4series.prefix import run_all


def _cmd_test(args: argparse.Namespace) -> int:
    root, checkout, python, line = line_paths(args)
    pytest_args = strip_dashdash(args.pytest_args)
    named = bool(args.checkout)
    return run_all(root, python, checkout, pytest_args, line=line, checkout_named=named)


def register(subparsers: argparse._SubParsersAction) -> None:
    t = subparsers.add_parser(
        "test",
        help="tests/tooling, tests/sglang, tests/gpu, check-reports and every prefix "
        "(what scripts/test.sh runs)",
    )
    t.add_argument("--checkout", help="series checkout (default .work/checkout)")
    add_line_option(t)
    t.add_argument("--python", help="interpreter with the test deps (default .work/venv)")
    t.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        help="if given: one targeted pytest run with these args instead of the full run",
    )
    t.set_defaults(func=_cmd_test)


def line_paths(args: argparse.Namespace) -> tuple[Path, Path, Path, Line]:
    from fp4series.paths import project_root
    from fp4series.workspace import venv_python

    root = project_root()
    line = resolve_line(args.line, root=root)
    checkout = Path(args.checkout or line.checkout).resolve()
    python = Path(args.python) if args.python else venv_python(line.venv)
    if not python.exists():
        if not line.is_pin:
            raise SeriesError(
                f"{python} does not exist: {line.label} has its own test venv",
                hint=f"run scripts/main.sh --line {line.version} (or scripts/build.sh --line "
                f"{line.version} {line.checkout}) first",
            )
        python = Path(sys.executable)
    return root, checkout, python, line


def strip_dashdash(args: list[str]) -> list[str]:
    return args[1:] if args[:1] == ["--"] else args
