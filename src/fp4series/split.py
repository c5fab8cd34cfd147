"""Split the series into single-purpose upstream PR branches, each carrying its own evidence.

For each patch (or each ``Group:`` of patches) a branch ``nvfp4-marlin/<stem>`` is created in the
given repository on the pin (or ``--base <version>`` / ``--base auto``: the newest release where the
branch's patches still apply, from reports/rebase-check.json). It holds that patch plus only the
patches it depends on: ``Depends-On:`` and patches whose added/changed lines its hunks touch
(see ``fp4series overlap``), applied with ``git am``. With ``--run-tests`` the branch's declared
non-GPU ``Tests:`` run against its tree (``PYTHONPATH=<worktree>/python``). A PR description in
SGLang's template layout is written to ``.work/split/<stem>.md``. Nothing is pushed: the
``git push`` / ``gh pr create`` commands are printed for a person to run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4series.errors import SeriesError
from fp4series.overlap import (
    PatchDoc,
    dependency_closure,
    derived_dependencies,
    explain_dependencies,
    load_patch_docs,
    register_overlap,
)
from fp4series.paths import inside, remove_tree_inside, safe_name

BRANCH_PREFIX = "nvfp4-marlin/"
UPSTREAM_REPO = "sgl-project/sglang"
DOCS = "https://docs.sglang.io/developer_guide/contribution_guide.html"
APPLIES = ("clean", "offset", "three-way")


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
    members: list[PatchDoc]
    deps: list[PatchDoc]

    @property
    def branch(self) -> str:
        return BRANCH_PREFIX + self.name

    @property
    def patches(self) -> list[PatchDoc]:
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


def unit_name(doc: PatchDoc) -> str:
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


def plan_units(docs: Sequence[PatchDoc], only: Sequence[str] | None = None) -> list[Unit]:
    """Units in series order with their dependency closure (declared + derived from overlaps)."""
    deps = derived_dependencies(docs)
    order = {d.name: i for i, d in enumerate(docs)}
    groups: dict[str, list[PatchDoc]] = {}
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
    full_env = dict(os.environ)
    full_env.pop("GIT_DIR", None)
    full_env.pop("GIT_INDEX_FILE", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=full_env)
    if check and proc.returncode != 0:
        raise SeriesError(
            f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip() or proc.stdout.strip()}",
            hint="check the repository state (git status) and run the split again",
        )
    return proc


def _committer_env(repo: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    if _git(repo, "config", "user.name", check=False).returncode != 0:
        env["GIT_COMMITTER_NAME"] = "fp4series split"
    if _git(repo, "config", "user.email", check=False).returncode != 0:
        env["GIT_COMMITTER_EMAIL"] = "fp4series@localhost"
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


def auto_base(unit: Unit, report: Path) -> str:
    """Newest release where every patch of the branch applies (per reports/rebase-check.json)."""
    if not report.is_file():
        return "pin"
    data = json.loads(report.read_text())
    verdicts: dict[str, dict[str, str]] = data.get("verdicts", {})
    best = "pin"
    for rel in data.get("releases", []):
        if all(verdicts.get(p.name, {}).get(rel) in APPLIES for p in unit.patches):
            best = rel
    return best


def make_branch(
    repo: Path, unit: Unit, base_rev: str, worktree: Path, *, three_way: bool, owner: Path
) -> tuple[bool, str, str]:
    """(ok, head, error): branch ``unit.branch`` at BASE_REV with the unit's patches via git am.
    WORKTREE is re-created; it must lie inside OWNER (the split's out dir), checked first."""
    worktree = inside(worktree, owner)
    if worktree.exists() or worktree.is_symlink():
        _git(repo, "worktree", "remove", "--force", str(worktree), check=False)
        remove_tree_inside(worktree, owner)
    _git(repo, "worktree", "prune")
    worktree.parent.mkdir(parents=True, exist_ok=True)
    _git(repo, "worktree", "add", "-q", "-f", "-B", unit.branch, str(worktree), base_rev)
    args = ["am", "-q", "--keep-cr", "--keep-non-patch"]  # keep "[Quant]" in subjects
    if three_way:
        args.append("-3")
    proc = _git(
        worktree,
        *args,
        *[str(p.path.resolve()) for p in unit.patches],
        env=_committer_env(repo),
        check=False,
    )
    if proc.returncode != 0:
        _git(worktree, "am", "--abort", check=False)
        msg = (proc.stdout + proc.stderr).strip().splitlines()
        return False, "", " | ".join(ln for ln in msg if ln.strip())[:800]
    head = _git(worktree, "rev-parse", "HEAD").stdout.strip()
    return True, head, ""


# ---------------------------------------------------------------------------------------------
# tests


def runnable_tests(unit: Unit) -> tuple[list[str], list[str]]:
    """(CPU tests to run, GPU/bench entries that are not run here) of the unit's own patches."""
    run: list[str] = []
    skip: list[str] = []
    for m in unit.members:
        for t in m.tests:
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
            proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env)
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


