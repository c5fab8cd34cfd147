"""Is this checkout the pin? By tag/commit ancestry, or by the pinned wheel's RECORD hashes.

Public API (stable):
    find_base(repo, lock, patches, *, cache_dir=None, allow_mismatch=False, progress=None) -> Base
        (a) the lock's tag (or resolved commit) is HEAD or an ancestor of HEAD, or
        (b) every file the series touches has, at HEAD~k, the sha256 the pinned wheel's RECORD
            lists (k = the number of series commits already on top, found by subject).
        Otherwise SeriesError listing the files and what to do; with allow_mismatch the base is
        HEAD~k anyway (how="mismatch-allowed").
    touched_files(patches) -> list[str]    repo paths the series changes that exist at the pin
    record_mismatches(repo, rev, lock, files, hashes) -> list[str]   empty when all match
    trailing_series_commits(repo, patches) -> int   k: HEAD~k..HEAD subjects == series[:k]
    Base: commit (sha), how ("tag" | "commit" | "record" | "mismatch-allowed"), detail
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import git
from git import Repo

from fp4series import gitops, paths
from fp4series.errors import SeriesError
from fp4series.lock import Lock
from fp4series.patch import Patch
from fp4series.progress import Progress
from fp4series.upstream import MATERIALIZED_TRAILER, fetch_wheel, record_hashes


@dataclass(frozen=True)
class Base:
    commit: str
    how: str
    detail: str = ""


def touched_files(patches: list[Patch]) -> list[str]:
    """Paths the series reads before changing them (files it creates itself are left out)."""
    created: set[str] = set()
    out: list[str] = []
    for patch in patches:
        for change in patch.changes:
            if change.old_path is None:
                if change.new_path:
                    created.add(change.new_path)
                continue
            if change.old_path not in created and change.old_path not in out:
                out.append(change.old_path)
    return out


def record_mismatches(
    repo: Repo, rev: str, lock: Lock, files: list[str], hashes: dict[str, str]
) -> list[str]:
    problems = []
    for path in files:
        wheel_path = lock.wheel_path(path)
        if wheel_path is None:
            problems.append(f"{path}: outside {lock.repo_prefix}, the wheel cannot vouch for it")
            continue
        expected = hashes.get(wheel_path)
        data = gitops.read_blob(repo, rev, path)
        if expected is None:
            problems.append(f"{path}: not in the pinned wheel ({wheel_path} missing from RECORD)")
        elif data is None:
            problems.append(f"{path}: missing in the checkout")
        elif hashlib.sha256(data).hexdigest() != expected:
            problems.append(f"{path}: content differs from the pin (sha256 != RECORD)")
    return problems


def _first_parents(repo: Repo, limit: int) -> list[git.Commit]:
    return list(repo.iter_commits("HEAD", first_parent=True, max_count=limit))


def trailing_series_commits(repo: Repo, patches: list[Patch]) -> int:
    """The largest k such that the top k commits carry the subjects of patches[:k], in order."""
    top = _first_parents(repo, len(patches) + 1)
    subjects = [c.summary for c in top]
    for k in range(min(len(patches), len(top)), 0, -1):
        if list(reversed(subjects[:k])) == [p.subject for p in patches[:k]]:
            return k
    return 0


def _rev_commit(repo: Repo, rev: str) -> git.Commit | None:
    try:
        return repo.commit(rev)
    except (git.BadName, ValueError):
        return None


def _mismatch_error(repo: Repo, lock: Lock, problems: list[str], why: str) -> SeriesError:
    shown = "\n".join(f"  {p}" for p in problems[:20])
    more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
    where = repo.working_tree_dir
    tag = lock.pin.tag
    if _rev_commit(repo, f"refs/tags/{tag}") is not None:
        take = f"check out the pin (git -C {where} checkout -b work {tag})"
    elif lock.pin.commit_resolved and _rev_commit(repo, lock.pin.commit) is not None:
        take = f"check out the pin's commit (git -C {where} checkout -b work {lock.pin.commit})"
    else:  # a hint naming a tag the checkout lacks would fail as written
        take = (
            f"this checkout has no tag {tag}: fetch it (git -C {where} fetch {lock.repo_url} "
            f"tag {tag}), then check it out (git -C {where} checkout -b work {tag})"
        )
    return SeriesError(
        f"{where} is not at the pin {tag}: {why}" + (f"\n{shown}{more}" if shown else ""),
        hint=f"{take}, or materialize the pin (scripts/fetch-upstream.sh DEST); or pass "
        "--allow-base-mismatch to try anyway (3-way merge, never fuzz)",
    )


def find_base(
    repo: Repo,
    lock: Lock,
    patches: list[Patch],
    *,
    cache_dir: Path | None = None,
    allow_mismatch: bool = False,
    progress: Progress | None = None,
) -> Base:
    """The pin's commit in this checkout, proven by ancestry or by the wheel RECORD."""
    tagged = _rev_commit(repo, f"refs/tags/{lock.pin.tag}")
    if tagged is not None:
        upstream_commit = MATERIALIZED_TRAILER + ":" not in tagged.message
        moved = lock.pin.commit_resolved and tagged.hexsha != lock.pin.commit
        if moved and upstream_commit and not allow_mismatch:
            raise _mismatch_error(
                repo,
                lock,
                [],
                f"tag {lock.pin.tag} is {tagged.hexsha}, upstream's is {lock.pin.commit}",
            )
        wheel_sha = re.search(r"^Wheel-Sha256: (\S+)$", tagged.message, re.M)
        if wheel_sha and wheel_sha.group(1) != lock.pin.sha256 and not allow_mismatch:
            raise _mismatch_error(
                repo,
                lock,
                [],
                f"tag {lock.pin.tag} was materialized from another wheel "
                f"(sha256 {wheel_sha.group(1)})",
            )
        if gitops.is_ancestor(repo, tagged.hexsha):
            return Base(tagged.hexsha, "tag", f"tag {lock.pin.tag}")
        if not allow_mismatch:
            raise _mismatch_error(
                repo, lock, [], f"HEAD does not contain the tag {lock.pin.tag} ({tagged.hexsha})"
            )
    if lock.pin.commit_resolved:
        pinned = _rev_commit(repo, lock.pin.commit)
        if pinned is not None and gitops.is_ancestor(repo, pinned.hexsha):
            return Base(pinned.hexsha, "commit", f"commit {lock.pin.commit}")
    k = trailing_series_commits(repo, patches)
    candidate = repo.commit(f"HEAD~{k}").hexsha
    files = touched_files(patches)
    wheel = fetch_wheel(
        lock.pin, cache_dir or paths.default_cache_dir(), progress=progress, package=lock.package
    )
    problems = record_mismatches(repo, candidate, lock, files, record_hashes(wheel))
    if not problems:
        return Base(
            candidate, "record", f"{len(files)} touched file(s) match the pinned wheel RECORD"
        )
    if allow_mismatch:
        return Base(candidate, "mismatch-allowed", "base mismatch allowed: " + "; ".join(problems))
    raise _mismatch_error(repo, lock, problems, "files the series touches differ from the pin")
