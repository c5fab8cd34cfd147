"""Rebase the series onto a newer upstream release: a maintained line in patches/<VERSION>/.

  rebase --to VERSION [--line SOURCE | --patches-dir DIR] [--out DIR] [--lock FILE] [--force]
  rebase --continue [--drop REASON] [--force]
  rebase --abort
  rebase --status
  rebase --to VERSION --check [--patches-dir DIR] [--out DIR] [--lock FILE]

--to materializes the release (its wheel sha256-verified, .work/upstream/<V>), judges the whole
source series on it (the rebase check's judge: fp4series.judging.stack) and replays it patch by
patch, in series order, on a work checkout .work/rebase/<V>/checkout (engine and crash safety:
fp4series.replay.engine):
  - a resolution recorded in the target line (a patch whose ``Rebased-From:`` names the source
    patch with its current patch-id, or a drop stanza) is replayed exactly: a rerun reproduces
    the committed line byte for byte; a stale record (the source was edited since) is said so;
  - a patch judged ``upstream`` is dropped: a stanza in <out>/dropped with ``Applied-Upstream:``
    (the first release judged upstream: reports/rebase-check.json when it was made for this
    series, else judged now) and the judge's evidence;
  - a ``partly-upstream`` patch is shrunk to the hunks upstream lacks;
  - the rest is applied exactly (files upstream moved followed), else with a 3-way merge, and
    committed with the source's author, date and message plus ``Rebased-From:``;
  - a conflict stops the rebase with the conflict in the work checkout and says what to do:
    resolve, git add, then --continue (which commits it with the prepared message, or takes
    your own commit); or --continue --drop "why"; or --abort.
At the end the work branch is exported into --out (export's refusal to overwrite uncommitted
changes applies; --force overrides), with the drop record, linted, and the line's [[lines]]
entry written into the lock; a summary says what was dropped, shrunk, applied and resolved.

Nothing is written to the project (patches/, the lock) before that final step, which is
idempotent: a kill during it is finished by --continue, as a kill anywhere else is resumed.
Before it writes, it copies the line's files and the lock (with their modes) into
.work/rebase/<V>/before; once written, the state says ``done`` until the work directory is gone
(it is renamed away first, so a kill in that cleanup leaves a finished rebase, not half of one).
--abort undoes a rebase at any step: the line's files and the lock are put back from ``before``
when the final write had begun, and a work checkout holding changes or untracked files of yours
is moved aside to .work/rebase-aborted/ (and named), as ``git rebase --abort`` keeps untracked
files; then it removes .work/rebase/<V>. One rebase command at a time; --status says so when
another one runs. Defaults: the source is the project's patches/ (the pin's line), --out
patches/<VERSION>.

--check replays in scratch with the committed --out line as the record and compares the line
it generates with --out byte for byte: exit 1 listing the files that differ (or where the
replay stopped: a resolution the line does not record). It changes nothing in the project.

Exit status: 0 done (or --check equal), 1 stopped for you, refused, or --check differs.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fp4series import export, lint, paths
from fp4series import lock as lock_mod
from fp4series.errors import SeriesError
from fp4series.judging.matrix import Target
from fp4series.progress import Progress
from fp4series.replay.engine import (
    MESSAGE,
    OWNER,
    STATE,
    Replay,
    State,
    Stop,
    load_state,
    pause,
    stop_of,
)
from fp4series.replay.record import DROPPED, Dropped, Stanza, parse_dropped, write_dropped
from fp4series.replay.worktree import WorkCheckout
from fp4series.series import SERIES_FILE, load_series, read_series_names
from fp4series.upstream import prepare_release

SCRIPT = "scripts/rebase.sh"
LOCK_FILE = "rebase.lock"
CHECK_DIR = "check"
SCRATCH_OUT = "out"
BEFORE = "before"  # the line's files and the lock as they were before the final write
MANIFEST = "manifest.json"
LOCK_COPY = "upstream.lock"
TRASH = ".removing-"  # a work directory renamed away to be removed: no longer a rebase
ABORTED = "rebase-aborted"  # under .work: work checkouts --abort moved aside
ABORTING = "aborting"  # written first by --abort: the rebase is being undone, not resumable


def run(args: argparse.Namespace) -> int:
    """The rebase as the command's options say (module doc); its exit status."""
    root = paths.project_root()
    base = root / ".work" / "rebase"
    starting = [o for o in ("line", "source_patches", "out", "lock") if getattr(args, o)]
    if not args.to and starting:
        spelled = {"source_patches": "--patches-dir"}
        flags = ", ".join(spelled.get(o, "--" + o.replace("_", "-")) for o in starting)
        raise SeriesError(
            f"{flags} only go with --to: a rebase in progress keeps what it was started with",
            hint=f"{SCRIPT} --status shows it",
        )
    if args.status:
        return _status(base)
    if args.check and not args.to:
        raise SeriesError("--check needs --to VERSION", hint=f"{SCRIPT} --to VERSION --check")
    if args.drop is not None and not args.cont:
        raise SeriesError("--drop goes with --continue", hint=f'{SCRIPT} --continue --drop "why"')
    base.mkdir(parents=True, exist_ok=True)
    with _one_at_a_time(base):
        _remove_trash(base)  # under the lock: no other command is removing it meanwhile
        if args.abort:
            return _abort(base)
        if args.cont:
            return _continue(base, args)
        return _start(root, base, args)


