"""Does a tree hold exactly the blobs a patch says it produces?

Every file header of a format-patch (``--full-index``) names the blob id of the file after the
patch. Comparing those ids with a tree is what proves a patch arrived whole: a patch cut at a
hunk boundary, or with one line changed, still applies but yields a different blob.

Public API (stable):
    blob_mismatches(repo, rev, patch) -> list[BlobMismatch]
        Compare REV's blob at each path PATCH writes with the patch's post-image id (a deleted
        file must be absent from REV). Empty list: every file is as the patch says.
    BlobMismatch: patch, file, expected (id or None for "absent"), actual (id or None),
                  describe() -> str
"""

from __future__ import annotations

from dataclasses import dataclass

from git import Repo

from fp4series.series import Patch


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
