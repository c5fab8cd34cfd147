"""Git helpers (gitpython) shared by apply/export/verify/rebase-check, with user-facing errors.

Public API (stable):
    open_repo(path) -> Repo                  SeriesError when missing / not a repo top level / bare
    status_lines(repo) -> list[str]          `git status --porcelain`, untracked files included
    is_dirty(repo) -> bool                   tracked or untracked changes
    require_clean(repo) -> None              SeriesError listing the changes (apply, export)
    operation_in_progress(repo) -> str|None  "git am" / "rebase" / "merge" / "cherry-pick"
    RepoState.snapshot(repo) / state.restore(repo)
        remember HEAD (sha + branch), index and status; restore aborts a pending `git am`,
        resets hard to the sha, removes files that were not there before, and verifies that
        `git status --porcelain` is identical to before (SeriesError if not).
    temp_worktree(repo, rev) -> context manager yielding a Repo in a detached scratch worktree
    is_ancestor(repo, ancestor, rev) -> bool
    read_blob(repo, rev, path) -> bytes | None
    patch_id(repo, diff_text) -> str | None  `git patch-id --stable`
    commit_patch_id(repo, rev) -> str | None
    committer_env(repo) -> dict              fallback committer identity when none is configured
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import git
from git import Repo

from fp4series.errors import SeriesError


def open_repo(path: Path | str) -> Repo:
    """Open the top level of a non-bare git work tree, or explain why not."""
    path = Path(path)
    if not path.exists():
        raise SeriesError(f"{path} does not exist", hint="pass the path of a git checkout")
    try:
        repo = Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SeriesError(
            f"{path} is not a git repository (or not its top-level directory)",
            hint="pass the top level of a clone of sglang at v0.5.11, or create one with "
            "scripts/fetch-upstream.sh DEST",
        ) from None
    if repo.bare:
        raise SeriesError(f"{path} is a bare repository", hint="pass a checkout with a work tree")
    return repo


def status_lines(repo: Repo) -> list[str]:
    out = repo.git.status("--porcelain=v1", "--untracked-files=all", "--ignore-submodules=none")
    return [line for line in out.splitlines() if line]


def is_dirty(repo: Repo) -> bool:
    return bool(status_lines(repo))


def operation_in_progress(repo: Repo) -> str | None:
    gd = Path(repo.git_dir)
    if (gd / "rebase-apply" / "applying").exists():
        return "git am"
    if (gd / "rebase-apply").exists() or (gd / "rebase-merge").exists():
        return "rebase"
    if (gd / "MERGE_HEAD").exists():
        return "merge"
    if (gd / "CHERRY_PICK_HEAD").exists():
        return "cherry-pick"
    return None


def require_clean(repo: Repo) -> None:
    """Refuse to work on a tree with changes, untracked files, no commits or a pending am/rebase."""
    where = repo.working_tree_dir
    busy = operation_in_progress(repo)
    if busy:
        raise SeriesError(
            f"{where}: a {busy} is in progress",
            hint=f"finish or abort it first (e.g. git -C {where} am --abort)",
        )
    if head_sha(repo) is None:
        raise SeriesError(f"{where} has no commits", hint="check out the pin v0.5.11 first")
    dirty = status_lines(repo)
    if dirty:
        shown = "\n".join(f"  {line}" for line in dirty[:15])
        more = f"\n  ... and {len(dirty) - 15} more" if len(dirty) > 15 else ""
        raise SeriesError(
            f"{where} has uncommitted changes or untracked files; nothing was changed:\n"
            f"{shown}{more}",
            hint=f"commit or stash them (git -C {where} stash -u), or use a fresh checkout",
        )


def head_sha(repo: Repo) -> str | None:
    try:
        return repo.head.commit.hexsha
    except ValueError:  # unborn branch
        return None


def current_branch(repo: Repo) -> str | None:
    return None if repo.head.is_detached else repo.active_branch.name


@dataclass(frozen=True)
class RepoState:
    """What must be identical after an operation that failed or only pretended (--check)."""

    head: str | None
    branch: str | None
    status: tuple[str, ...]

    @classmethod
    def snapshot(cls, repo: Repo) -> RepoState:
        return cls(head_sha(repo), current_branch(repo), tuple(status_lines(repo)))

    def restore(self, repo: Repo) -> None:
        """Put HEAD, index and work tree back; raise if the result differs from the snapshot."""
        if operation_in_progress(repo) == "git am":
            repo.git.am("--abort")
        if self.head is None:
            raise SeriesError("cannot restore an unborn branch")
        if self.branch is not None and current_branch(repo) != self.branch:
            repo.git.checkout("-f", self.branch)
        repo.git.reset("--hard", "-q", self.head)
        before = {line[3:] for line in self.status if line.startswith("?? ")}
        for line in status_lines(repo):
            if line.startswith("?? ") and line[3:] not in before:
                target = Path(repo.working_tree_dir or ".") / line[3:].strip('"')
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink(missing_ok=True)
        now = RepoState.snapshot(repo)
        if now != self:
            raise SeriesError(
                f"could not restore {repo.working_tree_dir} exactly: before {self}, now {now}",
                hint=f"inspect it by hand; the original commit was {self.head}",
            )


@contextmanager
def temp_worktree(repo: Repo, rev: str) -> Iterator[Repo]:
    """A detached scratch work tree at REV; removed (and pruned) afterwards whatever happens."""
    parent = Path(tempfile.mkdtemp(prefix="fp4series-wt-"))
    path = parent / "wt"
    repo.git.worktree("add", "--detach", "--quiet", str(path), rev)
    try:
        yield Repo(path)
    finally:
        with suppress(git.GitCommandError):
            repo.git.worktree("remove", "--force", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)
        repo.git.worktree("prune")


def is_ancestor(repo: Repo, ancestor: str, rev: str = "HEAD") -> bool:
    try:
        repo.git.merge_base("--is-ancestor", ancestor, rev)
    except git.GitCommandError:
        return False
    return True


def read_blob(repo: Repo, rev: str, path: str) -> bytes | None:
    """Bytes of PATH at REV (as stored in git), or None when it does not exist there."""
    try:
        blob = repo.commit(rev).tree / path
    except (KeyError, ValueError, git.BadName):
        return None
    return bytes(blob.data_stream.read())


def patch_id(repo: Repo, diff_text: str) -> str | None:
    """Stable patch id of a diff (whitespace- and line-number-insensitive), None for no diff."""
    out = repo.git.patch_id("--stable", istream=_stdin(diff_text))
    return out.split()[0] if out.strip() else None


def commit_patch_id(repo: Repo, rev: str) -> str | None:
    diff = repo.git.show(rev, "--format=", "--no-color", "--no-ext-diff", "--full-index")
    return patch_id(repo, diff + "\n")


def _stdin(text: str) -> IO[bytes]:
    """gitpython's istream wants a real file for a subprocess's stdin."""
    fh = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the caller's subprocess use)
    fh.write(text.encode("utf-8", "surrogateescape"))
    fh.seek(0)
    return fh


def committer_env(repo: Repo) -> dict[str, str]:
    """A committer identity for `git am` when the user has none configured (CI machines)."""
    env: dict[str, str] = {}
    reader = repo.config_reader()
    if not reader.get_value("user", "name", default=""):
        env["GIT_COMMITTER_NAME"] = "fp4series"
    if not reader.get_value("user", "email", default=""):
        env["GIT_COMMITTER_EMAIL"] = "fp4series@localhost"
    return env
