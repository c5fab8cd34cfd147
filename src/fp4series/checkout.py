"""How apply changes a user's checkout without ever losing what the user has there.

apply.py decides *what* goes in (the series, verified, as commits built in a scratch worktree).
This module owns the mechanics that must hold under races, a full disk and a kill at any
instant, so they can be read and tested on their own:

apply_lock -- one apply per checkout. ``flock`` on ``<git-dir>/fp4series-apply.lock``: the
    kernel drops it when the holder dies, so a killed run never leaves it stuck. The git commands
    that write the work tree inherit it, so it is held until they have exited too: holding it
    proves that nothing of ours still writes the checkout. The file names the holder (pid, host,
    time) for the refusal message and is removed on a clean exit; one found by the next holder
    means the previous run was killed, which is reported.

install(repo, branch, old, new) -- move the checkout from commit OLD to NEW, or change nothing:
    1. take ``<git-dir>/index.lock`` ourselves (marked as ours): git commands that write the
       index (commit, add, checkout, switch, reset, stash) are refused while we finish;
    2. HEAD must still be BRANCH and BRANCH still OLD, else stop (nothing changed);
    3. every path that differs between OLD and NEW must still hold OLD's content (no edit, no
       staged change, no untracked file where NEW adds one), else stop (nothing changed);
    4. record step "worktree", then ``git read-tree -m -u OLD NEW`` into a private copy of the
       index (``<git-dir>/fp4series-index``): it writes NEW's files on exactly those paths;
    5. ``git update-ref BRANCH NEW OLD``: a compare-and-swap, so a branch moved meanwhile is
       never overwritten (the work tree is then put back to OLD);
    6. install the private index and drop index.lock.
    The state file (``<git-dir>/fp4series-apply.json``: branch, old, new, step) is written before
    each step and removed first when the checkout is settled, so that ``recover`` knows what a
    killed run left. When read-tree fails (full disk) or is killed, it may have written some of
    those paths in part: the rollback puts OLD's content back on each path that holds NEW's
    content, a piece of it (what git leaves when a write fails) or nothing, and never touches a
    path holding anything else (a change of the user's, left as it is and named). When even
    the rollback cannot be written, the state file and index.lock stay and the message says the
    checkout is mid-move, which files, and that a rerun finishes the rollback.
    SIGINT/SIGTERM/SIGHUP arriving while install runs are held (``signals_held``): install stops
    at its next safe point, having put the checkout back (or, once the branch has moved,
    finished), and raises ``Interrupted``, which says which.

guarded(repo) -- the move's guard, a small process started before step 1 that lives through
    the move. apply tells it "done" when install returns or raises; if apply dies instead
    (SIGKILL, the OOM killer), the guard's pipe reaches end-of-file once apply and every git
    command it started are gone, and the guard runs ``apply --recover`` at once, still holding
    the apply lock it inherited: the checkout is back to "untouched or fully applied" within a
    moment, not at the next apply. What it did goes to ``<git-dir>/fp4series-apply.recovered``,
    which the next apply reports. While the move is unfinished, apply's index.lock says in words
    who holds it and the command that finishes or undoes the move (git's own "index.lock: File
    exists" cannot say more).

recover(repo) -- run by every apply (under the lock) before it looks at the checkout: finishes
    or rolls back an install that was killed, removes an index.lock, private index or its lock
    left by one, drops the killed run's refs/fp4series/applied/<branch>, and says what it did.
    It refuses, naming the files, when the checkout changed in a way it cannot prove safe.

remove_leftover_worktrees(repo) -- scratch worktrees of killed applies (their owner pid is dead)
    are removed, ``git worktree prune`` is run, and dead applies' scratch directories in the
    temporary directory are removed too.

Test hooks (no-ops unless set):
    pause(point) -- with FP4SERIES_PAUSE_AT=<point>[,<point>] and FP4SERIES_PAUSE_DIR=D, apply
        writes D/<point>.reached (its pid) and waits until D/<point>.release exists.
        Points: scratch (patches in, scratch worktree still there), applied (result ready,
        checkout untouched), index-locked (install's step 1 done), before-read-tree (step 3
        done, "worktree" recorded, read-tree next), worktree-updated, ref-moved (steps 4, 5).
        GUARD_POINT ("guard"): the guard's recovery, before it looks at the checkout.
    FP4SERIES_FAULT_GIT=PROG -- the git commands that write the work tree (read-tree and the
        rollback's checkout-index) run as ``PROG git ARGS...``, so a test can make them write
        part of their files and then fail or be killed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import git
from git import Repo

from fp4series import gitops
from fp4series.errors import SeriesError, as_series_error, machine_hint
from fp4series.paths import write_atomically

LOCK_NAME = "fp4series-apply.lock"
STATE_NAME = "fp4series-apply.json"
PRIVATE_INDEX = "fp4series-index"
INDEX_LOCK_MARK = b"fp4series apply"
WORKTREE_PREFIX = "fp4series-apply-"
RESULT_REF_PREFIX = "refs/fp4series/applied/"
GUARD_LOG = "fp4series-apply.recovered"
GUARD_POINT = "guard"
LOCK_FD_ENV = "FP4SERIES_APPLY_LOCK_FD"  # the guard's recovery: the apply lock it inherited
FAULT_GIT_ENV = "FP4SERIES_FAULT_GIT"
PAUSE_POINTS = (
    "scratch",
    "applied",
    "index-locked",
    "before-read-tree",
    "worktree-updated",
    "ref-moved",
)
# What git's two-tree merge prints when it refuses, before it writes anything (LC_ALL=C).
_REFUSALS = (
    "Cannot merge.",
    "would be overwritten by merge",
    "would be removed by merge",
    "would lose untracked files",
    "Refusing to remove",
)


def result_ref(branch: str) -> str:
    """Where apply leaves its result for BRANCH when it cannot move the checkout."""
    return RESULT_REF_PREFIX + branch.removeprefix("refs/heads/")


RESULT_REF_MESSAGE = "fp4series apply: result"


def result_ref_value(repo: Repo, ref: str) -> tuple[str | None, bool]:
    """(the commit REF holds or None, whether apply made it). apply creates its result refs
    with a reflog whose newest entry is RESULT_REF_MESSAGE at that commit; a ref made or moved
    by anyone else fails that test and is the user's."""
    value = branch_tip(repo, ref)
    if value is None:
        return None, False
    try:
        top = repo.git.log("-g", "-1", "--format=%H%x09%gs", ref, "--")
    except git.GitCommandError:
        return value, False
    sha, _tab, said = top.partition("\t")
    return value, sha == value and said == RESULT_REF_MESSAGE


