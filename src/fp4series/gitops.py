"""The git layer: every git command of the tooling goes through here, gitpython where it has the
operation, one plain-process runner (``run``, ``start``) where it has none.

gitpython serves reading and writing a checkout (status, blobs, worktrees, commits). ``run`` is
for what it does not give: the exit status and stderr as the answer, bytes on stdin, a clean
environment (the caller's GIT_DIR / GIT_WORK_TREE / GIT_INDEX_FILE never leak into a command
meant for another repository), descriptors handed down (apply's lock), a wrapper in front (a
fault-injection test's). No other module starts a git process itself.

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
  plumbing (plain processes):
    run(cwd, *args, input=None, env=None, text=True, check=False, hint="", pass_fds=(),
        wrapper=None, errors="surrogateescape") -> CompletedProcess
    start(cwd, *args, **popen) -> Popen      a long-running git (cat-file --batch)
    rev(cwd, revision) -> str | None         rev-parse --verify of REVISION in the repo at CWD
    executable() -> str                      the git gitpython runs (GIT_PYTHON_GIT_EXECUTABLE)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

import git
from git import Repo

from fp4series.errors import SeriesError, machine_hint


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


# ------------------------------------------------------------ plumbing: where gitpython has none

LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")


def executable() -> str:
    return git.Git.GIT_PYTHON_GIT_EXECUTABLE or "git"


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in LOCATION_VARS}
    return {**clean, **(env or {})}


def run(
    cwd: Path | str | None,
    *args: str,
    input: str | bytes | None = None,  # noqa: A002 (subprocess's name)
    env: dict[str, str] | None = None,
    text: bool = True,
    check: bool = False,
    hint: str = "",
    pass_fds: Sequence[int] = (),
    wrapper: str | None = None,
    errors: str = "surrogateescape",
    stdin: int | None = None,
) -> subprocess.CompletedProcess:
    """``git ARGS`` in CWD (None: no repository needed) as a plain process, to its end.

    ENV goes on top of the caller's environment without its git location variables; WRAPPER
    runs in front of git (``WRAPPER git ARGS``); PASS_FDS are handed down. CHECK: a failure is
    a SeriesError naming the command, the directory and what git said, with HINT (or the
    machine's: a full disk, a read-only file system)."""
    cmd = [*([wrapper] if wrapper else []), executable(), *args]
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            input=input,
            stdin=stdin,
            env=_environment(env),
            capture_output=True,
            text=text,
            encoding="utf-8" if text else None,
            errors=errors if text else None,
            pass_fds=tuple(pass_fds),
            check=False,
        )
    except OSError as exc:
        raise SeriesError(
            f"cannot run git: {exc}", hint="install git (2.30 or newer) and put it on PATH"
        ) from exc
    if check and proc.returncode != 0:
        said = proc.stderr if text else proc.stderr.decode("utf-8", "replace")
        said = said.strip() or (proc.stdout if text else "").strip()
        where = f" in {cwd}" if cwd else ""
        raise SeriesError(
            f"git {' '.join(args[:3])} failed{where}: {said}",
            hint=machine_hint(said) or hint or "read git's message, fix its cause, then run again",
        )
    return proc


def start(cwd: Path | str, *args: str, **popen: object) -> subprocess.Popen:
    """A long-running ``git ARGS`` in CWD (its pipes as POPEN says), environment as in run."""
    return subprocess.Popen(  # type: ignore[call-overload]
        [executable(), *args], cwd=cwd, env=_environment(None), **popen
    )


def rev(cwd: Path | str, revision: str) -> str | None:
    """The object id REVISION names in the repository at CWD, None when it names nothing."""
    proc = run(cwd, "rev-parse", "-q", "--verify", revision)
    return proc.stdout.strip() if proc.returncode == 0 else None
