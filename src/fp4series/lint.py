"""Patch linter (also the pre-commit hook): form, message sections, trailers, whitespace, series.

Messages read `patches/0003-x.patch:12: what is wrong`, one per problem, exit 1 if any.

Public API (stable):
    lint_patch(path, *, root, series_names=None) -> list[Problem]
    lint_series(patches_dir) -> list[Problem]
    lint_paths(paths, *, root, patches_dir) -> list[Problem]   what the CLI runs
    Problem(path, line, message); str(problem) is the one-line form above
    UPSTREAM_STATUS   regex of allowed Upstream-Status values
CLI: lint [FILES...]   (no FILES: every patch in patches/ plus the series file;
     an upstream.lock among FILES is validated too)
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from fp4series import paths
from fp4series.errors import SeriesError
from fp4series.lock import load_lock
from fp4series.series import SERIES_FILE, Patch, parse_patch, read_series_names, series_problems

SUBJECT_MAX = 72
SECTIONS = ("Why:", "What:", "How verified:")
UPSTREAM_STATUS = re.compile(
    r"^(Pending|Submitted \[\S.*\]|Backport \[\S.*\]|Inappropriate \[\S.*\])$"
)
TEST_PREFIXES = ("gpu:", "bench:")
WHITESPACE_CHECKED = (".py", ".pyi", ".h", ".cuh", ".cu", ".cc", ".cpp", ".c", ".hpp", ".toml")
_NAME = re.compile(r"^\d{4}-[a-z0-9][a-z0-9.-]*\.patch$")
_FROM_LINE = re.compile(r"^From [0-9a-f]{40} Mon Sep 17 00:00:00 2001$")


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.message}"
            if self.line
            else f"{self.path}: {self.message}"
        )


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _line_of(lines: list[str], prefix: str, start: int = 0) -> int:
    for i in range(start, len(lines)):
        if lines[i].startswith(prefix):
            return i + 1
    return 0


def _check_message(patch: Patch, lines: list[str], say: list[tuple[int, str]]) -> None:
    subj_line = _line_of(lines, "Subject:")
    if len(patch.subject) > SUBJECT_MAX:
        say.append((subj_line, f"subject is {len(patch.subject)} chars, at most {SUBJECT_MAX}"))
    if not re.sub(r"^(\[[^\]]+\]\s*)+", "", patch.subject).strip():
        say.append((subj_line, "subject has no summary after its [Area] prefix"))
    if patch.subject.endswith("."):
        say.append((subj_line, "subject ends with a period"))
    body_start = _line_of(lines, "", 1)
    message_lines = patch.message.splitlines()
    for section in SECTIONS:
        idx = next((i for i, ln in enumerate(message_lines) if ln.strip() == section), None)
        if idx is None:
            say.append((body_start, f"body has no '{section}' section (a line of its own)"))
            continue
        rest = message_lines[idx + 1 :]
        content = []
        for ln in rest:
            if ln.strip() in SECTIONS or not ln.strip():
                break
            content.append(ln)
        if not content:
            say.append((body_start + idx + 1, f"'{section}' section is empty"))


def _check_trailers(
    patch: Patch, lines: list[str], root: Path, names: list[str] | None, say: list[tuple[int, str]]
) -> None:
    end = _line_of(lines, "diff --git ") or len(lines)
    status = patch.upstream_status
    status_line = _line_of(lines, "Upstream-Status:")
    if status is None:
        say.append((end, "no 'Upstream-Status:' trailer in the last paragraph of the message"))
    elif not UPSTREAM_STATUS.match(status.strip()):
        say.append(
            (
                status_line,
                f"Upstream-Status {status!r} is not one of: Pending | Submitted [url] | "
                "Backport [ref] | Inappropriate [reason]",
            )
        )
    tests_line = _line_of(lines, "Tests:")
    if not patch.tests():
        say.append((tests_line or end, "no 'Tests:' trailer naming the tests that prove the patch"))
    for test in patch.tests():
        target = test
        for prefix in TEST_PREFIXES:
            if target.startswith(prefix):
                target = target[len(prefix) :]
        file_part = target.split("::", 1)[0]
        if not file_part or not (root / file_part).exists():
            say.append(
                (tests_line, f"Tests: {test} does not exist (looked for {root / file_part})")
            )
    if names is not None:
        dep_line = _line_of(lines, "Depends-On:")
        earlier = names[: names.index(patch.name)] if patch.name in names else names
        for dep in patch.depends_on:
            if dep not in earlier:
                say.append((dep_line, f"Depends-On: {dep} is not an earlier patch in the series"))


def _check_whitespace(patch: Patch, say: list[tuple[int, str]]) -> None:
    for hunk in patch.hunks:
        if not hunk.file.endswith(WHITESPACE_CHECKED):
            continue
        for i, line in enumerate(hunk.lines):
            if line.startswith("+") and line[1:] != line[1:].rstrip(" \t"):
                say.append((hunk.line_no + 1 + i, f"trailing whitespace added in {hunk.file}"))


def lint_patch(path: Path, *, root: Path, series_names: list[str] | None = None) -> list[Problem]:
    shown = _display(path)
    if not _NAME.match(path.name):
        name_problem = [Problem(shown, 0, "file name must look like NNNN-lower-case-stem.patch")]
    else:
        name_problem = []
    try:
        patch = parse_patch(path)
    except SeriesError as exc:
        text = str(exc)
        m = re.match(rf"^{re.escape(str(path))}(?::(\d+))?: (.*)$", text, re.S)
        line, msg = (int(m.group(1) or 0), m.group(2)) if m else (0, text)
        return [*name_problem, Problem(shown, line, msg)]
    lines = patch.text.split("\n")
    say: list[tuple[int, str]] = []
    if not _FROM_LINE.match(lines[0]):
        say.append(
            (1, "first line is not 'From <40 zeros> Mon Sep 17 ...' (export with --zero-commit)")
        )
    if not re.search(r"^Subject: \[PATCH\] ", patch.text, re.M):
        say.append((_line_of(lines, "Subject:"), "subject must start with '[PATCH] '"))
    _check_message(patch, lines, say)
    _check_trailers(patch, lines, root, series_names, say)
    _check_whitespace(patch, say)
    if series_names is not None and patch.name in series_names and _NAME.match(patch.name):
        pos = series_names.index(patch.name) + 1
        if int(patch.name[:4]) != pos:
            say.append((0, f"number {patch.name[:4]} but position {pos} in {SERIES_FILE}"))
    return name_problem + [Problem(shown, ln, msg) for ln, msg in say]


def lint_series(patches_dir: Path) -> list[Problem]:
    shown = _display(patches_dir / SERIES_FILE)
    return [Problem(shown, line, msg) for line, msg in series_problems(patches_dir)]


def lint_paths(files: list[Path], *, root: Path, patches_dir: Path) -> list[Problem]:
    """Lint the given patch files (all of PATCHES_DIR when none) and its series consistency."""
    targets = [f for f in files if f.suffix == ".patch"]
    if not files:
        targets = sorted(patches_dir.glob("*.patch"))
    problems = lint_series(patches_dir)
    for lock_file in [f for f in files if f.name == "upstream.lock"]:
        try:
            load_lock(lock_file)
        except SeriesError as exc:
            problems.append(Problem(_display(lock_file), 0, str(exc).split(": ", 1)[-1]))
    names = read_series_names(patches_dir)
    for path in targets:
        problems += lint_patch(path, root=root, series_names=names)
    return problems


def _cmd_lint(args: argparse.Namespace) -> int:
    problems = lint_paths(args.files, root=args.root, patches_dir=args.patches)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s); see the patch format in README.md", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lint", help="check patch files and the series (pre-commit hook)")
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--patches", type=Path, default=paths.default_patches_dir())
    p.add_argument("--root", type=Path, default=paths.project_root(), help="where Tests: live")
    p.set_defaults(func=_cmd_lint)
