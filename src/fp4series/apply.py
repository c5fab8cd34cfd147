"""Apply the series to a checkout atomically: all patches as commits, or nothing changed at all.

The patches are applied with `git am --3way --keep-cr --keep-non-patch` (author, subject and
message kept; never fuzz; the checkout's hooks not run) in a scratch worktree of the checkout,
and every file a patch writes is checked against the post-image blob id its header names (a
truncated or edited patch is refused).
Only when every patch went in is the checkout moved to the result, by checkout.install: a
compare-and-swap that never resets, cleans or overwrites anything the user has (see checkout.py
for the lock, the step order and the recovery of a killed run). When the checkout moved on while
apply ran, the result is left on refs/fp4series/applied/<branch> and the report says how to take
it. That ref is apply's own only when apply made it (its reflog says so): one the user made
there is refused up front, never overwritten nor deleted. A failing patch, a refusal or --check
change nothing at all.

Public API (stable):
    apply_series(checkout, patches, *, check=False, allow_base_mismatch=False, lock=None,
                 cache_dir=None, progress=None) -> ApplyReport
        Refuses (SeriesError, nothing changed): not a repo, another apply running, dirty tree
        (untracked files too), an am/rebase/merge/cherry-pick in progress, detached HEAD (unless
        check), base mismatch, a patch whose result differs from its blob ids.
        Returns a report; report.ok is False when a patch failed (then nothing changed);
        report.kept is set when the checkout moved on meanwhile (nothing changed either).
        Raises checkout.Interrupted (a KeyboardInterrupt) when SIGINT/SIGTERM/SIGHUP came while
        the checkout was being moved: it was put back (or, once the branch had moved, finished)
        first, and .state says which.
    ApplyReport: checkout, base, results, changed, check, head_before, head_after, ok, kept,
                 base_note, notes, format()
    PatchResult: name, status, commit, detail, fits (hunks.HunkFit of a failed patch)
        status: "applied" | "applied-3way" | "would-apply" | "would-apply-3way" |
                "already-applied" | "failed" | "not-tried"
    result_ref(branch) -> str    refs/fp4series/applied/<branch name>
CLI: apply [--line VERSION] [--check] [--allow-base-mismatch] CHECKOUT
     apply --recover CHECKOUT   finish or undo what a killed apply left; nothing else
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import git
from git import Repo

from fp4series import checkout as co
from fp4series import gitops, paths
from fp4series.blobs import blob_mismatches
from fp4series.errors import SeriesError, machine_hint
from fp4series.hunks import HunkFit, locate_patch
from fp4series.lock import Lock, load_lock
from fp4series.patch import ZERO_ID, Patch
from fp4series.progress import Progress
from fp4series.verify import Base, find_base

AM_ARGS = ("--3way", "--keep-cr", "--keep-non-patch", "--quiet")
RESULT_REF_PREFIX = co.RESULT_REF_PREFIX


def result_ref(branch: str) -> str:
    return co.result_ref(branch)


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
    kept: tuple[str, str] | None = None  # (result ref, why the checkout was not moved)
    base_note: str = ""  # what sits between the base and HEAD, when anything does
    notes: list[str] = field(default_factory=list)  # recovery of an earlier killed run

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.results)

    @property
    def already_applied(self) -> bool:
        return all(r.status == "already-applied" for r in self.results)

    def format(self) -> str:
        out = [f"note: {n}" for n in self.notes]
        if self.base is not None:
            out.append(f"base: {self.base.commit[:12]} ({self.base.detail})")
            if self.base_note:
                out.append(f"      {self.base_note}")
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
                    out.append("    " + r.detail.replace("\n", "\n      "))
        if not self.results and not self.notes:
            out.append("  (the series is empty)")
        if self.check:
            out.append("--check: nothing was changed")
        elif not self.ok:
            out.append(
                f"nothing was changed: HEAD is still {self.head_before[:12]} (the patches "
                "before the failing one would apply; none was kept)"
            )
        elif self.kept:
            ref, why = self.kept
            out.append(f"nothing was changed: {why}")
            out.append(f"the applied series is kept on {ref} ({self.head_after[:12]})")
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
        _refuse_changed_subject(repo, since, patches)
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


def _refuse_changed_subject(repo: Repo, since: list, patches: list[Patch]) -> None:
    """The commits on the base are the series in order, but a subject differs between a commit
    and its patch (reworded on one side): name that patch, not the first one that still
    matches."""
    if len(since) > len(patches):
        return
    differ = [(c, p) for c, p in zip(since, patches, strict=False) if c.summary != p.subject]
    same_change = [
        (c, p)
        for c, p in differ
        if gitops.commit_patch_id(repo, c.hexsha) == gitops.patch_id(repo, p.text)
    ]
    if not same_change or len(same_change) != len(differ):
        return  # not the series with a reworded subject: the caller's message stands
    commit, patch = same_change[0]
    where = repo.working_tree_dir
    raise SeriesError(
        f"{patch.name} is applied as commit {commit.hexsha[:12]} with another subject: "
        f"{commit.summary!r} in the checkout, {patch.subject!r} in {patch.name} (same changes); "
        "nothing was changed",
        hint=f"if you reworded the commit, export it (scripts/export.sh {where}); if you edited "
        f"the patch, reword the commit to match (git -C {where} rebase -i "
        f"{commit.hexsha[:12]}~1) or start again from a clean checkout of the pin",
    )


def _describe_base(repo: Repo, base: Base, k: int) -> str:
    """Say what lies between the base and the series, so "base: <tag>" is never half true."""
    below = f"HEAD~{k}"
    extra = int(repo.git.rev_list("--count", f"{base.commit}..{below}"))
    if extra == 0:
        return ""
    files = repo.git.diff("--name-only", base.commit, below).splitlines()
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (
        f"+ {extra} commit(s) of yours on top of it, changing {len(files)} file(s)"
        + (f": {shown}" if files else "")
        + "; the series goes on top of those"
    )


def _pre_image_matches(wt: Repo, patch: Patch) -> set[str]:
    """Files of PATCH whose current blob is the pre-image its header names: for those, git must
    produce exactly the post-image id (elsewhere a 3-way merge may legitimately differ)."""
    exact = set()
    for change in patch.changes:
        if change.old_id is None:
            continue
        have = gitops.blob_id(wt, "HEAD", change.old_path) if change.old_path else None
        if have == (None if change.old_id == ZERO_ID else change.old_id):
            exact.add(change.path)
    return exact


def _apply_one(wt: Repo, patch: Patch, env: dict[str, str], check: bool) -> PatchResult:
    exact = _pre_image_matches(wt, patch)
    try:
        wt.git.apply("--check", str(patch.path.resolve()))
        clean = True
    except git.GitCommandError:
        clean = False
    # The checkout's hooks do not run on the series: one that refused would read as "does not
    # apply", one that rewrote a message would make commits export cannot give back.
    am = wt.git(c=f"core.hooksPath={os.devnull}").am
    try:
        am(*AM_ARGS, str(patch.path.resolve()), env=env)
    except git.GitCommandError as exc:
        detail = (exc.stderr or exc.stdout or str(exc)).strip()
        if machine_hint(detail):  # the disk, not the patch: say so
            raise
        fits = locate_patch(patch, lambda p: gitops.read_blob(wt, "HEAD", p))
        if gitops.operation_in_progress(wt) == "git am":
            am("--abort")
        return PatchResult(patch.name, "failed", detail="git am said: " + detail, fits=fits)
    wrong = [m for m in blob_mismatches(wt, "HEAD", patch) if m.file in exact]
    if wrong:
        raise SeriesError(
            f"{patch.name} does not produce the files its header names (truncated or edited "
            "patch?); nothing was changed:\n" + "\n".join(f"  {m.describe()}" for m in wrong),
            hint=f"restore {patch.path} from git (git checkout -- {patch.path}) or "
            "regenerate it with scripts/export.sh",
        )
    status = ("would-apply" if check else "applied") + ("" if clean else "-3way")
    return PatchResult(patch.name, status, None if check else wt.head.commit.hexsha)


def _branch(repo: Repo, check: bool) -> str | None:
    """The checked-out branch apply will move; detached HEAD is refused (commits on no branch
    are easily lost), except for --check, which changes nothing."""
    try:
        return repo.git.symbolic_ref("-q", "HEAD")
    except git.GitCommandError:
        if check:
            return None
        where = repo.working_tree_dir
        raise SeriesError(
            f"{where}: detached HEAD at {gitops.head_sha(repo)}; apply adds commits only to a "
            "branch (commits on no branch are easily lost), so nothing was changed",
            hint=f"create a branch where you are (git -C {where} switch -c work) and run again",
        ) from None


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
    lock = lock or load_lock(paths.default_lock_path())
    with co.apply_lock(repo) as killed_before:
        notes = [n for n in (killed_before, co.guard_report(repo)) if n]
        moved = co.settle_killed_run(repo, notes)
        for note in notes:
            progress.info(note)
        if moved and gitops.is_dirty(repo):  # finished; the user's edits since then stay
            head = gitops.head_sha(repo) or ""
            return ApplyReport(Path(checkout), None, [], True, check, head, head, notes=notes)
        if (Path(repo.git_dir) / "index.lock").exists():
            raise co.stale_index_lock_error(repo)
        gitops.require_clean(repo)
        branch = _branch(repo, check)
        if branch is not None and not check:
            _refuse_users_result_ref(repo, result_ref(branch))
        head = gitops.head_sha(repo)
        assert head is not None
        report = _build(repo, patches, head, check, allow_base_mismatch, lock, cache_dir, progress)
        report.checkout, report.notes = Path(checkout), notes
        if check or not report.ok or report.head_after == head:
            return report
        assert branch is not None
        co.pause("applied")
        ref = result_ref(branch)
        short = branch.removeprefix("refs/heads/")
        with progress.step(f"move {short} to the result"), co.signals_held() as got:
            co.write_result_ref(repo, ref, report.head_after)
            try:
                why = co.install(repo, branch, head, report.head_after)
            except BaseException as exc:
                tip = co.branch_tip(repo, branch)
                settled = not co.pending(repo)
                if settled and tip in (head, report.head_after):
                    _drop_ref(repo, ref, report.head_after)  # undone or done: nothing of ours stays
                if isinstance(exc, KeyboardInterrupt) or not settled or tip != report.head_after:
                    raise
                why = None  # the branch had moved and install finished the rest
                report.notes.append(f"finished the move after: {exc!r}")
            if why:
                report.kept = (ref, why)
            else:
                _drop_ref(repo, ref, report.head_after)
                report.changed = True
            if got:  # came after install had settled the checkout
                done = f"apply had finished: the series is fully applied ({report.head_after[:12]})"
                raise co.Interrupted(
                    f"nothing was changed, and the series is on {ref}" if why else done
                )
        return report


def _drop_ref(repo: Repo, ref: str, value: str) -> None:
    co.drop_result_ref(repo, ref, value)


def _refuse_users_result_ref(repo: Repo, ref: str) -> None:
    """apply may have to leave its result on REF: one the user made there is refused up front
    (before any work), so it is never overwritten nor deleted."""
    value, ours = co.result_ref_value(repo, ref)
    if value is not None and not ours:
        raise co.users_result_ref_error(repo, ref, value)


def _build(
    repo: Repo,
    patches: list[Patch],
    head: str,
    check: bool,
    allow_base_mismatch: bool,
    lock: Lock,
    cache_dir: Path | None,
    progress: Progress,
) -> ApplyReport:
    """Find the base, apply what is missing in a scratch worktree; the checkout is not touched."""
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
    k, results = _already_applied(repo, base, patches)
    report = ApplyReport(Path("."), base, results, False, check, head, head)
    report.base_note = _describe_base(repo, base, k)
    if k == len(patches):
        return report
    env = gitops.committer_env(repo)
    step = f"{'check' if check else 'apply'} {len(patches) - k} patch(es)"
    with progress.step(step), gitops.temp_worktree(repo, head, co.new_worktree_dir()) as wt:
        for i, patch in enumerate(patches[k:], start=k):
            result = _apply_one(wt, patch, env, check)
            results.append(result)
            progress.info(f"{patch.name}: {result.status}")
            if result.status == "failed":
                progress.info("stopped; the checkout is left as it was")
                results.extend(PatchResult(p.name, "not-tried") for p in patches[i + 1 :])
                break
        new_head = wt.head.commit.hexsha
        co.pause("scratch")
    if not report.ok:  # the patches before the failing one were thrown away with the worktree
        for r in results[k:]:
            if r.status.startswith("applied"):
                r.status, r.commit = r.status.replace("applied", "would-apply"), None
    elif not check:
        report.head_after = new_head
    return report