def users_result_ref_error(repo: Repo, ref: str, value: str) -> SeriesError:
    where = repo.working_tree_dir
    try:
        subject = repo.git.log("-1", "--format=%s", value, "--")
    except git.GitCommandError:
        subject = "?"
    keep = "keep-" + ref.removeprefix(RESULT_REF_PREFIX).replace("/", "-")
    return SeriesError(
        f"{ref} already exists and apply did not make it (it holds {value[:12]} {subject!r}); "
        "apply leaves its result there when the checkout moves on meanwhile, so nothing was "
        "changed",
        hint=f"keep that commit under another name and free the ref (git -C {where} branch "
        f"{keep} {value} && git -C {where} update-ref -d {ref} {value}), then run apply again",
    )


def write_result_ref(repo: Repo, ref: str, new: str) -> None:
    """Create REF at NEW, or replace a result apply itself left there; a ref of the user's
    (or one that appears meanwhile: the update is a compare-and-swap) is refused."""
    value, ours = result_ref_value(repo, ref)
    if value is not None and not ours:
        raise users_result_ref_error(repo, ref, value)
    try:
        repo.git.update_ref("--create-reflog", "-m", RESULT_REF_MESSAGE, ref, new, value or "")
    except git.GitCommandError:
        now, _ours = result_ref_value(repo, ref)
        if now is not None and now != value:
            raise users_result_ref_error(repo, ref, now) from None
        raise


def drop_result_ref(repo: Repo, ref: str, value: str) -> None:
    """Delete REF if it is still apply's own result at VALUE (never a ref of the user's)."""
    now, ours = result_ref_value(repo, ref)
    if now != value or not ours:
        return
    with suppress(git.GitCommandError):  # already gone, or a full disk: only our own ref stays
        repo.git.update_ref("-d", ref, value)


def pause(point: str) -> None:
    """Block at a named point while a test acts on the checkout (no-op unless asked)."""
    assert point in PAUSE_POINTS, point
    wait_at(point)


def wait_at(point: str, variable: str = "FP4SERIES_PAUSE_AT") -> None:
    """pause's mechanism, for the other commands' named points (export's, rebase's, split's):
    with VARIABLE=<point>[,<point>] and FP4SERIES_PAUSE_DIR=D, write D/<point>.reached and wait
    until D/<point>.release exists."""
    wanted = os.environ.get(variable, "")
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

_LOCK_FDS: dict[str, int] = {}  # git dir -> the flocked fd this process holds for it


@contextmanager
def apply_lock(repo: Repo) -> Iterator[str | None]:
    """Hold the checkout's apply lock; yields a note when the previous holder was killed.

    The file exists only while held (a clean exit removes it), so the tree is left as found; a
    file that still names someone after we got the flock was left by a killed run. The guard's
    recovery (LOCK_FD_ENV set) keeps the lock the killed apply held instead of taking it anew."""
    path = Path(repo.git_dir) / LOCK_NAME
    fd = _inherited_lock(path) or _open_locked(path, repo)
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
        _LOCK_FDS[_key(repo)] = fd
        yield note
    finally:
        _LOCK_FDS.pop(_key(repo), None)
        with suppress(FileNotFoundError):
            path.unlink()  # still ours: unlinked before the flock is dropped
        os.close(fd)  # closing drops the flock (once the git commands we started have exited)


