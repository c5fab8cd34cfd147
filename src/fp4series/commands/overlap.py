"""The ``overlap`` command: which lines two patches both touch, and why each patch needs an
earlier one (fp4series.overlap)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fp4series.commands import add_patches_dir
from fp4series.errors import SeriesError
from fp4series.overlap import compute_overlaps, explain_dependencies, format_overlaps
from fp4series.paths import default_patches_dir
from fp4series.series import SERIES_FILE, load_series, require_names


def cmd_overlap(args: argparse.Namespace) -> int:
    docs = load_series(Path(args.patches_dir))
    if not docs and not args.patches:
        raise SeriesError(
            f"{args.patches_dir} holds no series (no {SERIES_FILE} file listing patches), "
            "so there is nothing to compare",
            hint="pass --patches-dir with the directory holding series and NNNN-*.patch "
            f"(default: the project's {default_patches_dir()})",
        )
    overlaps = compute_overlaps(docs)
    if args.patches:
        require_names(docs, args.patches)
        wanted = set(args.patches)
        names = {d.name for d in docs if d.name in wanted or d.stem in wanted}
        overlaps = [o for o in overlaps if o.earlier in names or o.later in names]
    if args.json:
        json.dump([o.as_dict() for o in overlaps], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_overlaps(overlaps))
        why = explain_dependencies(docs)
        rows = [
            f"  {later} needs {earlier}: {'; '.join(reasons)}"
            for later, deps in why.items()
            for earlier, reasons in deps.items()
        ]
        print("\nPR order constraints (why each patch needs an earlier one):")
        print("\n".join(rows) if rows else "  none: every patch stands on the pin alone")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "overlap",
        help="show which lines two patches both touch (so PRs can be ordered)",
        description=format_overlaps.__doc__,
    )
    add_patches_dir(
        p, old=(), help="the series folder (default: the project's patches/, from any cwd)"
    )
    p.set_defaults(patches_dir=default_patches_dir())
    p.add_argument("patches", nargs="*", help="limit to pairs involving these patches")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_overlap)
