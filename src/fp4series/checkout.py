"""How apply changes a user's checkout without ever losing what the user has there.

apply.py decides *what* goes in (the series, verified, as commits built in a scratch worktree).
This module owns the three mechanics that must hold under races and a kill at any instant, so
they can be read and tested on their own:

apply_lock -- one apply per checkout. ``flock`` on ``<git-dir>/fp4series-apply.lock``: the
    kernel drops it when the holder dies, so a killed run never leaves it stuck. The file names
    the holder (pid, host, time) for the refusal message and is removed on a clean exit; one
    found by the next holder means the previous run was killed, which is reported.

install(repo, branch, old, new) -- move the checkout from commit OLD to NEW, or change nothing:
    1. take ``<git-dir>/index.lock`` ourselves (marked as ours): git commands that write the
       index (commit, add, checkout, switch, reset, stash) are refused while we finish;
    2. HEAD must still be BRANCH and BRANCH still OLD, else stop (nothing changed);
    3. ``git read-tree -m -u OLD NEW`` into a private copy of the index: the two-tree merge
       writes NEW's files and refuses (writing nothing) when a local edit or an untracked file
       would be overwritten; edits to other files are carried over;
    4. ``git update-ref BRANCH NEW OLD``: a compare-and-swap, so a branch moved meanwhile is
       never overwritten (the work tree is then merged back to OLD);
    5. install the private index and drop index.lock.
    The branch moves only after the work tree holds NEW, so a kill before step 4 is undone by
    putting OLD's files back, a kill after it is finished by installing the index. A state
    file (``<git-dir>/fp4series-apply.json``: branch, old, new, step) is written before each
    step so that ``recover`` knows which of the two it is.

recover(repo) -- run by every apply (under the lock) before it looks at the checkout: finishes
    or rolls back an install that was killed, removes an index.lock left by us, and says what it
    did. It refuses, naming the files, when the checkout changed in a way it cannot prove safe.

remove_leftover_worktrees(repo) -- scratch worktrees of killed applies (their owner pid is dead)
    are removed, ``git worktree prune`` is run, and dead applies' scratch directories in the
    temporary directory are removed too.

pause(point) -- test hook: with FP4SERIES_PAUSE_AT=<point>[,<point>] and FP4SERIES_PAUSE_DIR=D,
    apply writes D/<point>.reached (its pid) and waits until D/<point>.release exists.
    Points: scratch (patches in, scratch worktree still there), applied (result ready, checkout
    untouched), index-locked, worktree-updated, ref-moved (install's steps 1, 3, 4 done).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import git
from git import Repo

from fp4series import gitops
from fp4series.errors import SeriesError

LOCK_NAME = "fp4series-apply.lock"
STATE_NAME = "fp4series-apply.json"
PRIVATE_INDEX = "fp4series-index"
INDEX_LOCK_MARK = b"fp4series apply"
WORKTREE_PREFIX = "fp4series-apply-"
PAUSE_POINTS = ("scratch", "applied", "index-locked", "worktree-updated", "ref-moved")


def pause(point: str) -> None:
    """Block at a named point while a test acts on the checkout (no-op unless asked)."""
    assert point in PAUSE_POINTS, point
    wanted = os.environ.get("FP4SERIES_PAUSE_AT", "")
    if point not in wanted.split(","):
        return
    where = Path(os.environ["FP4SERIES_PAUSE_DIR"])
    (where / f"{point}.reached").write_text(f"{os.getpid()}\n")
    while not (where / f"{point}.release").exists():
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------- lock


@contextmanager
def apply_lock(repo: Repo) -> Iterator[str | None]:
    """Hold the checkout's apply lock; yields a note when the previous holder was killed.

    The file exists only while held (a clean exit removes it), so the tree is left as found; a
    file that still names someone after we got the flock was left by a killed run."""
    path = Path(repo.git_dir) / LOCK_NAME
    fd = _open_locked(path, repo)
    try:
        previous = _read_holder(fd)
        note = None
        if previous:
            note = (
                f"a previous apply (pid {previous.get('pid', '?')}, started "
                f"{previous.get('time', '?')}) was killed before it finished; checking its state"
            )
        me = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.strftime("%FT%T%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        yield note
    finally:
        with suppress(FileNotFoundError):
            path.unlink()  # still ours: unlinked before the flock is dropped
        os.close(fd)  # closing drops the flock


def _open_locked(path: Path, repo: Repo) -> int:
    """Open PATH and flock it; retry when a releasing holder unlinked it meanwhile."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise SeriesError(
                f"another apply is running on {repo.working_tree_dir} "
                f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                f"started {holder.get('time', '?')}); nothing was changed",
                hint=f"wait for it to finish, or stop it (kill {holder.get('pid', 'PID')}); "
                "the lock is released when that process exits",
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _read_holder(fd: int) -> dict[str, object]:
    raw = os.pread(fd, 4096, 0)
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        return {"pid": "?"} if raw.strip() else {}
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------------------------ state, index lock