def _key(repo: Repo) -> str:
    return os.path.realpath(repo.git_dir)


def _inherited_lock(path: Path) -> int | None:
    """The flocked descriptor of PATH a killed apply handed its guard (LOCK_FD_ENV), if that is
    still the lock file's; it is taken out of the environment, so no child sees it."""
    raw = os.environ.pop(LOCK_FD_ENV, "")
    if not raw.isdigit():
        return None
    fd = int(raw)
    try:
        same = os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        same = False
    if not same:  # the file was removed meanwhile: take the lock as any apply does
        with suppress(OSError):
            os.close(fd)
        return None
    return fd


def _open_locked(path: Path, repo: Repo) -> int:
    """Open PATH and flock it; retry when a releasing holder unlinked it meanwhile."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            pid = holder.get("pid", "?")
            here = holder.get("host") == socket.gethostname()
            if isinstance(pid, int) and here and not pid_alive(pid):  # its guard or git child
                raise SeriesError(
                    f"an apply on {repo.working_tree_dir} (pid {pid}) was killed while it "
                    "moved the checkout: a git command it started is still writing the "
                    "checkout, or its guard is finishing or undoing the move, and holds its "
                    "lock; nothing was changed",
                    hint="wait a moment for it to exit, then run apply again (it reports "
                    "what the guard did, and finishes or rolls back anything left)",
                ) from None
            raise SeriesError(
                f"another apply is running on {repo.working_tree_dir} "
                f"(pid {pid} on {holder.get('host', '?')}, "
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


# ------------------------------------------------------------------------------------ signals


class Interrupted(KeyboardInterrupt):
    """A signal came while the checkout was being moved; it was settled first. STATE says, in
    words, what the checkout is now."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


_HELD: list[list[int]] = []  # the signals recorded by the signals_held block in force, if any


@contextmanager
def signals_held() -> Iterator[list[int]]:
    """Record SIGINT/SIGTERM/SIGHUP instead of acting on them; yields the list they go to.

    While the checkout is written, a signal must neither abandon a git child mid-write nor stop
    a rollback halfway: the code in the block looks at the list at its safe points. Re-entrant
    (an inner block shares the outer list); signals the process ignores stay ignored; a no-op
    off the main thread (signal handlers can only be set there)."""
    if _HELD:
        yield _HELD[-1]
        return
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def record(signum: int, _frame: object) -> None:
        got.append(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):  # None: set outside Python
            previous[sig] = signal.signal(sig, record)
    _HELD.append(got)
    try:
        yield got
    finally:
        _HELD.pop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------------------ state, index lock


def _state_path(repo: Repo) -> Path:
    return Path(repo.git_dir) / STATE_NAME


def _write_state(repo: Repo, **state: str) -> None:
    """Atomically: on a full disk the previous state file is intact."""
    write_atomically(_state_path(repo), (json.dumps(state) + "\n").encode())


def _read_state(repo: Repo) -> dict[str, str] | None:
    path = _state_path(repo)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:  # written atomically, so unreachable
        return None


def _index_lock(repo: Repo) -> Path:
    return Path(repo.git_dir) / "index.lock"


def _private(repo: Repo) -> Path:
    return Path(repo.git_dir) / PRIVATE_INDEX


def _private_leftovers(repo: Repo) -> list[Path]:
    """The private index, the lock git takes on it, the state's temporary files: ours alone."""
    gd = Path(repo.git_dir)
    found = [gd / n for n in (PRIVATE_INDEX, PRIVATE_INDEX + ".lock") if (gd / n).exists()]
    return found + sorted(gd.glob(f".{STATE_NAME}.*.tmp"))  # paths.write_atomically's


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


