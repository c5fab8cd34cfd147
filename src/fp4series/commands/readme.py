"""The ``readme`` command: regenerate the README's generated blocks (``--check``: say which differ
and fail), from fp4series.readme."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4series import paths
from fp4series.readme import render


def _cmd_readme(args: argparse.Namespace) -> int:
    root = paths.project_root()
    readme = Path(args.readme) if args.readme else root / "README.md"
    text = readme.read_text(encoding="utf-8")
    new, changed = render(text, root)
    if args.check:
        if changed:
            print(f"{readme}: generated blocks out of date: {', '.join(changed)}")
            print("  what to do: run `python -m fp4series readme` and commit README.md")
            return 1
        print(f"{readme}: generated blocks up to date")
        return 0
    if changed:
        tmp = readme.with_name(readme.name + ".tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(readme)
    print(f"{readme}: rewrote {', '.join(changed) or 'nothing (up to date)'}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "readme",
        help="regenerate the README's tables from patches/ and reports/ (--check: CI)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 on drift")
    p.add_argument("--readme", help="default: the project's README.md")
    p.set_defaults(func=_cmd_readme)
