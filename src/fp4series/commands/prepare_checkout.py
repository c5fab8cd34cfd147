"""The ``prepare-checkout`` command (scripts/main.sh's second stage): materialize the line's
release and make its checkout = release + series, one run at a time (fp4series.build)."""

from __future__ import annotations

import argparse

from fp4series.build import one_prepare_at_a_time, prepare_checkout
from fp4series.commands.build import line_of
from fp4series.line import add_line_option
from fp4series.paths import project_root


def _cmd_checkout(args: argparse.Namespace) -> int:
    root = project_root()
    with one_prepare_at_a_time(root):  # before the line is read: the first run may change it
        print(prepare_checkout(root, fresh=args.fresh, line=line_of(args)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser(
        "prepare-checkout",
        help="materialize the pin into .work/upstream/<tag> and make .work/checkout = pin + series "
        "(--line V: .work/upstream/V and .work/lines/V/checkout = V + patches/V)",
    )
    add_line_option(c)
    c.add_argument("--fresh", action="store_true", help="re-clone even if the checkout is current")
    c.set_defaults(
        func=_cmd_checkout,
        on_interrupt="run it again (scripts/main.sh does): it re-makes the checkout or reuses "
        "what is current",
    )
