"""The ``fetch-upstream`` command: materialize an upstream release (default: the pin) from its
sha256-verified wheel as a git repo (fp4series.upstream)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4series import paths
from fp4series.lock import load_lock
from fp4series.upstream import fetch_and_record, materialize


def _cmd_fetch(args: argparse.Namespace) -> int:
    lock = load_lock(args.lock)
    release = lock.release(args.version) if args.version else lock.pin
    if not release.sha256:  # trust on first use, recorded before anything is unpacked
        wheel = fetch_and_record(args.lock, release.version, args.cache_dir)
        print(f"recorded {wheel.name} sha256 in {args.lock}", file=sys.stderr)
        lock = load_lock(args.lock)
        release = lock.release(release.version)
    materialize(release, args.dest, args.cache_dir, lock=lock)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fetch-upstream", help="materialize an upstream release (default: the pin) as a git repo"
    )
    p.add_argument("dest", type=Path, help="new (or empty) directory")
    p.add_argument("--version", help="a rebase target from upstream.lock (default: the pin)")
    p.add_argument("--cache-dir", type=Path, default=paths.default_cache_dir())
    p.add_argument("--lock", type=Path, default=paths.default_lock_path())
    p.set_defaults(func=_cmd_fetch)