def _take_index_lock(repo: Repo, branch: str, old: str, new: str) -> None:
    try:
        fd = os.open(_index_lock(repo), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise stale_index_lock_error(repo) from None
    try:
        os.write(fd, index_lock_text(repo, branch, old, new).encode())
    finally:
        os.close(fd)


def index_lock_text(repo: Repo, branch: str, old: str, new: str) -> str:
    """What apply's index.lock says to someone whose git command met it: git itself prints
    only "File exists", so the file names its holder and the command that settles the move."""
    where = repo.working_tree_dir
    script = _apply_script()
    return (
        f"{INDEX_LOCK_MARK.decode()} (pid {os.getpid()}) holds this lock while it moves {branch} "
        f"from {old[:12]} to {new[:12]} in {where}; git may not write the index until that move "
        "is finished or undone.\n"
        "If that apply was killed, the guard it started finishes or undoes the move within "
        "seconds. If this file is still here after that, run\n"
        f"    {script} --recover {where}\n"
        "which finishes or undoes the move and changes nothing else (or run apply again: it "
        "does the same first, then applies the series).\n"
        "Do not remove this file by hand: git could then commit half-written files.\n"
    )


def _apply_script() -> str:
    """The apply command to name in messages: the project's script when it is there."""
    here = Path(__file__).resolve().parents[2] / "scripts" / "apply.sh"
    return str(here) if here.is_file() else f"{sys.executable} -m fp4series apply"


def _git_env(repo: Repo) -> dict[str, str]:
    return {"GIT_INDEX_FILE": str(_private(repo))}


def _release(repo: Repo) -> None:
    """The checkout is settled: the state goes first (a kill from here on leaves only files that
    recover removes without a question), then the private index, its lock, our index.lock."""
    _state_path(repo).unlink(missing_ok=True)
    for path in _private_leftovers(repo):
        path.unlink(missing_ok=True)
    if index_lock_is_ours(repo):
        _index_lock(repo).unlink()


def pending(repo: Repo) -> bool:
    """Is an install unfinished (its state file still there)?"""
    return _state_path(repo).exists()


# ------------------------------------------------------------------- what the move writes, undo


def _split(text: str) -> list[str]:
    return [p for p in text.split("\0") if p]


def _git_writing(repo: Repo, *args: str, index: Path | None = None) -> subprocess.CompletedProcess:
    """Run a git command that writes the work tree, always to its end: it inherits the apply
    lock (no later apply starts while it runs, even once we are killed) and the guard's pipe
    (the guard acts only once it has exited), and the caller holds the signals, so it is never
    left running behind our back. FP4SERIES_FAULT_GIT: module doc."""
    env = {"LC_ALL": "C", "LANGUAGE": "C"}
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    fds = tuple(fd for fd in (_LOCK_FDS.get(_key(repo)), _GUARD_FDS.get(_key(repo))) if fd)
    return gitops.run(
        repo.working_tree_dir,
        *args,
        env=env,
        stdin=subprocess.DEVNULL,
        errors="replace",
        pass_fds=fds,
        wrapper=os.environ.get(FAULT_GIT_ENV) or None,
    )


def _said(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or "").strip().replace("error: ", "").splitlines()
    said = "\n".join(lines[:3] + ([f"(and {len(lines) - 3} more lines)"] if len(lines) > 3 else []))
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return f"{said} (killed by {name})" if said else f"killed by {name}"
    return said or f"exit status {proc.returncode}"


@dataclass(frozen=True)
class _Change:
    path: str
    was: str | None  # its blob id in OLD (None: not there)
    will: str | None  # its blob id in NEW


def _changes(repo: Repo, old: str, new: str) -> list[_Change]:
    """The paths that differ between OLD and NEW: all that read-tree -m -u OLD NEW may write."""
    fields = repo.git.diff("--raw", "--no-renames", "--no-abbrev", "-z", old, new).split("\0")
    out = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if not meta.startswith(":"):
            break
        old_mode, new_mode, old_id, new_id, _status = meta[1:].split()
        if "160000" in (old_mode, new_mode):  # a submodule: read-tree writes nothing into it
            continue
        was, will = (None if set(i) == {"0"} else i for i in (old_id, new_id))
        out.append(_Change(path, was, will))
    return out


_DIR = "(a directory)"


def _work_tree_ids(repo: Repo, paths: list[str]) -> dict[str, str | None]:
    """The blob id each path holds in the work tree (as `git add` would store it), None when
    there is nothing, _DIR for a directory."""
    root = Path(repo.working_tree_dir or ".")
    out: dict[str, str | None] = {}
    files = []
    for rel in paths:
        path = root / rel
        if path.is_symlink():
            target = os.fsencode(os.readlink(path))
            out[rel] = hashlib.sha1(b"blob %d\0" % len(target) + target).hexdigest()  # noqa: S324
        elif path.is_dir():
            out[rel] = _DIR
        elif path.is_file():
            files.append(rel)
        else:
            out[rel] = None
    if files:
        ids = repo.git.hash_object("--", *files).split()
        out.update(zip(files, ids, strict=True))
    return out


def _piece_of(repo: Repo, new: str, rel: str) -> bool:
    """Does REL hold a leading part of NEW's content (what git leaves when a write fails)?"""
    path = Path(repo.working_tree_dir or ".") / rel
    if path.is_symlink() or not path.is_file():
        return False
    full = repo.git.cat_file(
        "--filters", f"{new}:{rel}", stdout_as_string=False, strip_newline_in_stdout=False
    )
    data = path.read_bytes()
    return len(data) < len(full) and full.startswith(data)


def _in_the_way(repo: Repo, old: str, changes: list[_Change]) -> list[str]:
    """The user's changes on paths the move would write, one line each (none may be there)."""
    staged = set(
        _split(
            repo.git.diff_index(
                "--cached", "--no-renames", "--name-only", "-z", old, env=_git_env(repo)
            )
        )
    )
    have = _work_tree_ids(repo, [c.path for c in changes])
    lines = []
    for c in changes:
        if c.path in staged:
            why = "a staged change"
        elif have[c.path] == c.was:
            continue
        elif c.was is None:
            why = "untracked: it would be overwritten by the file the series adds"
        elif have[c.path] is None:
            why = "deleted"
        else:
            why = "edited"
        lines.append(f"  {c.path} ({why})")
    return lines


class _WriteFailed(Exception):
    """Putting OLD's files back could not be written (the disk is still full?)."""

    def __init__(self, detail: str, paths: list[str]) -> None:
        super().__init__(detail)
        self.detail, self.paths = detail, paths


def _roll_back(repo: Repo, old: str, new: str) -> tuple[list[str], list[str]]:
    """Put OLD's content back on every path that the move wrote: one holding NEW's content, a
    leading part of it, or nothing where OLD has a file. Returns (paths put back, paths left as
    they are because they hold something else: a change of the user's)."""
    changes = _changes(repo, old, new)
    have = _work_tree_ids(repo, [c.path for c in changes])
    staged = set(
        _split(repo.git.diff_index("--cached", "--no-renames", "--name-only", "-z", old))
    )  # the index must hold OLD for checkout-index to restore it (it does while we hold it)
    ours, foreign = [], []
    for c in changes:
        h = have[c.path]
        if h == c.was and c.path not in staged:
            continue
        if c.path not in staged and (
            h == c.will
            or (h is None and c.was is not None)
            or (h not in (None, _DIR) and c.will is not None and _piece_of(repo, new, c.path))
        ):
            ours.append(c)
        elif h != c.was:
            foreign.append(c.path)
    restore = [c.path for c in ours if c.was is not None]
    remove = [c.path for c in ours if c.was is None]
    if restore:
        proc = _git_writing(repo, "checkout-index", "-f", "--", *restore)
        if proc.returncode != 0:
            raise _WriteFailed(_said(proc), restore + remove)
    root = Path(repo.working_tree_dir or ".")
    try:
        for rel in remove:
            (root / rel).unlink(missing_ok=True)
            for parent in Path(rel).parents:  # directories the move made for it, now empty
                if str(parent) == "." or gitops.blob_id(repo, old, parent.as_posix()):
                    break
                try:
                    (root / parent).rmdir()
                except OSError:
                    break
    except OSError as exc:
        raise _WriteFailed(str(exc), restore + remove) from None
    return restore + remove, foreign


def _low_space(path: str) -> str | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return None if free >= 1 << 20 else f"the disk holding {path} is full ({free // 1024} KiB free)"


def _fix_hint(said: str, root: str) -> str:
    hint = machine_hint(said)
    if hint:
        return hint
    low = _low_space(root)
    if low:
        return f"{low}: free space on it, then run apply again"
    return "read git's message above, fix its cause, then run apply again"


def _put_back(done: list[str]) -> str:
    if not done:
        return "had written no file yet"
    shown = ", ".join(done[:8]) + (f" and {len(done) - 8} more" if len(done) > 8 else "")
    return f"put the original content back in the {len(done)} file(s) it had written: {shown}"


def _left(foreign: list[str]) -> str:
    if not foreign:
        return ""
    return (
        "; these files changed while apply ran and are left as they are (they may hold part of "
        "the series' change as well as yours): " + ", ".join(foreign)
    )


def _undo(repo: Repo, old: str, new: str, cause: str) -> tuple[list[str], list[str]]:
    """Roll the work tree back to OLD and release; when that cannot be written, keep the state
    and index.lock (a rerun finishes it) and raise the message that says the checkout is
    mid-move."""
    try:
        done, foreign = _roll_back(repo, old, new)
    except (_WriteFailed, OSError, git.GitCommandError) as exc:  # the state stays, whatever failed
        if isinstance(exc, _WriteFailed):
            detail, paths = exc.detail, exc.paths
        else:
            detail, paths = str(as_series_error(exc)), ["(see git diff --stat)"]
            with suppress(Exception):
                paths = [c.path for c in _changes(repo, old, new)]
        root = repo.working_tree_dir or "."
        hint = machine_hint(detail) or _low_space(root)
        first = "free space on that disk" if hint else "fix what git said"
        raise SeriesError(
            f"{cause}; putting the original files back failed too ({detail}), so the "
            f"checkout is mid-move: HEAD is still {old[:12]}, but these files may not hold "
            f"their original content yet: {', '.join(paths)}",
            hint=f"{first}, then run apply on {root} again (the same command): before anything "
            f"else it finishes putting those files back. Until then {_index_lock(repo)} (apply's) "
            "stays, so that git cannot commit the half-written files: remove neither it nor "
            f"{_state_path(repo)}",
        ) from None
    _release(repo)
    return done, foreign


def _settle(repo: Repo, branch: str, old: str, new: str, cause: str) -> tuple[str, list, list]:
    """Finish (BRANCH already at NEW) or roll back (still at OLD) a move that stopped, and
    release: ("finished" | "rolled back", paths put back, paths left as they are)."""
    tip = branch_tip(repo, branch)
    if tip == new:
        if _private(repo).exists():
            os.replace(_private(repo), Path(repo.git_dir) / "index")
        _release(repo)
        return "finished", [], []
    if tip == old:
        done, foreign = _undo(repo, old, new, cause)
        return "rolled back", done, foreign
    raise SeriesError(
        f"an apply was stopped while moving {branch} from {old[:12]} to {new[:12]}, and {branch} "
        f"is now {tip}; apply changed nothing now",
        hint=f"its series commits are {new}; inspect the checkout, then remove "
        f"{_state_path(repo)} and {_index_lock(repo)}",
    )


def _words(what: str, branch: str, new: str, done: list[str], foreign: list[str]) -> str:
    if what == "finished":
        short = branch.removeprefix("refs/heads/")
        return (
            f"it had already moved {short} when the signal came, so it finished first: the "
            f"series is fully applied ({new[:12]})"
        )
    return f"it stopped and {_put_back(done)}; the checkout is as it was{_left(foreign)}"


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


def _would_overwrite(lines: list[str], said: str = "") -> str:
    return (
        "the work tree changed while apply ran; the series would overwrite these changes of "
        "yours:\n" + "\n".join(lines) + (f"\n  (git read-tree said: {said})" if said else "")
    )


def install(repo: Repo, branch: str, old: str, new: str) -> str | None:
    """Move BRANCH (checked out) and the checkout from OLD to NEW (see module doc).

    Returns None when done, or why nothing was changed (the checkout moved on meanwhile).
    Raises SeriesError when git failed (what it wrote was put back, or the message says that
    the checkout is mid-move and a rerun finishes), Interrupted on a signal (settled first)."""
    with signals_held() as got, guarded(repo):
        _write_state(repo, branch=branch, old=old, new=new, step="begin")
        try:
            _take_index_lock(repo, branch, old, new)
        except SeriesError:
            _state_path(repo).unlink(missing_ok=True)
            raise
        try:  # nothing is written to the work tree before read-tree: stopping only releases
            pause("index-locked")
            if _head_ref(repo) != branch or branch_tip(repo, branch) != old:
                _release(repo)
                return f"{branch} or HEAD moved while apply ran"
            shutil.copyfile(Path(repo.git_dir) / "index", _private(repo))
            # read-tree -m trusts stat data: refresh it. It exits 1 when a file differs (which
            # _in_the_way names); what it says otherwise (a full disk) explains a refusal.
            refresh = _git_writing(repo, "update-index", "-q", "--refresh", index=_private(repo))
            refresh_failed = _said(refresh) if refresh.returncode not in (0, 1) else ""
            mine = _in_the_way(repo, old, _changes(repo, old, new))
            if mine:
                _release(repo)
                return _would_overwrite(mine)
            _write_state(repo, branch=branch, old=old, new=new, step="worktree")
            pause("before-read-tree")
            if got:
                raise Interrupted("the checkout is as it was")
        except BaseException:
            _release(repo)
            raise
        proc = _git_writing(repo, "read-tree", "-m", "-u", old, new, index=_private(repo))
        if proc.returncode != 0:
            return _read_tree_failed(repo, branch, old, new, proc, got, refresh_failed)
        try:
            pause("worktree-updated")
            if got:
                raise Interrupted("")  # the files are NEW's, the branch is not moved: undo
            _write_state(repo, branch=branch, old=old, new=new, step="ref")
            try:
                repo.git.update_ref("-m", "fp4series apply", branch, new, old)
            except git.GitCommandError:
                _done, foreign = _undo(repo, old, new, f"{branch} moved while apply ran")
                return f"{branch} moved while apply ran{_left(foreign)}"
            pause("ref-moved")
            with suppress(OSError):  # the branch has moved: finishing needs no new record
                _write_state(repo, branch=branch, old=old, new=new, step="index")
            os.replace(_private(repo), Path(repo.git_dir) / "index")
            _release(repo)
        except SeriesError:
            raise  # settled, or the message says what is left
        except BaseException as exc:
            raise _settle_after(repo, branch, old, new, exc) from None
        if got:
            raise Interrupted(_words("finished", branch, new, [], []))
    return None


def _read_tree_failed(
    repo: Repo,
    branch: str,
    old: str,
    new: str,
    proc: subprocess.CompletedProcess,
    got: list,
    refresh_failed: str = "",
) -> str:
    """read-tree -m -u failed or was killed: the reason nothing was changed when it refused (it
    then wrote nothing); otherwise roll back what it wrote and raise what happened."""
    said = _said(proc)
    root = repo.working_tree_dir or "."
    if proc.returncode > 0 and not got and any(r in said for r in _REFUSALS):
        try:
            mine = _in_the_way(repo, old, _changes(repo, old, new))
        finally:
            _release(repo)  # it wrote nothing
        if mine:
            return _would_overwrite(mine, said)
        if refresh_failed:  # it saw stale stat data, because the refresh could not be written
            low = _low_space(root)
            cause = f"{low}: " if low else ""
            raise SeriesError(
                f"{cause}git could not refresh its index ({refresh_failed}), so read-tree "
                f"refused to update the work tree ({said}); nothing was changed",
                hint=machine_hint(refresh_failed)
                or (f"{low}: free space on it, then run apply again" if low else "")
                or "read git's message, fix its cause, then run apply again",
            )
        raise SeriesError(
            f"git read-tree refused to update the work tree ({said}), although those files "
            "hold what apply expects; nothing was changed",
            hint="run apply again",
        )
    cause = f"git read-tree failed while writing the work tree: {said}"
    done, foreign = _undo(repo, old, new, cause)
    if got:
        raise Interrupted(_words("rolled back", branch, new, done, foreign))
    raise SeriesError(
        f"{cause}; apply {_put_back(done)}; the checkout is as it was{_left(foreign)}",
        hint=_fix_hint(said, root),
    )


def _settle_after(repo: Repo, branch: str, old: str, new: str, exc: BaseException) -> BaseException:
    """install stopped on EXC after read-tree wrote NEW's files: finish or roll back; returns the
    exception that says what the checkout is now."""
    error = as_series_error(exc)
    stopped = "a signal" if isinstance(exc, KeyboardInterrupt) else (error or repr(exc))
    what, done, foreign = _settle(repo, branch, old, new, f"apply stopped on {stopped}")
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted(_words(what, branch, new, done, foreign))
    if what == "finished" or error is None:
        return exc  # the branch had moved (apply reports it done), or a bug: its traceback
    return SeriesError(
        f"{error}; apply {_put_back(done)}; the checkout is as it was{_left(foreign)}",
        hint=error.hint,
    )


def recover(repo: Repo) -> tuple[str, bool] | None:
    """Finish or undo an install that was killed: (what was done, whether the branch is now
    at the killed run's result); None when there was nothing to do (module doc)."""
    with signals_held():
        return _recover(repo)


def _recover(repo: Repo) -> tuple[str, bool] | None:
    state = _read_state(repo)
    step = state["step"] if state else "begin"
    if step == "begin":  # nothing was written: what a killed run left is ours to remove
        named = ["the index.lock"] if index_lock_is_ours(repo) else []
        named += [str(p) for p in _private_leftovers(repo)]
        _release(repo)
        if state:  # the killed run's result, never installed
            drop_result_ref(repo, result_ref(state["branch"]), state["new"])
        if not named:
            return None
        return (
            f"removed {' and '.join(named)} a killed apply left; the checkout itself was fine",
            False,
        )
    assert state is not None
    branch, old, new = state["branch"], state["old"], state["new"]
    if not index_lock_is_ours(repo):
        if _index_lock(repo).exists():
            lock = _index_lock(repo)
            raise SeriesError(
                f"an apply was interrupted while moving {branch} from {old[:12]} to {new[:12]}, "
                f"and {lock} now belongs to another git command; apply changed nothing now",
                hint=f"let that command finish (if none runs, remove {lock}), then run apply "
                "again: it finishes what the interrupted apply left",
            )
        _take_index_lock(repo, branch, old, new)  # removed by hand: hold it again meanwhile
    short = branch.removeprefix("refs/heads/")
    what, done, foreign = _settle(
        repo, branch, old, new, f"an interrupted apply was moving {short}"
    )
    drop_result_ref(repo, result_ref(branch), new)  # its result, now applied or undone
    if what == "finished":
        return f"finished an apply that was interrupted: {branch} is at {new[:12]}", True
    root = repo.working_tree_dir
    if foreign:
        raise SeriesError(
            "rolled back an apply that was interrupted while writing the work tree "
            f"({_put_back(done)}), except for these files, which hold neither the original nor "
            "the series' content (they changed after it started, and may carry the series' "
            "change as well as yours); they are left as they are: " + ", ".join(foreign),
            hint=f"nothing else is left to undo: look at them (git -C {root} diff -- FILE), keep "
            f"what you need, put the original back (git -C {root} checkout -- FILE), then run "
            "apply again",
        )
    if done:
        return (
            f"rolled back an apply that was interrupted: {_put_back(done)}; the checkout is as it "
            "was before it"
        ), False
    return (
        "an apply was interrupted before it wrote any file; the checkout is as it was before it",
        False,
    )


# ---------------------------------------------------------------------------------------- guard

_GUARD_FDS: dict[str, int] = {}  # git dir -> the write end of the guard's pipe, while guarded

# The guard: `python -S -c GUARD_CODE CHECKOUT LOG`, stdin the read end of apply's pipe. -S: it
# starts in milliseconds and imports nothing until it has work. It reads to end-of-file, which
# comes once apply and every git command apply started (they inherit the write end) are gone:
# "ok" first means apply settled the checkout itself; anything else, that apply died mid-move.
GUARD_CODE = """
import os, sys
said = sys.stdin.buffer.read()
if said.startswith(b"ok"):
    raise SystemExit(0)
os.environ["FP4SERIES_GUARD_LOG"] = sys.argv[2]
os.execv(sys.executable, [sys.executable, "-m", "fp4series", "apply", "--recover", sys.argv[1]])
"""
GUARD_LOG_ENV = "FP4SERIES_GUARD_LOG"


@contextmanager
def guarded(repo: Repo) -> Iterator[None]:
    """Run the block with the move's guard standing by (module doc): if this process dies in
    the block, the guard finishes or undoes the move right away. Without a python to start it
    with (or when it cannot start), the block runs unguarded: the next apply recovers."""
    key = _key(repo)
    lock_fd = _LOCK_FDS.get(key)
    proc = None
    if sys.executable and lock_fd is not None and key not in _GUARD_FDS:
        package_dir = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, LOCK_FD_ENV: str(lock_fd)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_dir, env.get("PYTHONPATH")) if p)
        with suppress(OSError):
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", GUARD_CODE, repo.working_tree_dir or ".",
                 str(Path(repo.git_dir) / GUARD_LOG)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                pass_fds=(lock_fd,),
                start_new_session=True,  # a Ctrl-C or hang-up meant for apply does not reach it
            )  # fmt: skip
    if proc is None or proc.stdin is None:
        yield
        return
    _GUARD_FDS[key] = proc.stdin.fileno()
    try:
        yield
    finally:
        _GUARD_FDS.pop(key, None)
        with suppress(OSError):
            proc.stdin.write(b"ok\n")
        with suppress(OSError):
            proc.stdin.close()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def guard_report(repo: Repo) -> str | None:
    """What the guard of a killed apply did (its log, removed once read), in one note."""
    path = Path(repo.git_dir) / GUARD_LOG
    try:
        said = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None
    path.unlink(missing_ok=True)
    said = " ".join(said.split()) or "(it said nothing)"
    return (
        f"an apply was killed while it moved the checkout; its guard settled it right away: {said}"
    )


