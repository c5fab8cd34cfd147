"""Patch linter (also the pre-commit hook): form, message sections, trailers, whitespace, series,
and that every patch is whole (its end marker; its blob ids, replayed on the pin's files).

Messages read `patches/0003-x.patch:12: what is wrong`, one per problem, exit 1 if any.
The linter refuses whatever apply or split would refuse (series entries and Group: values that
are not plain names, patches that do not parse).

The blob check needs the pin's blobs: a git repo holding the lock's pin tag, by default
<root>/.work/upstream/<tag> (made by scripts/main.sh or scripts/fetch-upstream.sh). Without it
the check is skipped with a note on stderr (the pre-commit hook runs offline); `--blobs` makes a
missing pin an error, which is how CI runs it after scripts/main.sh.

Public API (stable):
    lint_patch(path, *, root, series_names=None) -> list[Problem]
    lint_series(patches_dir) -> list[Problem]
    lint_blobs(patches_dir, pin_repo, rev) -> (list[Problem], list[str] notes)
    lint_paths(paths, *, root, patches_dir, pin=None, require_pin=False, notes=None)
        -> list[Problem]     what the CLI runs; notes (a list) receives what was skipped
    Problem(path, line, message); str(problem) is the one-line form above
    UPSTREAM_STATUS   regex of allowed Upstream-Status values
CLI: lint [FILES...] [--line VERSION] [--pin REPO] [--blobs]   (no FILES: every patch of the
     line plus its series file; FILES from several lines are linted per line; an upstream.lock
     among FILES is validated too)
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
from fp4series.series import (
    END_MARKER,
    SERIES_FILE,
    Patch,
    load_series,
    parse_patch,
    read_series_names,
    series_problems,
)

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
        if file_part.startswith("/") or ".." in file_part.split("/"):
            say.append(
                (tests_line, f"Tests: {test} must be a path inside the project (relative, no '..')")
            )
        elif not file_part or not (root / file_part).exists():
            say.append(
                (tests_line, f"Tests: {test} does not exist (looked for {root / file_part})")
            )
    group = patch.trailers.get("Group")
    if group is not None:
        bad = paths.name_problem(group.strip())
        if bad:
            say.append(
                (
                    _line_of(lines, "Group:"),
                    f"Group: {group!r} is not a plain name ({bad}); it names a branch and a "
                    "directory of scripts/split.sh",
                )
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
    if patch.signature != END_MARKER:
        last = patch.hunks[-1] if patch.hunks else None
        after = f" after hunk {last.header!r} of {last.file} (line {last.line_no})" if last else ""
        say.append(
            (
                len(patch.text.rstrip("\n").split("\n")),
                f"the patch ends{after} without its end marker ('-- ' then {END_MARKER!r}): it "
                "was cut short there, or not written by scripts/export.sh",
            )
        )
    if series_names is not None and patch.name in series_names and _NAME.match(patch.name):
        pos = series_names.index(patch.name) + 1
        if int(patch.name[:4]) != pos:
            say.append((0, f"number {patch.name[:4]} but position {pos} in {SERIES_FILE}"))
    return name_problem + [Problem(shown, ln, msg) for ln, msg in say]


def lint_series(patches_dir: Path) -> list[Problem]:
    shown = _display(patches_dir / SERIES_FILE)
    return [Problem(shown, line, msg) for line, msg in series_problems(patches_dir)]


def lint_blobs(patches_dir: Path, pin_repo: Path, rev: str) -> tuple[list[Problem], list[str]]:
    """Replay the series on the pin's blobs (blobs.check_series_blobs): every post-image id must
    come out of its hunks, every pre-image must be what the pin plus earlier patches hold."""
    from git import GitCommandError, InvalidGitRepositoryError, NoSuchPathError, Repo

    from fp4series.blobs import check_series_blobs

    try:
        patches = load_series(patches_dir)
    except SeriesError:
        return [], ["blob check skipped: the series does not load (see the problems above)"]
    try:
        repo = Repo(pin_repo)
        repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}")
    except (InvalidGitRepositoryError, NoSuchPathError, GitCommandError):
        raise SeriesError(
            f"{pin_repo} is not a git repo holding the pin {rev}, so the blob check cannot run",
            hint="pass --pin with a checkout that has the pin's tag, or materialize it: "
            f"scripts/fetch-upstream.sh {pin_repo}",
        ) from None
    result = check_series_blobs(patches, repo, rev)
    by_name = {patch.name: patch.path for patch in patches}
    problems = [Problem(_display(by_name[b.patch]), b.line, b.message) for b in result.problems]
    notes = [f"blob check: {why}" for why in result.skipped]
    return problems, notes


def _pin_location(root: Path, pin: Path | None, line: str | None) -> tuple[Path, str] | None:
    """(repo, tag) of the release LINE applies to (None: the pin's line), to check blobs
    against; None when the lock cannot say."""
    from fp4series.line import resolve_line

    try:
        found = resolve_line(line, root=root)
    except SeriesError:
        return None
    return (pin or found.upstream_dir), found.tag


def lint_paths(
    files: list[Path],
    *,
    root: Path,
    patches_dir: Path,
    pin: Path | None = None,
    require_pin: bool = False,
    notes: list[str] | None = None,
    line: str | None = None,
) -> list[Problem]:
    """Lint the given patch files (all of PATCHES_DIR when none), its series consistency and,
    where the base release's blobs are at hand (PIN, else the materialized release of LINE:
    <root>/.work/upstream/<tag> for the pin's line), the blob ids.
    What was not checked is appended to NOTES; REQUIRE_PIN makes a missing pin an error."""
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
    notes = notes if notes is not None else []
    where = _pin_location(root, pin, line)
    if where is None and require_pin:
        raise SeriesError(
            f"{root / 'upstream.lock'} does not name a pin, so the blob check cannot run",
            hint="fix upstream.lock (scripts/lint-patches.sh upstream.lock says what is wrong)",
        )
    if where is None:
        notes.append(f"blob check skipped: {root / 'upstream.lock'} does not name a pin")
    elif not (where[0] / ".git").exists() and not require_pin and pin is None:
        version = f" --version {line}" if line else ""
        notes.append(
            f"blob check skipped: {where[1]} is not materialized at {where[0]}; run "
            f"scripts/fetch-upstream.sh {where[0]}{version} (or scripts/main.sh), or pass --pin "
            f"with a checkout that has tag {where[1]}"
        )
    else:
        found, skipped = lint_blobs(patches_dir, where[0], where[1])
        problems += found
        notes += skipped
    return problems


def _lint_jobs(args: argparse.Namespace) -> list[tuple[str | None, Path, list[Path]]]:
    """(line, patches dir, files) per series line: with --line or --patches, that one; with
    FILES (the pre-commit hook), each file's own line (patches/ or patches/<V>/)."""
    from fp4series.line import line_of_patches_dir, resolve_line

    if args.line or args.patches:
        line = resolve_line(args.line, root=args.root) if args.line else None
        patches = args.patches or (line.patches_dir if line else args.root / "patches")
        return [(args.line, patches, list(args.files))]
    jobs: dict[Path, tuple[str | None, list[Path]]] = {}
    for f in args.files:
        folder = (f.parent if f.name != "upstream.lock" else args.root / "patches").resolve()
        jobs.setdefault(folder, (line_of_patches_dir(folder, args.root), []))[1].append(f)
    if not args.files:
        jobs[(args.root / "patches").resolve()] = (None, [])
    return [(line, folder, files) for folder, (line, files) in jobs.items()]


def _cmd_lint(args: argparse.Namespace) -> int:
    notes: list[str] = []
    problems: list[Problem] = []
    for line, patches_dir, files in _lint_jobs(args):
        problems += lint_paths(
            files,
            root=args.root,
            patches_dir=patches_dir,
            pin=args.pin,
            require_pin=args.blobs,
            notes=notes,
            line=line,
        )
    for problem in problems:
        print(problem)
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
    p.add_argument("--patches", type=Path, help="series directory (default: the line's)")
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
    p.set_defaults(func=_cmd_lint)
