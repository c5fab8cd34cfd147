"""Test runs: the whole suite (``test``) and "each prefix passes its tests" (``test-prefixes``).

Why prefixes: a series is reviewed, split and bisected one patch at a time, so patch k must not
lean on patch k+1. For each k this checks out the k-th series commit of ``.work/checkout`` as a
git worktree and runs the CPU tests named in the ``Tests:`` trailers of patches 1..k with
``PYTHONPATH=<worktree>/python``, so the prefix's SGLang shadows the installed (full-series)
one. ``gpu:`` and ``bench:`` entries need a GPU and are left to the GPU proof.

Every pytest run writes JUnit XML so the final line can total what ran; pytest's exit 5 (no
test collected) is a wiring failure, never a pass.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.line import Line, resolve_line

NON_CPU_KINDS = ("gpu", "bench")
PYTEST_NO_TESTS = 5


@dataclass(frozen=True)
class PatchInfo:
    name: str
    subject: str
    tests: tuple[str, ...]  # every Tests: entry, kinds kept (``gpu:...``)


@dataclass
class Tally:
    """Test counts summed over several pytest runs (from their JUnit XML)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)

    def add_junit(self, path: Path) -> None:
        if not path.is_file():
            return
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for s in suites:
            tests = int(s.get("tests", 0))
            bad = int(s.get("failures", 0)) + int(s.get("errors", 0))
            skipped = int(s.get("skipped", 0))
            self.failed += bad
            self.skipped += skipped
            self.passed += tests - bad - skipped