def _state_path(repo: Repo) -> Path:
    return Path(repo.git_dir) / STATE_NAME


def _write_state(repo: Repo, **state: str) -> None:
    path = _state_path(repo)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, path)


def _read_state(repo: Repo) -> dict[str, str] | None:
    path = _state_path(repo)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:  # killed while writing the .tmp: the old file is intact, so unreachable
        return None


def _index_lock(repo: Repo) -> Path:
    return Path(repo.git_dir) / "index.lock"


def index_lock_is_ours(repo: Repo) -> bool:
    try:
        return _index_lock(repo).read_bytes().startswith(INDEX_LOCK_MARK)
    except FileNotFoundError:
        return False


def stale_index_lock_error(repo: Repo) -> SeriesError:
    lock = _index_lock(repo)
    return SeriesError(
        f"{lock} exists: another git command is running in {repo.working_tree_dir}, or one "
        "crashed and left it; nothing was changed",
        hint=f"if no git command is running there, remove it (rm {lock}) and run apply again",
    )


def _take_index_lock(repo: Repo) -> None:
    try:
        fd = os.open(_index_lock(repo), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise stale_index_lock_error(repo) from None
    try:
        os.write(fd, INDEX_LOCK_MARK + f" pid {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _git_env(repo: Repo) -> dict[str, str]:
    return {"GIT_INDEX_FILE": str(Path(repo.git_dir) / PRIVATE_INDEX)}


# ------------------------------------------------------------------------------------- install


def branch_tip(repo: Repo, ref: str) -> str | None:
    try:
        return repo.git.rev_parse("--verify", "-q", ref + "^{commit}")
    except git.GitCommandError:
        return None


def _head_ref(repo: Repo) -> str | None:
    try:
        return repo.git.symbolic_ref("-q", "HEAD")
    except git.GitCommandError:
        return None


def install(repo: Repo, branch: str, old: str, new: str) -> str | None:
    """Move BRANCH (checked out) and the checkout from OLD to NEW (see module doc).

    Returns None when done, or why nothing was changed (the checkout moved on meanwhile)."""
    _write_state(repo, branch=branch, old=old, new=new, step="begin")
    try:
        _take_index_lock(repo)
    except SeriesError:
        _state_path(repo).unlink(missing_ok=True)
        raise
    try:
        pause("index-locked")
        if _head_ref(repo) != branch or branch_tip(repo, branch) != old:
            _release(repo)
            return f"{branch} or HEAD moved while apply ran"
        shutil.copyfile(Path(repo.git_dir) / "index", Path(repo.git_dir) / PRIVATE_INDEX)
        with suppress(git.GitCommandError):  # read-tree -m trusts stat data: refresh it first
            repo.git.update_index("-q", "--refresh", env=_git_env(repo))
        _write_state(repo, branch=branch, old=old, new=new, step="worktree")
        try:
            repo.git.read_tree("-m", "-u", old, new, env=_git_env(repo))
        except git.GitCommandError as exc:
            _release(repo)
            said = (exc.stderr or "").strip().replace("error: ", "")
            return f"the work tree changed while apply ran; the series would overwrite:\n{said}"
        pause("worktree-updated")
        _write_state(repo, branch=branch, old=old, new=new, step="ref")
        try:
            repo.git.update_ref("-m", "fp4series apply", branch, new, old)
        except git.GitCommandError:
            repo.git.read_tree("-m", "-u", new, old, env=_git_env(repo))
            _release(repo)
            return f"{branch} moved while apply ran"
        pause("ref-moved")
        _write_state(repo, branch=branch, old=old, new=new, step="index")
        os.replace(Path(repo.git_dir) / PRIVATE_INDEX, Path(repo.git_dir) / "index")
        _release(repo)
    except BaseException:
        with suppress(Exception):  # the original error is the one to report
            recover(repo)
        raise
    return None


def pending(repo: Repo) -> bool:
    """Is an install unfinished (its state file still there)?"""
    return _state_path(repo).exists()


def _release(repo: Repo) -> None:
    (Path(repo.git_dir) / PRIVATE_INDEX).unlink(missing_ok=True)
    if index_lock_is_ours(repo):
        _index_lock(repo).unlink()
    _state_path(repo).unlink(missing_ok=True)


def recover(repo: Repo) -> tuple[str, bool] | None:
    """Finish or undo an install that was interrupted: (what was done, whether the branch is now
    at the killed run's result); None when there was nothing to do (module doc)."""
    state = _read_state(repo)
    if state is None:
        if index_lock_is_ours(repo):  # killed right after taking it: nothing else was done
            _index_lock(repo).unlink()
            return "removed the index.lock a killed apply left; the checkout was not changed", False
        return None
    branch, old, new, step = state["branch"], state["old"], state["new"], state["step"]
    if step == "begin" or not index_lock_is_ours(repo):
        _release(repo)  # the work tree was not touched yet
        return None
    tip = branch_tip(repo, branch)
    if tip == new:
        private = Path(repo.git_dir) / PRIVATE_INDEX
        if private.exists():
            os.replace(private, Path(repo.git_dir) / "index")
        _release(repo)
        return f"finished an apply that was killed: {branch} is at {new[:12]}", True
    if tip == old:
        _roll_back_worktree(repo, old, new)
        _release(repo)
        return "rolled back an apply that was killed; the checkout is as it was before it", False
    raise SeriesError(
        f"an apply was killed while moving {branch} from {old[:12]} to {new[:12]}, and {branch} "
        f"is now {tip}; nothing was changed",
        hint=f"its series commits are {new}; inspect the checkout, then remove "
        f"{_state_path(repo)} and {_index_lock(repo)}",
    )


def _roll_back_worktree(repo: Repo, old: str, new: str) -> None:
    """Put OLD's files back where a killed install wrote NEW's, refusing anything else."""
    listing = repo.git.diff("--name-only", "--no-renames", "-z", old, new)
    changed = [p for p in listing.split("\0") if p]
    root = Path(repo.working_tree_dir or ".")
    foreign = []
    restore, remove = [], []
    for rel in changed:
        was, will = gitops.blob_id(repo, old, rel), gitops.blob_id(repo, new, rel)
        path = root / rel
        have = repo.git.hash_object("--", rel) if path.is_file() else None
        if have not in {was, will}:
            foreign.append(rel)
        elif was is not None and have != was:
            restore.append(rel)
        elif was is None and have is not None:
            remove.append(rel)
    if foreign:
        raise SeriesError(
            "an apply was killed while writing the work tree and these files now hold neither "
            "the original nor the series' content: " + ", ".join(foreign),
            hint=f"nothing was changed; keep what you need, then `git -C {root} checkout -- "
            f"<file>` them, remove {_state_path(repo)} and {_index_lock(repo)}, and rerun apply",
        )
    if restore:
        repo.git.checkout_index("-f", "--", *restore)
    for rel in remove:
        (root / rel).unlink()


# ------------------------------------------------------------------------------------ worktrees


def new_worktree_dir() -> Path:
    """A scratch directory for one apply's worktree, with its owner pid for later cleanup."""
    parent = Path(tempfile.mkdtemp(prefix=WORKTREE_PREFIX))
    (parent / "owner").write_text(f"{os.getpid()}\n")
    return parent


def remove_leftover_worktrees(repo: Repo) -> list[str]:
    """Remove scratch worktrees whose apply died (SIGKILL); prune git's registrations."""
    removed = []
    listing = repo.git.worktree("list", "--porcelain").splitlines()
    paths = [Path(line[len("worktree ") :]) for line in listing if line.startswith("worktree ")]
    for path in paths:
        parent = path.parent
        if not parent.name.startswith(WORKTREE_PREFIX) or _owner_alive(parent):
            continue
        with suppress(git.GitCommandError):
            repo.git.worktree("remove", "--force", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)
        removed.append(str(path))
    repo.git.worktree("prune")
    for owner in Path(tempfile.gettempdir()).glob(f"{WORKTREE_PREFIX}*/owner"):
        if not _owner_alive(owner.parent):  # registration already pruned, directory left
            shutil.rmtree(owner.parent, ignore_errors=True)
            removed.append(str(owner.parent / "wt"))
    return removed


def _owner_alive(parent: Path) -> bool:
    try:
        return pid_alive(int((parent / "owner").read_text()))
    except (OSError, ValueError):
        return False
