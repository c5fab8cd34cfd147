"""The ``venv`` command (scripts/setup-venv.sh) and the scripts' bootstrap: the line's test venv
from requirements/, and .work/tooling-venv (gitpython only) for scripts/*.sh on a fresh clone.

Stdlib-only, as fp4series.build is: ``python -m fp4series.commands.venv venv|tooling-venv`` runs
before any dependency is installed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from fp4series.build import (
    REQUIREMENT_FILES,
    TOOLING_REQUIREMENT_FILES,
    Steps,
    ensure_venv,
    tooling_venv_current,
)
from fp4series.errors import run_main, run_reporting_errors
from fp4series.paths import project_root
from fp4series.workspace import venv_python


def line_of(args: argparse.Namespace):  # noqa: ANN201 (the line module needs no gitpython)
    from fp4series.line import resolve_line

    return resolve_line(getattr(args, "line", None))


def _cmd_venv(args: argparse.Namespace) -> int:
    root = project_root()
    steps = Steps()
    if getattr(args, "line", None):
        line = line_of(args)
        venv, reqs = line.venv, line.requirements
    else:  # stdlib-only bootstrap of the pin's venv: no lock parsing needed
        venv, reqs = root / ".work" / "venv", REQUIREMENT_FILES
    with steps.step("venv") as note:
        note.append(ensure_venv(venv, root, base_python=args.python, requirements=reqs))
    print(venv_python(venv))
    return 0


def _cmd_tooling_venv(args: argparse.Namespace) -> int:
    """What scripts/lib/python.sh runs: silent when current, else create it with progress."""
    root = project_root()
    if tooling_venv_current(root):
        return 0
    venv = root / ".work" / "tooling-venv"
    steps = Steps(prefix="tooling")
    with steps.step(f"{venv}: gitpython for scripts/*.sh (first use; needs PyPI)") as note:
        note.append(ensure_venv(venv, root, requirements=TOOLING_REQUIREMENT_FILES))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from fp4series.line import add_line_option

    v = subparsers.add_parser("venv", help="create/refresh .work/venv from requirements/")
    add_line_option(v)
    v.add_argument("--python", help="interpreter for a new venv (default: this one)")
    v.set_defaults(func=_cmd_venv)


def main(argv: Sequence[str] | None = None) -> int:
    """Stdlib-only entry (``python -m fp4series.commands.venv venv``) for bootstrapping."""
    parser = argparse.ArgumentParser(prog="python -m fp4series.commands.venv")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("venv")
    v.add_argument("--python")
    v.add_argument("--line", help="a maintained line's venv (.work/lines/VERSION/venv)")
    v.set_defaults(func=_cmd_venv)
    t = sub.add_parser("tooling-venv", help="create .work/tooling-venv unless it is current")
    t.set_defaults(func=_cmd_tooling_venv)
    args = parser.parse_args(argv)
    return run_reporting_errors(args.func, args)


if __name__ == "__main__":
    run_main(main)
