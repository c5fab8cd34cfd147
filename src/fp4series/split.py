"""Split the series into single-purpose upstream PR branches, each carrying its own evidence.

For each patch (or each ``Group:`` of patches) a branch ``nvfp4-marlin/<stem>`` is created in the
given repository on a base release: the pin (default), ``--base <version>`` (its materialized
tag ``v<version>``, fetched into the repository when missing) or ``--base auto`` (the newest
release where the branch's patches still apply, from reports/rebase-check.json). It holds that
patch plus only the patches it depends on: ``Depends-On:`` and patches whose added/changed lines
its hunks touch (see ``fp4series overlap``), applied with ``git am``: exactly (no 3-way) first;
only on a base other than the series' own (``--series-base``, default the pin) does a patch
that does not apply exactly fall back to ``git am -3``, which the log and the record say. A
line's series on its own base (``--patches-dir patches/0.5.23 --base 0.5.23 --series-base
0.5.23``) therefore applies exactly or fails. Commits keep author and date; the committer date
is the author date, so re-splitting unchanged patches on an unchanged base gives the same head.

Commit messages on the PR branches carry no internal trailers: ``Upstream-Status:``,
``Tests:``, ``Provides:``, ``Depends-On:``, ``Group:`` and ``Rebased-From:`` describe this
project's series (its test paths, its patch file names, its bookkeeping), mean nothing in
upstream's history, and a maintainer expects a clean commit, so they are removed from the
patches given to ``git am`` (other trailers, e.g. ``Signed-off-by:``, stay). ``--keep-trailers``
keeps them (branches for review inside this project). The series files are never changed.

Each member's CPU ``Tests:`` files go into the branch's last commit at their place in upstream's
test tree (``Upstream-Tests: SRC=DEST``, default ``test/registered/quant/nvfp4_marlin/<name>``),
with the conftest.py and ``_*.py`` helpers beside them and tests/data/, and SGLang's CI
registration (``register_cpu_ci``, suite base-a-test-cpu) plus a ``__main__`` entry when the file
has neither. With ``--run-tests`` they run there, in the branch's tree (``PYTHONPATH=<worktree>/
python``), with ``--python`` (default: .work/venv). The PR description, ``<out-dir>/<unit>.md``,
follows SGLang's template (Motivation from ``Why:`` and the related upstream/vLLM work,
Modifications from ``What:`` and the diffstat, Accuracy Tests from the placed tests, this run
of them and the GPU numerics report in ``--reports-dir`` with its command, Speed Tests and
Profiling from its bench report, a Checklist that ticks only what the branch shows). A
description that names this project, its machines or its paths fails the split
(``description_problems``); wording about the series or runs not made is logged for the
patch's author. Nothing is pushed: the ``git push`` / ``gh pr create`` commands are printed
for a person to run.

Record: ``<out-dir>/split-record.json`` lists per branch: branch, base (label, version, tag,
commit), the patch files (name, sha256, stable patch-id; member or dependency), head commit,
how they applied, whether trailers were kept, tests, when. On the next split into the same
out dir, a branch already in the record is compared with its previous split: ``git range-diff
<old base>..<old head> <new base>..<new head>`` is written to ``<out-dir>/<unit>.range-diff.txt``
(and printed when it shows a change), with one summary line: unchanged / changed (how) / new.
The previous commits stay reachable on refs split owns: ``refs/fp4series/split/<unit>/head``
(the last split's head) and ``refs/fp4series/split/<unit>/previous`` (the one before it).

Public API:
    split(repo, docs, *, base, pin_version, pin_tag, pin_commit, out_dir, reports_dir,
          only=None, runner=None, fetch_release=None, rebase_report=None, series_base=None,
          keep_trailers=False, log=print) -> list[SplitResult]
        SplitResult: unit, base (label), base_rev, ok, head, error, tests, applied
        ("exact" / "three-way"), base_version, base_tag, change (the one-line summary),
        range_diff (path or None), description (path)
    strip_trailers(patch_text, drop=INTERNAL_TRAILERS) -> str
    make_branch(repo, unit, base_rev, worktree, *, owner, three_way_fallback=False,
                patch_files=None) -> BranchOutcome(ok, head, error, applied)
    load_record(out_dir) -> dict; compare_with_previous(repo, result, prev_entry, entry)
        -> (summary, range-diff text); pr_description(result, *, reports_dir) -> str
    INTERNAL_TRAILERS, RECORD_FILE ("split-record.json"), REF_PREFIX ("refs/fp4series/split/")
"""

from __future__ import annotations

import email
import email.utils
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fp4series import gitops
from fp4series import split_guard as guard
from fp4series.errors import SeriesError
from fp4series.overlap import (
    dependency_closure,
    derived_dependencies,
    explain_dependencies,
)
from fp4series.patch import Patch, message_lines, parse_trailers
from fp4series.patchid import patch_identity
from fp4series.paths import inside, remove_tree_inside, safe_name, write_atomically

BRANCH_PREFIX = "nvfp4-marlin/"
UPSTREAM_REPO = "sgl-project/sglang"
DOCS = "https://docs.sglang.io/developer_guide/contribution_guide.html"
APPLIES = ("clean", "offset", "three-way")
INTERNAL_TRAILERS = (
    "Upstream-Status",
    "Tests",
    "Upstream-Tests",
    "Related",
    "Provides",
    "Depends-On",
    "Group",
    "Rebased-From",
)
RECORD_FILE = "split-record.json"
RECORD_SCHEMA = 1
REF_PREFIX = "refs/fp4series/split/"
RANGE_DIFF_CREATION_FACTOR = 100


@dataclass
class TestRun:
    """Outcome of one branch's declared tests."""

    command: list[str]
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    returncode: int = 0
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.failed == 0 and self.errors == 0

    def summary(self) -> str:
        bits = [f"{self.passed} passed", f"{self.failed} failed"]
        if self.errors:
            bits.append(f"{self.errors} errors")
        if self.skipped:
            bits.append(f"{self.skipped} skipped")
        return ", ".join(bits)


TestRunner = Callable[[Path, list[str]], TestRun]


@dataclass
class Unit:
    """One PR: a patch, or a Group: of patches, and the earlier patches it needs."""

    name: str
    members: list[Patch]
    deps: list[Patch]

    @property
    def branch(self) -> str:
        return BRANCH_PREFIX + self.name

    @property
    def patches(self) -> list[Patch]:
        """Everything on the branch, deps first, in series order."""
        return self.deps + self.members


@dataclass
class SplitResult:
    unit: Unit
    base: str
    base_rev: str
    ok: bool
    head: str = ""
    error: str = ""
    tests: TestRun | None = None
    skipped_tests: list[str] = field(default_factory=list)
    description: Path | None = None
    dep_units: list[str] = field(default_factory=list)
    dep_reasons: dict[str, list[str]] = field(default_factory=dict)
    applied: str = ""  # "exact" (git am) or "three-way" (git am -3)
    base_version: str = ""
    base_tag: str = ""
    change: str = ""  # one line: unchanged / changed (...) / new, against the previous split
    range_diff: Path | None = None
    placed_tests: list[str] = field(default_factory=list)  # test files placed in upstream's tree
    test_ids: list[str] = field(default_factory=list)  # the tests as run on the branch
    warnings: list[str] = field(default_factory=list)  # description wording to reword


