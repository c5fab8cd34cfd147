"""apply under races, kills and a hostile machine: nothing the user has is lost, ever.

apply runs as a real process; FP4SERIES_PAUSE_AT=<point> stops it at a named point of its final
steps (checkout.PAUSE_POINTS) until the test has acted: edited a file, created one, committed,
started a second apply, filled the disk, or sent SIGKILL. No sleeps decide anything: the test
waits for the point's marker file and releases it with another.

Inside `git read-tree -m -u` (the branch move writing the work tree) there is no pause point:
FP4SERIES_FAULT_GIT runs FAULT_GIT in place of git there, which writes some of the files, one
of them cut short, and then fails, is killed or signals apply, as TEST_FAULT says.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import git as git_module
import gitdb
import pytest
import smmap
from _fakepin import (
    Env,
    default_signals,
    edit,
    git,
    make_env,
    settle,
    tree_fingerprint,
)

import fp4series
from fp4series import checkout, cli

SRC = Path(__file__).resolve().parents[2] / "src"
A_PY = "python/sglang/srt/a.py"
POINTS = checkout.PAUSE_POINTS
BEFORE_WRITE = ("scratch", "applied", "index-locked", "before-read-tree")  # files not yet written
GUARDED = ("index-locked", "before-read-tree", "worktree-updated", "ref-moved")  # install's
SUBJECTS = ["[Quant] Return two and add new module", "[Quant] Change value ten"]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Env:
    """One synthetic pin + series for the module (tests clone it; they never change it)."""
    tmp = tmp_path_factory.mktemp("pin")
    cfg = tmp / "gitconfig"
    cfg.write_text("[user]\n\tname = Test User\n\temail = test@example.com\n")
    old = {k: os.environ.get(k) for k in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM")}
    os.environ.update(GIT_CONFIG_GLOBAL=str(cfg), GIT_CONFIG_NOSYSTEM="1")
    try:
        return make_env(tmp)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def env(template: Env, tmp_path: Path) -> Env:
    root = tmp_path / "project"
    shutil.copytree(template.root, root, symlinks=True)
    return Env(root, template.cache, template.lock, template.pin, root / "patches")


def apply_cmd(env: Env, co: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "fp4series", "apply", str(co), "--patches-dir", str(env.patches),
        "--lock", str(env.lock.path), "--cache-dir", str(env.cache), *extra,
    ]  # fmt: skip


def proc_env(
    pause_dir: Path | None = None, point: str = "", extra: dict[str, str] | None = None
) -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(SRC)}
    out.pop("FP4SERIES_PAUSE_AT", None)
    out.pop(checkout.FAULT_GIT_ENV, None)
    if pause_dir is not None:
        out.update(FP4SERIES_PAUSE_AT=point, FP4SERIES_PAUSE_DIR=str(pause_dir))
    return {**out, **(extra or {})}


def run(
    env: Env, co: Path, *extra: str, fault: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        apply_cmd(env, co, *extra),
        capture_output=True,
        text=True,
        env=proc_env(extra=fault),
        check=False,
        preexec_fn=default_signals,  # the signals the tests send act as from a terminal
    )


class Paused:
    """An apply process stopped at POINT."""

    def __init__(
        self,
        env: Env,
        co: Path,
        point: str,
        tmp: Path,
        fault: dict[str, str] | None = None,
        also: tuple[str, ...] = (),
    ) -> None:
        self.dir = tmp / f"pause-{point}"
        self.dir.mkdir()
        self.point = point
        self.co = co
        self.proc = subprocess.Popen(
            apply_cmd(env, co),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=proc_env(self.dir, ",".join((point, *also)), fault),
            preexec_fn=default_signals,
        )
        reached = self.dir / f"{point}.reached"
        while not reached.exists():  # an event, not a timing guess: the process says it is there
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                pytest.fail(f"apply exited {self.proc.returncode} before {point}:\n{out}\n{err}")
            time.sleep(0.01)

    def release(self) -> tuple[int, str]:
        (self.dir / f"{self.point}.release").write_text("")
        out, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, out + err

    def kill(self, wait_for_guard: bool = True) -> None:
        """SIGKILL apply; then wait until its guard (if it was moving the checkout) is done."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=60)
        if wait_for_guard:
            lock_released(self.co)

    def wait_for(self, point: str) -> int:
        """Block until a process of this run (apply's guard, too) reached POINT; its pid."""
        reached = self.dir / f"{point}.reached"
        while not reached.exists() or not reached.read_text().strip():
            time.sleep(0.01)
        return int(reached.read_text())


def lock_released(co: Path) -> None:
    """Block until nothing holds CO's apply lock: a killed apply's git command and its guard
    have exited (the guard removes the file when it is done)."""
    try:
        fh = (co / ".git" / checkout.LOCK_NAME).open("rb")
    except FileNotFoundError:
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)


def guard_said(co: Path) -> str:
    """What the guard of a killed apply did (its log; the next apply reports and removes it)."""
    log = co / ".git" / checkout.GUARD_LOG
    return log.read_text() if log.exists() else ""


def index_writable(co: Path) -> bool:
    """Can a git command take the index lock (git add of nothing takes it)?"""
    add = subprocess.run(["git", "-C", str(co), "add", "-A"], capture_output=True, check=False)
    return add.returncode == 0


