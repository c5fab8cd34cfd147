"""The ``split`` command: one upstream PR branch per patch or Group:, with its tests and a PR
description (fp4series.split; what it may write: fp4series.split_guard)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4series import gitops
from fp4series.commands import add_patches_dir, deprecated_flag
from fp4series.errors import SeriesError
from fp4series.series import load_series
from fp4series.split import RECORD_FILE, default_python, push_commands, pytest_runner, split


def cmd_split(args: argparse.Namespace) -> int:
    from fp4series import lock as lock_mod
    from fp4series import paths

    root = paths.project_root()
    _apply_line(args, root)
    repo = Path(args.repo).resolve()
    lock = lock_mod.load_lock(Path(args.lock) if args.lock else paths.default_lock_path())
    if not repo.exists():  # a fresh clone of the materialized base (CI, first use)
        from fp4series.upstream import prepare_release

        own = (args.series_base or lock.pin.version).lstrip("v")
        version = own if args.base in ("pin", "auto") else args.base.lstrip("v")
        rel = prepare_release(lock, version, root / ".work", paths.default_cache_dir())
        gitops.run(root, "clone", "-q", str(rel.repo), str(repo), check=True)
        what = "pin" if version == lock.pin.version else f"release {version}"
        print(f"{repo}: cloned from the materialized {what} {rel.repo}")
    if not (repo / ".git").exists():
        raise SeriesError(
            f"{repo} is not the top of a git checkout",
            hint="pass a materialized pin (scripts/fetch-upstream.sh DEST), an sglang clone, "
            "or a path that does not exist yet (a clone of the pin is made there)",
        )
    docs = load_series(Path(args.patches_dir) if args.patches_dir else root / "patches")
    if not docs:
        raise SeriesError("the series is empty", hint="add patches to patches/series first")

    def fetch_release(version: str) -> Path:
        from fp4series.upstream import prepare_release

        return prepare_release(lock, version, root / ".work", paths.default_cache_dir()).repo

    runner = pytest_runner(args.python or default_python(root), root) if args.run_tests else None
    out_dir = Path(args.out_dir) if args.out_dir else root / ".work" / "split"
    results = split(
        repo,
        docs,
        base=args.base,
        pin_version=lock.pin.version,
        pin_tag=lock.pin.tag,
        pin_commit=lock.pin.commit if lock.pin.commit_resolved else None,
        out_dir=out_dir,
        reports_dir=Path(args.reports_dir) if args.reports_dir else root / "reports" / "h200",
        only=args.only,
        runner=runner,
        fetch_release=fetch_release,
        rebase_report=Path(
            getattr(args, "rebase_report", None) or root / "reports/rebase-check.json"
        ),
        series_base=args.series_base,
        keep_trailers=args.keep_trailers,
        force=args.force or (),
        project=root,
    )
    if any(not r.ok for r in results):
        for r in results:
            if not r.ok:
                print(f"failed: {r.unit.branch}: {r.error}", file=sys.stderr)
        return 1
    print(f"\nRecord: {out_dir / RECORD_FILE}")
    print("\nNothing was pushed. To open the PRs (in dependency order):")
    newest = lock.lines[-1].version if lock.lines else None
    if newest and not args.line and args.base in ("pin", lock.pin.version):
        print(
            f"  (these branches are on the pin {lock.pin.tag}; upstream takes PRs on its newest "
            f"release: scripts/split.sh --line {newest} REPO makes them on v{newest})"
        )
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
        "a path that does not exist yet gets a clone of the materialized base release (the pin "
        "for --base pin/auto)",
    )
    p.add_argument(
        "--base",
        default="pin",
        help="pin (default), a release version, or auto (newest release where it still applies)",
    )
    p.add_argument(
        "--line",
        metavar="VERSION",
        help="split that series line: patches/VERSION on release VERSION, its venv for the "
        "tests, reports/h200/VERSION, .work/lines/VERSION/split (default: the pin's line)",
    )
    p.add_argument(
        "--only", nargs="+", metavar="NAME", help="only these patches / groups (default: all)"
    )
    deprecated_flag(p, "--patches", "--only", "only", nargs="+")
    p.add_argument("--run-tests", action="store_true", help="run each branch's CPU Tests:")
    p.add_argument("--python", help="interpreter for the tests (default: .work/venv or this one)")
    add_patches_dir(p, old=())
    p.add_argument(
        "--series-base",
        metavar="VERSION",
        help="the release the series is made on (default: the pin): on it patches must apply "
        "exactly; on any other --base a patch that does not falls back to git am -3",
    )
    p.add_argument(
        "--reports-dir",
        help="GPU reports quoted in the PR descriptions (numerics.json, bench.json; default: "
        "reports/h200)",
    )
    p.add_argument(
        "--keep-trailers",
        action="store_true",
        help="keep the series' internal trailers (Upstream-Status:, Tests:, Provides:, "
        "Depends-On:, Group:, Rebased-From:) in the branch commits; default: removed",
    )
    p.add_argument("--lock", help="upstream.lock (default: the project's)")
    p.add_argument(
        "--out-dir",
        help="where descriptions, worktrees, split-record.json and range-diffs go "
        "(default: .work/split)",
    )
    p.add_argument(
        "--force",
        action="append",
        metavar="NAME",
        help="(repeatable) replace this branch (nvfp4-marlin/<unit>) or out-dir file "
        "(<unit>.md, ...) although it is not split's; the old one is kept aside and named",
    )
    p.add_argument("--remote", default="origin", help="remote named in the printed push command")
    p.set_defaults(func=cmd_split)


def _apply_line(args: argparse.Namespace, root: Path) -> None:
    """--line V: the line's series on its own release, its venv, reports and split dir (any
    option given explicitly wins)."""
    from fp4series.line import resolve_line

    line = resolve_line(args.line, lock_path=Path(args.lock) if args.lock else None, root=root)
    if line.is_pin:
        return
    args.patches_dir = args.patches_dir or str(line.patches_dir)
    args.base = line.version if args.base == "pin" else args.base
    args.series_base = args.series_base or line.version
    args.python = args.python or str(line.venv / "bin" / "python")
    args.reports_dir = args.reports_dir or str(line.reports_dir)
    args.out_dir = args.out_dir or str(line.work / "split")
    args.rebase_report = str(line.rebase_matrix)
