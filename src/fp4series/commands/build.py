"""The ``build`` command (scripts/build.sh): repack the pinned wheel with a checkout's changed
files, install it into the line's venv and compile-check the Marlin JIT modules the series
changes (fp4series.build, fp4series.compile_check)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4series import compile_check
from fp4series.build import build
from fp4series.commands import add_allow_base_mismatch
from fp4series.line import Line, add_line_option
from fp4series.workspace import PIN_TAG


def line_of(args: argparse.Namespace) -> Line:
    """The series line the command acts on (--line; the pin's without it)."""
    from fp4series.line import resolve_line

    return resolve_line(getattr(args, "line", None))


def _cmd_build(args: argparse.Namespace) -> int:
    build(
        Path(args.checkout),
        line=line_of(args),
        base=args.base,
        allow_base_mismatch=args.allow_base_mismatch,
        compile_targets=args.compile_targets,
        force_compile=args.force_compile,
        skip_compile=args.skip_compile,
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "build",
        help="repack the pinned wheel with a checkout's patched files, install it into "
        ".work/venv and compile-check the Marlin JIT modules",
    )
    p.add_argument("checkout", help="git checkout of SGLang with the series applied")
    add_line_option(p)
    p.add_argument(
        "--base", help=f"commit of the base in the checkout (default: the line's tag, {PIN_TAG})"
    )
    add_allow_base_mismatch(
        p, "build even if the base's files differ from the pinned wheel's RECORD"
    )
    p.add_argument("--compile-targets", help="comma list MODULE[@SET]:DTYPE:ARCH, 'full' "
                   "(the defaults as whole modules) or 'none' "
                   f"(default: {', '.join(compile_check.DEFAULT_TARGETS)}"
                   " + SM75 targets when the templates have a Turing path)")  # fmt: skip
    p.add_argument("--force-compile", action="store_true", help="ignore the compile stamps")
    p.add_argument("--skip-compile", action="store_true", help="no nvcc compile check")
    p.set_defaults(func=_cmd_build)
