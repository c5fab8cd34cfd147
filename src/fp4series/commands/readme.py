"""The ``readme`` command: regenerate the generated tables of the README and docs/*.md
(fp4series.readme); ``--check`` changes nothing and fails naming the blocks that differ."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4series import paths
from fp4series.paths import write_atomically
from fp4series.readme import documents, render


def _cmd_readme(args: argparse.Namespace) -> int:
    root = paths.project_root()
    files = [Path(args.readme)] if args.readme else documents(root)
    stale = 0
    for doc in files:
        text = doc.read_text(encoding="utf-8")
        new, changed = render(text, root)
        if args.check:
            if changed:
                stale += 1
                print(f"{doc}: generated blocks out of date: {', '.join(changed)}")
            else:
                print(f"{doc}: generated blocks up to date")
            continue
        if changed:
            write_atomically(doc, new.encode("utf-8"))
        print(f"{doc}: rewrote {', '.join(changed) or 'nothing (up to date)'}")
    if stale:
        print("  what to do: run `python -m fp4series readme` and commit what it rewrote")
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "readme",
        help="regenerate the tables of the README and docs/ from patches/ and reports/ "
        "(--check: CI)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 on drift")
    p.add_argument("--readme", help="one file only (default: README.md and docs/*.md)")
    p.set_defaults(func=_cmd_readme)
