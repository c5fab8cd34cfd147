"""Build the patched tree: repack the pinned wheel, set up the test venv, compile-check Marlin.

Why a repacked wheel: the pin exists offline only as PyPI's ``sglang==0.5.11`` wheel, and the
series touches plain sources, so the installable artifact of a patched checkout is that wheel
with the checkout's changed ``python/sglang/**`` files swapped in (``wheel unpack``/``pack``
regenerates RECORD) and a PEP 440 local version (``0.5.11+nvfp4marlin.N.gSHA``) so nobody
mistakes it for upstream's.

This module is stdlib-only at import time: ``python -m fp4series.commands.venv venv`` bootstraps the
venv on a machine that has nothing but python3.11 (gitpython is imported lazily).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fp4series import compile_check
from fp4series.digest import sha256_file
from fp4series.errors import SeriesError
from fp4series.paths import project_root
from fp4series.workspace import pin_release, resolve_base, venv_python

if TYPE_CHECKING:
    from fp4series.line import Line

PIN_WHEEL = "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"
#: Folders (os.pathsep-separated) of an offline copy of the pinned wheels, tried before
#: the network: a machine without PyPI access, or a shared download.
WHEEL_DIR_ENV = "FP4SERIES_WHEEL_DIR"
LOCAL_VERSION_PREFIX = "nvfp4marlin"
REQUIREMENT_FILES = ("requirements/cpu-test.txt", "requirements/constraints.txt")
# scripts/*.sh need only gitpython: a fresh clone gets it in seconds, without the test venv
TOOLING_REQUIREMENT_FILES = ("requirements/scripts.txt", "requirements/constraints.txt")
VENV_STAMP = ".fp4series-requirements.sha256"
WHEEL_STAMP = ".fp4series-wheel.sha256"


def work_dir() -> Path:
    return project_root() / ".work"


# -------------------------------------------------------------------------------- step timing


@dataclass
class Steps:
    """Prints ``[build] step ...`` lines and keeps each step's wall time for the summary."""

    prefix: str = "build"
    times: list[tuple[str, float, str]] = field(default_factory=list)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[list[str]]:
        note: list[str] = []
        print(f"[{self.prefix}] {name} ...", flush=True)
        start = time.monotonic()
        try:
            yield note
        finally:
            seconds = time.monotonic() - start
            self.times.append((name, seconds, " ".join(note)))
            tail = f" ({' '.join(note)})" if note else ""
            print(f"[{self.prefix}] {name}: {seconds:.1f}s{tail}", flush=True)

    def summary(self) -> str:
        width = max((len(n) for n, _, _ in self.times), default=4)
        lines = [f"  {n:<{width}}  {s:7.1f}s  {note}".rstrip() for n, s, note in self.times]
        total = sum(s for _, s, _ in self.times)
        return "\n".join([*lines, f"  {'total':<{width}}  {total:7.1f}s"])


# ----------------------------------------------------------------------------- hashing, stamps


def inputs_hash(files: Sequence[Path], extra: Sequence[str] = ()) -> str:
    """Hash of file names + contents + extra strings: the key a stamp records."""
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
        h.update(b"\0")
    for item in extra:
        h.update(item.encode() + b"\0")
    return h.hexdigest()


def stamp_matches(stamp: Path, key: str) -> bool:
    return stamp.is_file() and stamp.read_text().strip() == key


def write_stamp(stamp: Path, key: str) -> None:
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(key + "\n")


# ------------------------------------------------------------------------------ pinned wheel


def seed_wheel_cache(cache: Path, release: object | None = None) -> None:
    """Copy the pinned wheel (or RELEASE's) from a local offline copy into the cache (sha256
    checked later)."""
    name = str(getattr(release or pin_release(), "wheel_filename", PIN_WHEEL))
    cached = cache / "wheels" / name
    if cached.is_file():
        return
    folders = [Path(f) for f in os.environ.get(WHEEL_DIR_ENV, "").split(os.pathsep) if f]
    for folder in folders:
        if (folder / name).is_file():
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, cached)
            return


def pinned_wheel(cache_dir: Path | None = None, release: object | None = None) -> Path:
    """The pinned sglang wheel (or RELEASE's, a line's base), sha256-verified (tooling-core's
    ``upstream.fetch_wheel``).

    An offline copy (``$FP4SERIES_WHEEL_DIR``) is copied into the cache first, and
    ``fetch_wheel`` verifies the sha256 either way.
    """
    from fp4series import upstream

    cache = cache_dir or work_dir() / "cache"
    release = release or pin_release()
    seed_wheel_cache(cache, release)
    return Path(upstream.fetch_wheel(release, cache))  # type: ignore[arg-type]


