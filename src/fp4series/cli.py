"""Thin command-line front end: each subcommand is a module of fp4series.commands (one a verb).

Every module in ``COMMAND_MODULES`` exposes ``register(subparsers) -> None``, which adds its
subparser(s) and sets ``func`` (a callable taking the parsed namespace and returning an exit code)
and, optionally, ``on_interrupt``: what to run next when SIGINT stops the command (default: run
it again). SIGINT at any moment ends in one line, that hint and exit status 130, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fp4series.commands import COMMANDS
from fp4series.errors import (
    INTERRUPTED,
    STARTING,
    SeriesError,
    interrupted,
    report,
    run_reporting_errors,
)

COMMAND_MODULES = tuple(f"fp4series.commands.{name}" for name in COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fp4series",
        description="The NVFP4-on-Marlin patch series for SGLang and its lines: apply, export, "
        "lint, build, test, split and rebase them (scripts/*.sh run these; each verb's --help "
        "says more).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # module not written yet
                continue
            if exc.name and not exc.name.startswith("fp4series"):
                raise _missing_dependency(exc.name) from None
            raise
        module.register(subparsers)
    return parser


def _missing_dependency(module: str) -> SeriesError:
    package = {"git": "gitpython"}.get(module, module)
    return SeriesError(
        f"{sys.executable} cannot import {module!r} ({package}), which fp4series needs",
        hint="use scripts/*.sh, which make .work/tooling-venv on first use; if this python is "
        ".work/venv, finish it with scripts/setup-venv.sh (or remove it); otherwise "
        "pip install -r requirements/scripts.txt -c requirements/constraints.txt",
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            parser = build_parser()
        except SeriesError as exc:
            report(exc)
            return exc.exit_code
        args = parser.parse_args(argv)
        return run_reporting_errors(args.func, args)
    except BaseException as exc:  # before the command started (then: run_reporting_errors)
        if not interrupted(exc):
            raise
        report(SeriesError(STARTING, hint="run the same command again"))
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
