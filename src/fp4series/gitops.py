"""Git helpers (gitpython) shared by apply/export/verify/rebase-check, with user-facing errors.

Public API (stable):
    open_repo(path) -> Repo                  SeriesError when missing / not a repo top level / bare
    status_lines(repo) -> list[str]          `git status --porcelain`, untracked files included
    is_dirty(repo) -> bool                   tracked or untracked changes
    require_clean(repo) -> None              SeriesError listing the changes (apply, export)
    operation_in_progress(repo) -> str|None  "git am" / "rebase" / "merge" / "cherry-pick" /
                                             "revert"
    ABORT_COMMANDS: {operation: the command that abandons it}
    temp_worktree(repo, rev, parent=None) -> context manager yielding a Repo in a detached
        scratch worktree under PARENT (a new temporary directory by default), removed after
    is_ancestor(repo, ancestor, rev) -> bool
    blob_id(repo, rev, path) -> str | None
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
    # --no-optional-locks: a status check must not rewrite the user's index (nor need the disk)
    out = repo.git(no_optional_locks=True).status(
        "--porcelain=v1", "--untracked-files=all", "--ignore-submodules=none"
    )
    return [line for line in out.splitlines() if line]


def is_dirty(repo: Repo) -> bool:
    return bool(status_lines(repo))


ABORT_COMMANDS = {
    "git am": "git am --abort",
    "rebase": "git rebase --abort",
    "merge": "git merge --abort",
    "cherry-pick": "git cherry-pick --abort",
    "revert": "git revert --abort",
}


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
    if (gd / "REVERT_HEAD").exists():
        return "revert"
    return None


def require_clean(repo: Repo) -> None:
    """Refuse to work on a tree with changes, untracked files, no commits or a pending am/rebase."""
    where = repo.working_tree_dir
    busy = operation_in_progress(repo)
    if busy:
        abort = ABORT_COMMANDS[busy].replace("git ", f"git -C {where} ", 1)
        raise SeriesError(
            f"{where}: a {busy} is in progress; nothing was changed",
            hint=f"finish it, or abandon it with `{abort}`",
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


@contextmanager
def temp_worktree(repo: Repo, rev: str, parent: Path | None = None) -> Iterator[Repo]:
    """A detached scratch work tree at REV; removed (and pruned) afterwards whatever happens."""
    parent = parent or Path(tempfile.mkdtemp(prefix="fp4series-wt-"))
    path = parent / "wt"
    try:
        repo.git.worktree("add", "--detach", "--quiet", str(path), rev)
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


def blob_id(repo: Repo, rev: str, path: str) -> str | None:
    """The blob id of PATH at REV, or None when it does not exist there."""
    try:
        return repo.git.rev_parse("--verify", "-q", f"{rev}:{path}")
    except git.GitCommandError:
        return None


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