def _section(message: str, title: str) -> str:
    """Text under ``Title:`` in the patch message, up to the next known heading or trailers."""
    heads = r"(Why|What|How verified|Upstream-Status|Tests|Provides|Depends-On|Group)"
    m = re.search(rf"^{re.escape(title)}:[ \t]*\n?(.*?)(?=^{heads}:|\Z)", message, re.M | re.S)
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


def _short(report: Path) -> str:
    return "/".join(report.parts[-3:])


def _report_list(report: Path, key: str, what: str) -> list[Any] | str:
    """``report``'s top-level list ``key``, or the line to print instead of numbers."""
    if not report.is_file():
        return f"No GPU {what} report ({report.name}) in this checkout yet."
    try:
        items: list[Any] = json.loads(report.read_text()).get(key, [])
        return items
    except (json.JSONDecodeError, AttributeError) as exc:
        return f"{report} could not be read ({exc}); no numbers quoted."


def numerics_evidence(unit: Unit, report: Path) -> list[str]:
    """Lines for Accuracy Tests from reports/h200/numerics.json (``cases`` with ``rel_l2``)."""
    cases = _report_list(report, "cases", "numerics")
    if isinstance(cases, str):
        return [cases]
    files = [f for m in unit.members for f in m.files]
    wanted = numerics_paths(files)
    picked = [c for c in cases if isinstance(c, dict) and c.get("path") in wanted]
    if not picked:
        return [f"{report.name} has no case for paths {', '.join(sorted(wanted))}."]
    out = [
        f"H200 numerics ({_short(report)}), paths {', '.join(sorted(wanted))} "
        "(relative L2 error against an fp32 reference from the same FP4 data):",
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


def bench_evidence(unit: Unit, report: Path) -> list[str]:
    """Lines for Benchmarking from reports/h200/bench.json ``rows`` (times in microseconds)."""
    touches_speed = any("marlin" in f or "fp4" in f for m in unit.members for f in m.files) or any(
        t.startswith("bench:") for m in unit.members for t in m.tests
    )
    if not touches_speed:
        return ["This change does not touch a kernel or a GEMM path; no speed impact expected."]
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
        f"H200 ({_short(report)}), {len(rows)} rows; ratios > 1 mean FP4 Marlin is faster "
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


def _diffstat(doc: PatchDoc) -> list[str]:
    out = []
    for f in doc.diff.files:
        add = sum(len(h.added()) for h in f.hunks)
        rem = sum(len(h.removed()) for h in f.hunks)
        what = " (new)" if f.is_new else " (deleted)" if f.is_deleted else ""
        out.append(f"- `{f.new_path or f.old_path}`{what}: +{add} −{rem}")
    return out


def pr_title(unit: Unit) -> str:
    if len(unit.members) == 1:
        return unit.members[0].subject
    return f"[Quant] {unit.name}: " + "; ".join(
        re.sub(r"^\[[^\]]+\]\s*", "", m.subject) for m in unit.members
    )


def pr_description(result: SplitResult, *, reports_dir: Path) -> str:
    """SGLang PR template layout, filled from the patch header and this run's evidence."""
    unit = result.unit
    lines: list[str] = [f"<!-- {pr_title(unit)} -->", "", "## Motivation", ""]
    for m in unit.members:
        if len(unit.members) > 1:
            lines += [f"**{m.subject}**", ""]
        lines += [_section(m.message, "Why") or m.subject, ""]
        status = m.trailers.get("Upstream-Status", "")
        if status:
            lines += [f"Upstream status: {status}", ""]
    if result.dep_units:
        lines += [
            "Depends on (merge first; this branch carries their commits until they land):",
            "",
        ]
        for d in result.dep_units:
            why = "; ".join(result.dep_reasons.get(d, []))
            lines.append(f"- `{BRANCH_PREFIX}{d}`" + (f": {why}" if why else ""))
        lines.append("")
    lines += ["## Modifications", ""]
    for m in unit.members:
        if len(unit.members) > 1:
            lines += [f"**{m.subject}**", ""]
        lines += [_section(m.message, "What") or "(no What: section in the patch)", ""]
        lines += ["Files:", *_diffstat(m), ""]
    lines += ["## Accuracy Tests", ""]
    if result.tests is not None:
        t = result.tests
        verdict = "passed" if t.ok else "FAILED"
        lines += [
            f"Unit tests on branch `{unit.branch}` ({result.head[:12]} on {result.base}): "
            f"{verdict}: {t.summary()}.",
            "",
            "```",
            " ".join(t.command),
            "```",
            "",
        ]
    else:
        run, _ = runnable_tests(unit)
        if run:
            lines += ["Declared unit tests (not run by this split; use --run-tests):", ""]
            lines += [f"- `{x}`" for x in run] + [""]
        else:
            lines += ["This patch declares no CPU unit tests.", ""]
    if result.skipped_tests:
        lines += ["GPU evidence declared by the patch (run on the H200, numbers below):", ""]
        lines += [f"- `{x}`" for x in result.skipped_tests] + [""]
    lines += numerics_evidence(unit, reports_dir / "numerics.json") + [""]
    for m in unit.members:
        hv = _section(m.message, "How verified")
        if hv:
            lines += ["How it was verified (from the commit message):", "", hv, ""]
    lines += ["## Benchmarking and Profiling", ""]
    lines += bench_evidence(unit, reports_dir / "bench.json") + [""]
    has_tests = any(m.tests for m in unit.members)
    has_numbers = (reports_dir / "numerics.json").is_file()
    box = lambda ok: "x" if ok else " "  # noqa: E731
    lines += [
        "## Checklist",
        "",
        f"- [x] Code formatted with pre-commit ([format with pre-commit]"
        f"({DOCS}#format-code-with-pre-commit)).",
        f"- [{box(has_tests)}] Unit tests added ([run and add unit tests]"
        f"({DOCS}#run-and-add-unit-tests)).",
        f"- [ ] Documentation updated ([write documentations]({DOCS}#write-documentations)).",
        f"- [{box(has_numbers)}] Accuracy and speed results provided ([test the accuracy]"
        f"({DOCS}#test-the-accuracy), [benchmark the speed]({DOCS}#benchmark-the-speed)).",
        f"- [x] Code style guidance followed ([code style]({DOCS}#code-style-guidance)).",
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
# driver


def split(
    repo: Path,
    docs: Sequence[PatchDoc],
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
    log: Callable[[str], None] = print,
) -> list[SplitResult]:
    """Create one branch per unit, run its tests (when RUNNER), write its PR description."""
    units_all = plan_units(docs)
    reasons = explain_dependencies(docs)
    units = plan_units(docs, only) if only else units_all
    results: list[SplitResult] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for unit in units:
        want = base
        if base == "auto":
            want = auto_base(unit, rebase_report or Path("reports/rebase-check.json"))
        label, rev = resolve_base(
            repo,
            want,
            pin_version=pin_version,
            pin_tag=pin_tag,
            pin_commit=pin_commit,
            fetch_release=fetch_release,
        )
        wt = out_dir / "worktrees" / unit.name
        ok, head, err = make_branch(
            repo, unit, rev, wt, three_way=not label.startswith("pin"), owner=out_dir
        )
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
            unit, label, rev, ok, head, err, dep_units=dep_units, dep_reasons=dep_reasons
        )
        run, skip = runnable_tests(unit)
        res.skipped_tests = skip
        if ok and runner is not None and run:
            res.tests = runner(wt, run)
        body = inside(out_dir / f"{unit.name}.md", out_dir)
        body.write_text(pr_description(res, reports_dir=reports_dir))
        res.description = body
        results.append(res)
        names = ", ".join(p.name for p in unit.patches)
        if ok:
            tests = f"; tests: {res.tests.summary()}" if res.tests else ""
            log(f"{unit.branch}: {len(unit.patches)} commit(s) on {label} [{names}]{tests}")
        else:
            log(f"{unit.branch}: FAILED on {label}: {err}")
        log(f"  PR description: {body}")
    return results


def _default_python(root: Path) -> str:
    env = os.environ.get("FP4SERIES_PYTHON")
    if env:
        return env
    venv = root / ".work" / "venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def cmd_split(args: argparse.Namespace) -> int:
    from fp4series import lock as lock_mod
    from fp4series import paths

    root = paths.project_root()
    repo = Path(args.repo).resolve()
    lock = lock_mod.load_lock(Path(args.lock) if args.lock else paths.default_lock_path())
    if not repo.exists():  # a fresh clone of the materialized pin (CI, first use)
        from fp4series.rebase_check import prepare_release

        pin = prepare_release(lock, lock.pin.version, root / ".work", paths.default_cache_dir())
        _git(root, "clone", "-q", str(pin.repo), str(repo))
        print(f"{repo}: cloned from the materialized pin {pin.repo}")
    if not (repo / ".git").exists():
        raise SeriesError(
            f"{repo} is not the top of a git checkout",
            hint="pass a materialized pin (scripts/fetch-upstream.sh DEST), an sglang clone, "
            "or a path that does not exist yet (a clone of the pin is made there)",
        )
    docs = load_patch_docs(Path(args.patches_dir) if args.patches_dir else root / "patches")
    if not docs:
        raise SeriesError("the series is empty", hint="add patches to patches/series first")

    def fetch_release(version: str) -> Path:
        from fp4series.rebase_check import prepare_release

        return prepare_release(lock, version, root / ".work", paths.default_cache_dir()).repo

    runner = pytest_runner(args.python or _default_python(root), root) if args.run_tests else None
    out_dir = Path(args.out_dir) if args.out_dir else root / ".work" / "split"
    results = split(
        repo,
        docs,
        base=args.base,
        pin_version=lock.pin.version,
        pin_tag=lock.pin.tag,
        pin_commit=lock.pin.commit if lock.pin.commit_resolved else None,
        out_dir=out_dir,
        reports_dir=root / "reports" / "h200",
        only=args.patches,
        runner=runner,
        fetch_release=fetch_release,
        rebase_report=root / "reports" / "rebase-check.json",
    )
    summary = []
    for r in results:
        summary.append(
            {
                "branch": r.unit.branch,
                "patches": [p.name for p in r.unit.patches],
                "base": r.base,
                "ok": r.ok,
                "head": r.head,
                "error": r.error,
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
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\nNothing was pushed. To open the PRs (in dependency order):")
    for r in results:
        if r.ok and r.description is not None:
            for c in push_commands(repo, r, r.description, args.remote):
                print("  " + c)
    bad = [r for r in results if not r.ok or (r.tests is not None and not r.tests.ok)]
    for r in bad:
        why = r.error or (r.tests.tail if r.tests else "")
        print(f"failed: {r.unit.branch}: {why}", file=sys.stderr)
    return 1 if bad else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "split",
        help="one upstream PR branch per patch (or Group:), with tests and a PR description",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "repo",
        help="git checkout to create the branches in (a materialized pin or an sglang clone); "
        "a path that does not exist yet gets a clone of the materialized pin",
    )
    p.add_argument(
        "--base",
        default="pin",
        help="pin (default), a release version, or auto (newest release where it still applies)",
    )
    p.add_argument("--patches", nargs="+", help="only these patches / groups (default: all)")
    p.add_argument("--run-tests", action="store_true", help="run each branch's CPU Tests:")
    p.add_argument("--python", help="interpreter for the tests (default: .work/venv or this one)")
    p.add_argument("--patches-dir", help="series directory (default: the project's patches/)")
    p.add_argument("--lock", help="upstream.lock (default: the project's)")
    p.add_argument("--out-dir", help="where descriptions/worktrees go (default: .work/split)")
    p.add_argument("--remote", default="origin", help="remote named in the printed push command")
    p.set_defaults(func=cmd_split)
    register_overlap(subparsers)
