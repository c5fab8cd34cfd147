"""Apply the series to a checkout atomically: all patches as commits, or nothing changed at all.

The patches are applied with `git am --3way --keep-cr --keep-non-patch` (author, subject and
message kept; never fuzz) in a scratch worktree of the checkout; only when every patch went in is
the checkout's HEAD fast-forwarded to the result. So a failing patch, a refusal or --check leave
HEAD, index and work tree untouched (checked against a snapshot and restored if ever needed).

Public API (stable):
    apply_series(checkout, patches, *, check=False, allow_base_mismatch=False, lock=None,
                 cache_dir=None, progress=None) -> ApplyReport
        Refuses (SeriesError, nothing changed): not a repo, dirty tree (untracked files too),
        an am/rebase/merge in progress, detached HEAD at an unknown base, base mismatch.
        Returns a report; report.ok is False when a patch failed (then nothing changed).
    ApplyReport: checkout, base, results, changed, check, head_before, head_after, ok, format()
    PatchResult: name, status, commit, detail, fits (hunks.HunkFit of a failed patch)
        status: "applied" | "applied-3way" | "would-apply" | "would-apply-3way" |
                "already-applied" | "failed" | "not-tried"
CLI: apply [--check] [--allow-base-mismatch] CHECKOUT
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import git
from git import Repo

from fp4series import gitops, paths
from fp4series.errors import SeriesError
from fp4series.hunks import HunkFit, locate_patch
from fp4series.lock import Lock, load_lock
from fp4series.progress import Progress
from fp4series.series import Patch, load_series
from fp4series.verify import Base, find_base

AM_ARGS = ("--3way", "--keep-cr", "--keep-non-patch", "--quiet")


@dataclass
class PatchResult:
    name: str
    status: str
    commit: str | None = None
    detail: str = ""
    fits: list[HunkFit] = field(default_factory=list)


@dataclass
class ApplyReport:
    checkout: Path
    base: Base | None
    results: list[PatchResult]
    changed: bool
    check: bool
    head_before: str
    head_after: str

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.results)

    @property
    def already_applied(self) -> bool:
        return all(r.status == "already-applied" for r in self.results)

    def format(self) -> str:
        out = []
        if self.base is not None:
            out.append(f"base: {self.base.commit[:12]} ({self.base.detail})")
        for r in self.results:
            line = f"  {r.name}: {r.status}"
            if r.commit:
                line += f" -> {r.commit[:12]}"
            out.append(line)
            if r.status == "failed":
                bad = [f for f in r.fits if not f.ok]
                for fit in bad:
                    out.append("    " + fit.describe().replace("\n", "\n    "))
                if r.detail and not bad:
                    out.append("    git am said: " + r.detail.replace("\n", "\n      "))
        if not self.results:
            out.append("  (the series is empty)")
        if self.check:
            out.append("--check: nothing was changed")
        elif not self.ok:
            out.append(f"nothing was changed: HEAD is still {self.head_before[:12]}")
        elif self.already_applied and self.results:
            out.append("the series is already applied; nothing was changed")
        return "\n".join(out)


def _already_applied(repo: Repo, base: Base, patches: list[Patch]) -> tuple[int, list[PatchResult]]:
    """How many leading patches are the top commits since the base (subject and patch-id)."""
    since = list(reversed(list(repo.iter_commits(f"{base.commit}..HEAD", first_parent=True))))
    subjects = [p.subject for p in patches]
    k = 0
    for n in range(min(len(since), len(patches)), 0, -1):
        if [c.summary for c in since[-n:]] == subjects[:n]:
            k = n
            break
    stray = [c for c in since[: len(since) - k] if c.summary in subjects]
    if stray:
        raise SeriesError(
            f"commit {stray[0].hexsha[:12]} ({stray[0].summary!r}) has a series subject but "
            "other commits sit on top of it",
            hint="start from a clean checkout of the pin, or export your commits first "
            "(scripts/export.sh) so the series matches them",
        )
    results = []
    for patch, commit in zip(patches[:k], since[len(since) - k :], strict=True):
        want = gitops.patch_id(repo, patch.text)
        have = gitops.commit_patch_id(repo, commit.hexsha)
        if want != have and base.how != "mismatch-allowed":
            raise SeriesError(
                f"commit {commit.hexsha[:12]} carries the subject of {patch.name} but different "
                "changes (an older or edited version of the series is applied)",
                hint="export your edits (scripts/export.sh) or start again from the pin",
            )
        results.append(PatchResult(patch.name, "already-applied", commit.hexsha))
    return k, results


def _apply_one(wt: Repo, patch: Patch, env: dict[str, str], check: bool) -> PatchResult:
    try:
        wt.git.apply("--check", str(patch.path.resolve()))
        clean = True
    except git.GitCommandError:
        clean = False
    try:
        wt.git.am(*AM_ARGS, str(patch.path.resolve()), env=env)
    except git.GitCommandError as exc:
        fits = locate_patch(patch, lambda p: gitops.read_blob(wt, "HEAD", p))
        if gitops.operation_in_progress(wt) == "git am":
            wt.git.am("--abort")
        detail = (exc.stderr or exc.stdout or str(exc)).strip()
        return PatchResult(patch.name, "failed", detail=detail, fits=fits)
    status = ("would-apply" if check else "applied") + ("" if clean else "-3way")
    return PatchResult(patch.name, status, None if check else wt.head.commit.hexsha)


def apply_series(
    checkout: Path | str,
    patches: list[Patch],
    *,
    check: bool = False,
    allow_base_mismatch: bool = False,
    lock: Lock | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> ApplyReport:
    """Apply PATCHES in order as commits on CHECKOUT, or change nothing (see module doc)."""
    progress = progress or Progress()
    repo = gitops.open_repo(checkout)
    gitops.require_clean(repo)
    lock = lock or load_lock(paths.default_lock_path())
    state = gitops.RepoState.snapshot(repo)
    assert state.head is not None
    with progress.step("verify the base"):
        base = find_base(
            repo,
            lock,
            patches,
            cache_dir=cache_dir,
            allow_mismatch=allow_base_mismatch,
            progress=progress,
        )
        progress.info(base.detail)
    if repo.head.is_detached and base.how == "mismatch-allowed":
        raise SeriesError(
            f"{checkout}: detached HEAD at an unknown base",
            hint="create a branch first (git switch -c work) so the series commits are kept",
        )
    k, results = _already_applied(repo, base, patches)
    report = ApplyReport(Path(checkout), base, results, False, check, state.head, state.head)
    if k == len(patches):
        return report
    env = gitops.committer_env(repo)
    with progress.step(f"{'check' if check else 'apply'} {len(patches) - k} patch(es)"):
        with gitops.temp_worktree(repo, state.head) as wt:
            for i, patch in enumerate(patches[k:], start=k):
                result = _apply_one(wt, patch, env, check)
                results.append(result)
                progress.info(f"{patch.name}: {result.status}")
                if result.status == "failed":
                    progress.info("stopped; the checkout is left as it was")
                    results.extend(PatchResult(p.name, "not-tried") for p in patches[i + 1 :])
                    break
            new_head = wt.head.commit.hexsha
        if gitops.RepoState.snapshot(repo) != state:
            state.restore(repo)
        if check or not report.ok:
            return report
        try:
            repo.git.merge("--ff-only", "-q", new_head)
        except BaseException:
            state.restore(repo)
            raise
    report.changed, report.head_after = True, new_head
    return report


def _cmd_apply(args: argparse.Namespace) -> int:
    patches = load_series(args.patches)
    report = apply_series(
        args.checkout,
        patches,
        check=args.check,
        allow_base_mismatch=args.allow_base_mismatch,
        lock=load_lock(args.lock),
        cache_dir=args.cache_dir,
    )
    print(report.format())
    if not report.ok:
        failed = next(r for r in report.results if r.status == "failed")
        raise SeriesError(
            f"{failed.name} does not apply to {args.checkout}; nothing was changed",
            hint="rebase the patch: apply the series up to it, then "
            f"git -C {args.checkout} am -3 {args.patches / failed.name}, resolve, "
            "git am --continue, and regenerate with scripts/export.sh",
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("apply", help="apply patches/series to a checkout of the pin")
    p.add_argument("checkout", type=Path)
    p.add_argument("--check", action="store_true", help="report what would happen, change nothing")
    p.add_argument(
        "--allow-base-mismatch",
        action="store_true",
        help="apply even when the checkout is not provably the pin",
    )
    p.add_argument("--patches", type=Path, default=paths.default_patches_dir())
    p.add_argument("--lock", type=Path, default=paths.default_lock_path())
    p.add_argument("--cache-dir", type=Path, default=paths.default_cache_dir())
    p.set_defaults(func=_cmd_apply)