def reachable(co: Path) -> set[str]:
    """Every commit reachable from a ref or a reflog: what 'no commit lost' means."""
    return set(git(co, "rev-list", "--all", "--reflog").split())


def scratch_dirs_of(pid: int) -> list[Path]:
    """The scratch worktree directories apply process PID made (and did not remove)."""
    owners = Path(tempfile.gettempdir()).glob(f"{checkout.WORKTREE_PREFIX}*/owner")
    return [p.parent for p in owners if p.read_text().strip() == str(pid)]


def series_on_top(co: Path, rev: str = "HEAD") -> bool:
    return git(co, "log", "--format=%s", f"v0.5.11..{rev}").splitlines()[:2] == SUBJECTS


def assert_no_debris(co: Path) -> None:
    gd = co / ".git"
    leftovers = [
        n
        for n in ("index.lock", checkout.STATE_NAME, checkout.PRIVATE_INDEX, checkout.LOCK_NAME)
        if (gd / n).exists()
    ]
    assert not leftovers
    assert not (gd / (checkout.PRIVATE_INDEX + ".lock")).exists()
    assert git(co, "worktree", "list", "--porcelain").count("worktree ") == 1


def result_refs(co: Path) -> str:
    return git(co, "for-each-ref", "--format=%(refname)", checkout.RESULT_REF_PREFIX)


# ------------------------------------------------------------------- the user acts at each point


@pytest.mark.parametrize("point", POINTS)
def test_user_edit_of_a_series_file_at_each_point_is_kept(
    env: Env, tmp_path: Path, point: str
) -> None:
    co = env.clone("co")
    old = git(co, "rev-parse", "HEAD").strip()
    before = reachable(co)
    paused = Paused(env, co, point, tmp_path)
    edit(co, A_PY, "value_20 = 20\n", "value_20 = 2000\n")
    rc, out = paused.release()
    assert "value_20 = 2000\n" in (co / A_PY).read_text()  # the user's edit, whatever happened
    assert before <= reachable(co)
    if point in BEFORE_WRITE:  # before the work tree was written: not moved
        assert rc == 1, out
        assert git(co, "rev-parse", "HEAD").strip() == old
        assert "changed while apply ran" in out and "refs/fp4series/applied/work" in out
        assert series_on_top(co, "refs/fp4series/applied/work")
        assert "not uptodate" in out or "would overwrite" in out
        assert "stash push && " in out and "merge --ff-only refs/fp4series/applied/work" in out
        assert git(co, "status", "--porcelain") == f" M {A_PY}\n"
    else:  # after: the series is in, the user's edit sits on top of it
        assert rc == 0, out
        assert series_on_top(co)
        assert "value_10 = 100\n" in (co / A_PY).read_text()
        assert git(co, "status", "--porcelain") == f" M {A_PY}\n"
    assert_no_debris(co)


