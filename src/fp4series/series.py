"""The patch series: the order file ``patches/series`` and its patches (fp4series.patch).

Public API (stable):
    load_series(patches_dir) -> list[Patch]
        Read the order file ('#' comments and blank lines allowed) and parse every patch.
        SeriesError if an entry is missing, listed twice, not a plain file name in the directory
        (no '/', '..' or absolute path: see paths.name_problem), a symbolic link to a file
        outside the directory, numbered NNNN- other than its position, or a *.patch file is not
        listed. lint reports exactly these (series_problems), so lint and apply agree.
        A directory with neither a series file nor patches is an empty series.
    require_names(patches, names)        SeriesError naming what is not in the series
    read_series_names(patches_dir) -> list[str]          just the order file
    series_problems(patches_dir) -> list[(line, problem)]
    SERIES_FILE = "series"
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.patch import Patch, parse_patch
from fp4series.paths import name_problem

SERIES_FILE = "series"
_NUMBER = re.compile(r"^(\d{4})-")  # NNNN-stem.patch: its number is its position


def read_series_names(patches_dir: Path | str) -> list[str]:
    """Patch file names from the order file, in order (comments and blanks skipped)."""
    series = Path(patches_dir) / SERIES_FILE
    if not series.exists():
        return []
    names = []
    for line in series.read_text(encoding="utf-8").splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            names.append(entry)
    return names


def series_problems(patches_dir: Path | str) -> list[tuple[int, str]]:
    """(line in series file, problem) for missing, duplicate and unlisted patches."""
    patches_dir = Path(patches_dir)
    series = patches_dir / SERIES_FILE
    on_disk = sorted(p.name for p in patches_dir.glob("*.patch"))
    if not series.exists():
        return [(0, f"no {SERIES_FILE} file but patches exist: {on_disk}")] if on_disk else []
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    real_dir = patches_dir.resolve()
    position = 0
    for no, line in enumerate(series.read_text(encoding="utf-8").splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        position += 1
        bad = name_problem(entry)
        if bad:
            problems.append((no, f"{entry!r} is not a plain file name in {patches_dir}: {bad}"))
            continue
        if entry in seen:
            problems.append((no, f"{entry} is listed twice (first on line {seen[entry]})"))
        seen.setdefault(entry, no)
        path = patches_dir / entry
        if not path.is_file():
            problems.append((no, f"{entry} is listed but does not exist"))
        elif path.is_symlink() and path.resolve().parent != real_dir:
            problems.append(
                (no, f"{entry} is a symbolic link to {path.resolve()}, outside {patches_dir}")
            )
        number = _NUMBER.match(entry)
        if number and int(number.group(1)) != position:
            problems.append(
                (no, f"{entry}: number {number.group(1)} but position {position} in {SERIES_FILE}")
            )
    for name in on_disk:
        if name not in seen:
            problems.append((0, f"{name} exists but is not listed in {SERIES_FILE}"))
    return problems


def load_series(patches_dir: Path | str) -> list[Patch]:
    """The parsed series in order; SeriesError on any inconsistency."""
    patches_dir = Path(patches_dir)
    problems = series_problems(patches_dir)
    if problems:
        where = patches_dir / SERIES_FILE
        text = "; ".join(f"{where}:{no}: {p}" if no else f"{where}: {p}" for no, p in problems)
        raise SeriesError(
            text,
            hint="list every patches/*.patch exactly once in patches/series, in order, "
            "by its file name alone",
        )
    return [parse_patch(patches_dir / name) for name in read_series_names(patches_dir)]


def require_names(patches: list[Patch], names: Iterable[str]) -> None:
    """SeriesError for any of NAMES (patch file names or stems) not in PATCHES."""
    unknown = sorted(set(names) - {p.name for p in patches} - {p.stem for p in patches})
    if unknown:
        raise SeriesError(
            f"not in the series: {', '.join(unknown)}",
            hint=f"choose from: {', '.join(p.name for p in patches)}",
        )
