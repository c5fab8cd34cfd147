"""Materialize an upstream release offline: PyPI wheel -> sha256 check -> git repo like upstream.

Public API (stable):
    fetch_wheel(release, cache_dir, *, progress=None, package="sglang") -> Path
        `pip download --no-deps <package>==<version>` into <cache_dir>/wheels (reused when
        present), then verify release.sha256. A release with an empty sha256 (a rebase target not
        yet recorded) is fetched unverified: call sha256_file() and lock.record_target_sha256().
        Mismatch -> SeriesError with expected/actual; the bad download is moved aside, nothing
        else is deleted. Offline -> SeriesError saying so.
    materialize(release, dest, cache_dir, *, lock=None, progress=None) -> Path
        Unpack the wheel's `sglang/` into `python/sglang/` of a new git repo at DEST (must not
        exist or be empty): one reproducible commit (fixed author/committer/date), tag v<version>.
        Built in a temp dir beside DEST and renamed, so DEST is never half-written.
    record_hashes(wheel) -> dict[str, str]   wheel path -> sha256 hex, from the wheel's RECORD
    sha256_file(path) -> str
    fetch_and_record(lock_path, version, cache_dir) -> Path
        fetch a target and record its file name/sha256 in the lock when it had none (TOFU).
    MATERIALIZED_TRAILER   trailer in the materialized commit's message ("Materialized-From")
    prepare_release(lock, version, work, cache) -> Target
        the release fetched (a target's sha256 recorded on first resolve) and materialized once
        under <work>/upstream/<version>; Target(version, repo, rev) names its tree
CLI: fetch-upstream DEST [--version V], resolve-commit CHECKOUT.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from git import Repo

from fp4series import gitops, paths
from fp4series.digest import sha256_file
from fp4series.errors import SeriesError
from fp4series.lock import Lock, Release, load_lock, record_pin_commit, record_target_sha256
from fp4series.progress import Progress

MATERIALIZED_TRAILER = "Materialized-From"
_AUTHOR = "sglang upstream (PyPI wheel)"
_EMAIL = "pypi@sglang.invalid"
_OFFLINE_MARKERS = (
    "Temporary failure in name resolution",
    "Failed to establish a new connection",
    "Network is unreachable",
    "ConnectionError",
    "NewConnectionError",
    "Max retries exceeded",
    "Could not fetch URL",
    "timed out",
)


def _pip_command(package: str, version: str, dest: Path) -> list[str]:
    """pip download of exactly one wheel, the cp311 manylinux one the lock names, no deps."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_34_x86_64",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        f"{package}=={version}",
    ]


def _largest_file(root: Path) -> int:
    best = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                best = max(best, os.path.getsize(os.path.join(dirpath, name)))
    return best