def _running(base: Path) -> str | None:
    """Who holds the one-at-a-time lock now ("pid N"), or None; takes nothing."""
    try:
        fd = os.open(base / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid ?"
    finally:
        os.close(fd)
    return None


def _rebase_dirs(base: Path) -> list[Path]:
    """The rebases' own work directories (marked by OWNER), not a check's, not trash."""
    if not base.is_dir():
        return []
    return sorted(
        d
        for d in base.iterdir()
        if d.name != CHECK_DIR and not d.name.startswith(TRASH) and (d / OWNER).exists()
    )


def _remove_trash(base: Path) -> None:
    """Work directories renamed away by a finished or aborted rebase killed while removing them."""
    if base.is_dir():
        for d in base.iterdir():
            if d.name.startswith(TRASH):
                paths.remove_tree_inside(d, base)


def _remove_work(work: Path) -> None:
    """Rename WORK away first (atomic), then remove it: a kill leaves it whole or not a rebase."""
    trash = work.parent / f"{TRASH}{work.name}-{os.getpid()}"
    os.replace(work, trash)
    pause("work-renamed")
    paths.remove_tree_inside(trash, work.parent)


@contextmanager
def _one_at_a_time(base: Path) -> Iterator[None]:
    """One rebase command at a time (an flock; the kernel drops it when the holder dies)."""
    fd = os.open(base / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid ?"
        os.close(fd)
        raise SeriesError(
            f"another rebase command is running ({holder}); nothing was changed",
            hint="wait for it to finish (the lock goes when that process exits)",
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------- start


def _in_progress(base: Path) -> list[Path]:
    return [d for d in _rebase_dirs(base) if (d / STATE).is_file()]


def _start(root: Path, base: Path, args: argparse.Namespace) -> int:
    busy = _in_progress(base)
    if busy and not args.check:  # a check works in its own scratch: it may run meanwhile
        state = load_state(busy[0])
        raise SeriesError(
            f"a rebase is in progress: {_where(state) if state else busy[0]}; nothing was started",
            hint=f"continue it ({SCRIPT} --continue), see where it is ({SCRIPT} --status), or "
            f"give it up ({SCRIPT} --abort: removes {_display(busy[0])}, moving changes of "
            "yours in its checkout aside)",
        )
    lock_path = Path(args.lock) if args.lock else paths.default_lock_path()
    lock = lock_mod.load_lock(lock_path)
    version = paths.safe_name(args.to, "the target version")
    release = lock.release(version)
    if release is lock.pin:
        raise SeriesError(f"{version} is the pin", hint="rebase to one of the [[targets]]")
    if not release.sha256:
        raise SeriesError(
            f"{lock_path}: target {version} has no recorded sha256, so its wheel cannot be "
            "verified (and the rebase writes nothing to the lock before its end)",
            hint=f"record it first: scripts/rebase-check.sh --releases {version}",
        )
    from fp4series.line import resolve_line

    if args.source_patches and args.line:
        raise SeriesError(
            "--patches-dir and --line both name the series to rebase", hint="give one of them"
        )
    entry = lock.line(version)
    if args.source_patches:
        source = Path(args.source_patches)
    else:  # --line: the line to rebase (default: the one the committed line was made from)
        made_from = args.line or (entry.rebased_from if entry is not None else None)
        source = resolve_line(made_from, lock_path=lock_path, root=root).patches_dir
    default_out = lock_path.resolve().parent / "patches" / version
    out = Path(args.out) if args.out else default_out
    if out.resolve() != default_out:
        raise SeriesError(
            f"--out {out}: a line on {version} lives in {default_out} (the [[lines]] entry of "
            f"{lock_path} can name nothing else)",
            hint="leave out --out; to try a rebase without touching the project, use --check",
        )
    source_version = _source_version(source, lock, root)
    order = [lock.pin.version, *(t.version for t in lock.targets)]
    if order.index(version) <= order.index(source_version):
        raise SeriesError(
            f"{version} is not newer than {source_version}, the release {source} sits on",
            hint="rebase to a later [[targets]] release",
        )
    work = base / CHECK_DIR / version if args.check else base / version
    if work.exists() and not (work / OWNER).exists():
        raise SeriesError(
            f"{_display(work)} exists but no rebase made it (it has no {OWNER} mark); nothing "
            "was started and nothing there was touched",
            hint=f"move it elsewhere (or remove it if you do not need it: rm -r {_display(work)}), "
            "then start again",
        )
    if work.exists():  # ours (no state: a start killed before its first step, or a check)
        paths.remove_tree_inside(work, base)
    work.parent.mkdir(parents=True, exist_ok=True)
    cache = paths.default_cache_dir()
    progress = Progress()
    with progress.step(f"materialize {version} and {source_version}"):
        target = prepare_release(lock, version, root / ".work", cache)
        src = prepare_release(lock, source_version, root / ".work", cache)
    docs = [p.name for p in load_series(source)]
    state = State(
        version=version,
        tag=target.rev,
        release_repo=str(target.repo.resolve()),
        source_version=source_version,
        source_repo=str(src.repo.resolve()),
        source_tag=src.rev,
        source=str(source.resolve()),
        out=str(out.resolve()),
        record=str(out.resolve()) if (out / SERIES_FILE).is_file() else None,
        lock=str(lock_path.resolve()),
        check=bool(args.check),
        earlier=order[order.index(source_version) + 1 : order.index(version)],
        history=_history_from_report(
            resolve_line(
                None if source_version == lock.pin.version else source_version,
                lock_path=lock_path,
                root=root,
            ).rebase_matrix,
            docs,
            source_version,
        ),
    )
    if args.check and state.record is None:
        raise SeriesError(
            f"--check needs a committed line in {out} (it has no series file)",
            hint=f"make the line first: {SCRIPT} --to {version}",
        )
    try:
        replay = Replay.begin(work, state, _preparer(root, lock_path), progress)
        return _drive(replay, force=bool(args.force))
    except BaseException:
        if work.exists() and not (work / STATE).exists():  # failed before its first state
            paths.remove_tree_inside(work, base)
        raise
    finally:
        if args.check and work.exists():
            paths.remove_tree_inside(work, base)


def _source_version(source: Path, lock: lock_mod.Lock, root: Path) -> str:
    """The release a source series sits on: a line directory patches/<V> is on V; any other
    series (the project's patches/ included) is on the pin."""
    where = source.resolve()
    if where.parent == (root / "patches").resolve() and where.name in {
        t.version for t in lock.targets
    }:
        return where.name
    return lock.pin.version


def _history_from_report(report: Path, names: list[str], pin: str) -> dict[str, dict[str, str]]:
    """release -> patch -> effective verdict from the committed rebase check, when it was made
    for exactly this series on the same release; else nothing (then judged when needed)."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return {}
    if data.get("patches") != names or data.get("pin") != pin:
        return {}
    out: dict[str, dict[str, str]] = {}
    details = data.get("details", {})
    for release in data.get("releases", []):
        cells = [details.get(p, {}).get(release) for p in names]
        if all(isinstance(c, dict) for c in cells):
            out[release] = {p: _effective(c) for p, c in zip(names, cells, strict=True)}
    return out


def _effective(cell: dict[str, Any]) -> str:
    verdict = str(cell.get("verdict", ""))
    return str(cell.get("moved_verdict") or verdict) if verdict == "moved" else verdict


def _preparer(root: Path, lock_path: Path) -> Callable[[str], Target]:
    """Materialize a release for judging; one whose sha256 is not recorded is refused (the
    lock is not written before the end)."""

    def prepare(version: str) -> Target:
        lock = lock_mod.load_lock(lock_path)
        if not lock.release(version).sha256:
            raise SeriesError(f"{version} has no recorded sha256 in {lock_path}")
        return prepare_release(lock, version, root / ".work", paths.default_cache_dir())

    return prepare


# -------------------------------------------------------------------------- continue, abort


def _continue(base: Path, args: argparse.Namespace) -> int:
    busy = _in_progress(base)
    if not busy:
        killed = _rebase_dirs(base)
        hint = f"start one: {SCRIPT} --to VERSION"
        if killed:
            hint = (
                f"{_display(killed[0])} is a rebase killed while it started (before its first "
                f"step): start it again with {SCRIPT} --to {killed[0].name}"
            )
        raise SeriesError("no rebase in progress", hint=hint)
    work = busy[0]
    if (work / ABORTING).exists():
        raise SeriesError(
            f"the rebase to {work.name} is being aborted (an --abort was interrupted); it "
            "cannot be continued",
            hint=f"finish the abort: {SCRIPT} --abort",
        )
    state = load_state(work)
    assert state is not None
    replay = Replay(work, state, _preparer(paths.project_root(), Path(state.lock)))
    stopped = state.step is not None and state.step["phase"] == "stopped"
    if args.drop is not None and not stopped:
        raise SeriesError(
            f"--drop: no patch is stopped for you ({_where(state)})",
            hint=f"{SCRIPT} --continue without --drop resumes it",
        )
    if stopped:
        replay.continue_stopped(args.drop)
    return _drive(replay, force=bool(args.force))


def _abort(base: Path) -> int:
    found = _rebase_dirs(base)
    if not found:
        raise SeriesError("no rebase in progress; nothing to abort", hint=f"{SCRIPT} --status")
    for work in found:
        state = load_state(work)
        (work / ABORTING).write_text("scripts/rebase.sh --abort\n")
        kept = _keep_users_work(work, state)
        restored = _restore_before(work) if state is not None else []
        pause("abort-restored")
        _remove_work(work)
        print(f"aborted the rebase to {work.name}: removed {_display(work)}")
        if kept is not None:
            print(
                f"  the work checkout held changes or untracked files of yours: moved it to "
                f"{_display(kept)} (git -C {_display(kept)} status shows them; remove it when "
                "you are done with them)"
            )
        if restored:
            print(
                "  its final write had begun: put back as they were before it: "
                + ", ".join(restored)
            )
        elif state is not None and state.phase in ("write", "done"):  # no copy: an older run
            print(
                f"  note: its final write had begun: {_display(Path(state.out))} may hold new "
                "files; `git status` shows them, `git checkout` restores the committed ones"
            )
        else:
            print("  the project's patches and lock were not touched")
    return 0


def _keep_users_work(work: Path, state: State | None) -> Path | None:
    """Move the work checkout aside when it holds anything the rebase did not leave there: a
    resolution begun, files edited or staged, untracked files, commits after the stop."""
    co = WorkCheckout(work / "checkout")
    if not (co.path / ".git").exists():
        return None
    step = state.step if state is not None else None
    try:
        if step is not None and step["phase"] == "stopped":
            mine = co.fingerprint() != step.get("fingerprint")
        else:
            mine = bool(co.status())
    except (OSError, SeriesError, subprocess.CalledProcessError):
        mine = True  # cannot tell: keep it
    if not mine:
        return None
    stamp = f"{work.name}-{time.strftime('%Y%m%dT%H%M%S')}"
    dest = work.parent.parent / ABORTED / stamp
    n = 1
    while dest.exists():  # two aborts in one second: never into an earlier one's folder
        n += 1
        dest = dest.with_name(f"{stamp}-{n}")
    dest.mkdir(parents=True)
    if (work / MESSAGE).is_file():
        shutil.copyfile(work / MESSAGE, dest / MESSAGE)
    os.replace(co.path, dest / "checkout")
    return dest / "checkout"


# ---------------------------------------------------------------- before the final write


def _take_before(replay: Replay) -> None:
    """Copy the line's files and the lock, with their modes, into BEFORE (whole or not at all:
    made under a temporary name, then renamed)."""
    st = replay.state
    out, lock_path = Path(st.out), Path(st.lock)
    final, tmp = replay.work / BEFORE, replay.work / (BEFORE + ".tmp")
    for d in (final, tmp):
        if d.exists():
            paths.remove_tree_inside(d, replay.work)
    tmp.mkdir()
    files = {}
    for name in _line_files(out):
        shutil.copyfile(out / name, tmp / name)
        files[name] = stat.S_IMODE(os.stat(out / name).st_mode)
    shutil.copyfile(lock_path, tmp / LOCK_COPY)
    manifest = {
        "out_existed": out.is_dir(),
        "files": files,
        "lock_mode": stat.S_IMODE(os.stat(lock_path).st_mode),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, final)


def _restore_before(work: Path) -> list[str]:
    """Put the line's files and the lock back from BEFORE (what the final write may have
    changed); idempotent. Returns what was put back, [] when the write had not begun."""
    state = load_state(work)
    before = work / BEFORE
    if state is None or state.phase not in ("write", "done") or not (before / MANIFEST).is_file():
        return []
    manifest = json.loads((before / MANIFEST).read_text())
    out, lock_path = Path(state.out), Path(state.lock)
    files: dict[str, int] = manifest["files"]
    for name in _line_files(out):
        if name not in files:
            (out / name).unlink()
    for name, mode in files.items():
        paths.write_atomically(out / name, (before / name).read_bytes())
        os.chmod(out / name, mode)
    if not manifest["out_existed"] and out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    paths.write_atomically(lock_path, (before / LOCK_COPY).read_bytes())
    os.chmod(lock_path, manifest["lock_mode"])
    return [_display(out) + "/", _display(lock_path)]


def _status(base: Path) -> int:
    running = _running(base)
    if running is not None:
        print(
            f"a rebase command is running now ({running}); what it has recorded so far follows "
            "(it changes as that command goes on)"
        )
    busy = _in_progress(base)
    if not busy:
        killed = _rebase_dirs(base)
        if killed and running is None:
            print(
                f"no rebase in progress: {_display(killed[0])} is a rebase killed while it "
                f"started (before its first step): start it again with {SCRIPT} --to "
                f"{killed[0].name}, or remove it with {SCRIPT} --abort"
            )
        elif running is None:
            print("no rebase in progress")
        else:
            print("  it has not recorded its first step yet")
        return 0
    work = busy[0]
    state = load_state(work)
    assert state is not None
    if (work / ABORTING).exists():
        print(
            f"rebase to {state.version}: an --abort was interrupted; it is half undone (its work "
            f"checkout may already be moved aside to .work/{ABORTED}/, the line and the lock may "
            "already be put back)"
        )
        print(f"  finish it with: {SCRIPT} --abort")
        return 0
    if state.phase == "done":
        print(
            f"rebase to {state.version} finished: the line is written into "
            f"{_display(Path(state.out))} and {_display(Path(state.lock))}; only removing "
            f"{_display(work)} is left"
        )
        print(f"  finish it with: {SCRIPT} --continue (or undo the write: {SCRIPT} --abort)")
        return 0
    print(f"rebase to {state.version} in progress: {_where(state)}")
    print(
        f"  source {_display(Path(state.source))} ({state.source_version}), "
        f"out {_display(Path(state.out))}, work {_display(work)}"
    )
    for d in state.done:
        print(f"  {d['patch']}: {d['outcome']}" + (f" ({d['detail']})" if d["detail"] else ""))
    for p in state.patches[state.index :]:
        print(f"  {p['name']}: to do (judged {p['shown']})")
    if state.step is not None and state.step["phase"] == "stopped":
        print(_describe_stop(stop_of(state), state, work))
    else:
        for problem in state.problems:
            print(f"  lint: {problem}")
        print(f"  resume with: {SCRIPT} --continue")
    return 0


def _where(state: State) -> str:
    step = state.step
    if state.phase == "finish":
        n = len(state.patches)
        return f"to {state.version}, all {n} patches replayed, the line not written yet"
    if state.phase != "replay":
        return (
            f"to {state.version}, all {len(state.patches)} patches replayed, stopped while "
            f"writing the line into {_display(Path(state.out))} and the lock"
        )
    if step is not None and step["phase"] == "stopped":
        return f"to {state.version}, stopped at {step['patch']} ({step['kind']})"
    return f"to {state.version}, {state.index} of {len(state.patches)} patches done"


# ---------------------------------------------------------------------------------- finish


def _drive(replay: Replay, *, force: bool) -> int:
    """Run the state machine from where the state says to its end, or to the next stop."""
    st = replay.state
    if st.phase == "replay":
        stop = replay.run()
        if stop is not None:
            if st.check:
                print(
                    f"--check: the replay stopped at {stop.patch} ({stop.kind} in "
                    f"{', '.join(stop.files) or 'the patch'}): the line in "
                    f"{_display(Path(st.out))} records no resolution for it, or a stale one"
                )
                for note in st.notes:
                    print(f"  note: {note}")
                return 1
            print(_describe_stop(stop, st, replay.work))
            return 1
    if st.phase == "done":  # killed in the cleanup: only the work directory is left
        print(_summary(st))
        _remove_work(replay.work)
        return 0
    if st.phase == "finish":
        problems = _finish(replay)
        if problems:
            shown = _display(Path(st.out))
            print(f"the line does not pass the linter; nothing was written to {shown}:")
            for p in problems:
                print(f"  {p}")
            if not st.check:
                print(
                    f"fix the commits in {_display(replay.co.path)} (git rebase -i {st.tag}), "
                    f"then {SCRIPT} --continue"
                )
            return 1
        if st.check:
            return _compare(replay)
        _take_before(replay)
        st.phase = "write"
        replay.save()
    _write(replay, force)
    st.phase = "done"
    replay.save()
    pause("write-done")
    print(_summary(st))
    _remove_work(replay.work)
    return 0


def _finish(replay: Replay) -> list[str]:
    """Export and lint the line in scratch (.work/rebase/<V>/out); nothing of the project's is
    written. Seeded with --out's series and patches so headers and file names carry over."""
    st = replay.state
    out, scratch = Path(st.out), replay.work / SCRATCH_OUT
    if scratch.exists():
        paths.remove_tree_inside(scratch, replay.work)
    scratch.mkdir()
    if out.is_dir():
        for f in [out / SERIES_FILE, *sorted(out.glob("*.patch"))]:
            if f.is_file():
                shutil.copyfile(f, scratch / f.name)
    lock = lock_mod.load_lock(st.lock)
    with replay.progress.step("export the line (scratch)"):
        export.export_series(
            replay.co.path,
            scratch,
            base=st.tag,
            lock=lock,
            force=True,
            allow_empty=True,
            allow_delete=True,
            progress=replay.progress,
        )
    header = parse_dropped(out / DROPPED).header if (out / DROPPED).is_file() else None
    dropped = Dropped(stanzas=[Stanza(t) for t in st.drops])
    if header is not None:
        dropped.header = header
    write_dropped(scratch / DROPPED, dropped)
    parse_dropped(scratch / DROPPED)  # what we write must read back
    with replay.progress.step("lint the line"):
        root = paths.project_root()
        problems = lint.lint_series(scratch)
        names = read_series_names(scratch)
        for patch in sorted(scratch.glob("*.patch")):
            problems += lint.lint_patch(patch, root=root, series_names=names)
        found, notes = lint.lint_blobs(scratch, Path(st.release_repo), st.tag)
        for note in notes:
            replay.progress.info(note)
    st.problems = [str(p) for p in problems + found]
    replay.save()
    return st.problems


def _line_files(d: Path) -> dict[str, bytes]:
    if not d.is_dir():
        return {}
    files = [d / SERIES_FILE, d / DROPPED, *d.glob("*.patch")]
    return {f.name: f.read_bytes() for f in files if f.is_file()}


def _compare(replay: Replay) -> int:
    st = replay.state
    made, have = _line_files(replay.work / SCRATCH_OUT), _line_files(Path(st.out))
    shown = _display(Path(st.out))
    diffs = []
    for name in sorted(made.keys() | have.keys()):
        if name not in have:
            diffs.append(f"  generated, not in {shown}: {name}")
        elif name not in made:
            diffs.append(f"  in {shown}, not generated: {name}")
        elif made[name] != have[name]:
            diffs.append(f"  differs: {shown}/{name}")
    for note in st.notes:
        print(f"note: {note}")
    if diffs:
        print(f"--check: the rebase to {st.version} does not reproduce {shown}:")
        print("\n".join(diffs))
        print(f"  regenerate it with {SCRIPT} --to {st.version} (then review git diff {shown})")
        return 1
    print(
        f"--check: the rebase to {st.version} reproduces {shown} byte for byte ({len(made)} files)"
    )
    return 0


def _write(replay: Replay, force: bool) -> None:
    """The only step that writes the project: the line, its drop record, its lock entry.
    Idempotent: what an interrupted run wrote already equals what is written again."""
    st = replay.state
    out = Path(st.out)
    dropped = (replay.work / SCRATCH_OUT / DROPPED).read_bytes()
    again = f"{SCRIPT} --continue (--force: replace them)"
    try:
        if not force:
            export._refuse_losses(out, {DROPPED: dropped}, [])
        with replay.progress.step(f"write the line into {_display(out)}"):
            export.export_series(
                replay.co.path,
                out,
                base=st.tag,
                lock=lock_mod.load_lock(st.lock),
                force=force,
                allow_empty=True,
                allow_delete=True,  # the line is the rebase's to replace (--abort restores it)
                progress=replay.progress,
            )
    except SeriesError as exc:
        raise SeriesError(str(exc), hint=f"{exc.hint}; then resume: {again}") from None
    pause("write-exported")
    export._write(out / DROPPED, dropped)
    if _line_files(out) != _line_files(replay.work / SCRATCH_OUT):
        raise SeriesError(f"internal: {out} differs from the line exported in scratch")
    lock_path = Path(st.lock)
    try:
        rel = out.resolve().relative_to(lock_path.resolve().parent).as_posix()
    except ValueError:
        rel = str(out.resolve())
    lock_mod.record_line(lock_path, st.version, rel, st.source_version)


# --------------------------------------------------------------------------------- messages


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _describe_stop(stop: Stop, st: State, work: Path) -> str:
    co, msg = _display(work / "checkout"), _display(work / MESSAGE)
    assert st.step is not None
    a = st.step["author"]
    lines = [
        f"stopped at {stop.patch} ({stop.position} of {len(st.patches)}; judged "
        f"{stop.verdict} on {st.version})"
    ]
    if stop.kind == "conflict":
        lines += [
            "  the 3-way merge left conflicts (markers in the files, unmerged in the index) in",
            *(f"    {f}" for f in stop.files),
            f"  work checkout: {co}",
        ]
        todo = [
            "  to resolve it: edit those files, then",
            f"    git -C {co} add {' '.join(stop.files)}",
            f"    {SCRIPT} --continue",
            "  (--continue commits what is staged with the prepared message and the patch's",
            f"  author; to commit yourself: git -C {co} commit -F {msg} "
            f'--author="{a["name"]} <{a["email"]}>" --date="{a["date"]}")',
        ]
    else:
        said = stop.said.splitlines()[:6]
        lines += [
            "  git could not apply or merge it at all (nothing was changed); git said:",
            *(f"    {s}" for s in said),
            f"  work checkout: {co}; the source patch: {_display(work / 'source' / stop.patch)}",
        ]
        todo = [
            "  to resolve it: make its change by hand in the work checkout, then",
            f"    git -C {co} add FILES",
            f"    {SCRIPT} --continue",
        ]
    lines += [f"  prepared commit message: {msg}", *todo]
    lines += [
        f'  to drop it (upstream covers it): {SCRIPT} --continue --drop "why"',
        f"  to give up: {SCRIPT} --abort (removes {_display(work)}; changes of yours in its "
        "checkout are moved aside, not lost)",
    ]
    return "\n".join(lines)


def _summary(st: State) -> str:
    groups: dict[str, list[str]] = {}
    label = {
        "dropped": "dropped (upstream has them)",
        "dropped-by-hand": "dropped by hand",
        "recorded-drop": "dropped as recorded",
        "shrunk": "shrunk",
        "clean": "applied",
        "offset": "applied",
        "three-way": "applied",
        "resolved": "resolved by hand",
        "recorded": "replayed from the record",
    }
    for d in st.done:
        to = f" -> {', '.join(d['names'])}" if d["names"] else ""
        groups.setdefault(label[d["outcome"]], []).append(f"    {d['patch']}{to}: {d['detail']}")
    count = sum(len(d["names"]) for d in st.done)
    out = [
        f"rebased {len(st.patches)} patches from {st.source_version} onto {st.version}: "
        f"{count} in {_display(Path(st.out))}; upstream.lock [[lines]] {st.version} "
        f"(rebased_from {st.source_version})"
    ]
    for name, rows in groups.items():
        out += [f"  {name} ({len(rows)}):", *rows]
    out += [f"  note: {n}" for n in st.notes]
    return "\n".join(out)
