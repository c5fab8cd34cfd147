"""The pinned upstream and its rebase targets, read from and recorded into ``upstream.lock``.

Public API (stable):
    load_lock(path) -> Lock
        Parse and validate the lock (tomllib). Raises SeriesError with a hint on bad content;
        values that become file names (tags, wheel file names, package, path prefixes' parts)
        must be plain names (paths.name_problem).
    record_target_sha256(lock_path, version, filename, sha256) -> None
        Record a target wheel's file name and sha256, editing the text in place (comments kept);
        appends a ``[[targets]]`` entry when the version is not listed yet.
    record_pin_commit(lock_path, commit) -> None
        Fill in ``[pin] commit`` (used by ``resolve-commit``).
    record_line(lock_path, version, patches, rebased_from) -> None
        Add or update the ``[[lines]]`` entry of a maintained line (used by ``rebase``).
    Lock.release(version) -> Release          the pin or a target, SeriesError if unknown
    Lock.lines -> tuple[LineEntry, ...]      the maintained lines on newer releases ([[lines]])
    Lock.for_line(version) -> Lock           the lock as that line sees it: ``pin`` is the
                                              release the line applies to (the pin itself for
                                              the pin's version), so apply/verify/export work
                                              unchanged on a line
    Lock.wheel_path(repo_path) -> str | None  repo ``python/sglang/x`` -> wheel ``sglang/x``
    Lock.repo_path(wheel_path) -> str | None  the inverse
    UNRESOLVED                                the placeholder for a commit not yet resolved
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.paths import name_problem, write_atomically

UNRESOLVED = "unresolved"
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


@dataclass(frozen=True)
class Release:
    """One upstream release: tag, commit (or UNRESOLVED) and the PyPI wheel standing in for it."""

    version: str
    tag: str
    commit: str
    wheel_filename: str
    sha256: str

    @property
    def commit_resolved(self) -> bool:
        return self.commit != UNRESOLVED


@dataclass(frozen=True)
class LineEntry:
    """A maintained series line: the series rebased onto a newer release (``[[lines]]``)."""

    version: str  # the release it applies to: a [[targets]] entry with wheel and sha256
    patches: str  # its directory, relative to the project: "patches/<version>"
    rebased_from: str  # the line it was made from: the pin's version or another line's


@dataclass(frozen=True)
class Lock:
    repo_url: str
    pin: Release
    targets: list[Release]
    wheel_prefix: str
    repo_prefix: str
    package: str = "sglang"
    path: Path | None = field(default=None, compare=False)
    lines: tuple[LineEntry, ...] = ()

    def line(self, version: str) -> LineEntry | None:
        return next((ln for ln in self.lines if ln.version == version), None)

    def for_line(self, version: str) -> Lock:
        """This lock as the line on VERSION sees it: its ``pin`` is that release."""
        if version == self.pin.version:
            return self
        if self.line(version) is None:
            known = ", ".join([self.pin.version, *(ln.version for ln in self.lines)])
            raise SeriesError(
                f"there is no series line on {version} in {self.path}",
                hint=f"lines: {known}; make one with scripts/rebase.sh --to {version}",
            )
        return replace(self, pin=self.release(version))

    def release(self, version: str) -> Release:
        for rel in [self.pin, *self.targets]:
            if rel.version == version:
                return rel
        known = ", ".join(r.version for r in [self.pin, *self.targets])
        raise SeriesError(
            f"version {version} is neither the pin nor a rebase target in {self.path}",
            hint=f"use one of: {known}; or add a [[targets]] entry to upstream.lock",
        )

    def wheel_path(self, repo_path: str) -> str | None:
        if repo_path.startswith(self.repo_prefix):
            return self.wheel_prefix + repo_path[len(self.repo_prefix) :]
        return None

    def repo_path(self, wheel_path: str) -> str | None:
        if wheel_path.startswith(self.wheel_prefix):
            return self.repo_prefix + wheel_path[len(self.wheel_prefix) :]
        return None


def _bad(path: Path, what: str, hint: str = "") -> SeriesError:
    return SeriesError(
        f"{path}: {what}", hint=hint or "fix upstream.lock (see the comments in the file)"
    )


def _plain(path: Path, value: str, what: str) -> None:
    """Values that become file or directory names (a tag names .work/upstream/<tag>)."""
    problem = name_problem(value)
    if problem:
        raise _bad(path, f"{what} {value!r} is not a plain name: {problem}")


def _str(path: Path, table: dict, key: str, where: str, *, required: bool = True) -> str:
    value = table.get(key, "" if not required else None)
    if value is None:
        raise _bad(path, f"{where} has no '{key}'")
    if not isinstance(value, str):
        raise _bad(path, f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _release(path: Path, table: dict, where: str, *, pinned: bool) -> Release:
    version = _str(path, table, "version", where)
    if not _VERSION.match(version):
        raise _bad(path, f"{where}.version {version!r} is not a release version like 0.5.11")
    tag = _str(path, table, "tag", where, required=False) or f"v{version}"
    commit = _str(path, table, "commit", where, required=False) or UNRESOLVED
    if commit != UNRESOLVED and not _SHA1.match(commit):
        raise _bad(
            path,
            f"{where}.commit {commit!r} is not a 40-hex commit id",
            hint=f"set it to {UNRESOLVED!r} or run: python -m fp4series resolve-commit CHECKOUT",
        )
    wheel = _str(path, table, "wheel_filename", where, required=pinned)
    sha = _str(path, table, "sha256", where, required=pinned).lower()
    _plain(path, tag, f"{where}.tag")
    if wheel and (name_problem(wheel) or not wheel.endswith(".whl")):
        why = name_problem(wheel) or "it does not end in .whl"
        raise _bad(path, f"{where}.wheel_filename {wheel!r} is not a wheel file name: {why}")
    if sha and not _SHA256.match(sha):
        raise _bad(path, f"{where}.sha256 {sha!r} is not 64 hex digits")
    if pinned and not (wheel and sha):
        raise _bad(path, f"{where} needs wheel_filename and sha256 (the pin must be verifiable)")
    return Release(version, tag, commit, wheel, sha)


def load_lock(path: Path | str) -> Lock:
    """Read upstream.lock; every problem is a SeriesError naming the key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SeriesError(
            f"{path} not found", hint="run from the project checkout or pass --lock"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise _bad(path, f"not valid TOML: {exc}") from None
    upstream = data.get("upstream")
    pin = data.get("pin")
    paths = data.get("paths", {})
    if not isinstance(upstream, dict) or not isinstance(pin, dict):
        raise _bad(path, "needs an [upstream] table (repo_url) and a [pin] table")
    repo_url = _str(path, upstream, "repo_url", "[upstream]")
    package = _str(path, upstream, "package", "[upstream]", required=False) or "sglang"
    wheel_prefix = _str(path, paths, "wheel_prefix", "[paths]", required=False) or "sglang/"
    repo_prefix = _str(path, paths, "repo_prefix", "[paths]", required=False) or "python/sglang/"
    _plain(path, package, "[upstream].package")
    for name, prefix in (("wheel_prefix", wheel_prefix), ("repo_prefix", repo_prefix)):
        if not prefix.endswith("/") or prefix.startswith("/"):
            raise _bad(path, f"[paths].{name} {prefix!r} must be relative and end with '/'")
        for part in prefix[:-1].split("/"):
            _plain(path, part, f"[paths].{name} {prefix!r}: component")
    raw_targets = data.get("targets", [])
    if not isinstance(raw_targets, list):
        raise _bad(path, "targets must be an array of tables ([[targets]])")
    targets = [
        _release(path, t, f"[[targets]] #{i + 1}", pinned=False) for i, t in enumerate(raw_targets)
    ]
    pinned = _release(path, pin, "[pin]", pinned=True)
    seen: set[str] = {pinned.version}
    for t in targets:
        if t.version in seen:
            raise _bad(path, f"version {t.version} is listed twice")
        seen.add(t.version)
    lines = _lines(path, data.get("lines", []), pinned, targets)
    return Lock(repo_url, pinned, targets, wheel_prefix, repo_prefix, package, path, lines)


def _lines(path: Path, raw: object, pin: Release, targets: list[Release]) -> tuple[LineEntry, ...]:
    """``[[lines]]``: each on a verifiable target, in patches/<version>, made from a known line."""
    if not isinstance(raw, list):
        raise _bad(path, "lines must be an array of tables ([[lines]])")
    by_version = {t.version: t for t in targets}
    out: list[LineEntry] = []
    for i, table in enumerate(raw):
        where = f"[[lines]] #{i + 1}"
        if not isinstance(table, dict):
            raise _bad(path, f"{where} is not a table")
        version = _str(path, table, "version", where)
        target = by_version.get(version)
        if target is None:
            raise _bad(path, f"{where}.version {version!r} is not a [[targets]] release")
        if not (target.wheel_filename and target.sha256):
            raise _bad(
                path,
                f"{where}: release {version} has no wheel_filename/sha256 yet",
                hint=f"record it first: scripts/fetch-upstream.sh DEST --version {version}",
            )
        patches = _str(path, table, "patches", where, required=False) or f"patches/{version}"
        if patches != f"patches/{version}":
            raise _bad(path, f"{where}.patches must be 'patches/{version}', not {patches!r}")
        source = _str(path, table, "rebased_from", where)
        known = [pin.version, *(ln.version for ln in out)]
        if source not in known:
            raise _bad(
                path,
                f"{where}.rebased_from {source!r} is neither the pin nor an earlier line",
                hint=f"one of: {', '.join(known)}",
            )
        if version in known:
            raise _bad(path, f"{where}: there is already a line on {version}")
        out.append(LineEntry(version, patches, source))
    return tuple(out)


# --- in-place recording (keeps comments and layout) ------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?\s*(#.*)?$")


def _blocks(lines: list[str]) -> list[tuple[str, int, int]]:
    """(table name, first line, end line exclusive) for each table; '[[x]]' names are 'x[]'."""
    heads: list[tuple[str, int]] = []
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m:
            heads.append((m.group(2) + ("[]" if m.group(1) == "[[" else ""), i))
    return [
        (name, start, heads[k + 1][1] if k + 1 < len(heads) else len(lines))
        for k, (name, start) in enumerate(heads)
    ]


def _key_line(key: str) -> re.Pattern[str]:
    return re.compile(rf'^(\s*{re.escape(key)}\s*=\s*)"[^"]*"(.*)$')


def _set_key(lines: list[str], start: int, end: int, key: str, value: str) -> None:
    pat = _key_line(key)
    for i in range(start + 1, end):
        m = pat.match(lines[i])
        if m:
            lines[i] = f'{m.group(1)}"{value}"{m.group(2)}'
            return
    # key absent: insert after the last key line of the block (before trailing blanks/comments)
    last = start
    for i in range(start + 1, end):
        if re.match(r"^\s*[A-Za-z0-9_-]+\s*=", lines[i]):
            last = i
    lines.insert(last + 1, f'{key} = "{value}"')


def _write_checked(lock_path: Path, lines: list[str]) -> None:
    """Write atomically (keeping the file's mode), but only text that still parses as a valid
    lock."""
    text = "\n".join(lines) + "\n"
    write_atomically(lock_path, text.encode("utf-8"), check=load_lock)


def _update_entry(
    lock_path: Path,
    table: str,
    version: str,
    values: dict[str, str],
    new_only: dict[str, str] | None = None,
) -> None:
    """Set VALUES in the ``[[TABLE]]`` entry of VERSION, in place (comments and order kept),
    or append a new entry (version, NEW_ONLY, then VALUES); write it checked."""
    lines = lock_path.read_text(encoding="utf-8").splitlines()
    version_pat = re.compile(rf'^\s*version\s*=\s*"{re.escape(version)}"')
    for name, start, end in _blocks(lines):
        if name == f"{table}[]" and any(version_pat.match(x) for x in lines[start + 1 : end]):
            for key, value in values.items():
                _set_key(lines, start, end, key, value)
            break
    else:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += ["", f"[[{table}]]", f'version = "{version}"']
        lines += [f'{key} = "{value}"' for key, value in {**(new_only or {}), **values}.items()]
    _write_checked(lock_path, lines)


def record_target_sha256(lock_path: Path | str, version: str, filename: str, sha256: str) -> None:
    """Record a rebase target's wheel file name and sha256 in the lock text, keeping comments."""
    lock_path = Path(lock_path)
    sha256 = sha256.lower()
    if not _SHA256.match(sha256):
        raise SeriesError(f"not a sha256: {sha256!r}")
    lock = load_lock(lock_path)
    if version == lock.pin.version:
        raise SeriesError(
            f"{version} is the pin; its sha256 is fixed by hand",
            hint="edit [pin] in upstream.lock deliberately if the pin itself changes",
        )
    values = {"wheel_filename": filename, "sha256": sha256}
    new_only = {"tag": f"v{version}", "commit": UNRESOLVED}
    _update_entry(lock_path, "targets", version, values, new_only)


def record_pin_commit(lock_path: Path | str, commit: str) -> None:
    """Fill in the pin's commit id (resolved from a real clone of upstream)."""
    lock_path = Path(lock_path)
    if not _SHA1.match(commit):
        raise SeriesError(f"not a commit id: {commit!r}")
    lines = lock_path.read_text(encoding="utf-8").splitlines()
    for name, start, end in _blocks(lines):
        if name == "pin":
            _set_key(lines, start, end, "commit", commit)
            break
    else:
        raise _bad(lock_path, "has no [pin] table")
    _write_checked(lock_path, lines)


# --- [[lines]]: the maintained series lines (written by the rebase) ---------------------------


def record_line(lock_path: Path | str, version: str, patches: str, rebased_from: str) -> None:
    """Add or update the ``[[lines]]`` entry of VERSION in place (comments kept): the line on
    that release lives in PATCHES (relative to the lock's directory) and was rebased from the
    line on REBASED_FROM. The release must be a target with a recorded wheel and sha256."""
    lock_path = Path(lock_path)
    lock = load_lock(lock_path)
    release = lock.release(version)
    if release is lock.pin:
        raise SeriesError(
            f"{version} is the pin: its line is patches/ itself, not a [[lines]] entry",
            hint="rebase to a newer release (one of the [[targets]])",
        )
    if not (release.wheel_filename and release.sha256):
        raise SeriesError(
            f"{lock_path}: target {version} has no recorded wheel_filename and sha256",
            hint=f"record them first: scripts/rebase-check.sh --releases {version}",
        )
    lock.release(rebased_from)  # a known release, or SeriesError naming the known ones
    _update_entry(lock_path, "lines", version, {"patches": patches, "rebased_from": rebased_from})
