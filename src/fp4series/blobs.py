"""Does a tree hold exactly the blobs a patch says it produces?

Every file header of a format-patch (``--full-index``) names the blob ids of the file before and
after the patch. Checking those ids is what proves a patch arrived whole: a patch cut at a hunk
boundary, or with one line changed, still applies but yields a different blob.

Two checks, one per side:
- apply's: after applying, does the tree hold each post-image blob?  (blob_mismatches)
- lint's: starting from the pin's tree, does applying each patch's hunks, in series order, to
  its pre-image blob give exactly its post-image id, and is each pre-image what the pin plus the
  earlier patches hold?  (check_series_blobs; no work tree, only blob contents)

Public API (stable):
    blob_mismatches(repo, rev, patch) -> list[BlobMismatch]
        Compare REV's blob at each path PATCH writes with the patch's post-image id (a deleted
        file must be absent from REV). Empty list: every file is as the patch says.
    BlobMismatch: patch, file, expected (id or None for "absent"), actual (id or None),
                  describe() -> str
    check_series_blobs(patches, repo, rev) -> SeriesBlobCheck
        problems: [BlobProblem(patch, line, message)], skipped: [str] (files not checkable,
        e.g. binary), checked: int (files whose post-image id was recomputed and matched)
    apply_hunks(data, hunks) -> bytes   hunks applied at exactly the lines their headers name
    blob_id(data, hex_len=40) -> str    what `git hash-object` prints (sha1, or sha256 for 64)
    HunkMisfit(hunk): apply_hunks' error when a hunk's pre-image is not at its stated line
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from git import GitCommandError, Repo

from fp4series.patch import FileDiff, Hunk, Patch


@dataclass(frozen=True)
class BlobMismatch:
    patch: str
    file: str
    expected: str | None  # None: the patch deletes the file
    actual: str | None  # None: the tree has no such file

    def describe(self) -> str:
        want = self.expected or "<absent>"
        have = self.actual or "<absent>"
        return f"{self.patch}: {self.file}: the patch's post-image is blob {want}, found {have}"


def _tree_ids(repo: Repo, rev: str, files: list[str]) -> dict[str, str]:
    """{path: blob id} for those FILES that REV's tree holds (one ls-tree call; -z: no quoting)."""
    if not files:
        return {}
    out = repo.git.ls_tree("-z", "--full-tree", rev, "--", *files)
    ids: dict[str, str] = {}
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, name = entry.split("\t", 1)
        _mode, kind, sha = meta.split()
        if kind == "blob":
            ids[name] = sha
    return ids


def blob_mismatches(repo: Repo, rev: str, patch: Patch) -> list[BlobMismatch]:
    """Every file of PATCH whose blob in REV differs from the patch's post-image id."""
    expected: dict[str, str | None] = {}
    for change in patch.changes:
        if change.new_id is None:  # a pure mode change names no blob
            continue
        if change.new_path is None:
            expected[change.path] = None
        else:
            expected[change.new_path] = change.new_id
    actual = _tree_ids(repo, rev, sorted(expected))
    return [
        BlobMismatch(patch.name, file, want, actual.get(file))
        for file, want in expected.items()
        if actual.get(file) != want
    ]


# --------------------------------------------------------------------------- lint: the series


@dataclass(frozen=True)
class BlobProblem:
    patch: str
    line: int  # in the patch file: the file's "diff --git" line, or the hunk's "@@" line
    message: str


@dataclass
class SeriesBlobCheck:
    problems: list[BlobProblem] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    checked: int = 0


class HunkMisfit(Exception):
    def __init__(self, hunk: Hunk) -> None:
        super().__init__(hunk.header)
        self.hunk = hunk


def blob_id(data: bytes, hex_len: int = 40) -> str:
    algo = hashlib.sha1 if hex_len == 40 else hashlib.sha256
    return algo(b"blob %d\0" % len(data) + data).hexdigest()