def read_record(unpacked: Path) -> dict[str, str]:
    """RECORD of an unpacked wheel: path -> urlsafe-b64 sha256 (without the ``sha256=``)."""
    records = list(unpacked.glob("*.dist-info/RECORD"))
    if len(records) != 1:
        raise SeriesError(f"{unpacked} has {len(records)} RECORD files, expected one")
    out: dict[str, str] = {}
    for line in records[0].read_text().splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            out[parts[0]] = parts[1][len("sha256=") :]
    return out


def record_digest(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


# ---------------------------------------------------------------------------------- repacking

#: A change set: wheel-relative path (``sglang/...``) -> new bytes, or None to delete the file.
Changes = Mapping[str, bytes | None]


def repack_wheel(
    wheel: Path,
    changes: Changes,
    dest_dir: Path,
    *,
    local_version: str | None,
    expected_old: Mapping[str, str] | None = None,
    python: Path | None = None,
) -> Path:
    """Unpack ``wheel``, apply ``changes``, pack it into ``dest_dir`` (RECORD regenerated).

    ``expected_old`` maps paths to the urlsafe sha256 the base had: a mismatch with the wheel's
    RECORD means the checkout's base is not the wheel's tree, and the build refuses.
    """
    py = str(python or sys.executable)
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="repack-", dir=dest_dir) as tmp:
        _run([py, "-m", "wheel", "unpack", "-d", tmp, str(wheel)], "wheel unpack")
        roots = [p for p in Path(tmp).iterdir() if p.is_dir()]
        if len(roots) != 1:
            raise SeriesError(f"unexpected layout after unpacking {wheel.name}")
        root = roots[0]
        record = read_record(root)
        if expected_old:
            bad = [p for p, d in expected_old.items() if record.get(p) != d]
            if bad:
                raise SeriesError(
                    f"the checkout's base differs from {wheel.name} in {len(bad)} file(s) the "
                    f"series touches, e.g. {bad[0]}",
                    hint="build a checkout of the pin (scripts/fetch-upstream.sh) or pass "
                    "--allow-base-mismatch if you know the base is right",
                )
        for rel, data in sorted(changes.items()):
            target = root / rel
            if not target.resolve().is_relative_to(root.resolve()):
                raise SeriesError(f"refusing to write outside the wheel: {rel}")
            if data is None:
                if not target.is_file():
                    raise SeriesError(f"the series deletes {rel}, which the wheel does not have")
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        before = set(dest_dir.glob("*.whl"))
        cmd = [py, "-m", "wheel", "pack", "-d", str(dest_dir), str(root)]
        if local_version:
            cmd += ["--local-version", local_version]
        _run(cmd, "wheel pack")
    made = (
        sorted(set(dest_dir.glob("*.whl")) - before)
        or sorted(dest_dir.glob("*.whl"), key=lambda p: p.stat().st_mtime)[-1:]
    )
    if not made:
        raise SeriesError("wheel pack produced no wheel")
    return made[-1]


def repack_key(wheel: Path, changes: Changes, version: str) -> str:
    """What a repacked wheel is made of: the pinned wheel, every change, the version label."""
    h = hashlib.sha256(f"{wheel.name}\0{version}\0".encode())
    h.update(sha256_file(wheel).encode())
    for rel, data in sorted(changes.items()):
        h.update(rel.encode() + b"\0" + (b"<deleted>" if data is None else data) + b"\0")
    return h.hexdigest()


def _run(cmd: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SeriesError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            + (proc.stdout + proc.stderr).strip()[-3000:],
        )
    return proc


# ------------------------------------------------------------------------- checkout -> changes


def checkout_changes(checkout: Path, base: str) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """Changed ``python/sglang`` files between ``base`` and HEAD, as wheel-relative changes.

    Returns (changes, expected_old): the second maps each modified/deleted path to the RECORD
    digest its base blob has, so the repack can prove the base is the pinned wheel.
    """
    import git

    repo = git.Repo(checkout)
    head = repo.commit("HEAD")
    base_commit = repo.commit(base)
    changes: dict[str, bytes | None] = {}
    expected_old: dict[str, str] = {}
    for diff in base_commit.diff(head, paths="python/sglang"):
        for side in ("a", "b"):
            path = getattr(diff, f"{side}_path")
            if path and not path.startswith("python/sglang/"):
                raise SeriesError(f"unexpected path in diff: {path}")
        if diff.a_path and (diff.deleted_file or diff.renamed_file):
            changes[diff.a_path.removeprefix("python/")] = None
        if diff.a_blob is not None and diff.a_path and not diff.new_file:
            rel = diff.a_path.removeprefix("python/")
            expected_old[rel] = record_digest(diff.a_blob.data_stream.read())
        if diff.b_blob is not None and diff.b_path and not diff.deleted_file:
            changes[diff.b_path.removeprefix("python/")] = diff.b_blob.data_stream.read()
    dirty = repo.is_dirty(path="python/sglang") or any(
        p.startswith("python/sglang/") for p in repo.untracked_files
    )
    if dirty:
        print(
            f"warning: {checkout} has uncommitted changes under python/sglang; the build uses "
            "the committed HEAD only (commit them, or they are not in the wheel)",
            file=sys.stderr,
        )
    return changes, expected_old


