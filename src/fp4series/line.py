"""Which series line a command acts on, and where that line keeps its files.

The project maintains the series on more than one upstream release. The pin's line is the one
the project was made for; a maintained line carries the series onto a newer release (made by
``scripts/rebase.sh --to VERSION``, recorded in upstream.lock's ``[[lines]]``). Every command
takes ``--line VERSION`` (default: the pin) and finds everything through a ``Line``, so the
pin's layout stays exactly as it was and a line's layout is the same one step down:

    what                 the pin's line (0.5.11)            a line on V (e.g. 0.5.23)
    patches              patches/                           patches/V/ (+ its ``dropped``)
    CPU tests            tests/sglang (+ tooling, serve,    tests/sglang-V
                         gpu)
    test requirements    requirements/cpu-test.txt          requirements/V/cpu-test.txt
    scratch              .work/{checkout,venv,build,...}    .work/lines/V/{checkout,venv,...}
    materialized release .work/upstream/<tag>               .work/upstream/V
    GPU reports          reports/h200/                      reports/h200/V/
    rebase-check matrix  reports/rebase-check.json          reports/V/rebase-check.json

Stdlib-only at import time (``fp4series.build`` bootstraps venvs with it).

Public API (stable):
    resolve_line(version=None, *, lock_path=None, root=None) -> Line
    line_versions(lock) -> list[str]       the pin's version, then every [[lines]] version
    add_line_option(parser)                ``--line VERSION`` (default: the pin)
    ``python -m fp4series.line work VERSION``  prints the line's scratch dir (scripts/lib/line.sh)
    line_of_patches_dir(path, root) -> str | None   the line a patches directory belongs to
    Line: version, lock (``lock.pin`` is the line's release), patches_dir, work, is_pin,
          rebased_from; release, tag, venv, checkout, build_dir, prefix_dir, results_dir,
          upstream_dir, requirements, cpu_suites, reports_dir, rebase_matrix
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fp4series import paths
from fp4series.errors import SeriesError, report, run_main
from fp4series.lock import Lock, Release, load_lock

PIN_SUITES = ("tests/tooling", "tests/sglang", "tests/serve", "tests/gpu")


@dataclass(frozen=True)
class Line:
    version: str
    lock: Lock  # as this line sees it: lock.pin is the release the line applies to
    patches_dir: Path
    work: Path
    root: Path
    is_pin: bool
    rebased_from: str | None = None

    @property
    def release(self) -> Release:
        return self.lock.pin

    @property
    def tag(self) -> str:
        return self.release.tag

    @property
    def label(self) -> str:
        """How messages name it: ``the pin's line (0.5.11)`` / ``the 0.5.23 line``."""
        return f"the pin's line ({self.version})" if self.is_pin else f"the {self.version} line"

    @property
    def venv(self) -> Path:
        return self.work / "venv"

    @property
    def checkout(self) -> Path:
        return self.work / "checkout"

    @property
    def build_dir(self) -> Path:
        return self.work / "build"

    @property
    def prefix_dir(self) -> Path:
        return self.work / "prefix"

    @property
    def results_dir(self) -> Path:
        return self.work / "test-results"

    @property
    def upstream_dir(self) -> Path:
        """The materialized release (what ``rebase-check`` and ``prepare-checkout`` make)."""
        if self.is_pin:
            return paths.pin_repo_dir(self.tag, self.root)
        return self.root / ".work" / "upstream" / self.version

    @property
    def requirements(self) -> tuple[str, str]:
        """(requirements file, constraints file) of its CPU test venv, project-relative."""
        folder = "requirements" if self.is_pin else f"requirements/{self.version}"
        return (f"{folder}/cpu-test.txt", f"{folder}/constraints.txt")

    @property
    def cpu_suites(self) -> tuple[str, ...]:
        """The test folders ``scripts/test.sh`` runs for this line."""
        return PIN_SUITES if self.is_pin else (f"tests/sglang-{self.version}",)

    @property
    def reports_dir(self) -> Path:
        base = self.root / "reports" / "h200"
        return base if self.is_pin else base / self.version

    @property
    def rebase_matrix(self) -> Path:
        """The committed rebase-check matrix of this line against newer releases."""
        name = "rebase-check.json"
        return self.root / "reports" / (name if self.is_pin else f"{self.version}/{name}")


def line_versions(lock: Lock) -> list[str]:
    return [lock.pin.version, *(ln.version for ln in lock.lines)]


def resolve_line(
    version: str | None = None, *, lock_path: Path | None = None, root: Path | None = None
) -> Line:
    """The line on VERSION (the pin's when None or the pin's version)."""
    root = root or paths.project_root()
    lock = load_lock(lock_path or root / "upstream.lock")
    if version is None or version == lock.pin.version:
        return Line(lock.pin.version, lock, root / "patches", root / ".work", root, True)
    entry = lock.line(version)
    if entry is None:
        raise SeriesError(
            f"there is no series line on {version} in {lock.path}",
            hint=f"lines: {', '.join(line_versions(lock))}; make one with "
            f"scripts/rebase.sh --to {version}",
        )
    return Line(
        version,
        lock.for_line(version),
        root / entry.patches,
        root / ".work" / "lines" / paths.safe_name(version, "a line's version"),
        root,
        False,
        entry.rebased_from,
    )


def line_of_patches_dir(path: Path, root: Path | None = None) -> str | None:
    """'0.5.23' for <root>/patches/0.5.23, None for <root>/patches (the pin's) or elsewhere."""
    root = (root or paths.project_root()).resolve()
    try:
        rel = path.resolve().relative_to(root / "patches")
    except ValueError:
        return None
    parts = rel.parts
    return parts[0] if len(parts) == 1 else None


def add_line_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--line",
        metavar="VERSION",
        help="the series line to act on: the pin's (default) or a maintained line "
        "(upstream.lock [[lines]], e.g. 0.5.23 = patches/0.5.23)",
    )


def main(argv: list[str] | None = None) -> int:
    """``work VERSION``: the line's scratch directory, for the shell entry points."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "work":
        print("usage: python -m fp4series.line work VERSION", file=sys.stderr)
        return 2
    try:
        print(resolve_line(args[1]).work)
    except SeriesError as exc:
        report(exc)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    run_main(main)