def unit_name(doc: Patch) -> str:
    """The unit a patch belongs to: its Group: or its stem. It names a branch, a directory and
    a file under the split's out dir, so it must be a plain name (the linter checks it too)."""
    if doc.group is None:
        return safe_name(doc.stem, f"{doc.name}: file stem")
    return safe_name(
        doc.group,
        f"{doc.name}: Group:",
        hint="a Group: value names a branch and a directory: use letters, digits, '.', '_', "
        "'+' and '-' only",
    )


def plan_units(docs: Sequence[Patch], only: Sequence[str] | None = None) -> list[Unit]:
    """Units in series order with their dependency closure (declared + derived from overlaps)."""
    deps = derived_dependencies(docs)
    order = {d.name: i for i, d in enumerate(docs)}
    groups: dict[str, list[Patch]] = {}
    for d in docs:
        groups.setdefault(unit_name(d), []).append(d)
    units: list[Unit] = []
    for name, members in groups.items():
        member_names = {m.name for m in members}
        need: set[str] = set()
        for m in members:
            need |= dependency_closure(m.name, deps)
        need -= member_names
        dep_docs = sorted((d for d in docs if d.name in need), key=lambda d: order[d.name])
        units.append(Unit(name, members, dep_docs))
    if only:
        wanted = set(only)
        picked = [
            u
            for u in units
            if u.name in wanted or any(m.name in wanted or m.stem in wanted for m in u.members)
        ]
        known = {u.name for u in units} | {m.name for u in units for m in u.members}
        known |= {m.stem for u in units for m in u.members}
        unknown = sorted(wanted - known)
        if unknown:
            raise SeriesError(
                f"no patch or group named {', '.join(unknown)}",
                hint="choose from: " + ", ".join(u.name for u in units),
            )
        units = picked
    return units


def unit_of(units_all: Sequence[Unit], patch_name: str) -> str | None:
    for u in units_all:
        if any(m.name == patch_name for m in u.members):
            return u.name
    return None


# ---------------------------------------------------------------------------------------------
# git