def _run_pip(cmd: list[str], tmp: Path, progress: Progress, label: str) -> tuple[int, str]:
    """Run pip, showing a live percentage (from the size of pip's partial download) on a TTY."""
    env = dict(os.environ, TMPDIR=str(tmp / "piptmp"), PIP_NO_INPUT="1")
    (tmp / "piptmp").mkdir()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    output: list[str] = []
    total = [0]

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            m = re.search(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)", line)
            if m:
                scale = {"kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)]
                total[0] = int(float(m.group(1)) * scale)
                progress.info(line.strip())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    while proc.poll() is None:
        if total[0]:
            progress.percent(label, _largest_file(tmp), total[0])
        time.sleep(0.3)
    thread.join()
    if total[0]:
        progress.percent(label, total[0], total[0])
    progress.done_percent()
    return proc.returncode, "".join(output)


def _download(release: Release, package: str, cache: Path, progress: Progress) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    try:
        rc, out = _run_pip(_pip_command(package, release.version, tmp), tmp, progress, "download")
        if rc != 0:
            tail = "\n".join(out.strip().splitlines()[-6:])
            if any(marker in out for marker in _OFFLINE_MARKERS):
                raise SeriesError(
                    f"cannot download {package}=={release.version}: PyPI is not reachable "
                    f"(offline?)\n{tail}",
                    hint=f"connect to PyPI, or copy {release.wheel_filename or 'the wheel'} "
                    f"into {cache} and run again",
                )
            raise SeriesError(
                f"pip could not download {package}=={release.version} (exit {rc})\n{tail}",
                hint="check the version exists: pip index versions " + package,
            )
        found = sorted(tmp.glob(f"{package}-{release.version}-*.whl"))
        if not found:
            raise SeriesError(f"pip reported success but left no {package} wheel in {tmp}")
        wheel = found[0]
        if release.wheel_filename and wheel.name != release.wheel_filename:
            raise SeriesError(
                f"PyPI served {wheel.name}, the lock expects {release.wheel_filename}",
                hint="check the platform tag in upstream.lock",
            )
        final = cache / wheel.name
        os.replace(wheel, final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_wheel(
    release: Release,
    cache_dir: Path | str,
    *,
    progress: Progress | None = None,
    package: str = "sglang",
) -> Path:
    """The release's wheel from the cache or PyPI, sha256-verified when the lock has a hash."""
    progress = progress or Progress()
    cache = Path(cache_dir) / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    if release.wheel_filename:
        cached: Path | None = cache / release.wheel_filename
    else:  # an unrecorded target: any cached wheel of that version (verified after recording)
        found = sorted(cache.glob(f"{package}-{release.version}-*.whl"))
        cached = found[0] if found else None
    with progress.step(f"fetch {package}=={release.version}"):
        fresh = cached is None or not cached.is_file()
        if not fresh:
            progress.info(f"cached: {cached}")
            wheel = cached
        else:
            wheel = _download(release, package, cache, progress)
        actual = sha256_file(wheel)
        if release.sha256 and actual != release.sha256:
            if fresh:  # our own download: move it aside for inspection
                rejected = cache / "rejected"
                rejected.mkdir(exist_ok=True)
                wheel = Path(shutil.move(str(wheel), rejected / wheel.name))
                note = f"the download was moved to {wheel}"
            else:
                note = f"the cached file {wheel} was left as it is"
            raise SeriesError(
                f"sha256 mismatch for {wheel.name}: expected {release.sha256}, actual {actual} "
                f"({note})",
                hint="the artifact is not the pinned upstream; delete the cached file to download "
                "it again, or fix upstream.lock if the pin really changed",
            )
        progress.info(f"sha256 {actual}" + (" (verified)" if release.sha256 else " (unpinned)"))
    return wheel


def record_hashes(wheel: Path | str) -> dict[str, str]:
    """Map wheel path -> sha256 hex from the wheel's RECORD (urlsafe base64 in the file)."""
    with zipfile.ZipFile(wheel) as zf:
        records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise SeriesError(f"{wheel}: expected one *.dist-info/RECORD, found {records}")
        text = zf.read(records[0]).decode("utf-8")
    out: dict[str, str] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 2 or not row[1]:
            continue
        algo, _, digest = row[1].partition("=")
        if algo != "sha256":
            continue
        raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
        out[row[0]] = raw.hex()
    return out


def _safe_member(name: str) -> bool:
    parts = Path(name).parts
    return not (name.startswith("/") or ".." in parts)


def _unpack(wheel: Path, lock: Lock, root: Path) -> tuple[int, datetime]:
    """Extract the package tree to its repo location; returns file count and newest zip time."""
    count = 0
    newest = datetime(1980, 1, 1, tzinfo=UTC)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir() or not name.startswith(lock.wheel_prefix):
                continue
            if not _safe_member(name):
                raise SeriesError(f"{wheel.name}: unsafe path in the wheel: {name!r}")
            repo_path = lock.repo_path(name)
            assert repo_path is not None
            target = root / repo_path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, 0o755 if mode & 0o111 else 0o644)
            newest = max(newest, datetime(*info.date_time, tzinfo=UTC))
            count += 1
    if count == 0:
        raise SeriesError(f"{wheel.name} has no files under {lock.wheel_prefix}")
    return count, newest


def _commit_reproducibly(root: Path, release: Release, when: datetime) -> Repo:
    repo = Repo.init(root, initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("core", "autocrlf", "false")
        cfg.set_value("core", "fileMode", "true")
        cfg.set_value("commit", "gpgsign", "false")
    repo.git.add("--all", "--force")
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S+0000")
    env = {
        "GIT_AUTHOR_NAME": _AUTHOR,
        "GIT_AUTHOR_EMAIL": _EMAIL,
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_NAME": _AUTHOR,
        "GIT_COMMITTER_EMAIL": _EMAIL,
        "GIT_COMMITTER_DATE": stamp,
    }
    message = (
        f"sglang {release.tag}: python/ tree from the PyPI wheel\n\n"
        f"Not upstream's commit: the published files of {release.wheel_filename or 'the wheel'} "
        f"laid out as in the repository.\n\n"
        f"{MATERIALIZED_TRAILER}: {release.wheel_filename}\n"
        f"Wheel-Sha256: {release.sha256}\n"
    )
    repo.git.commit("-q", "--no-verify", "--allow-empty-message", "-m", message, env=env)
    repo.create_tag(release.tag)
    return repo


def materialize(
    release: Release,
    dest: Path | str,
    cache_dir: Path | str,
    *,
    lock: Lock | None = None,
    progress: Progress | None = None,
) -> Path:
    """A git repo at DEST holding the release's python/ tree, one commit, tagged v<version>."""
    progress = progress or Progress()
    dest = Path(dest).absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise SeriesError(
            f"{dest} exists and is not empty", hint="pass a new directory (or empty it first)"
        )
    lock = lock or load_lock(paths.default_lock_path())
    wheel = fetch_wheel(release, cache_dir, progress=progress, package=lock.package)
    if not release.sha256:
        release = Release(
            release.version, release.tag, release.commit, wheel.name, sha256_file(wheel)
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        with progress.step(f"unpack {wheel.name} into python/"):
            count, newest = _unpack(wheel, lock, tmp)
            progress.info(f"{count} files")
        with progress.step(f"commit and tag {release.tag}"):
            repo = _commit_reproducibly(tmp, release, newest)
            progress.info(f"commit {repo.head.commit.hexsha}")
        if dest.exists():
            dest.rmdir()
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress.info(f"materialized {release.tag} at {dest}")
    return dest


def fetch_and_record(lock_path: Path | str, version: str, cache_dir: Path | str) -> Path:
    """Fetch a target's wheel; record its name/sha256 in the lock if it had none yet."""
    lock = load_lock(lock_path)
    release = lock.release(version)
    wheel = fetch_wheel(release, cache_dir, package=lock.package)
    if not release.sha256 and release is not lock.pin:
        record_target_sha256(lock_path, version, wheel.name, sha256_file(wheel))
    return wheel


def resolve_commit(checkout: Path | str, lock_path: Path | str) -> str:
    """Record the pin tag's commit from a real clone of upstream in the lock."""
    lock = load_lock(lock_path)
    repo = gitops.open_repo(checkout)
    try:
        commit = repo.commit(lock.pin.tag)
    except Exception:
        raise SeriesError(
            f"{checkout} has no tag {lock.pin.tag}",
            hint=f"git -C {checkout} fetch --tags {lock.repo_url}",
        ) from None
    if MATERIALIZED_TRAILER + ":" in commit.message:
        raise SeriesError(
            f"{checkout} is a tree materialized from the wheel, not a clone of upstream; "
            "its commit id is not upstream's",
            hint=f"clone {lock.repo_url} and pass that checkout",
        )
    if lock.pin.commit_resolved and lock.pin.commit != commit.hexsha:
        raise SeriesError(
            f"{lock.pin.tag} is {commit.hexsha} in {checkout}, the lock says {lock.pin.commit}",
            hint="a moved tag? check the clone's origin; fix upstream.lock by hand if intended",
        )
    record_pin_commit(lock_path, commit.hexsha)
    return commit.hexsha


# ------------------------------------------------ a release materialized once, reused


@dataclass
class Target:
    """A materialized release: its version and a git repo + revision holding its tree."""

    version: str
    repo: Path
    rev: str


def _materialized(dest: Path, tag: str) -> bool:
    if not (dest / ".git").exists():
        return False
    return gitops.rev(dest, f"refs/tags/{tag}") is not None


def prepare_release(lock: Lock, version: str, work: Path, cache: Path) -> Target:
    """Fetch (recording a target's sha256 into the lock on first resolve) and materialize one
    release under ``.work/upstream/<version>``; a materialized release is reused as it is."""
    from fp4series.paths import remove_tree_inside

    release = lock.release(version)
    dest = work / "upstream" / version
    tag = release.tag or f"v{version}"
    if not _materialized(dest, tag):
        if version != lock.pin.version and not release.sha256:
            fetch_and_record(lock.path, version, cache)
            lock = load_lock(lock.path)
            release = lock.release(version)
        if dest.exists():
            remove_tree_inside(dest, work / "upstream")
        materialize(release, dest, cache, lock=lock)
    return Target(version, dest, tag)