@pytest.mark.parametrize("untracked", [False, True])
def test_hint_after_an_edit_meanwhile_takes_the_series_and_keeps_the_edit(
    env: Env, tmp_path: Path, untracked: bool
) -> None:
    co = env.clone("co")
    paused = Paused(env, co, "applied", tmp_path)
    edit(co, A_PY, "value_20 = 20\n", "value_20 = 2000\n")
    if untracked:
        (co / "notes.txt").write_text("mine\n")
    rc, out = paused.release()
    assert rc == 1, out
    hint = out.split("keep your changes: ", 1)[1].split(" (if pop", 1)[0]
    assert ("--include-untracked" in hint) == untracked
    subprocess.run(["bash", "-c", hint], check=True, capture_output=True)  # followed word for word
    assert series_on_top(co)
    text = (co / A_PY).read_text()
    assert "value_20 = 2000\n" in text and "value_10 = 100\n" in text
    assert git(co, "stash", "list") == ""
    assert not untracked or (co / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("point", POINTS)
def test_untracked_file_at_each_point_is_kept(env: Env, tmp_path: Path, point: str) -> None:
    co = env.clone("co")
    paused = Paused(env, co, point, tmp_path)
    (co / "notes.txt").write_text("mine\n")
    rc, out = paused.release()
    assert rc == 0, out
    assert (co / "notes.txt").read_text() == "mine\n"
    assert series_on_top(co)
    assert git(co, "status", "--porcelain") == "?? notes.txt\n"
    assert_no_debris(co)


@pytest.mark.parametrize("point", POINTS)
def test_untracked_file_where_the_series_adds_one_is_kept(
    env: Env, tmp_path: Path, point: str
) -> None:
    co = env.clone("co")
    paused = Paused(env, co, point, tmp_path)
    new = co / "python/sglang/srt/new.py"
    if point in BEFORE_WRITE:
        new.write_text("USER = 1\n")
        rc, out = paused.release()
        assert rc == 1 and "would be overwritten" in out, out
        assert new.read_text() == "USER = 1\n"
        assert not series_on_top(co)
    else:  # the series wrote it already: the user's change is an edit of it
        new.write_text("NEW = 1\nUSER = 1\n")
        rc, out = paused.release()
        assert rc == 0, out
        assert series_on_top(co) and new.read_text() == "NEW = 1\nUSER = 1\n"
    assert_no_debris(co)


@pytest.mark.parametrize("point", POINTS)
def test_commit_at_each_point_is_kept(env: Env, tmp_path: Path, point: str) -> None:
    co = env.clone("co")
    old = git(co, "rev-parse", "HEAD").strip()
    paused = Paused(env, co, point, tmp_path)
    (co / "notes.txt").write_text("mine\n")
    committed = all(
        subprocess.run(["git", "-C", str(co), *cmd], capture_output=True, check=False).returncode
        == 0
        for cmd in (["add", "notes.txt"], ["commit", "-q", "-m", "my note"])
    )
    mine = git(co, "rev-parse", "HEAD").strip() if committed else None
    rc, out = paused.release()
    assert (co / "notes.txt").read_text() == "mine\n"
    if point in ("scratch", "applied"):  # the index was free: the commit went in, apply stood back
        assert committed and rc == 1, out
        assert git(co, "rev-parse", "HEAD").strip() == mine != old
        assert "refs/fp4series/applied/work" in out
        assert git(co, "status", "--porcelain") == ""
        assert f"rerun scripts/apply.sh {co}, which puts the series on top" in out
        assert "merge --ff-only" not in out  # it cannot fast-forward over the user's commit
        again = run(env, co)  # the hint, followed
        assert again.returncode == 0, again.stdout + again.stderr
        assert series_on_top(co) and git(co, "log", "-1", "--format=%s", "HEAD~2") == "my note\n"
    else:  # apply held the index: git refused the commit, apply finished, the file is there
        assert not committed
        assert rc == 0, out
        assert series_on_top(co)
        assert git(co, "status", "--porcelain") == "?? notes.txt\n"
    assert_no_debris(co)


def _user_result_ref(co: Path) -> str:
    """A commit of the user's on refs/fp4series/applied/work, reachable from nothing else."""
    (co / "mine.txt").write_text("mine\n")
    git(co, "add", "mine.txt")
    git(co, "commit", "-q", "-m", "my own result")
    mine = git(co, "rev-parse", "HEAD").strip()
    git(co, "reset", "-q", "--hard", "HEAD~1")
    git(co, "update-ref", "refs/fp4series/applied/work", mine)
    return mine


def test_result_ref_the_user_made_is_refused_untouched(env: Env) -> None:
    co = env.clone("co")
    mine = _user_result_ref(co)
    head = git(co, "rev-parse", "HEAD").strip()
    proc = run(env, co)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refs/fp4series/applied/work already exists and apply did not make it" in proc.stderr
    assert mine[:12] in proc.stderr and "Traceback" not in proc.stderr
    assert git(co, "rev-parse", "refs/fp4series/applied/work").strip() == mine
    assert git(co, "rev-parse", "HEAD").strip() == head
    hint = proc.stderr.split("free the ref (", 1)[1].split("), then", 1)[0]
    subprocess.run(["bash", "-c", hint], check=True, capture_output=True)  # followed as written
    again = run(env, co)
    assert again.returncode == 0, again.stdout + again.stderr
    assert series_on_top(co) and not result_refs(co)
    assert git(co, "rev-parse", "refs/heads/keep-work").strip() == mine  # kept, named


@pytest.mark.parametrize("point", ["scratch", "applied"])
def test_result_ref_the_user_makes_while_apply_runs_is_never_overwritten(
    env: Env, tmp_path: Path, point: str
) -> None:
    co = env.clone("co")
    head = git(co, "rev-parse", "HEAD").strip()
    paused = Paused(env, co, point, tmp_path)
    mine = _user_result_ref(co)
    rc, out = paused.release()
    assert rc == 1, out
    assert "already exists and apply did not make it" in out and "Traceback" not in out
    assert git(co, "rev-parse", "refs/fp4series/applied/work").strip() == mine
    assert git(co, "rev-parse", "HEAD").strip() == head
    assert_no_debris(co)


def test_a_result_apply_left_is_its_own_to_replace_and_drop(env: Env, tmp_path: Path) -> None:
    co = env.clone("co")
    paused = Paused(env, co, "applied", tmp_path)
    (co / "notes.txt").write_text("mine\n")
    git(co, "add", "notes.txt")
    git(co, "commit", "-q", "-m", "my note")
    rc, out = paused.release()
    assert rc == 1 and "the series is on refs/fp4series/applied/work" in out, out
    again = run(env, co)  # its own kept result: replaced, then dropped once applied
    assert again.returncode == 0, again.stdout + again.stderr
    assert series_on_top(co) and not result_refs(co)


# ------------------------------------------------------------------------------ two at once, kills


def test_second_apply_while_one_runs_is_refused(env: Env, tmp_path: Path) -> None:
    co = env.clone("co")
    paused = Paused(env, co, "applied", tmp_path)
    second = run(env, co)
    assert second.returncode == 1
    assert "another apply is running" in second.stderr
    assert f"pid {paused.proc.pid}" in second.stderr
    rc, out = paused.release()
    assert rc == 0, out
    assert series_on_top(co) and git(co, "status", "--porcelain") == ""
    assert_no_debris(co)


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_point_then_rerun_finishes(env: Env, tmp_path: Path, point: str) -> None:
    co = env.clone("co")
    old = git(co, "rev-parse", "HEAD").strip()
    before = reachable(co)
    paused = Paused(env, co, point, tmp_path)
    paused.kill()
    tip = git(co, "rev-parse", "refs/heads/work").strip()
    if point != "ref-moved":
        assert tip == old  # the branch moves only at the compare-and-swap
    if point in GUARDED:  # the guard settled the move at once: git works, nothing half-done
        said = guard_said(co)
        assert "was killed" in said and "Traceback" not in said, said
        assert index_writable(co)
        assert git(co, "status", "--porcelain") == ""
        assert series_on_top(co) == (point == "ref-moved")
        assert not result_refs(co)
    again = run(env, co)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "was killed" in again.stderr
    assert series_on_top(co) and git(co, "status", "--porcelain") == ""
    assert before <= reachable(co)
    assert_no_debris(co)
    assert not result_refs(co)  # the killed run's result ref goes too, whichever way it ended
    assert not scratch_dirs_of(paused.proc.pid)


@pytest.mark.parametrize("point", ["worktree-updated", "ref-moved"])
def test_sigkill_then_user_edit_is_never_overwritten(env: Env, tmp_path: Path, point: str) -> None:
    co = env.clone("co")
    paused = Paused(env, co, point, tmp_path, also=(checkout.GUARD_POINT,))
    paused.kill(wait_for_guard=False)
    paused.wait_for(checkout.GUARD_POINT)  # the guard holds the lock, before it looks
    edit(co, A_PY, "value_20 = 20\n", "value_20 = 2000\n")
    (paused.dir / f"{checkout.GUARD_POINT}.release").write_text("")
    lock_released(co)
    assert "value_20 = 2000\n" in (co / A_PY).read_text()
    if point == "worktree-updated":  # cannot prove a.py is ours to roll back: says what to do
        assert A_PY in guard_said(co) and "neither" in guard_said(co)
        again = run(env, co)  # and so does every apply until the user has looked
        assert again.returncode == 1
        assert A_PY in again.stderr and "neither" in again.stderr
        assert "value_20 = 2000\n" in (co / A_PY).read_text()
    else:  # the branch had moved: the guard finished, the edit stays on top
        assert "finished an apply that was interrupted" in guard_said(co)
        assert series_on_top(co)
        assert git(co, "status", "--porcelain") == f" M {A_PY}\n"
        assert_no_debris(co)


def test_sigterm_removes_everything_it_made(env: Env, tmp_path: Path) -> None:
    co = env.clone("co")
    settle(co)
    before = tree_fingerprint(co)
    paused = Paused(env, co, "index-locked", tmp_path)
    paused.proc.send_signal(signal.SIGTERM)
    rc, out = paused.release()
    assert rc == 130 and "interrupted" in out
    assert tree_fingerprint(co) == before
    assert_no_debris(co)


def test_sigterm_in_the_scratch_worktree_removes_it(env: Env, tmp_path: Path) -> None:
    co = env.clone("co")
    paused = Paused(env, co, "scratch", tmp_path)
    owned = scratch_dirs_of(paused.proc.pid)
    assert len(owned) == 1 and (owned[0] / "wt").is_dir()
    paused.proc.send_signal(signal.SIGTERM)
    rc, out = paused.release()
    assert rc == 130, out
    assert not owned[0].exists()
    assert_no_debris(co)


# ---------------------------------------------------------------------- inside git read-tree -m -u

# Run as `FAULT_GIT git ARGS...` for the git commands that write the work tree. read-tree, when
# TEST_FAULT is set, does what git does when a write fails or it is stopped: holds its index's
# lock, writes NEW's files in order (the last one cut short, as a failed write leaves it), then:
#   enospc   fails as git does on a full disk (its lock removed, nothing in its index)
#   index    writes every file in full, then fails to write its index (SIGINT ignored: git's
#            handler removed its lock and it went on)
#   kill     SIGKILLs apply and then itself (the private index's lock stays)
#   SIGTERM, SIGINT, SIGHUP: sends it to apply first, then dies of it, as a signal to the
#            whole process group does
#   orphan   SIGKILLs apply, waits for TEST_RELEASE, then runs the real read-tree
# checkout-index fails while the file TEST_DISK_FULL exists (the rollback cannot be written).
# TEST_FAULT=refresh-enospc: update-index --refresh fails as on a full disk; read-tree is real.
FAULT_GIT = """
import os, signal, subprocess, sys, time
from pathlib import Path

git, *args = sys.argv[1:]
fault = os.environ.get("TEST_FAULT", "")
full = os.environ.get("TEST_DISK_FULL", "")
if args[0] == "checkout-index" and full and os.path.exists(full):
    sys.stderr.write(f"error: unable to write file {args[-1]}\\n")
    sys.exit(1)
if args[0] == "update-index" and fault == "refresh-enospc":
    sys.stderr.write("error: unable to write new index file: No space left on device\\n")
    sys.exit(128)
if args[0] != "read-tree" or fault == "refresh-enospc" or not fault:
    os.execvp(git, [git, *args])
if fault == "orphan":
    os.kill(os.getppid(), signal.SIGKILL)
    while not os.path.exists(os.environ["TEST_RELEASE"]):
        time.sleep(0.01)
    os.execvp(git, [git, *args])
old, new = args[-2:]
lock = Path(os.environ["GIT_INDEX_FILE"] + ".lock")
lock.touch(exist_ok=False)
if fault.startswith("SIG"):
    os.kill(os.getppid(), getattr(signal, fault))
out = subprocess.run([git, "diff", "--name-only", "-z", old, new], capture_output=True, check=True)
paths = out.stdout.decode().split("\\0")[:-1]
for i, path in enumerate(paths):
    blob = subprocess.run([git, "cat-file", "blob", f"{new}:{path}"], capture_output=True)
    data = blob.stdout
    if i == len(paths) - 1 and fault != "index":
        data = data[: len(data) // 2]
    Path(path).unlink(missing_ok=True)
    Path(path).write_bytes(data)
if fault == "kill":
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
lock.unlink()
if fault.startswith("SIG"):
    signal.signal(getattr(signal, fault), signal.SIG_DFL)
    os.kill(os.getpid(), getattr(signal, fault))
sys.stderr.write(
    "fatal: unable to write new index file\\n" if fault == "index"
    else f"error: unable to write file {paths[-1]}\\n"
)
sys.exit(128)
"""
WRITTEN = ["python/sglang/srt/a.py", "python/sglang/srt/b.py", "python/sglang/srt/new.py"]


@pytest.fixture
def fault_git(tmp_path: Path) -> Path:
    path = tmp_path / "fault-git"
    path.write_text(f"#!{sys.executable}\n{FAULT_GIT}")
    path.chmod(0o755)
    return path


def faulty(fault_git: Path, fault: str, **more: str) -> dict[str, str]:
    return {checkout.FAULT_GIT_ENV: str(fault_git), "TEST_FAULT": fault, **more}


@pytest.mark.parametrize("fault", ["enospc", "index"])
def test_read_tree_failing_midway_puts_back_what_it_wrote(
    env: Env, fault_git: Path, fault: str
) -> None:
    co = env.clone("co")
    before = tree_fingerprint(co)
    proc = run(env, co, fault=faulty(fault_git, fault))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "git read-tree failed while writing the work tree" in out
    assert (
        f"put the original content back in the 3 file(s) it had written: {', '.join(WRITTEN)}"
        in out
    )
    assert "; the checkout is as it was" in out
    assert "nothing was changed" not in out and "your work is as you left it" not in out
    assert "Traceback" not in out
    assert tree_fingerprint(co) == before  # every file, the index, HEAD: as they were
    assert_no_debris(co)
    assert not result_refs(co)
    again = run(env, co)
    assert again.returncode == 0, again.stdout + again.stderr
    assert series_on_top(co) and git(co, "status", "--porcelain") == ""


def test_rollback_that_cannot_be_written_says_mid_move_and_a_rerun_finishes(
    env: Env, tmp_path: Path, fault_git: Path
) -> None:
    co = env.clone("co")
    old = git(co, "rev-parse", "HEAD").strip()
    full = tmp_path / "disk-full"
    full.write_text("")
    proc = run(env, co, fault=faulty(fault_git, "enospc", TEST_DISK_FULL=str(full)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "putting the original files back failed too" in out and "mid-move" in out
    assert f"HEAD is still {old[:12]}" in out and ", ".join(WRITTEN) in out
    assert "run apply on" in out and "finishes putting those files back" in out
    assert "nothing was changed" not in out and "as it was" not in out
    gd = co / ".git"
    assert (gd / checkout.STATE_NAME).exists()  # kept, with apply's index.lock, for the rerun
    assert (gd / "index.lock").read_bytes().startswith(checkout.INDEX_LOCK_MARK)
    assert git(co, "rev-parse", "HEAD").strip() == old
    full.unlink()  # space freed: the rerun finishes the rollback, then applies
    again = run(env, co)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert "rolled back an apply that was interrupted: put the original content back" in out
    assert series_on_top(co) and git(co, "status", "--porcelain") == ""
    assert_no_debris(co)
    assert not result_refs(co)


def test_sigkill_during_read_tree_is_rolled_back_by_the_guard_at_once(
    env: Env, fault_git: Path
) -> None:
    co = env.clone("co")
    before = reachable(co)
    files = tree_fingerprint(co)
    killed = run(env, co, fault=faulty(fault_git, "kill"))  # 3 files written, one cut short
    assert killed.returncode == -signal.SIGKILL
    lock_released(co)  # the guard is done: no rerun of apply needed for a usable checkout
    said = guard_said(co)
    assert "rolled back an apply that was interrupted: put the original content back in the 3" in (
        said
    )
    now = tree_fingerprint(co)
    assert now.pop(f".git/{checkout.GUARD_LOG}")
    assert now == files  # every file, the index, HEAD: as they were
    assert index_writable(co)
    again = run(env, co)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert "its guard settled it right away" in out and "put the original content back" in out
    assert "changed while apply ran" not in out
    assert series_on_top(co) and git(co, "status", "--porcelain") == ""
    assert before <= reachable(co)
    assert_no_debris(co)
    assert not result_refs(co)


def test_index_refresh_failing_on_a_full_disk_is_named_not_a_stale_file(
    env: Env, fault_git: Path, tmp_path: Path
) -> None:
    """The refresh cannot be written (no space): read-tree then sees a file whose stat data
    changed as "not uptodate". The message names the refresh and the disk, not the file."""
    co = env.clone("co")
    before = tree_fingerprint(co)
    paused = Paused(env, co, "index-locked", tmp_path, fault=faulty(fault_git, "refresh-enospc"))
    os.utime(co / A_PY, (1_700_000_100, 1_700_000_100))  # same bytes, new stat data
    rc, out = paused.release()
    assert rc == 1, out
    assert "git could not refresh its index (unable to write new index file: No space" in out
    assert "not uptodate" in out and "nothing was changed" in out and "free space" in out
    assert "Traceback" not in out
    os.utime(co / A_PY, (1_700_000_000, 1_700_000_000))
    assert tree_fingerprint(co) == before
    assert_no_debris(co)


def test_private_index_lock_left_by_a_killed_apply_is_removed(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    left = co / ".git" / (checkout.PRIVATE_INDEX + ".lock")
    left.write_text("")
    rc, out = cli_apply(env, co, capsys)
    assert rc == 0, out
    assert f"removed {left} a killed apply left; the checkout itself was fine" in out
    assert "changed while apply ran" not in out
    assert series_on_top(co)
    assert_no_debris(co)
    rc, out = cli_apply(env, co, capsys)  # and no loop: the next run is plain
    assert rc == 0 and "already applied" in out and "removed" not in out


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_during_read_tree_puts_back_what_it_wrote_before_exiting(
    env: Env, fault_git: Path, sig: str
) -> None:
    co = env.clone("co")
    before = tree_fingerprint(co)
    proc = run(env, co, fault=faulty(fault_git, sig))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out
    assert "apply was interrupted; it stopped and put the original content back in the 3" in out
    assert "; the checkout is as it was" in out and "Traceback" not in out
    assert tree_fingerprint(co) == before
    assert_no_debris(co)
    assert not result_refs(co)
    again = run(env, co)  # nothing to recover: a plain apply
    assert again.returncode == 0, again.stdout + again.stderr
    assert "interrupted" not in again.stderr and series_on_top(co)


@pytest.mark.parametrize("point", ["worktree-updated", "ref-moved"])
def test_sigterm_during_the_move_settles_it_first_and_says_how(
    env: Env, tmp_path: Path, point: str
) -> None:
    co = env.clone("co")
    settle(co)
    before = tree_fingerprint(co)
    paused = Paused(env, co, point, tmp_path)
    paused.proc.send_signal(signal.SIGTERM)
    rc, out = paused.release()
    assert rc == 130, out
    if point == "worktree-updated":  # the branch had not moved: undone
        assert "put the original content back in the 3 file(s)" in out and "as it was" in out
        assert tree_fingerprint(co) == before
    else:  # it had: finished
        assert "so it finished first: the series is fully applied" in out
        assert series_on_top(co) and git(co, "status", "--porcelain") == ""
    assert_no_debris(co)
    assert not result_refs(co)


def test_read_tree_of_a_killed_apply_holds_the_lock_until_it_exits(
    env: Env, tmp_path: Path, fault_git: Path
) -> None:
    co = env.clone("co")
    release = tmp_path / "release"
    killed = run(env, co, fault=faulty(fault_git, "orphan", TEST_RELEASE=str(release)))
    assert killed.returncode == -signal.SIGKILL  # apply is gone, its read-tree still runs
    second = run(env, co)
    assert second.returncode == 1
    assert "a git command it started is still writing the checkout" in second.stderr
    assert "or its guard is finishing or undoing the move" in second.stderr
    release.write_text("")
    lock_released(co)
    again = run(env, co)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert "rolled back an apply that was interrupted: put the original content back" in out
    assert series_on_top(co) and git(co, "status", "--porcelain") == ""
    assert_no_debris(co)


def test_index_lock_names_apply_and_the_command_that_settles_the_move(
    env: Env, tmp_path: Path
) -> None:
    """git says only "index.lock: File exists"; the file itself names its holder and what to
    run. With the guard gone too, that command, followed word for word, settles the move."""
    co = env.clone("co")
    files = tree_fingerprint(co)
    paused = Paused(env, co, "worktree-updated", tmp_path, also=(checkout.GUARD_POINT,))
    said = (co / ".git" / "index.lock").read_text()
    assert said.startswith(f"fp4series apply (pid {paused.proc.pid}) holds this lock")
    assert "moves refs/heads/work from" in said and "Do not remove this file by hand" in said
    commit = subprocess.run(
        ["git", "-C", str(co), "commit", "-qam", "mine"], capture_output=True, text=True
    )
    assert commit.returncode != 0 and "index.lock': File exists" in commit.stderr
    paused.kill(wait_for_guard=False)
    guard = paused.wait_for(checkout.GUARD_POINT)
    os.kill(guard, signal.SIGKILL)  # the guard dies too: nothing settles the move by itself
    lock_released(co)
    said = (co / ".git" / "index.lock").read_text()  # still there, still saying what to do
    command = next(line.strip() for line in said.splitlines() if "--recover" in line)
    assert command.endswith(f"scripts/apply.sh --recover {co}")
    follow = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        env={**proc_env(), "FP4SERIES_PYTHON": sys.executable},
        check=False,
    )
    out = follow.stdout + follow.stderr
    assert follow.returncode == 0, out
    assert "rolled back an apply that was interrupted: put the original content back" in out
    now = tree_fingerprint(co)
    assert now == files and index_writable(co)
    assert_no_debris(co)


def test_recover_with_nothing_to_recover_changes_nothing(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    before = tree_fingerprint(co)
    assert cli.main(["apply", "--recover", str(co)]) == 0
    assert "nothing to recover" in capsys.readouterr().out
    assert tree_fingerprint(co) == before


# ------------------------------------------------------------------------- leftovers, bad input


def cli_apply(env: Env, co: Path, capsys: pytest.CaptureFixture, *extra: str) -> tuple[int, str]:
    argv = apply_cmd(env, co, *extra)[3:]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out + err


def test_foreign_index_lock_is_refused_untouched(env: Env, capsys: pytest.CaptureFixture) -> None:
    co = env.clone("co")
    (co / ".git" / "index.lock").write_text("")
    settle_before = tree_fingerprint(co)
    rc, out = cli_apply(env, co, capsys)
    assert rc == 1
    assert f"{co / '.git' / 'index.lock'} exists" in out and "rm " in out
    assert tree_fingerprint(co) == settle_before


def test_index_lock_left_by_a_killed_apply_is_cleared(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    (co / ".git" / "index.lock").write_bytes(checkout.INDEX_LOCK_MARK + b" pid 999999999\n")
    rc, out = cli_apply(env, co, capsys)
    assert rc == 0, out
    assert "removed the index.lock a killed apply left" in out
    assert series_on_top(co)
    assert_no_debris(co)


def test_lock_file_of_a_dead_apply_is_reported_and_taken(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    (co / ".git" / checkout.LOCK_NAME).write_text('{"pid": 999999999, "time": "yesterday"}\n')
    rc, out = cli_apply(env, co, capsys)
    assert rc == 0, out
    assert "previous apply (pid 999999999, started yesterday) was killed" in out
    assert_no_debris(co)


def test_patch_with_a_changed_line_is_refused_before_anything_changes(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    settle(co)
    before = tree_fingerprint(co)
    patch = env.patches / "0002-return-two-and-add-new-module.patch"
    patch.write_text(patch.read_text().replace("+    return 2\n", "+    return 3\n"))
    rc, out = cli_apply(env, co, capsys)
    assert rc == 1
    assert "0002-return-two-and-add-new-module.patch" in out
    assert "python/sglang/srt/b.py" in out and "post-image is blob" in out
    assert tree_fingerprint(co) == before
    assert_no_debris(co)


# ------------------------------------------------------------------------------------- messages


def test_failure_hint_keeps_the_series_recognisable(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    edit(co, "python/sglang/srt/b.py", "    return 1\n", "    return 11\n")
    git(co, "commit", "-qam", "conflicting change")
    rc, out = cli_apply(env, co, capsys)
    assert rc == 1
    assert "am --3way --keep-cr --keep-non-patch" in out and "am -3 " not in out
    assert "0001-change-value-ten.patch: would-apply\n" in out and " -> " not in out
    assert "+ 1 commit(s) of yours on top of it" in out and "python/sglang/srt/b.py" in out


def test_failure_hint_lists_every_patch_left_and_following_it_applies_them_all(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    edit(co, A_PY, "value_10 = 10\n", "value_10 = 11\n")  # conflicts with the first patch
    git(co, "commit", "-qam", "conflicting change")
    rc, out = cli_apply(env, co, capsys)
    assert rc == 1 and "0001-change-value-ten.patch does not apply" in out
    names = ["0001-change-value-ten.patch", "0002-return-two-and-add-new-module.patch"]
    am = [*f"git -C {co} am --3way --keep-cr --keep-non-patch".split()]
    am += [str((env.patches / n).resolve()) for n in names]
    assert " ".join(am) + " (every patch not applied yet, to the end of the series" in out
    assert "until git am has applied them all (2). Only then regenerate" in out
    assert "exporting earlier drops the patches not applied yet" in out
    mine = git(co, "rev-parse", "HEAD").strip()  # the user's commit below the series
    export_cmd = f"scripts/export.sh {co} --base {mine[:12]} (exporting earlier"
    assert export_cmd in out  # not from the pin: that would make the user's commit 0001
    first = subprocess.run(am, capture_output=True, text=True, check=False)  # the hint, followed
    assert first.returncode != 0  # stopped at 0001, as the hint says
    git(co, "checkout", "--theirs", "--", A_PY)  # resolved (the series' side)
    git(co, "add", A_PY)
    git(co, "am", "--continue")  # and the rest of the series follows
    assert series_on_top(co)
    assert git(co, "log", "-1", "--format=%s", "HEAD~2") == "conflicting change\n"
    out_dir = co.parent / "exported"  # the export the hint names keeps the series' numbering
    argv = ["export", str(co), "--patches-dir", str(out_dir), "--lock", str(env.lock.path)]
    assert cli.main([*argv, "--cache-dir", str(env.cache), "--base", mine[:12]]) == 0
    assert sorted(p.name for p in out_dir.glob("*.patch")) == names


@pytest.mark.parametrize(
    ("operation", "abort"),
    [
        ("merge", "merge --abort"),
        ("cherry-pick", "cherry-pick --abort"),
        ("rebase", "rebase --abort"),
    ],
)
def test_operation_in_progress_gets_its_own_abort_hint(
    env: Env, capsys: pytest.CaptureFixture, operation: str, abort: str
) -> None:
    co = env.clone("co")
    marker = {"merge": "MERGE_HEAD", "cherry-pick": "CHERRY_PICK_HEAD", "rebase": "rebase-merge"}
    target = co / ".git" / marker[operation]
    if operation == "rebase":
        target.mkdir()
    else:
        target.write_text(git(co, "rev-parse", "HEAD"))
    rc, out = cli_apply(env, co, capsys)
    assert rc == 1
    assert f"a {operation} is in progress" in out and f"git -C {co} {abort}" in out


def test_detached_head_is_refused_but_check_works(env: Env, capsys: pytest.CaptureFixture) -> None:
    co = env.clone("co")
    git(co, "checkout", "-q", "--detach")
    rc, out = cli_apply(env, co, capsys)
    assert rc == 1 and "detached HEAD" in out and "switch -c" in out
    rc, out = cli_apply(env, co, capsys, "--check")
    assert rc == 0 and "--check: nothing was changed" in out


def test_missing_gitpython_is_a_message(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "fp4series", "apply", "--help"],
        capture_output=True,
        text=True,
        env=proc_env(),
        check=False,
    )
    assert proc.returncode == 1
    assert "cannot import 'git' (gitpython)" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------ a hostile machine


@contextlib.contextmanager
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (root only; skipped where it cannot be mounted)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield disk
    finally:
        gc.collect()  # gitpython's cat-file helpers run inside the checkout until collected
        if subprocess.run(["umount", str(disk)], check=False).returncode:
            subprocess.run(["umount", "--lazy", str(disk)], check=False)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill DISK up to its last page, except LEAVE bytes (kept free as a reserve first)."""
    if leave:
        (disk / "reserve").write_bytes(b"\0" * leave)
    fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    if leave:
        (disk / "reserve").unlink()


def test_full_disk_is_a_message_and_changes_nothing(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with small_disk(tmp_path) as disk:
        co = disk / "co"
        git(tmp_path, "clone", "-q", str(env.pin), str(co))
        git(co, "checkout", "-q", "-b", "work", "v0.5.11")
        settle(co)
        before = tree_fingerprint(co)
        fill(disk, leave=8192)  # two pages: room for apply's lock only
        rc, out = cli_apply(env, co, capsys)
        (disk / "fill").unlink()
        assert rc == 1
        assert "No space left on device" in out and "free space" in out
        assert "the checkout was not changed" in out and "Traceback" not in out
        assert tree_fingerprint(co) == before
        assert_no_debris(co)


def test_disk_filling_up_during_the_branch_move_is_undone(env: Env, tmp_path: Path) -> None:
    """The real thing: git read-tree runs out of space after it wrote some of the files."""
    with small_disk(tmp_path) as disk:
        co = disk / "co"
        git(tmp_path, "clone", "-q", str(env.pin), str(co))
        git(co, "checkout", "-q", "-b", "work", "v0.5.11")
        settle(co)
        before = tree_fingerprint(co)
        paused = Paused(env, co, "before-read-tree", tmp_path)
        fill(disk)  # not a page left: git's first write of a file that is not replaced fails
        rc, out = paused.release()
        assert rc == 1, out
        assert "git read-tree failed while writing the work tree" in out
        assert "put the original content back in the 3 file(s) it had written" in out
        assert "; the checkout is as it was" in out and "free space" in out
        assert "nothing was changed" not in out and "Traceback" not in out
        (disk / "fill").unlink()
        assert tree_fingerprint(co) == before
        assert_no_debris(co)


def test_read_only_checkout_for_another_user_is_a_message(env: Env) -> None:
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("needs root and runuser to act as an unprivileged user")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    base = Path(tempfile.mkdtemp(prefix="fp4series-ro-"))  # tmp_path is private to root
    try:
        base.chmod(0o755)
        co = base / "co"
        git(base, "clone", "-q", str(env.pin), str(co))
        git(co, "checkout", "-q", "-b", "work", "v0.5.11")
        shutil.copytree(env.patches, base / "patches")
        shutil.copy(env.lock.path, base / "upstream.lock")
        site = base / "site"  # what the unprivileged python imports, readable by it
        for module in (git_module, gitdb, smmap, fp4series):
            shutil.copytree(Path(module.__file__).parent, site / module.__name__)
        subprocess.run(["chmod", "-R", "a+rX,go-w", str(base)], check=True)
        settle(co)  # chmod changed every ctime: refresh the index once, before the snapshot
        before = tree_fingerprint(co)
        pythons = [os.path.realpath(getattr(sys, "_base_executable", sys.executable))]
        pythons += [p for p in ("/usr/bin/python3.11", "/usr/local/bin/python3.11")]
        as_nobody = {
            **proc_env(),
            "PYTHONPATH": str(site),
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            "HOME": str(base),
        }
        cmd = [
            "runuser", "-u", "nobody", "--", "PYTHON", "-m", "fp4series", "apply", str(co),
            "--patches-dir", str(base / "patches"), "--lock", str(base / "upstream.lock"),
            "--cache-dir", str(base / "cache"),
        ]  # fmt: skip
        usable = [
            py
            for py in pythons
            if subprocess.run(
                [*cmd[:4], py, "-c", "import git, fp4series.cli"], env=as_nobody, check=False
            ).returncode
            == 0
        ]
        if not usable:
            pytest.skip(f"user nobody can run none of {pythons} with gitpython")
        cmd[4] = usable[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=as_nobody, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Permission denied" in proc.stderr and "Traceback" not in proc.stderr
        assert "the checkout was not changed" in proc.stderr
        assert tree_fingerprint(co) == before
    finally:
        shutil.rmtree(base)


def test_scratch_directory_of_a_dead_apply_is_removed_even_when_unregistered(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    co = env.clone("co")
    left = checkout.new_worktree_dir()
    (left / "owner").write_text("999999999\n")  # a dead apply's, its worktree already pruned
    (left / "wt").mkdir()
    rc, out = cli_apply(env, co, capsys)
    assert rc == 0, out
    assert not left.exists() and f"removed {left / 'wt'}" in out
