"""The ``resolve-commit`` command: fill in the pin's commit id in upstream.lock from a real clone
of upstream (fp4series.upstream)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4series import paths
from fp4series.upstream import resolve_commit


def _cmd_resolve(args: argparse.Namespace) -> int:
    commit = resolve_commit(args.checkout, args.lock)
    print(f"recorded pin commit {commit} in {args.lock}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    r = subparsers.add_parser(
        "resolve-commit", help="fill in the pin's commit id from a real clone of upstream"
    )
    r.add_argument("checkout", type=Path)
    r.add_argument("--lock", type=Path, default=paths.default_lock_path())
    r.set_defaults(func=_cmd_resolve)
