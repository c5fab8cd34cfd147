"""The ``export`` command: the commits of a checkout above the pin (or --base) written back as the
series, byte-stable, never losing what patches/ holds (fp4series.export)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4series import paths
from fp4series.checkout import Interrupted
from fp4series.commands import add_patches_dir
from fp4series.errors import SeriesError
from fp4series.export import export_series
from fp4series.line import add_line_option, resolve_line


def _cmd_export(args: argparse.Namespace) -> int:
    line = resolve_line(args.line, lock_path=args.lock)
    args.patches_dir = args.patches_dir or line.patches_dir
    written = export_series(
        args.checkout,
        args.patches_dir,
        base=args.base,
        lock=line.lock,
        cache_dir=args.cache_dir,
        force=args.force,
        allow_empty=args.allow_empty,
        allow_delete=args.allow_delete,
    )
    print(f"exported {len(written)} patch(es) to {args.patches_dir}")
    return 0


def _cmd_export_reporting(args: argparse.Namespace) -> int:
    """A signal before the writes: nothing written; during them: held until the set is whole."""
    try:
        return _cmd_export(args)
    except Interrupted as exc:
        error = SeriesError(f"export was interrupted after it wrote every file; {exc.state}")
        error.hint = "nothing is left to do; check the result with git diff " + str(
            args.patches_dir
        )
        error.exit_code = 130
        raise error from None
    except KeyboardInterrupt:
        error = SeriesError("export was interrupted before it wrote anything")
        error.hint = f"run scripts/export.sh {args.checkout} again"
        error.exit_code = 130
        raise error from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="regenerate patches/ from commits on top of the pin (--line: patches/VERSION/ "
        "from commits on top of upstream VERSION)",
    )
    p.add_argument("checkout", type=Path)
    p.add_argument("--base", help="the pin revision (default: the lock's tag, else RECORD check)")
    add_line_option(p)
    add_patches_dir(p)
    p.add_argument("--lock", type=Path, default=paths.default_lock_path())
    p.add_argument("--cache-dir", type=Path, default=paths.default_cache_dir())
    p.add_argument(
        "--force",
        action="store_true",
        help="overwrite or delete files in the patches dir even if their changes are not committed",
    )
    p.add_argument(
        "--allow-delete",
        action="store_true",
        help="with --base: delete the patches no commit on top of it makes",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="export a checkout with no commits on the pin (empties the series)",
    )
    p.set_defaults(func=_cmd_export_reporting)