def _git(
    repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return gitops.run(
        repo,
        *args,
        env=env,
        check=check,
        hint="check the repository state (git status) and run the split again",
    )


def _committer_env(repo: Path, patch_text: str = "") -> dict[str, str]:
    """Committer for REPO's new commits: its git identity, else the patch's author (the
    commits go upstream, so no name of this tooling stands in for a missing identity)."""
    name, addr = email.utils.parseaddr(
        str(email.message_from_string(patch_text.split("\n\n", 1)[0]).get("From", ""))
    )
    env: dict[str, str] = {}
    if _git(repo, "config", "user.name", check=False).returncode != 0:
        env["GIT_COMMITTER_NAME"] = name or "split"
    if _git(repo, "config", "user.email", check=False).returncode != 0:
        env["GIT_COMMITTER_EMAIL"] = addr or "split@localhost"
    return env


def _rev(repo: Path, rev: str) -> str | None:
    proc = _git(repo, "rev-parse", "-q", "--verify", f"{rev}^{{commit}}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def resolve_base(
    repo: Path,
    base: str,
    *,
    pin_version: str,
    pin_tag: str,
    pin_commit: str | None,
    fetch_release: Callable[[str], Path] | None = None,
) -> tuple[str, str]:
    """(label, commit) of the base in REPO; a release missing there is materialized and fetched."""
    if base in ("pin", pin_version):
        for cand in (pin_tag, pin_commit):
            if cand and (sha := _rev(repo, cand)):
                return f"pin {pin_version}", sha
        raise SeriesError(
            f"{repo} has neither tag {pin_tag} nor the pin commit {pin_commit or '(unresolved)'}",
            hint="split a materialized pin (scripts/fetch-upstream.sh DEST) or a clone of "
            "sgl-project/sglang with its tags",
        )
    tag = base if base.startswith("v") else f"v{base}"
    sha = _rev(repo, tag)
    if sha is None and fetch_release is not None:
        src = fetch_release(base.lstrip("v"))
        _git(repo, "fetch", "-q", "--no-tags", str(src), f"refs/tags/{tag}:refs/tags/{tag}")
        sha = _rev(repo, tag)
    if sha is None:
        raise SeriesError(
            f"{repo} has no tag {tag}", hint="use --base pin, or a version listed in upstream.lock"
        )
    return f"release {tag}", sha


def auto_base(unit: Unit, report: Path, fallback: str = "pin") -> str:
    """Newest release where every patch of the branch applies (per the rebase-check matrix
    REPORT); FALLBACK (the release the series is made on) when none is newer."""
    if not report.is_file():
        return fallback
    data = json.loads(report.read_text())
    verdicts: dict[str, dict[str, str]] = data.get("verdicts", {})
    best = fallback
    for rel in data.get("releases", []):
        if all(verdicts.get(p.name, {}).get(rel) in APPLIES for p in unit.patches):
            best = rel
    return best


def strip_trailers(text: str, drop: Sequence[str] = INTERNAL_TRAILERS) -> str:
    """TEXT (a format-patch file) without the trailers named in DROP in its message's last
    paragraph (continuation lines included); the diff and every other line are kept."""
    lines = text.split("\n")
    try:
        start, end = message_lines(lines)
    except ValueError:
        return text
    message = lines[start:end]
    last = len(message)
    while last > 0 and not message[last - 1].strip():
        last -= 1
    first = last
    while first > 0 and message[first - 1].strip():
        first -= 1
    para = message[first:last]
    if not para or not parse_trailers("\n".join(para)):
        return text
    wanted = {k.lower() for k in drop}
    kept: list[str] = []
    dropping = False
    for ln in para:
        if ln[:1] in (" ", "\t"):
            if not dropping:
                kept.append(ln)
            continue
        key = ln.split(":", 1)[0].strip().lower()
        dropping = key in wanted
        if not dropping:
            kept.append(ln)
    body = message[:first]
    while body and not body[-1].strip():
        body.pop()
    if kept:
        body += ["", *kept] if body else kept
    tail = message[last:]
    new_message = body + (tail if tail else [""])
    return "\n".join(lines[:start] + new_message + lines[end:])


@dataclass
class BranchOutcome:
    ok: bool
    head: str = ""
    error: str = ""
    applied: str = ""  # "exact" or "three-way"


def make_branch(
    repo: Path,
    unit: Unit,
    base_rev: str,
    worktree: Path,
    *,
    owner: Path,
    three_way_fallback: bool = False,
    patch_files: Sequence[Path] | None = None,
) -> BranchOutcome:
    """Commits for ``unit.branch`` at BASE_REV with the unit's patches (or PATCH_FILES, the same
    patches prepared for the branch) via ``git am``: exactly; when that fails and
    THREE_WAY_FALLBACK, again with ``-3``. The commits are made in WORKTREE (detached, left
    there for the tests); no branch is moved here (split moves every branch at once, once all
    are built: split_guard.Transaction). WORKTREE is re-created; it must lie inside OWNER (the
    split's out dir), checked first."""
    worktree = inside(worktree, owner)
    if worktree.exists() or worktree.is_symlink():
        _git(repo, "worktree", "remove", "--force", str(worktree), check=False)
        remove_tree_inside(worktree, owner)
    _git(repo, "worktree", "prune")
    worktree.parent.mkdir(parents=True, exist_ok=True)
    # detached: the branch is set once its commits exist, and is never checked out here, so
    # a split into another out dir (or a failed one) cannot lock or half-rewrite it
    _git(repo, "worktree", "add", "-q", "-f", "--detach", str(worktree), base_rev)
    files = [str(Path(p).resolve()) for p in (patch_files or [d.path for d in unit.patches])]
    # --keep-non-patch keeps "[Quant]" in subjects; the committer date is the author date so
    # that the same patches on the same base give the same commits
    args = ["am", "-q", "--keep-cr", "--keep-non-patch", "--committer-date-is-author-date"]
    attempts = [("exact", args)]
    if three_way_fallback:
        attempts.append(("three-way", [*args, "-3"]))
    error = ""
    for how, cmd in attempts:
        first = unit.patches[0].text if unit.patches else ""
        proc = _git(worktree, *cmd, *files, env=_committer_env(repo, first), check=False)
        if proc.returncode == 0:
            head = _git(worktree, "rev-parse", "HEAD").stdout.strip()
            return BranchOutcome(True, head, "", how)
        _git(worktree, "am", "--abort", check=False)
        _git(worktree, "reset", "-q", "--hard", base_rev, check=False)
        msg = (proc.stdout + proc.stderr).strip().splitlines()
        error = " | ".join(ln for ln in msg if ln.strip())[:800]
    return BranchOutcome(False, "", error, "")


# ---------------------------------------------------------------------------------------------
# tests


# Where a patch's CPU tests go in upstream's tree. A patch names them with ``Upstream-Tests:
# SRC=DEST`` entries (SRC: a file of its Tests:, DEST: its path in upstream's tree); without one,
# each Tests: file under tests/ goes to UPSTREAM_TEST_DIR under its own name. Its directory's
# conftest.py and the _*.py helpers it imports go with it, and tests/data/ (the checkpoint configs
# the tests parse) to the same place relative to them.
UPSTREAM_TEST_DIR = "test/registered/quant/nvfp4_marlin"
UPSTREAM_CI_SUITE = "base-a-test-cpu"  # SGLang's CPU suite (register_cpu_ci, v0.5.23)
_CI_FOOTER = """

# SGLang's CI collects this file by its registration and runs it as a script.
from sglang.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time={est}, suite="{suite}")

if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
"""


@dataclass
class TestPlacement:
    """A project test file and where it goes in upstream's tree."""

    source: str  # project-relative
    dest: str  # upstream-tree-relative


def test_placements(unit: Unit) -> list[TestPlacement]:
    """Where the unit's members' CPU Tests: files go in upstream's tree."""
    out: list[TestPlacement] = []
    seen: set[str] = set()
    for m in unit.members:
        declared: dict[str, str] = {}
        for entry in re.split(r"[,\s]+", m.trailers.get("Upstream-Tests", "")):
            if "=" in entry:
                src, dest = entry.split("=", 1)
                declared[src] = dest
        for t in m.tests():
            if re.match(r"^(gpu|bench):", t):
                continue
            src = t.split("::", 1)[0]
            if src in seen or not src.startswith("tests/"):
                continue
            seen.add(src)
            dest = declared.get(src, f"{UPSTREAM_TEST_DIR}/{Path(src).name}")
            out.append(TestPlacement(src, dest))
    return out


SHARED_TEST_HELPERS = "tests/sglang"  # the SGLang CPU harness every line's tests import


def _support_files(project: Path, src: Path) -> list[Path]:
    """conftest.py beside SRC and the modules SRC or they import, found beside it or in the
    shared SGLang CPU harness (SHARED_TEST_HELPERS): helpers, or another test file whose
    builders a test reuses. They are placed beside the test."""
    here = src.parent
    folders = [here, project / SHARED_TEST_HELPERS]
    found: list[Path] = []
    todo = [src] + ([here / "conftest.py"] if (here / "conftest.py").is_file() else [])
    while todo:
        f = todo.pop()
        if f != src and f not in found:
            found.append(f)
        text = f.read_text(encoding="utf-8")
        for name in re.findall(r"^\s*(?:from|import)\s+(\w+)", text, re.M) + re.findall(
            r"import_module\(\"(\w+)\"\)", text
        ):
            cand = next((d / f"{name}.py" for d in folders if (d / f"{name}.py").is_file()), None)
            if cand is not None and cand not in found and cand != src:
                todo.append(cand)
    return found


def runnable_by_upstream_ci(text: str) -> str:
    """A test file's text with SGLang's CI registration and a __main__ entry, when it has
    neither. The ``import pytest`` the entry needs goes beside it, not on top: a file may open
    with a docstring and ``from __future__`` imports, which must come first."""
    if re.search(r"^register_\w+_ci\(", text, re.M) or "__main__" in text:
        return text
    text = text.rstrip("\n") + "\n"
    if not re.search(r"^import pytest$", text, re.M):
        text += "\nimport pytest  # noqa: E402 (the entry below)\n"
    return text + _CI_FOOTER.format(est=60, suite=UPSTREAM_CI_SUITE)


def place_tests(
    unit: Unit, worktree: Path, project: Path, repo: Path
) -> tuple[list[str], dict[str, str], list[str]]:
    """Copy the unit's tests (and their support) into WORKTREE at their upstream paths, make
    each runnable by SGLang's CI (register_cpu_ci and a __main__ entry, when it has neither),
    and fold them into the branch's last commit (its author date kept as committer date).
    Returns (placed test files, {project path: upstream path} for every file copied,
    notes on what could not be placed)."""
    placed: list[str] = []
    mapping: dict[str, str] = {}
    notes: list[str] = []
    for pl in test_placements(unit):
        src = project / pl.source
        if not src.is_file():
            notes.append(f"{pl.source}: not in this project, not placed")
            continue
        dest = worktree / pl.dest
        if dest.exists():
            notes.append(f"{pl.dest} exists in the base, not overwritten")
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(runnable_by_upstream_ci(src.read_text(encoding="utf-8")), encoding="utf-8")
        mapping[pl.source] = pl.dest
        placed.append(pl.dest)
        for sup in _support_files(project, src):
            rel = sup.relative_to(project).as_posix()
            target = dest.parent / sup.name
            if not target.exists():
                target.write_bytes(sup.read_bytes())
            mapping.setdefault(rel, (Path(pl.dest).parent / sup.name).as_posix())
        data = src.parent.parent / "data"
        data_dest = dest.parent.parent / "data"
        if data.is_dir() and not data_dest.exists():
            for f in sorted(data.rglob("*")):
                if f.is_file():
                    t = data_dest / f.relative_to(data)
                    t.parent.mkdir(parents=True, exist_ok=True)
                    t.write_bytes(f.read_bytes())
            mapping.setdefault(
                data.relative_to(project).as_posix() + "/",
                (Path(pl.dest).parent.parent / "data").as_posix() + "/",
            )
    for rel in sorted(set(mapping.values())):
        f = worktree / rel
        if not f.is_file():
            continue
        hard, _ = description_problems(f.read_text(encoding="utf-8", errors="replace"))
        for h in hard[:3]:
            notes.append(f"{rel} (from this project's tests), {h}: reword it in the test")
        if len(hard) > 3:
            notes.append(f"{rel}: {len(hard) - 3} more such lines")
    if placed:
        _git(worktree, "add", "-A", "test")
        name, addr, date = (
            _git(worktree, "log", "-1", "--format=%cn%x00%ce%x00%aI")
            .stdout.strip("\n")
            .split("\x00")
        )
        env = {"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": addr, "GIT_COMMITTER_DATE": date}
        _git(worktree, "commit", "-q", "--amend", "--no-edit", "--no-verify", env=env)
    return placed, mapping, notes


def upstream_test_ids(tests: Sequence[str], mapping: dict[str, str]) -> list[str]:
    """Test ids of the project mapped to their placed upstream paths (unplaced ones dropped)."""
    out = []
    for t in tests:
        file, sep, rest = t.partition("::")
        if file in mapping:
            out.append(mapping[file] + sep + rest)
    return out


def runnable_tests(unit: Unit) -> tuple[list[str], list[str]]:
    """(CPU tests to run, GPU/bench entries that are not run here) of the unit's own patches."""
    run: list[str] = []
    skip: list[str] = []
    for m in unit.members:
        for t in m.tests():
            if re.match(r"^(gpu|bench):", t):
                skip.append(t)
            elif t not in run:
                run.append(t)
    return run, skip


def pytest_runner(python: str, project: Path) -> TestRunner:
    """Run pytest from the project root with the branch's python/ tree first on the path."""

    def run(worktree: Path, tests: list[str]) -> TestRun:
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "junit.xml"
            cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
            cmd += tests
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(worktree / "python"), env.get("PYTHONPATH", "")) if p
            )
            in_tree = all((worktree / t.split("::", 1)[0]).exists() for t in tests)
            cwd = worktree if in_tree else project
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
            tr = TestRun(
                [f"PYTHONPATH={worktree / 'python'}", python, "-m", "pytest", "-q", *tests],
                returncode=proc.returncode,
                tail="\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:]),
            )
            if junit.is_file():
                root = ET.parse(junit).getroot()
                suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
                for s in suites:
                    total = int(s.get("tests", 0))
                    tr.failed += int(s.get("failures", 0))
                    tr.errors += int(s.get("errors", 0))
                    tr.skipped += int(s.get("skipped", 0))
                    tr.passed += (
                        total
                        - int(s.get("failures", 0))
                        - int(s.get("errors", 0))
                        - int(s.get("skipped", 0))
                    )
            elif proc.returncode != 0:
                tr.errors += 1
            return tr

    return run