def local_version_for(checkout: Path, base: str) -> str:
    """``nvfp4marlin.<patches>.g<short sha>``: how many commits on the pin, and which HEAD."""
    import git

    repo = git.Repo(checkout)
    count = int(repo.git.rev_list("--count", f"{base}..HEAD"))
    return f"{LOCAL_VERSION_PREFIX}.{count}.g{repo.head.commit.hexsha[:10]}"


# ------------------------------------------------------------------------------------- venv


def venv_site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise SeriesError(f"{venv} has no site-packages", hint=f"remove {venv} and build again")
    return found[0]


def ensure_venv(
    venv: Path,
    root: Path,
    *,
    base_python: str | None = None,
    requirements: Sequence[str] = REQUIREMENT_FILES,
) -> str:
    """Create/refresh a venv from REQUIREMENTS (file, constraints); skip pip when their hash is
    unchanged. The test venv by default; the scripts' small tooling venv with
    TOOLING_REQUIREMENT_FILES."""
    reqs = [root / r for r in requirements]
    missing = [str(r) for r in reqs if not r.is_file()]
    if missing:
        raise SeriesError(f"missing requirement file(s): {', '.join(missing)}")
    py = base_python or sys.executable
    pyver = _run([py, "-c", "import sys; print(sys.version.split()[0])"], "python").stdout.strip()
    if not pyver.startswith("3.11"):
        print(f"warning: the tests are pinned for Python 3.11, {py} is {pyver}", file=sys.stderr)
    key = inputs_hash(reqs, [pyver, platform.machine()])
    stamp = venv / VENV_STAMP
    if venv_python(venv).exists() and stamp_matches(stamp, key):
        _link_tooling(venv, root)
        return "reused (requirements unchanged)"
    if not venv_python(venv).exists():
        _run([py, "-m", "venv", str(venv)], "python -m venv")
    cmd = [
        str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check",
        "--progress-bar", "off", "-r", str(reqs[0]), "-c", str(reqs[1]),
    ]  # fmt: skip
    print("  " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise SeriesError(
            f"pip could not install {reqs[0].name} into {venv} (exit {proc.returncode})",
            hint="read pip's message above; on a network failure re-run (pip resumes from cache)",
        )
    _link_tooling(venv, root)
    write_stamp(stamp, key)
    return "installed"


def _link_tooling(venv: Path, root: Path) -> None:
    """Make ``import fp4series`` work in the venv (a .pth line: the editable install, offline)."""
    pth = venv_site_packages(venv) / "fp4series-src.pth"
    line = str(root / "src") + "\n"
    if not pth.is_file() or pth.read_text() != line:
        pth.write_text(line)


def install_wheel(venv: Path, wheel: Path) -> str:
    """``pip install --no-deps`` the built wheel unless that exact file is already installed."""
    key = sha256_file(wheel)
    stamp = venv / WHEEL_STAMP
    if stamp_matches(stamp, key):
        return "already installed"
    _run(
        [str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check",
         "--no-deps", "--force-reinstall", "--no-index", str(wheel)],
        "pip install of the built wheel",
    )  # fmt: skip
    write_stamp(stamp, key)
    return "installed"


# ------------------------------------------------------------------- pin -> checkout -> apply

CHECKOUT_STAMP = "fp4series-applied.json"  # inside .git/, so it is never part of the tree


def series_key(patches: Path, upstream_head: str) -> str:
    """Hash of the series file, every patch file and the base's commit: what the checkout is."""
    files = [patches / "series", *sorted(patches.glob("*.patch"))]
    return inputs_hash(files, [upstream_head])


PREPARE_LOCK = "prepare-checkout.lock"  # under .work/
_PREPARING: set[str] = set()  # the .work dirs whose prepare lock this process holds


@contextlib.contextmanager
def one_prepare_at_a_time(root: Path) -> Iterator[None]:
    """Serialize prepare-checkout runs of a project (an flock the kernel drops when the holder
    dies): a second run waits, saying for whom, then reuses what the first made."""
    work = root / ".work"
    key = os.path.realpath(work)
    if key in _PREPARING:  # this process holds it already (the command around the function)
        yield
        return
    work.mkdir(parents=True, exist_ok=True)
    fd = os.open(work / PREPARE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid ?"
            print(
                f"waiting for another prepare-checkout ({holder}) to finish with "
                f"{work} (one at a time)",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        _PREPARING.add(key)
        yield
    finally:
        _PREPARING.discard(key)
        os.close(fd)


def prepare_checkout(root: Path, *, fresh: bool = False, line: Line | None = None) -> Path:
    """Materialize the line's release (once), then make its checkout = release + series
    (.work/checkout for the pin's line), re-using it if current. One run at a time per project
    (a second one waits for the first).

    A checkout that has commits or edits the pipeline did not make (someone editing patches in
    it) is never deleted: it is moved aside to ``<checkout>.saved-<time>`` with a message.
    """
    with one_prepare_at_a_time(root):
        return _prepare_checkout(root, fresh=fresh, line=line)


def _prepare_checkout(root: Path, *, fresh: bool, line: Line | None) -> Path:
    import git

    from fp4series import upstream
    from fp4series.line import resolve_line

    line = line or resolve_line(root=root)
    the_lock, pin = line.lock, line.release
    work = line.work
    steps = Steps(prefix="checkout")
    up_dir = line.upstream_dir
    with steps.step(f"{'pin' if line.is_pin else 'release'} {pin.tag}") as note:
        if (up_dir / ".git").is_dir():
            up_repo = git.Repo(up_dir)
            if pin.tag not in [t.name for t in up_repo.tags]:
                raise SeriesError(
                    f"{up_dir} has no tag {pin.tag}",
                    hint=f"remove {up_dir}; the next run materializes it again",
                )
            note.append(f"reused {up_dir}")
        else:
            cache = root / ".work" / "cache"
            seed_wheel_cache(cache, pin)
            upstream.materialize(pin, up_dir, cache, lock=the_lock)
            up_repo = git.Repo(up_dir)
            note.append(f"materialized {up_dir}")
        up_head = up_repo.commit(pin.tag).hexsha
    checkout = line.checkout
    key = series_key(line.patches_dir, up_head)
    stamp = checkout / ".git" / CHECKOUT_STAMP
    with steps.step("checkout") as note:
        if checkout.exists():
            state = json.loads(stamp.read_text()) if stamp.is_file() else {}
            repo = git.Repo(checkout)
            ours = state.get("head") == repo.head.commit.hexsha and not repo.is_dirty(
                untracked_files=True
            )
            if ours and state.get("key") == key and not fresh:
                note.append(f"reused {checkout} (series unchanged, {state.get('patches')} patches)")
                return checkout
            if ours:
                shutil.rmtree(checkout)
            else:
                saved = work / f"checkout.saved-{time.strftime('%Y%m%d-%H%M%S')}"
                saved.parent.mkdir(parents=True, exist_ok=True)
                os.rename(checkout, saved)
                print(
                    f"warning: {checkout} had commits or edits not made from patches/; moved it "
                    f"to {saved} (run scripts/export.sh {saved} if you meant to keep them)",
                    file=sys.stderr,
                )
            shutil.rmtree(line.prefix_dir, ignore_errors=True)  # worktrees of the old checkout
        checkout.parent.mkdir(parents=True, exist_ok=True)
        git.Repo.clone_from(str(up_dir), str(checkout))
        note.append(f"cloned {up_dir}")
    names = [ln.split("#", 1)[0].strip() for ln in _series_lines(line.patches_dir)]
    names = [n for n in names if n]
    with steps.step(f"apply {len(names)} patch(es)") as note:
        if names:
            line_args = [] if line.is_pin else ["--line", line.version]
            proc = subprocess.run(
                [sys.executable, "-m", "fp4series", "apply", *line_args, str(checkout)],
                cwd=root,
                check=False,
            )
            if proc.returncode != 0:
                raise SeriesError(
                    f"the series does not apply to {checkout} (exit {proc.returncode})",
                    hint="read apply's report above; fix the patch (see README: editing a patch)",
                )
        else:
            note.append(f"{line.patches_dir / 'series'} is empty")
    repo = git.Repo(checkout)
    stamp.write_text(
        json.dumps({"key": key, "head": repo.head.commit.hexsha, "patches": len(names)}) + "\n"
    )
    return checkout


def _series_lines(patches: Path) -> list[str]:
    series = patches / "series"
    return series.read_text().splitlines() if series.is_file() else []


# ----------------------------------------------------------------------------------- build


@dataclass
class BuildResult:
    wheel: Path
    version: str
    changed: int
    deleted: int
    compile: list[str]


def build(
    checkout: Path,
    *,
    base: str | None = None,
    allow_base_mismatch: bool = False,
    compile_targets: str | None = None,
    force_compile: bool = False,
    skip_compile: bool = False,
    line: Line | None = None,
) -> BuildResult:
    from fp4series.line import resolve_line

    root = project_root()
    line = line or resolve_line(root=root)
    cache = root / ".work" / "cache"
    steps = Steps()
    checkout = checkout.resolve()
    if not (checkout / ".git").exists() or not (checkout / "python" / "sglang").is_dir():
        raise SeriesError(
            f"{checkout} is not a git checkout with python/sglang",
            hint="pass an SGLang checkout (e.g. .work/checkout after scripts/apply.sh)",
        )
    with steps.step("venv") as note:
        note.append(ensure_venv(line.venv, root, requirements=line.requirements))
    py = venv_python(line.venv)
    with steps.step("pinned wheel" if line.is_pin else f"release {line.version} wheel") as note:
        wheel = pinned_wheel(cache, line.release)
        note.append(wheel.name)
    with steps.step("repack") as note:
        base_sha = resolve_base(checkout, base or line.tag)
        changes, expected_old = checkout_changes(checkout, base_sha)
        version = local_version_for(checkout, base_sha)
        out = line.build_dir
        deleted = sum(1 for v in changes.values() if v is None)
        key = repack_key(wheel, changes, version)
        stamp = out / "wheel.stamp"
        previous = stamp.read_text().split() if stamp.is_file() else []
        if len(previous) == 2 and previous[0] == key and (out / previous[1]).is_file():
            built = out / previous[1]
            note.append(f"{built.name} reused (same pin, same changes)")
        else:
            for old in out.glob("sglang-*.whl"):
                old.unlink()
            built = repack_wheel(
                wheel, changes, out, local_version=version,
                expected_old=None if allow_base_mismatch else expected_old, python=py,
            )  # fmt: skip
            stamp.write_text(f"{key} {built.name}\n")
            note.append(
                f"{built.name}: {len(changes) - deleted} file(s) replaced/added, {deleted} deleted"
            )
    with steps.step("install wheel") as note:
        note.append(install_wheel(line.venv, built))
    compile_lines: list[str] = []
    failed: list[compile_check.CompileResult] = []
    if not skip_compile:
        with steps.step("compile check (nvcc)") as note:
            sglang_dir = venv_site_packages(line.venv) / "sglang"
            targets = compile_check.select_targets(sglang_dir, compile_targets)
            results = compile_check.run_compile_checks(
                targets, python=py, sglang_dir=sglang_dir,
                cache_dir=cache / "compile", build_root=line.build_dir / "jit",
                force=force_compile,
            )  # fmt: skip
            compile_lines = [f"{r.target}: {r.status} {r.seconds:.0f}s" for r in results]
            note.append("; ".join(compile_lines) or "no targets")
            failed = [r for r in results if r.status == "failed"]
    print("[build] built:")
    size = built.stat().st_size / 1e6
    print(f"  wheel    {built} ({size:.1f} MB, version {built.name.split('-')[1]})")
    print(f"  venv     {line.venv} (python {py})")
    for row in compile_lines:
        print(f"  jit      {row}")
    print("[build] step times:\n" + steps.summary(), flush=True)
    if failed:
        raise SeriesError(
            f"{len(failed)} Marlin JIT module(s) failed to compile: "
            + ", ".join(str(r.target) for r in failed),
            hint=f"read nvcc's errors above; logs in {line.build_dir}/jit/<target>/worker.log",
        )
    return BuildResult(built, version, len(changes) - deleted, deleted, compile_lines)


def tooling_venv_current(root: Path) -> bool:
    """Is .work/tooling-venv there with the current requirements (no output, no pip)?"""
    venv = root / ".work" / "tooling-venv"
    reqs = [root / r for r in TOOLING_REQUIREMENT_FILES]
    if not venv_python(venv).exists() or not all(r.is_file() for r in reqs):
        return False
    key = inputs_hash(reqs, [sys.version.split()[0], platform.machine()])
    return stamp_matches(venv / VENV_STAMP, key)
