"""The commands: one module a verb (``python -m fp4series <verb>``, scripts/*.sh).

Each module in COMMANDS has ``register(subparsers)``, which adds its verb's subparser and sets
``func`` (the namespace -> exit status) and, where it says more than "run it again",
``on_interrupt`` (what to run next after Ctrl-C). A command reads its options, calls the model
(fp4series.patch, series, apply, export, lint, split, judging, replay, ...) and says what
happened; what it does lives in the model, not here.

One spelling for each option shared by commands (the helpers below): ``--patches-dir`` for the
series folder, ``--allow-base-mismatch``, ``--line``, ``--lock``, ``--cache-dir``. An old
spelling still works for one release of the tooling and says, on one line, which to use.

Stdlib-only, like fp4series.build: commands/venv.py bootstraps the venvs through it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

COMMANDS = (  # fp4series.commands.<module>: the verb it registers
    "fetch_upstream",  # fetch-upstream
    "resolve_commit",  # resolve-commit
    "venv",  # venv
    "prepare_checkout",  # prepare-checkout
    "apply",  # apply (--check, --recover)
    "export",  # export
    "lint",  # lint (the pre-commit hook)
    "build",  # build
    "test",  # test
    "prefixes",  # test-prefixes
    "rebase_check",  # rebase-check
    "rebase",  # rebase (--to, --continue, --abort, --status, --check)
    "split",  # split
    "overlap",  # overlap
    "check_reports",  # check-reports
    "readme",  # readme (--check)
)


class Deprecated(argparse.Action):
    """An old spelling of an option: does what the new one does, and says so on one line."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kw) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        print(
            f"warning: {option_string} is deprecated, use {self.new} (the old spelling goes "
            "away in a later release of the tooling)",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def deprecated_flag(
    parser: argparse.ArgumentParser, old: str, new: str, dest: str, **kw: object
) -> None:
    """OLD as a hidden alias of the option NEW (DEST)."""
    parser.add_argument(old, action=Deprecated, new=new, dest=dest, help=argparse.SUPPRESS, **kw)


def add_patches_dir(
    parser: argparse.ArgumentParser,
    *,
    dest: str = "patches_dir",
    old: Sequence[str] = ("--patches",),
    help: str = "the series folder (default: the line's: patches/ or patches/VERSION)",  # noqa: A002
) -> None:
    """``--patches-dir DIR``, the series folder, in every command that reads a series."""
    parser.add_argument("--patches-dir", dest=dest, type=Path, metavar="DIR", help=help)
    for spelling in old:
        deprecated_flag(parser, spelling, "--patches-dir", dest, type=Path, metavar="DIR")


def add_allow_base_mismatch(parser: argparse.ArgumentParser, help: str) -> None:  # noqa: A002
    parser.add_argument("--allow-base-mismatch", action="store_true", help=help)
    deprecated_flag(
        parser,
        "--allow-mismatched-base",
        "--allow-base-mismatch",
        "allow_base_mismatch",
        nargs=0,
        const=True,
        default=False,
    )