# ---------------------------------------------------------------------------------------------
# evidence and the PR description


def _without_trailers(message: str) -> str:
    """MESSAGE without its last paragraph when that is the trailers (series.parse_trailers)."""
    paras = re.split(r"\n\s*\n", message.strip("\n"))
    if len(paras) > 1 and parse_trailers(paras[-1]):
        return "\n\n".join(paras[:-1])
    return message


def _section(message: str, title: str) -> str:
    """Text under ``Title:`` in the patch message, up to the next known heading or trailers."""
    heads = r"(Why|What|How verified|Upstream-Status|Tests|Provides|Depends-On|Group|Rebased-From)"
    body = _without_trailers(message)
    m = re.search(rf"^{re.escape(title)}:[ \t]*\n?(.*?)(?=^{heads}:|\Z)", body, re.M | re.S)
    return m.group(1).strip() if m else ""


def numerics_paths(doc_files: Sequence[str]) -> set[str]:
    """Which numerics report ``path``s exercise a patch, from the files it touches.

    method: modelopt / ct (compressed-tensors) when the patch touches only that method's files,
    both otherwise; kind: moe / dense likewise (MoE files vs everything else).
    """
    joined = " ".join(doc_files)
    methods = {"modelopt", "ct"}
    if "modelopt" in joined and "compressed_tensors" not in joined:
        methods = {"modelopt"}
    elif "compressed_tensors" in joined and "modelopt" not in joined:
        methods = {"ct"}
    moe = [f for f in doc_files if "moe" in f]
    dense = [f for f in doc_files if "moe" not in f]
    kinds = {"dense", "moe"}
    if moe and not dense:
        kinds = {"moe"}
    elif dense and not moe and any("gemm/marlin/" in f for f in dense):
        kinds = {"dense"}
    return {f"{m}-{k}" for m in methods for k in kinds}


def _provenance(report: Path) -> str:
    """'<device>, <date>, made by `<command>`' from a GPU report's header (what it has)."""
    try:
        head = json.loads(report.read_text())
    except (OSError, ValueError):
        head = {}
    head = head if isinstance(head, dict) else {}
    bits = [str(head.get("device") or "GPU"), str(head.get("date") or "")[:10]]
    text = ", ".join(b for b in bits if b)
    command = str(head.get("command") or "")
    if command and not description_problems(command)[0]:
        text += f", made by `{command}`"
    elif command:  # this project's own tooling: not quoted, but said where the numbers come from
        text += ", measured by a GPU harness kept outside this PR that drives these SGLang layers"
    return text


def report_notes(report: Path) -> list[str]:
    """What a report quoted by a description lacks for upstream (its command, when the one it
    records names this project's tooling or machines and so is left out)."""
    try:
        head = json.loads(report.read_text())
    except (OSError, ValueError):
        return []
    command = str(head.get("command") or "") if isinstance(head, dict) else ""
    if command and description_problems(command)[0]:
        return [
            f"{report}: its command ({command[:80]}) speaks of this project, so the "
            "description quotes no command: record one a reviewer can run"
        ]
    return []


def _report_list(report: Path, key: str, what: str) -> list[Any] | str:
    """``report``'s top-level list ``key``, or the line to print instead of numbers."""
    if not report.is_file():
        return f"No GPU {what} results for this change on this base yet."
    try:
        items: list[Any] = json.loads(report.read_text()).get(key, [])
        return items
    except (json.JSONDecodeError, AttributeError) as exc:
        return f"The GPU {what} report could not be read ({exc}); no numbers quoted."


TURING_PTX = (
    "the same check with the Marlin kernels built as compute_75 PTX only (the Turing SM75 code "
    "path, JIT-compiled by the driver)"
)


def numerics_evidence(unit: Unit, report: Path, *, what: str = "") -> list[str]:
    """Lines for Accuracy Tests from reports/h200/numerics.json (``cases`` with ``rel_l2``);
    WHAT names another run of the same check (turing_ptx.json: TURING_PTX)."""
    cases = _report_list(report, "cases", "numerics")
    if isinstance(cases, str):
        return [cases]
    files = [f for m in unit.members for f in m.files]
    wanted = numerics_paths(files)
    picked = [c for c in cases if isinstance(c, dict) and c.get("path") in wanted]
    if not picked:
        return [f"The GPU accuracy run has no case for these layers ({', '.join(sorted(wanted))})."]
    out = [
        f"GPU accuracy{', ' + what if what else ''}, {_provenance(report)}: relative L2 error "
        "of the layer output "
        "against an fp32 reference computed from the same FP4 weights and scales, layers "
        f"{', '.join(sorted(wanted))} (templates: `patched` is the release with this change and "
        "the related NVFP4 Marlin changes it is sent with, the others the release without "
        "them):",
        "",
        "| path | templates | cases | max rel_l2 | worst case |",
        "|---|---|---|---|---|",
    ]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in picked:
        rows.setdefault((str(c.get("path")), str(c.get("templates", "patched"))), []).append(c)
    for (path, templ), cs in sorted(rows.items()):
        scored = [c for c in cs if isinstance(c.get("rel_l2"), int | float)]
        if not scored:
            out.append(f"| {path} | {templ} | {len(cs)} | n/a | |")
            continue
        worst = max(scored, key=lambda c: float(c["rel_l2"]))
        desc = ", ".join(f"{k}={worst[k]}" for k in ("dtype", "m", "n", "k", "bias") if k in worst)
        out.append(f"| {path} | {templ} | {len(cs)} | {float(worst['rel_l2']):.2e} | {desc} |")
    return out