def recover_only(repo: Repo) -> list[str]:
    """`apply --recover`: under the apply lock, finish or undo what a killed apply left (scratch
    worktrees, a half-done move, its result ref) and change nothing else; returns what was
    done, one note each. The guard runs this; so can a user who meets apply's index.lock. In
    the guard (GUARD_LOG_ENV set), what it did or why it could not is written to that log
    before the lock is let go, so whoever waits for the lock finds it complete."""
    log = os.environ.pop(GUARD_LOG_ENV, "")
    with apply_lock(repo) as killed_before:
        notes = [n for n in (killed_before, None if log else guard_report(repo)) if n]
        try:
            wait_at(GUARD_POINT)
            settle_killed_run(repo, notes)
        except BaseException as exc:
            if log:
                error = as_series_error(exc)
                _write_log(Path(log), [*notes, f"error: {error or repr(exc)}"])
            raise
        if log:
            _write_log(Path(log), notes)
    return notes


def settle_killed_run(repo: Repo, notes: list[str]) -> bool:
    """Under the apply lock: remove a killed apply's scratch worktrees and finish or undo its
    move (recover), adding a note for each to NOTES. True when that finished the move (the
    branch is at the killed run's result). Raises Interrupted on a signal, once settled."""
    notes += [f"removed {p}, left by a killed apply" for p in remove_leftover_worktrees(repo)]
    with signals_held() as got:  # a rollback is never left halfway
        recovered, moved = recover(repo) or ("", False)
    notes += [recovered] if recovered else []
    if got:
        raise Interrupted(recovered or "the checkout is as it was")
    return moved


def _write_log(path: Path, notes: list[str]) -> None:
    with suppress(OSError):  # a full disk: the next apply finds the state and says it itself
        write_atomically(path, ("\n".join(notes) + "\n").encode())


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
