"""The ``lint`` command (also the pre-commit hook): every check of fp4series.lint over the
patches named, or over a whole line and its series file; problems on stdout, exit 1 if any."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4series import paths
from fp4series.commands import add_patches_dir
from fp4series.lint import Problem, line_matrix, lint_paths


def _cmd_lint(args: argparse.Namespace) -> int:
    notes: list[str] = []
    warnings: list[Problem] = []
    problems: list[Problem] = []
    for line, patches_dir, files in _lint_jobs(args):
        matrix, cross = (args.matrix, True) if args.matrix else line_matrix(line, args.root, notes)
        problems += lint_paths(
            files,
            root=args.root,
            patches_dir=patches_dir,
            pin=args.pin,
            require_pin=args.blobs,
            notes=notes,
            line=line,
            matrix=matrix,
            cross_check_matrix=cross and not args.no_matrix,
            warnings=warnings,
        )
    for problem in problems:
        print(problem)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s); see the patch format in README.md", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lint", help="check patch files and the series (pre-commit hook)")
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument(
        "--line",
        metavar="VERSION",
        help="lint that series line (patches/VERSION); default: the pin's, or each FILE's own",
    )
    add_patches_dir(p)
    p.add_argument("--root", type=Path, default=paths.project_root(), help="where Tests: live")
    p.add_argument(
        "--pin",
        type=Path,
        help="git repo holding the pin's tag, for the blob check (default: "
        "<root>/.work/upstream/<tag>, skipped with a note when absent)",
    )
    p.add_argument(
        "--blobs", action="store_true", help="a missing pin is an error, not a skipped check"
    )
    p.add_argument(
        "--matrix",
        type=Path,
        metavar="FILE",
        help="rebase-check JSON to cross-check Upstream-Status against (default: "
        "<root>/reports/rebase-check.json, skipped with a note when absent or made for another "
        "series; a FILE given that cannot be read is an error)",
    )
    p.add_argument("--no-matrix", action="store_true", help="skip the Upstream-Status cross-check")
    p.set_defaults(func=_cmd_lint)


def _lint_jobs(args: argparse.Namespace) -> list[tuple[str | None, Path, list[Path]]]:
    """(line, patches dir, files) per series line: with --line or --patches-dir, that one; with
    FILES (the pre-commit hook), each file's own line (patches/ or patches/<V>/)."""
    from fp4series.line import line_of_patches_dir, resolve_line

    if args.line or args.patches_dir:
        version = args.line or line_of_patches_dir(args.patches_dir, args.root)
        line = resolve_line(version, root=args.root) if version else None
        patches = args.patches_dir or (line.patches_dir if line else args.root / "patches")
        return [(version, patches, list(args.files))]
    jobs: dict[Path, tuple[str | None, list[Path]]] = {}
    for f in args.files:
        folder = (f.parent if f.name != "upstream.lock" else args.root / "patches").resolve()
        jobs.setdefault(folder, (line_of_patches_dir(folder, args.root), []))[1].append(f)
    if not args.files:
        jobs[(args.root / "patches").resolve()] = (None, [])
    return [(line, folder, files) for folder, (line, files) in jobs.items()]