KERNEL_SOURCE = re.compile(r"(\.(cu|cuh|h|hpp|cc|cpp|c)$|(^|/)(csrc|jit_kernel|kernels/jit)/)")
NO_KERNEL_CHANGE = (
    "No speed changes: this change touches no kernel source (CUDA/C++), so the kernels run "
    "as before and no kernel benchmark was run."
)


def changes_kernels(unit: Unit) -> bool:
    """Whether the unit edits kernel sources (CUDA/C++, SGLang's JIT kernel trees)."""
    return any(KERNEL_SOURCE.search(f) for m in unit.members for f in m.files)


def bench_evidence(unit: Unit, report: Path) -> list[str]:
    """Lines for Benchmarking from reports/h200/bench.json ``rows`` (times in microseconds)."""
    touches_speed = any("marlin" in f or "fp4" in f for m in unit.members for f in m.files) or any(
        t.startswith("bench:") for m in unit.members for t in m.tests()
    )
    if not touches_speed:
        return [
            "Not applicable: this change does not touch a kernel or a GEMM path; no speed "
            "impact expected."
        ]
    declared = any(t.startswith("bench:") for m in unit.members for t in m.tests())
    if not declared and not changes_kernels(unit):
        return [NO_KERNEL_CHANGE]
    rows = _report_list(report, "rows", "benchmark")
    if isinstance(rows, str):
        return [rows]
    rows = [r for r in rows if isinstance(r, dict) and isinstance(r.get("fp4_us"), int | float)]
    if not rows:
        return [f"{report.name} has no rows with fp4_us."]

    def ratio(r: dict[str, Any], key: str) -> str:
        v = r.get(key)
        return f"{float(v) / float(r['fp4_us']):.2f}" if isinstance(v, int | float) else "n/a"

    ms = sorted({r.get("m") for r in rows if isinstance(r.get("m"), int)})
    keep_m = {m for m in ms if m in (1, 16, 128, 1024)} or set(ms[:4])
    shown = [r for r in rows if r.get("m") in keep_m][:16]
    out = [
        f"Kernel times, {_provenance(report)}, {len(rows)} rows; ratios > 1 mean FP4 "
        "Marlin is faster "
        "(roofline: fraction of the HBM bound reached):",
        "",
        "| shape | M | fp4 us | bf16/fp4 | int4/fp4 | roofline/fp4 | upstream/fp4 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in shown:
        ratios = " | ".join(
            ratio(r, k) for k in ("bf16_us", "int4_us", "roofline_us", "upstream_fp4_us")
        )
        out.append(f"| {r.get('shape')} | {r.get('m')} | {float(r['fp4_us']):.1f} | {ratios} |")
    return out


def _diffstat(doc: Patch) -> list[str]:
    out = []
    for f in doc.changes:
        add = sum(len(h.added()) for h in f.hunks)
        rem = sum(len(h.removed()) for h in f.hunks)
        what = " (new)" if f.is_new else " (deleted)" if f.is_deleted else ""
        out.append(f"- `{f.new_path or f.old_path}`{what}: +{add} −{rem}")
    return out


UPSTREAM_TEST_DIRS = ("test/", "python/sglang/test/")

# Upstream work a change follows or mirrors, cited in its Motivation. A patch names its own with
# a ``Related:`` trailer (``Related: sgl-project/sglang#35020, vllm-project/vllm#29901``); these
# are the ones known for patches whose headers do not say yet, by the patch's stem (no number).
RELATED_WORK = {
    "sgl-project/sglang#35020": "the same bias-ordering bug fixed for dense FP8 Marlin "
    '("Correct dense FP8 Marlin bias ordering"); this is its NVFP4 counterpart',
    "vllm-project/vllm#29901": "vLLM's Marlin path for Turing (SM75), whose approach this follows",
}
RELATED_BY_STEM = {
    "nvfp4-marlin-add-the-linear-bias-in-its-original-order": ["sgl-project/sglang#35020"],
    "marlin-fp4-w4a16-path-for-turing-sm75-fp16": ["vllm-project/vllm#29901"],
    "marlin-fp4-turing-sm75": ["vllm-project/vllm#29901"],
}


def related_work(unit: Unit) -> list[str]:
    """The upstream/vLLM PRs the unit's patches cite (``Related:``, else RELATED_BY_STEM)."""
    out: list[str] = []
    for m in unit.members:
        raw = m.trailers.get("Related", "")
        refs = [x for x in re.split(r"[,\s]+", raw) if x] or RELATED_BY_STEM.get(m.stem, [])
        out += [r for r in refs if r not in out]
    return out


def _link(ref: str) -> str:
    m = re.match(r"^([\w.-]+/[\w.-]+)#(\d+)$", ref)
    return f"[{ref}](https://github.com/{m.group(1)}/pull/{m.group(2)})" if m else ref


def upstream_tests(unit: Unit, placed: Sequence[str] = ()) -> list[str]:
    """Test files the branch carries in upstream's test tree: the unit's own patches' files
    there, and PLACED (the project tests split placed in that tree)."""
    own = [f for m in unit.members for f in m.files if f.startswith(UPSTREAM_TEST_DIRS)]
    return own + [f for f in placed if f not in own]


# What a description for upstream must not contain: this project's name, how it is built and
# run, and its own paths (hard: split fails), and wording that speaks of this project's series
# or contradicts the results quoted (soft: listed for the patch's author to reword).
_HARD = (
    (r"fp4series", "names this project"),
    (r"\b(2|two)-core\b|\bshared\b[^.\n]*\bmachine\b", "names build machines"),
    (
        r"device (time|calls?)|\$OUT\b|\bgpu-proof\b|\bmake-bundle\b|\bscripts/device/",
        "names GPU logistics",
    ),
    (
        r"(^|[\s`(])\.work/|(^|[\s`(])tests/(sglang[\w.-]*|gpu|tooling|serve)/",
        "names a path of this project",
    ),
)
_SOFT = (
    (r"\b(the|this|our) series\b", "speaks of a patch series"),
    (r"\bdownstream (series|project|patch(es)?|tests?)\b", "calls itself downstream"),
    (r"\b(previous|next) patch\b|\bpatch \d+\b|\bthe [A-Z]\w* patch\b", "names another patch"),
    (r"\bnot (yet )?(re-?)?(run|measured)\b", "says something was not run"),
    (r"\bthe line's\b|\bthis line\b", "speaks of a maintained line"),
)


def description_problems(text: str) -> tuple[list[str], list[str]]:
    """(hard, soft) problems of a PR description, each 'line N: why: the text'."""
    hard: list[str] = []
    soft: list[str] = []
    for no, line in enumerate(text.splitlines(), 1):
        for rules, into in ((_HARD, hard), (_SOFT, soft)):
            for pattern, why in rules:
                if re.search(pattern, line, re.I):
                    into.append(f"line {no}: {why}: {line.strip()[:120]}")
    return hard, soft


def pr_title(unit: Unit) -> str:
    if len(unit.members) == 1:
        return unit.members[0].subject
    return f"[Quant] {unit.name}: " + "; ".join(
        re.sub(r"^\[[^\]]+\]\s*", "", m.subject) for m in unit.members
    )


_DEP_WORDS = (
    (re.compile(r"^declared in Depends-On$"), "uses what it adds"),
    (re.compile(r"^edits lines it wrote in (\S+)$"), r"changes lines it adds in `\1`"),
    (re.compile(r"^context lines it wrote in (\S+)$"), r"edits next to lines it adds in `\1`"),
)


def _dep_reason(reason: str, own_stems: Sequence[str]) -> str:
    """A dependency reason (fp4series.overlap's, prefixed with the member's stem) in words for
    upstream: no trailer names, no stems."""
    for stem in own_stems:
        if reason.startswith(stem + " "):
            reason = reason[len(stem) + 1 :]
            break
    for pattern, words in _DEP_WORDS:
        if pattern.match(reason):
            return pattern.sub(words, reason)
    return reason


def _test_command(result: SplitResult, tests: Sequence[str]) -> str:
    return "python3 -m pytest -q " + " ".join(result.test_ids or tests)


def pr_description(result: SplitResult, *, reports_dir: Path) -> str:
    """A PR description in SGLang's template (Motivation, Modifications, Accuracy Tests, Speed
    Tests and Profiling, Checklist), addressed to upstream: from the patch's Why:/What:, the
    tests the branch carries in upstream's test tree and this split's run of them, and the GPU
    reports in REPORTS_DIR with the command that made them."""
    unit = result.unit
    lines: list[str] = [f"<!-- {pr_title(unit)} -->", "", "## Motivation", ""]
    for m in unit.members:
        if len(unit.members) > 1:
            lines += [f"**{m.subject}**", ""]
        lines += [_section(m.message, "Why") or m.subject, ""]
    related = related_work(unit)
    if related:
        lines += ["Related work:", ""]
        lines += [f"- {_link(r)}" + (f": {RELATED_WORK[r]}" if r in RELATED_WORK else "")
                  for r in related] + [""]  # fmt: skip
    if result.dep_units:
        lines += ["Depends on (merge those first; until they land this branch also carries "
                  "their commits):", ""]  # fmt: skip
        own = [m.stem for m in unit.members]
        for d in result.dep_units:
            why = "; ".join(
                dict.fromkeys(_dep_reason(r, own) for r in result.dep_reasons.get(d, []))
            )
            lines.append(
                f"- depends on #<PR of `{BRANCH_PREFIX}{d}`>" + (f": {why}" if why else "")
            )
        lines.append("")
    lines += ["## Modifications", ""]
    for m in unit.members:
        if len(unit.members) > 1:
            lines += [f"**{m.subject}**", ""]
        lines += [_section(m.message, "What") or m.subject, ""]
        lines += ["Files:", *_diffstat(m), ""]
    if result.placed_tests:
        lines += ["Tests added:", *[f"- `{t}` (new)" for t in result.placed_tests], ""]
    lines += ["## Accuracy Tests", ""]
    tests = upstream_tests(unit, result.placed_tests)
    if tests:
        lines += [
            "Unit tests (CPU only: the device capability and the CUDA ops are mocked, the "
            "rest is SGLang's own code):",
            "",
            "```",
            _test_command(result, tests),
            "```",
            "",
        ]
    if result.tests is not None:
        t = result.tests
        verdict = "pass" if t.ok else "FAIL"
        lines += [f"On this branch ({result.head[:12]}, on {result.base}): {verdict}, "
                  f"{t.summary()}.", ""]  # fmt: skip
    numbers = numerics_evidence(unit, reports_dir / "numerics.json")
    lines += numbers + [""]
    turing = reports_dir / "turing_ptx.json"
    if changes_kernels(unit) and turing.is_file():
        lines += numerics_evidence(unit, turing, what=TURING_PTX) + [""]
    lines += ["## Speed Tests and Profiling", ""]
    speed = bench_evidence(unit, reports_dir / "bench.json")
    lines += speed + [""]
    # accuracy numbers, and speed numbers unless no kernel changed (then there are none to give)
    has_numbers = any(ln.startswith("| ") for ln in numbers) and (
        any(ln.startswith("| ") for ln in speed)
        or speed[0] == NO_KERNEL_CHANGE
        or speed[0].startswith("Not applicable")
    )
    tests_pass = bool(tests) and (result.tests is None or result.tests.ok)
    box = lambda ok: "x" if ok else " "  # noqa: E731
    lines += [
        "## Checklist",
        "",
        f"- [ ] Format your code according to the [Format code with pre-commit]"
        f"({DOCS}#format-code-with-pre-commit).",
        f"- [{box(tests_pass)}] Add unit tests according to the [Run and add unit tests]"
        f"({DOCS}#run-and-add-unit-tests).",
        f"- [ ] Update documentation according to [Write documentations]"
        f"({DOCS}#write-documentations).",
        f"- [{box(has_numbers)}] Provide accuracy and speed benchmark results according to "
        f"[Test the accuracy]({DOCS}#test-the-accuracy) and [Benchmark the speed]"
        f"({DOCS}#benchmark-the-speed).",
        f"- [ ] Follow the SGLang code style [guidance]({DOCS}#code-style-guidance).",
        "",
    ]
    return "\n".join(lines)


def push_commands(repo: Path, result: SplitResult, body: Path, remote: str) -> list[str]:
    title = pr_title(result.unit).replace("'", "'\\''")
    return [
        f"git -C {repo} push {remote} {result.unit.branch}",
        f"gh pr create --repo {UPSTREAM_REPO} --base main --head <your-fork-owner>:"
        f"{result.unit.branch} --title '{title}' --body-file {body}",
    ]


# ---------------------------------------------------------------------------------------------
# the record of what was generated, and the range-diff against the last split


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_record(out_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """``<out_dir>/split-record.json`` (empty when there is none). An unreadable record is set
    aside as ``split-record.json.unreadable`` (and said so): every branch then counts as new."""
    path = out_dir / RECORD_FILE
    empty: dict[str, Any] = {"schema": RECORD_SCHEMA, "branches": []}
    if not path.is_file():
        return empty
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("branches"), list):
            raise ValueError("no `branches` list")
        return data
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        aside = path.with_name(RECORD_FILE + ".unreadable")
        os.replace(path, aside)
        log(f"{path}: unreadable ({exc}); moved to {aside}, every branch counts as new")
        return empty


def write_record(out_dir: Path, record: dict[str, Any]) -> Path:
    """Write the record atomically (a rename), so an interrupted split leaves the old one."""
    path = inside(out_dir / RECORD_FILE, out_dir)
    write_atomically(path, (json.dumps(record, indent=2) + "\n").encode())
    return path


def _unit_ref(repo: Path, unit: Unit, which: str) -> str:
    ref = f"{REF_PREFIX}{unit.name}/{which}"
    if _git(repo, "check-ref-format", ref, check=False).returncode != 0:
        raise SeriesError(
            f"{unit.name!r} cannot name the git ref {ref}",
            hint="rename the patch or its Group: (no '..', no trailing '.lock')",
        )
    return ref


def record_entry(res: SplitResult, *, trailers_kept: bool, when: str) -> dict[str, Any]:
    """What the record keeps about one generated branch."""
    members = {m.name for m in res.unit.members}
    patches = []
    for d in res.unit.patches:
        ident = patch_identity(d.path)
        patches.append(
            {
                "name": d.name,
                "role": "member" if d.name in members else "dependency",
                "sha256": ident.sha256,
                "patch_id": ident.patch_id,
            }
        )
    tests = None
    if res.tests is not None:
        t = res.tests
        tests = {"passed": t.passed, "failed": t.failed, "errors": t.errors,
                 "skipped": t.skipped, "ok": t.ok}  # fmt: skip
    return {
        "unit": res.unit.name,
        "branch": res.unit.branch,
        "base": {
            "label": res.base,
            "version": res.base_version,
            "tag": res.base_tag,
            "commit": res.base_rev,
        },
        "patches": patches,
        "head": res.head,
        "applied": res.applied,
        "trailers": "kept" if trailers_kept else "stripped",
        "tests": tests,
        "description": res.description.name if res.description else None,
        "when": when,
        "change": res.change,
    }


_RANGE_DIFF_LINE = re.compile(r"^\s*(?:\d+|-):\s+\S+ ([=!<>]) +(?:\d+|-):\s+\S+")


def compare_with_previous(
    repo: Path, res: SplitResult, prev: dict[str, Any] | None, entry: dict[str, Any]
) -> tuple[str, str]:
    """(one-line summary, range-diff text or "") of RES's branch against PREV, its entry in the
    last record. The previous commits must be in REPO (split keeps them on its refs)."""
    if prev is None or prev.get("branch") != res.unit.branch:
        return "new (no previous split of this branch in the record)", ""
    old_base = str((prev.get("base") or {}).get("commit", ""))
    old_head = str(prev.get("head", ""))
    old_label = str((prev.get("base") or {}).get("label", old_base[:12]))
    moved = "" if old_base == res.base_rev else f"; base {old_label} -> {res.base}"
    when = prev.get("when", "?")
    if not (old_base and old_head and _rev(repo, old_head) and _rev(repo, old_base)):
        same = old_base == res.base_rev and [
            (x.get("name"), x.get("patch_id")) for x in prev.get("patches", [])
        ] == [(x["name"], x["patch_id"]) for x in entry["patches"]]
        what = "unchanged" if same else "changed"
        return (
            f"{what} since the split of {when} by the record (its commits {old_head[:12]} are "
            f"not in {repo}: no range-diff{moved})",
            "",
        )
    rd = _git(
        repo,
        "range-diff",
        "--no-color",
        # one commit per patch: pair an edited patch with its old self even when the edit is
        # most of a small diff (git's default, 60, shows it as removed + added)
        f"--creation-factor={RANGE_DIFF_CREATION_FACTOR}",
        f"{old_base}..{old_head}",
        f"{res.base_rev}..{res.head}",
    ).stdout
    marks = [m.group(1) for ln in rd.splitlines() if (m := _RANGE_DIFF_LINE.match(ln))]
    changed, added, removed = marks.count("!"), marks.count(">"), marks.count("<")
    if not (changed or added or removed or moved):
        return f"unchanged since the split of {when}", rd
    counts = f"{changed} commit(s) changed, {added} added, {removed} removed"
    return f"changed since the split of {when}: {counts}{moved}", rd


# ---------------------------------------------------------------------------------------------
# driver


def _base_names(want: str, pin_version: str, pin_tag: str) -> tuple[str, str]:
    """(version, tag) of a --base value that resolve_base accepted."""
    if want in ("pin", pin_version):
        return pin_version, pin_tag
    tag = want if want.startswith("v") else f"v{want}"
    return tag[1:], tag


def split(
    repo: Path,
    docs: Sequence[Patch],
    *,
    base: str,
    pin_version: str,
    pin_tag: str,
    pin_commit: str | None,
    out_dir: Path,
    reports_dir: Path,
    only: Sequence[str] | None = None,
    runner: TestRunner | None = None,
    fetch_release: Callable[[str], Path] | None = None,
    rebase_report: Path | None = None,
    series_base: str | None = None,
    keep_trailers: bool = False,
    force: Sequence[str] = (),
    place_upstream_tests: bool = True,
    project: Path | None = None,
    log: Callable[[str], None] = print,
) -> list[SplitResult]:
    """Create one branch per unit, run its tests (when RUNNER), write its PR description, the
    record and, for a branch split before, its range-diff against that split.

    All or nothing (split_guard): every branch and out-dir file is checked first (a user's is
    refused unless FORCE names it), the branches are built detached and moved in one ref
    transaction only when every unit applied, the files are renamed into place after that and
    the record last; a failure at any step leaves the user's branches and files as they were.

    SERIES_BASE: the release the series is made on (default: the pin); on it the patches must
    apply exactly, on any other base a patch that does not falls back to ``git am -3``."""
    units_all = plan_units(docs)
    reasons = explain_dependencies(docs)
    units = plan_units(docs, only) if only else units_all
    out_dir.mkdir(parents=True, exist_ok=True)
    own_version = (series_base or pin_version).lstrip("v")
    record = load_record(out_dir, log)
    previous = {str(e.get("unit")): e for e in record["branches"] if isinstance(e, dict)}
    entries: dict[str, dict[str, Any]] = dict(previous)
    claims = guard.preflight(
        repo,
        out_dir,
        [(u.branch, f"{REF_PREFIX}{u.name}/head") for u in units],
        [n for u in units for n in (f"{u.name}.md", f"{u.name}.range-diff.txt")] + ["summary.json"],
        [out_dir / "worktrees" / u.name for u in units],
        record,
        force,
    )
    guard.pause("planned")
    tags_before = _tags(repo)
    txn = guard.Transaction(repo, out_dir, claims, log)
    try:
        results = _build_all(
            repo, docs, units, units_all, reasons, txn,
            base=base, pin_version=pin_version, pin_tag=pin_tag, pin_commit=pin_commit,
            out_dir=out_dir, reports_dir=reports_dir, runner=runner,
            fetch_release=fetch_release, rebase_report=rebase_report, series_base=series_base,
            own_version=own_version, keep_trailers=keep_trailers, previous=previous,
            entries=entries, log=log, place_upstream_tests=place_upstream_tests,
            project=project,
        )  # fmt: skip
        failed = [r for r in results if not r.ok]
        if failed:
            log(
                f"no branch was created or moved and no file written: {len(failed)} of "
                f"{len(results)} branch(es) did not apply ("
                + ", ".join(r.unit.branch for r in failed)
                + "); fix those patches (or pick a --base where they apply) and run again"
            )
            _drop_new_tags(repo, tags_before, log)
            return results
        if not only:
            gone = [name for name in entries if name not in {u.name for u in units_all}]
            for name in gone:
                log(f"{BRANCH_PREFIX}{name}: in the last record, no longer in the series (dropped)")
                del entries[name]
        txn.write("summary.json", json.dumps(summary_rows(results), indent=2) + "\n")
        txn.commit()
        owned = {k: v for k, v in guard.recorded_outputs(record).items() if v}
        owned.update(guard.pending_outputs(out_dir))
        owned = {k: v for k, v in owned.items() if k not in txn.removals}
        owned.update(txn.written)
        order = {u.name: i for i, u in enumerate(units_all)}
        write_record(
            out_dir,
            {
                "schema": RECORD_SCHEMA,
                "repo": str(repo),
                "series": str(Path(docs[0].path).parent) if docs else "",
                "series_base": own_version,
                "updated": _now(),
                "branches": sorted(
                    entries.values(), key=lambda e: order.get(str(e.get("unit")), 1 << 30)
                ),
                "outputs": dict(sorted(owned.items())),
            },
        )
        txn.done()
        txn.keep_forced_files()
        return results
    except BaseException:
        txn.rollback()
        _drop_new_tags(repo, tags_before, log)
        log("split stopped: no branch was created or moved and the out dir is as it was")
        raise
    finally:
        txn.close()


def _tags(repo: Path) -> dict[str, str]:
    out = _git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/tags").stdout
    return dict(ln.split(" ", 1) for ln in out.splitlines() if " " in ln)


def _drop_new_tags(repo: Path, before: dict[str, str], log: Callable[[str], None]) -> None:
    """Remove the release tags this split fetched into REPO (a failed split leaves nothing)."""
    for ref, sha in _tags(repo).items():
        if ref not in before:
            _git(repo, "update-ref", "-d", ref, sha, check=False)
            log(f"{ref}: fetched by this split, removed again")


def _build_all(
    repo: Path,
    docs: Sequence[Patch],
    units: Sequence[Unit],
    units_all: Sequence[Unit],
    reasons: dict[str, dict[str, list[str]]],
    txn: guard.Transaction,
    *,
    base: str,
    pin_version: str,
    pin_tag: str,
    pin_commit: str | None,
    out_dir: Path,
    reports_dir: Path,
    runner: TestRunner | None,
    fetch_release: Callable[[str], Path] | None,
    rebase_report: Path | None,
    series_base: str | None,
    own_version: str,
    keep_trailers: bool,
    previous: dict[str, dict[str, Any]],
    entries: dict[str, dict[str, Any]],
    log: Callable[[str], None],
    place_upstream_tests: bool = True,
    project: Path | None = None,
) -> list[SplitResult]:
    """Build each unit's commits (detached), run its tests, stage its description, range-diff
    and ref moves in TXN; nothing outside the worktrees is written here."""
    results: list[SplitResult] = []
    for unit in units:
        want = base
        if base == "auto":
            want = auto_base(
                unit, rebase_report or Path("reports/rebase-check.json"), series_base or "pin"
            )
        label, rev = resolve_base(
            repo,
            want,
            pin_version=pin_version,
            pin_tag=pin_tag,
            pin_commit=pin_commit,
            fetch_release=fetch_release,
        )
        version, tag = _base_names(want, pin_version, pin_tag)
        head_ref, prev_ref = _unit_ref(repo, unit, "head"), _unit_ref(repo, unit, "previous")
        with tempfile.TemporaryDirectory(prefix="split-mbox-") as mbox_dir:
            files = [d.path for d in unit.patches]
            if not keep_trailers:
                files = []
                for d in unit.patches:
                    clean = Path(mbox_dir) / d.name
                    clean.write_text(strip_trailers(d.text), encoding="utf-8")
                    files.append(clean)
            wt = out_dir / "worktrees" / unit.name
            outcome = make_branch(
                repo,
                unit,
                rev,
                wt,
                owner=out_dir,
                three_way_fallback=version != own_version,
                patch_files=files,
            )
        guard.pause("branch-built")
        dep_units: list[str] = []
        dep_reasons: dict[str, list[str]] = {}
        for d in unit.deps:
            du = unit_of(units_all, d.name)
            if du and du not in dep_units:
                dep_units.append(du)
            for m in unit.members:
                for r in reasons.get(m.name, {}).get(d.name, []):
                    dep_reasons.setdefault(du or d.stem, []).append(f"{m.stem} {r}")
        res = SplitResult(
            unit,
            label,
            rev,
            outcome.ok,
            outcome.head,
            outcome.error,
            dep_units=dep_units,
            dep_reasons=dep_reasons,
            applied=outcome.applied,
            base_version=version,
            base_tag=tag,
        )
        run, skip = runnable_tests(unit)
        res.skipped_tests = skip
        if res.ok and place_upstream_tests:
            placed, mapping, notes = place_tests(unit, wt, project or Path.cwd(), repo)
            res.placed_tests = placed
            res.head = _git(wt, "rev-parse", "HEAD").stdout.strip()
            for n in notes:
                log(f"{unit.branch}: test placement: {n}")
            res.warnings += notes
            run = upstream_test_ids(run, mapping) or run
            res.test_ids = [t for t in run if t.split("::", 1)[0] in placed]
        if res.ok and runner is not None and run:
            res.tests = runner(wt, run)
        text = pr_description(res, reports_dir=reports_dir)
        hard, soft = description_problems(text)
        soft += [n for r in ("numerics.json", "bench.json") for n in report_notes(reports_dir / r)]
        res.warnings += soft
        for w in soft:
            log(f"{unit.branch}: PR description, reword in the patch header: {w}")
        if hard and res.ok:
            res.ok = False
            res.error = (
                "its PR description speaks of this project, not to upstream ("
                + "; ".join(hard)
                + "): reword the patch's Why:/What: (or the reports it quotes) and split again"
            )
        res.description = txn.write(f"{unit.name}.md", text)
        results.append(res)
        names = ", ".join(p.name for p in unit.patches)
        if not res.ok:
            log(f"{unit.branch}: FAILED on {label}: {res.error}")
            continue
        how = " (with 3-way merges)" if res.applied == "three-way" else ""
        tests = f"; tests: {res.tests.summary()}" if res.tests else ""
        log(f"{unit.branch}: {len(unit.patches)} commit(s) on {label}{how} [{names}]{tests}")
        log(f"  PR description: {res.description}")
        entry = record_entry(res, trailers_kept=keep_trailers, when=_now())
        entry["upstream_tests"] = res.placed_tests
        entry["description_warnings"] = res.warnings
        prev = previous.get(unit.name)
        res.change, rd = compare_with_previous(repo, res, prev, entry)
        entry["change"] = res.change
        name = f"{unit.name}.range-diff.txt"
        if rd:
            res.range_diff = txn.write(name, rd)
            entry["range_diff"] = name
        else:
            txn.remove(name)  # a stale one from an earlier split would mislead
        if prev is not None and prev.get("head") and _rev(repo, str(prev["head"])):
            txn.set_ref(prev_ref, str(prev["head"]))
        txn.set_branch(unit.branch, res.head, head_ref)
        txn.set_ref(head_ref, res.head)
        log(f"  {res.change}" + (f" (range-diff: {res.range_diff})" if res.range_diff else ""))
        if rd and not res.change.startswith("unchanged"):
            for ln in rd.rstrip("\n").splitlines():
                log(f"    {ln}")
        entries[unit.name] = entry
    return results


def summary_rows(results: Sequence[SplitResult]) -> list[dict[str, Any]]:
    """``summary.json``: one row per branch of this split."""
    rows = []
    for r in results:
        rows.append(
            {
                "branch": r.unit.branch,
                "patches": [p.name for p in r.unit.patches],
                "base": r.base,
                "base_commit": r.base_rev,
                "ok": r.ok,
                "head": r.head,
                "applied": r.applied,
                "error": r.error,
                "change": r.change,
                "range_diff": str(r.range_diff) if r.range_diff else None,
                "tests": None
                if r.tests is None
                else {
                    "passed": r.tests.passed,
                    "failed": r.tests.failed,
                    "errors": r.tests.errors,
                    "skipped": r.tests.skipped,
                    "ok": r.tests.ok,
                },
                "description": str(r.description),
                "depends_on_branches": [BRANCH_PREFIX + d for d in r.dep_units],
            }
        )
    return rows


def default_python(root: Path) -> str:
    env = os.environ.get("FP4SERIES_PYTHON")
    if env:
        return env
    venv = root / ".work" / "venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable
