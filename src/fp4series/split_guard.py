"""What split may write, and writing it all or nothing.

Split writes into names the user may already own: the branches ``nvfp4-marlin/<unit>`` of the
repository, and the files of its ``--out-dir`` (``<unit>.md``, ``<unit>.range-diff.txt``,
``split-record.json``, ``summary.json``, ``worktrees/<unit>``). Each is split's own only when
split made it and can prove it:

- a branch is split's when it does not exist, or when its tip is the commit split last put there
  (``refs/fp4series/split/<unit>/head``); any other tip holds someone's work;
- an out-dir file is split's when it does not exist, or when the record lists it with the
  sha256 of the bytes split wrote (a record written before outputs were listed vouches for the
  files its entries name); a file edited since, or never written by split, is the user's;
- a worktree directory is split's when git lists it as a worktree of the repository.

``preflight`` refuses every name that is the user's before anything is written, unless
``--force`` names it (the branch, or the file as split names it, e.g. ``change-a.md``); a
forced branch's old tip is kept on ``refs/fp4series/split/<unit>/replaced-<UTC time>`` and a
forced file is moved to ``<name>.replaced-<UTC time>``, and both are said.

``Transaction`` makes a split all or nothing. Branches are built detached; the branch and
split-ref moves happen in one ``git update-ref --stdin`` transaction (git applies all or none,
each checked against the value preflight saw), the out-dir files are written to a staging
directory and renamed into place only after that, and the record last. A failure (an exception
or Ctrl-C) at any step puts back the refs and the files it had replaced; a kill before the ref
transaction leaves the user's branches and files as they were, a kill after it leaves every
branch moved, each on its split ref, so the next split counts them as its own.

Pause points (``PAUSE_POINTS``): ``FP4SERIES_SPLIT_PAUSE_AT=<point>[,<point>]`` with
``FP4SERIES_PAUSE_DIR`` blocks there until a test creates ``<point>.release`` (after writing
``<point>.reached``); tests of one process set ``PAUSE_HOOK`` instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fp4series import gitops
from fp4series.checkout import pid_alive, wait_at
from fp4series.errors import SeriesError
from fp4series.paths import inside, write_atomically

ZERO = "0" * 40
PAUSE_POINTS = ("planned", "branch-built", "before-refs", "refs-moved", "files-placed")
PAUSE_HOOK: Callable[[str], None] | None = None
STAGING = ".split-staging"
PENDING = ".split-pending.json"  # the files being placed, until the record lists them


def pause(point: str) -> None:
    """Stop at a named point for a fault-injection test (no-op unless asked)."""
    assert point in PAUSE_POINTS, point
    if PAUSE_HOOK is not None:
        PAUSE_HOOK(point)
    wait_at(point, "FP4SERIES_SPLIT_PAUSE_AT")


def _git(repo: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return gitops.run(repo, *args, input=stdin)


def ref_tip(repo: Path, ref: str) -> str | None:
    proc = _git(repo, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}")
    return proc.stdout.strip() if proc.returncode == 0 else None


def ref_name_problem(repo: Path, ref: str) -> str | None:
    """Why git cannot use REF as a ref name (None: it can)."""
    if _git(repo, "check-ref-format", ref).returncode != 0:
        return f"git cannot use {ref} as a ref name (see git help check-ref-format)"
    return None


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def pending_outputs(out_dir: Path) -> dict[str, str]:
    """What a split killed between placing its files and writing its record had placed."""
    try:
        data = json.loads((out_dir / PENDING).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def recorded_outputs(record: dict[str, Any]) -> dict[str, str | None]:
    """{out-dir relative name: sha256 split wrote (None: vouched for by an older record)}."""
    outputs = record.get("outputs")
    if isinstance(outputs, dict):
        return {str(k): str(v) for k, v in outputs.items() if isinstance(v, str)}
    vouched: dict[str, str | None] = {}
    if record.get("branches"):  # a record from before outputs were listed
        for e in record["branches"]:
            if not isinstance(e, dict):
                continue
            for key in ("description", "range_diff"):
                if isinstance(e.get(key), str):
                    vouched[e[key]] = None
        vouched["summary.json"] = None
    return vouched


def worktrees_of(repo: Path) -> set[Path]:
    proc = _git(repo, "worktree", "list", "--porcelain")
    return {
        Path(ln[len("worktree ") :]).resolve()
        for ln in proc.stdout.splitlines()
        if ln.startswith("worktree ")
    }


@dataclass
class BranchClaim:
    """A branch split means to set: where it is now and whether split may move it."""

    branch: str  # without refs/heads/
    split_ref: str  # refs/fp4series/split/<unit>/head
    tip: str | None  # the branch's commit now (None: no such branch)
    forced: bool = False

    @property
    def ref(self) -> str:
        return "refs/heads/" + self.branch


@dataclass
class Claims:
    branches: dict[str, BranchClaim] = field(default_factory=dict)
    forced_files: set[str] = field(default_factory=set)


def preflight(
    repo: Path,
    out_dir: Path,
    branches: Sequence[tuple[str, str]],
    files: Iterable[str],
    worktrees: Iterable[Path],
    record: dict[str, Any],
    force: Sequence[str] = (),
) -> Claims:
    """Check every name split will write (BRANCHES: (branch, split head ref); FILES: out-dir
    relative names; WORKTREES) before anything is written. SeriesError lists every name that
    is the user's, unless FORCE names it. FORCE entries that name nothing split writes are an
    error too (a typo would otherwise protect nothing and say nothing)."""
    problems: list[str] = []
    for branch, split_ref in branches:
        for ref in ("refs/heads/" + branch, split_ref):
            if why := ref_name_problem(repo, ref):
                problems.append(why)
    if problems:
        raise SeriesError(
            "; ".join(problems),
            hint="rename the patch or its Group: (letters, digits, '.', '_', '+', '-'; no "
            "'..', no name ending in '.lock'); nothing was written",
        )
    forced = set(force)
    used: set[str] = set()
    claims = Claims()
    owned = recorded_outputs(record)
    pending = pending_outputs(out_dir)
    for branch, split_ref in branches:
        tip = ref_tip(repo, "refs/heads/" + branch)
        mine = ref_tip(repo, split_ref)
        claim = BranchClaim(branch, split_ref, tip)
        if tip is not None and tip != mine:
            if branch in forced:
                claim.forced = True
                used.add(branch)
            else:
                where = f"split last left {mine[:12]} there" if mine else "split never made it"
                problems.append(
                    f"branch {branch} exists at {tip[:12]} and is not split's ({where}): it "
                    "holds someone's work"
                )
        claims.branches[branch] = claim
    for name in files:
        path = inside(out_dir / name, out_dir)
        if not (path.exists() or path.is_symlink()):
            continue
        ok = path.is_file() and not path.is_symlink() and (name in owned or name in pending)
        if ok and owned.get(name, "") is not None:  # None: vouched for by an older record
            ok = sha256_of(path) in (owned.get(name), pending.get(name))
        if ok:
            continue
        if name in forced:
            claims.forced_files.add(name)
            used.add(name)
            continue
        mine = name in owned or name in pending
        why = "edited since split wrote it" if mine else "split did not write it"
        problems.append(f"{path} exists and is not split's ({why})")
    registered = worktrees_of(repo)
    for wt in worktrees:
        path = inside(wt, out_dir)
        if (path.exists() or path.is_symlink()) and path.resolve() not in registered:
            problems.append(f"{path} exists and is not a worktree split made in {repo}")
    if problems:
        raise SeriesError(
            "refusing to overwrite what is not split's: " + "; ".join(problems),
            hint="rename or move those aside, choose another --out-dir, or pass --force NAME "
            "for each branch or out-dir file split may replace (the old one is kept aside and "
            "named); nothing was written",
        )
    stray = sorted(forced - used - {c.branch for c in claims.branches.values()} - set(files))
    if stray:
        raise SeriesError(
            f"--force {' '.join(stray)}: split writes no branch or out-dir file of that name",
            hint="name a branch (nvfp4-marlin/<unit>) or an out-dir file (<unit>.md, "
            "<unit>.range-diff.txt, summary.json); nothing was written",
        )
    return claims


class Transaction:
    """Stage refs and files; ``commit`` moves all of them, ``rollback`` puts back what it moved."""

    def __init__(
        self, repo: Path, out_dir: Path, claims: Claims, log: Callable[[str], None] = print
    ) -> None:
        self.repo, self.out_dir, self.claims, self.log = repo, out_dir, claims, log
        self._clear_stale_staging()
        self.staging = inside(out_dir / f"{STAGING}-{os.getpid()}", out_dir)
        if self.staging.exists():
            shutil.rmtree(self.staging)
        (self.staging / "new").mkdir(parents=True)
        (self.staging / "old").mkdir()
        self.refs: dict[str, tuple[str, str]] = {}  # ref -> (new, expected old or ZERO)
        self.files: dict[str, Path] = {}  # out-dir name -> staged file ("" content: removal)
        self.removals: set[str] = set()
        self.written: dict[str, str] = {}  # out-dir name -> sha256 after commit
        self.moved_refs: dict[str, str] = {}
        self.placed: list[tuple[Path, Path | None]] = []  # (target, its old bytes aside)
        self.committed = False
        self._prior_pending: dict[str, str] = {}

    def _clear_stale_staging(self) -> None:
        """Remove what a killed split staged; files it had moved aside are kept and named."""
        for stale in sorted(self.out_dir.glob(f"{STAGING}-*")):
            pid = stale.name.rsplit("-", 1)[-1]
            if pid.isdigit() and pid_alive(int(pid)):
                continue  # another split is running there
            if any(p.is_file() for p in (stale / "old").rglob("*")):
                kept = self.out_dir / f".split-interrupted-{stamp()}-{pid}"
                os.replace(stale, kept)
                self.log(
                    f"a split killed while placing its files had moved files of this out dir "
                    f"aside; they are in {kept / 'old'}"
                )
            else:
                shutil.rmtree(stale, ignore_errors=True)

    # staging ---------------------------------------------------------------------------------

    def set_ref(self, ref: str, new: str) -> None:
        old = ref_tip(self.repo, ref) or ZERO
        self.refs[ref] = (new, old)

    def set_branch(self, branch: str, new: str, unit_ref: str) -> None:
        claim = self.claims.branches[branch]
        self.refs[claim.ref] = (new, claim.tip or ZERO)
        if claim.forced and claim.tip:
            aside = unit_ref.rsplit("/", 1)[0] + f"/replaced-{stamp()}"
            self.refs[aside] = (claim.tip, ZERO)
            self.log(f"{branch}: its old tip {claim.tip[:12]} (--force) is kept on {aside}")

    def write(self, name: str, text: str) -> Path:
        """Stage out-dir file NAME; returns where it will be once committed."""
        staged = self.staging / "new" / name
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(text, encoding="utf-8")
        self.files[name] = staged
        self.removals.discard(name)
        return self.out_dir / name

    def remove(self, name: str) -> None:
        """Remove out-dir file NAME on commit (a stale output of split's)."""
        if (self.out_dir / name).exists() or (self.out_dir / name).is_symlink():
            self.removals.add(name)
        self.files.pop(name, None)

    # commit / rollback -----------------------------------------------------------------------

    def _update_refs(self, moves: dict[str, tuple[str, str]]) -> None:
        lines = ["start"] + [f"update {ref} {new} {old}" for ref, (new, old) in moves.items()]
        lines += ["prepare", "commit", ""]
        proc = _git(self.repo, "update-ref", "--stdin", stdin="\n".join(lines))
        if proc.returncode != 0:
            raise SeriesError(
                f"moving the branches in {self.repo} failed, none was moved: {proc.stderr.strip()}",
                hint="a branch changed while split ran, or the repository is locked (another "
                "git command): check git status and run the split again",
            )

    def commit(self) -> None:
        pause("before-refs")
        if self.refs:
            self._update_refs(self.refs)
            self.moved_refs = {ref: old for ref, (_, old) in self.refs.items()}
        self.committed = True
        pause("refs-moved")
        self._prior_pending = pending_outputs(self.out_dir)
        pending = {**self._prior_pending, **{n: sha256_of(f) for n, f in self.files.items()}}
        write_atomically(self.out_dir / PENDING, (json.dumps(pending, indent=2) + "\n").encode())
        for name in sorted(self.files) + sorted(self.removals):
            target = inside(self.out_dir / name, self.out_dir)
            aside: Path | None = None
            if target.exists() or target.is_symlink():
                aside = self.staging / "old" / name
                aside.parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, aside)
            self.placed.append((target, aside))
            if name in self.files:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.files[name], target)
                self.written[name] = sha256_of(target)
        pause("files-placed")

    def keep_forced_files(self) -> None:
        """After the commit: a forced (user's) file goes next to its replacement, named."""
        for target, aside in self.placed:
            name = str(target.relative_to(self.out_dir.resolve()))
            if aside is not None and name in self.claims.forced_files:
                kept = target.with_name(f"{target.name}.replaced-{stamp()}")
                os.replace(aside, kept)
                self.log(f"{target}: the file there before (--force) is now {kept}")

    def rollback(self) -> None:
        for target, aside in reversed(self.placed):
            if target.exists() or target.is_symlink():
                target.unlink()
            if aside is not None:
                os.replace(aside, target)
        self.placed.clear()
        if self._prior_pending:
            (self.out_dir / PENDING).write_text(json.dumps(self._prior_pending, indent=2) + "\n")
        else:
            with contextlib.suppress(FileNotFoundError):
                (self.out_dir / PENDING).unlink()
        if self.moved_refs:
            back: dict[str, tuple[str, str]] = {}
            for ref, old in self.moved_refs.items():
                new = self.refs[ref][0]
                back[ref] = (old, new)  # ZERO as new value deletes the ref git created
            lines = ["start"]
            for ref, (old, new) in back.items():
                lines.append(f"delete {ref} {new}" if old == ZERO else f"update {ref} {old} {new}")
            lines += ["prepare", "commit", ""]
            proc = _git(self.repo, "update-ref", "--stdin", stdin="\n".join(lines))
            if proc.returncode != 0:
                self.log(
                    f"could not put back the branches split moved in {self.repo}: "
                    f"{proc.stderr.strip()}; their previous tips: "
                    + ", ".join(f"{r} {o[:12]}" for r, o in self.moved_refs.items())
                )
            self.moved_refs.clear()
        self.committed = False

    def done(self) -> None:
        """The record lists the placed files now: the pending list has served."""
        with contextlib.suppress(FileNotFoundError):
            (self.out_dir / PENDING).unlink()

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