def _lines(data: bytes) -> list[bytes]:
    """DATA split after each LF only (a CR is content), the last line possibly without one."""
    parts = data.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def apply_hunks(data: bytes, hunks: list[Hunk]) -> bytes:
    """DATA with HUNKS applied at exactly the lines their headers name: no offset and no fuzz,
    since DATA is the very blob the patch was made from. HunkMisfit if a pre-image differs."""
    lines = _lines(data)
    out: list[bytes] = []
    cursor = 0
    for hunk in hunks:
        pre, post = (
            [ln.encode("utf-8", "surrogateescape") for ln in side] for side in hunk.images()
        )
        start = hunk.old_start - 1 if hunk.old_len else hunk.old_start
        if start < cursor or lines[start : start + len(pre)] != pre:
            raise HunkMisfit(hunk)
        out += lines[cursor:start] + post
        cursor = start + len(pre)
    return b"".join(out + lines[cursor:])


class _Blobs:
    """Blob contents by id: those computed from earlier patches, else the repository's."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self.known: dict[str, bytes] = {}

    def get(self, sha: str) -> bytes | None:
        if not sha.strip("0"):  # the all-zero id: no file
            return b""
        if sha not in self.known:
            try:
                out = self.repo.git.cat_file(
                    "blob", sha, stdout_as_string=False, strip_newline_in_stdout=False
                )
            except GitCommandError:
                return None
            assert isinstance(out, bytes)
            self.known[sha] = out
        return self.known[sha]


def _check_change(
    patch: Patch, change: FileDiff, state: dict[str, str], blobs: _Blobs, out: SeriesBlobCheck
) -> None:
    def say(line: int, message: str) -> None:
        out.problems.append(BlobProblem(patch.name, line, f"{change.path}: {message}"))

    old, new = change.old_id or "", change.new_id or ""
    have = state.get(change.old_path) if change.old_path else None
    if change.old_path is None and change.new_path in state:
        say(
            change.line_no,
            "the patch creates this file, but the pin plus the earlier patches already hold it",
        )
    elif change.old_path is not None and have is None:
        say(change.line_no, "the pin plus the earlier patches do not hold this file")
    elif change.old_path is not None and have != old:
        say(
            change.line_no,
            f"the patch was made on blob {old[:12]}, but the pin plus the earlier patches hold "
            f"{have[:12]}: an earlier patch lacks a change to this file (cut short?) or this one "
            "was made on another base",
        )
    if change.old_path:
        state.pop(change.old_path, None)
    if change.new_path:
        state[change.new_path] = new
    if change.binary:
        out.skipped.append(f"{patch.name}: {change.path}: binary, its blob id is not recomputed")
        return
    pre = blobs.get(old)
    if pre is None:
        out.skipped.append(f"{patch.name}: {change.path}: pre-image blob {old[:12]} is not here")
        return
    hunks = [h for h in patch.hunks if h.file == change.path]
    try:
        post = apply_hunks(pre, hunks)
    except HunkMisfit as exc:
        say(
            exc.hunk.line_no,
            f"hunk {exc.hunk.header!r} does not match its pre-image blob {old[:12]} at line "
            f"{exc.hunk.old_start}: the hunk was edited",
        )
        return
    if change.new_path is None:  # a deletion's hunks must remove every line
        got = blob_id(post, len(old)) if post else new
    else:
        got = blob_id(post, len(new))
    if got != new:
        last = hunks[-1] if hunks else None
        where = f"after its last hunk {last.header!r} (line {last.line_no})" if last else ""
        say(
            last.line_no if last else change.line_no,
            f"its hunks turn blob {old[:12]} into {got[:12]}, but its index line says "
            f"{new[:12]}: a hunk is missing {where} or a line in a hunk was changed "
            "(the patch was cut short or edited); re-export it with scripts/export.sh",
        )
        return
    blobs.known[new] = post
    out.checked += 1


def check_series_blobs(patches: list[Patch], repo: Repo, rev: str) -> SeriesBlobCheck:
    """Replay PATCHES, in order, on the blobs of REV's tree, checking every id on the way."""
    touched = sorted(
        {p for patch in patches for c in patch.changes for p in (c.old_path, c.new_path) if p}
    )
    state = _tree_ids(repo, rev, touched)
    blobs = _Blobs(repo)
    out = SeriesBlobCheck()
    for patch in patches:
        for change in patch.changes:
            if change.new_id is not None:  # a pure mode change names no blob
                _check_change(patch, change, state, blobs, out)
    return out
