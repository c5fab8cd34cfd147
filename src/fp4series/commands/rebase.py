"""The ``rebase`` command (scripts/rebase.sh): the series carried onto a newer release as a
maintained line, stopping for the user at a conflict; --continue, --abort, --status, --check
(fp4series.replay.rebase says how)."""

from __future__ import annotations

import argparse

from fp4series.commands import add_patches_dir
from fp4series.replay import rebase


def register(subparsers: argparse._SubParsersAction) -> None:
    script = rebase.SCRIPT
    p = subparsers.add_parser(
        "rebase",
        help="rebase the series onto a newer release (a maintained line)",
        description=rebase.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--to", metavar="VERSION", help="start a rebase onto this lock target")
    what.add_argument("--continue", dest="cont", action="store_true", help="resume it")
    what.add_argument("--abort", action="store_true", help="give it up (removes its .work dir)")
    what.add_argument("--status", action="store_true", help="where it is")
    p.add_argument("--check", action="store_true", help="with --to: reproduce --out, compare")
    p.add_argument("--drop", metavar="REASON", help="with --continue: drop the stopped patch")
    p.add_argument(
        "--line",
        metavar="VERSION",
        help="with --to: the series line to rebase (default: the pin's, patches/)",
    )
    add_patches_dir(
        p,
        dest="source_patches",
        old=("--source-patches",),
        help="with --to: the series to rebase (default: the --line's directory)",
    )
    p.add_argument("--out", metavar="DIR", help="default: patches/<VERSION>")
    p.add_argument("--lock", metavar="FILE", help="default: the project's upstream.lock")
    p.add_argument(
        "--force",
        action="store_true",
        help="let the final write replace uncommitted changes in --out",
    )
    p.set_defaults(
        func=rebase.run,
        on_interrupt=f"{script} --status says where it stopped; {script} --continue resumes it "
        f"(a check: run it again), {script} --abort gives it up",
    )