def cpu_tests(entries: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Drop ``gpu:``/``bench:`` entries; strip an explicit ``cpu:`` kind; keep node ids."""
    out = []
    for entry in entries:
        kind, sep, rest = entry.partition(":")
        if sep and not rest.startswith(":") and kind in NON_CPU_KINDS:
            continue
        if sep and not rest.startswith(":") and kind == "cpu":
            entry = rest
        out.append(entry)
    return tuple(out)


def load_patches(patches_dir: Path) -> list[PatchInfo]:
    """The series in order, via tooling-core's parser (which checks series consistency)."""
    from fp4series import series

    return [PatchInfo(p.name, p.subject, tuple(p.tests())) for p in series.load_series(patches_dir)]


def prefix_plan(patches: list[PatchInfo]) -> list[tuple[int, PatchInfo, tuple[str, ...]]]:
    """(k, patch k, CPU tests of patches 1..k in order, de-duplicated) for k = 1..n."""
    plan = []
    seen: list[str] = []
    for k, info in enumerate(patches, start=1):
        for test in cpu_tests(info.tests):
            if test not in seen:
                seen.append(test)
        plan.append((k, info, tuple(seen)))
    return plan


def series_commits(checkout: Path, base: str, patches: list[PatchInfo]) -> list[str]:
    """The checkout's commits on top of ``base``, one per patch, checked against the subjects."""
    import git

    repo = git.Repo(checkout)
    shas = repo.git.rev_list("--reverse", "--first-parent", f"{base}..HEAD").split()
    if len(shas) != len(patches):
        raise SeriesError(
            f"{checkout} has {len(shas)} commit(s) on the pin but patches/series has "
            f"{len(patches)}",
            hint="re-create the checkout with scripts/main.sh (or apply the series to a "
            "fresh clone of the pin with scripts/apply.sh)",
        )
    for k, (sha, info) in enumerate(zip(shas, patches, strict=True), start=1):
        subject = " ".join(str(repo.commit(sha).summary).split())
        if info.subject and subject != " ".join(info.subject.split()):
            raise SeriesError(
                f"commit {k} of {checkout} ({sha[:10]} {subject!r}) is not patch {info.name} "
                f"({info.subject!r})",
                hint="the checkout is out of date with patches/: re-run scripts/main.sh",
            )
    return shas


def ensure_worktree(checkout: Path, path: Path, sha: str) -> None:
    """A detached worktree of ``checkout`` at ``sha`` (re-used, forced clean, if it exists)."""
    import git

    repo = git.Repo(checkout)
    if (path / ".git").exists():
        try:
            wt = git.Repo(path)
            wt.git.checkout("--detach", "--force", sha)
            wt.git.clean("-fdxq")
            return
        except (git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError):
            shutil.rmtree(path)  # a worktree of a checkout that was re-created
    elif path.exists():
        shutil.rmtree(path)
    repo.git.worktree("prune")
    path.parent.mkdir(parents=True, exist_ok=True)
    repo.git.worktree("add", "--detach", "--force", str(path), sha)


def run_pytest(
    python: Path,
    args: list[str],
    *,
    root: Path,
    junit: Path,
    label: str,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """One pytest run; returns (exit code, status text). Exit 5 is reported as a failure."""
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *args]
    print(f"{label}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    rc = subprocess.run(cmd, cwd=root, env=env, check=False).returncode
    took = f"{time.monotonic() - start:.1f}s"
    if rc == 0:
        return rc, f"passed in {took}"
    if rc == PYTEST_NO_TESTS:
        return rc, f"FAILED in {took}: pytest collected no tests (wiring error)"
    return rc, f"FAILED in {took} (pytest exit {rc})"


def run_prefixes(
    checkout: Path,
    *,
    root: Path,
    python: Path,
    base: str,
    tally: Tally,
    only: int | None = None,
    pytest_args: list[str] | None = None,
    line: Line | None = None,
) -> int:
    """Run every prefix's tests; print a line per prefix and a summary; return 0 or 1.
    LINE: the series line (default: the pin's layout under ROOT, patches/ and .work/)."""
    patches_dir = line.patches_dir if line else root / "patches"
    work = line.work if line else root / ".work"
    patches = load_patches(patches_dir)
    if not patches:
        print(f"[prefix] {patches_dir / 'series'} is empty: no prefixes to test", flush=True)
        return 0
    shas = series_commits(checkout, base, patches)
    results: list[tuple[int, str, str]] = []
    plan = prefix_plan(patches)
    for k, info, tests in plan:
        if only is not None and k != only:
            continue
        label = f"[prefix {k}/{len(plan)}] {info.name}"
        if not tests:
            status = f"skipped: no CPU test named in the Tests: trailers of patches 1..{k}"
            print(f"{label}: {status}", flush=True)
            results.append((k, info.name, status))
            continue
        missing = [t for t in tests if not (root / t.split("::", 1)[0]).exists()]
        if missing:
            status = f"FAILED: named test file(s) missing: {', '.join(missing)}"
            print(f"{label}: {status}", flush=True)
            tally.failed += 1
            tally.failures.append(f"prefix {k}")
            results.append((k, info.name, status))
            continue
        wt = work / "prefix" / f"{k:02d}"
        ensure_worktree(checkout, wt, shas[k - 1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(wt / "python"), str(root / "src")]
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env["FP4SERIES_PREFIX"] = str(k)
        junit = work / "test-results" / f"prefix-{k:02d}.xml"
        rc, status = run_pytest(
            python, ["-q", *(pytest_args or []), *tests], root=root, junit=junit,
            label=f"{label} at {shas[k - 1][:10]}", env=env,
        )  # fmt: skip
        tally.add_junit(junit)
        if rc != 0:
            if rc == PYTEST_NO_TESTS:
                tally.failed += 1
            tally.failures.append(f"prefix {k}")
        print(f"{label}: {status}", flush=True)
        results.append((k, info.name, status))
    print("[prefix] summary:")
    for k, name, status in results:
        print(f"  {k:2d} {name:<58} {status}")
    return 1 if any("FAILED" in r[2] for r in results) else 0


def run_all(
    root: Path,
    python: Path,
    checkout: Path,
    pytest_args: list[str],
    line: Line | None = None,
    *,
    checkout_named: bool = False,
) -> int:
    """The README's test command for a line: its suites, report checks, prefixes; one closing
    tally line, whatever happened. Without the line's checkout (a fresh clone where only
    scripts/build.sh ran, as the README's own-checkout section does) the prefixes are skipped
    with a note; a checkout the caller named (CHECKOUT_NAMED) must exist."""
    line = line or resolve_line(root=root)
    tally = Tally()
    rcs: list[int] = []
    results = line.results_dir
    if pytest_args:  # a targeted run: exactly what the caller named, nothing else
        junit = results / "targeted.xml"
        rc, status = run_pytest(python, pytest_args, root=root, junit=junit, label="[test]")
        tally.add_junit(junit)
        print(f"[test] {status}")
        print(f"{tally.passed} passed, {tally.failed} failed, {tally.skipped} skipped", flush=True)
        return rc
    print(f"[test] {line.label}: {', '.join(line.cpu_suites)}", flush=True)
    for suite in line.cpu_suites:
        folder = root / suite
        has_tests = folder.is_dir() and any(folder.rglob("test_*.py"))
        if not has_tests:
            print(f"[test] {suite}: no test files yet, skipped", flush=True)
            continue
        junit = results / f"{suite.replace('/', '-')}.xml"
        rc, status = run_pytest(
            python, ["-q", suite], root=root, junit=junit, label=f"[test] {suite}"
        )
        tally.add_junit(junit)
        if rc != 0:
            tally.failures.append(suite)
            if rc == PYTEST_NO_TESTS:
                tally.failed += 1
        print(f"[test] {suite}: {status}", flush=True)
        rcs.append(rc)
    if os.environ.get("FP4SERIES_SKIP_REPORTS") == "1":
        print("[test] check-reports: skipped (FP4SERIES_SKIP_REPORTS=1)", flush=True)
    elif not line.is_pin and not line.reports_dir.is_dir():
        shown = line.reports_dir.relative_to(root)
        print(f"[test] check-reports: no GPU reports for {line.label} ({shown}): pending")
    elif importlib.util.find_spec("fp4series.report") is not None:
        print("[test] check-reports ...", flush=True)
        reports = ["--dir", str(line.reports_dir.relative_to(root))]
        reports += [] if line.is_pin else ["--line", line.version]
        rc = subprocess.run(
            [str(python), "-m", "fp4series", "check-reports", "--allow-none", *reports],
            cwd=root,
            check=False,
        ).returncode
        print(f"[test] check-reports: {'passed' if rc == 0 else f'FAILED (exit {rc})'}")
        if rc != 0:
            tally.failed += 1
            tally.failures.append("check-reports")
        else:
            tally.passed += 1
        rcs.append(rc)
    else:
        print("[test] check-reports: fp4series.report not written yet, skipped", flush=True)
    if os.environ.get("FP4SERIES_SKIP_PREFIXES") == "1":
        print("[test] prefixes: skipped (FP4SERIES_SKIP_PREFIXES=1)", flush=True)
    else:
        rcs.append(_prefixes_step(root, python, checkout, line, tally, checkout_named))
    if tally.failures:
        print("[test] failed: " + ", ".join(tally.failures))
    if tally.passed + tally.failed == 0:
        print("[test] FAILED: no test ran at all")
        rcs.append(PYTEST_NO_TESTS)
    print(f"{tally.passed} passed, {tally.failed} failed, {tally.skipped} skipped", flush=True)
    return 0 if all(rc == 0 for rc in rcs) else 1


def _prefixes_step(
    root: Path, python: Path, checkout: Path, line: Line, tally: Tally, checkout_named: bool
) -> int:
    """run_all's prefix step: a refusal is a failure with its message, not the end of the run
    (the closing tally line is still printed)."""
    from fp4series.workspace import resolve_base

    if not (checkout / ".git").exists() and not checkout_named:
        print(
            f"[test] prefixes: skipped: {checkout} is not a git checkout (scripts/main.sh makes "
            "it; on your own checkout: python -m fp4series test-prefixes CHECKOUT)",
            flush=True,
        )
        return 0
    try:
        if not (checkout / ".git").exists():
            raise SeriesError(f"{checkout} is not a git checkout", hint="run scripts/main.sh first")
        base = resolve_base(checkout, line.tag)
        return run_prefixes(checkout, root=root, python=python, base=base, tally=tally, line=line)
    except SeriesError as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        print(f"[test] prefixes: FAILED: {exc}{hint}", flush=True)
        tally.failed += 1
        tally.failures.append("prefixes")
        return 1
