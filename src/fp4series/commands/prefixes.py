"""The ``test-prefixes`` command: for k = 1..n, the CPU tests named by patches 1..k run on a
worktree of the k-th series commit, so each prefix of the series passes its own tests
(fp4series.prefix)."""

from __future__ import annotations

import argparse

from fp4series.commands.test import line_paths, strip_dashdash
from fp4series.errors import SeriesError
from fp4series.line import add_line_option
from fp4series.prefix import Tally, run_prefixes


def _cmd_prefixes(args: argparse.Namespace) -> int:
    from fp4series.workspace import resolve_base

    root, checkout, python, line = line_paths(args)
    if not (checkout / ".git").exists():
        raise SeriesError(f"{checkout} is not a git checkout", hint="run scripts/main.sh first")
    tally = Tally()
    rc = run_prefixes(
        checkout, root=root, python=python, base=resolve_base(checkout, args.base or line.tag),
        tally=tally, only=args.only, pytest_args=strip_dashdash(args.pytest_args), line=line,
    )  # fmt: skip
    print(f"{tally.passed} passed, {tally.failed} failed, {tally.skipped} skipped")
    return rc


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "test-prefixes",
        help="for k = 1..n run the CPU tests named by patches 1..k on a worktree of commit k",
    )
    p.add_argument("checkout", nargs="?", help="series checkout (default .work/checkout)")
    add_line_option(p)
    p.add_argument("--base", help="commit of the pin (default: the lock's tag)")
    p.add_argument("--only", type=int, help="run prefix K only")
    p.add_argument("--python", help="interpreter with the test deps (default .work/venv)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest args after --")
    p.set_defaults(func=_cmd_prefixes)
