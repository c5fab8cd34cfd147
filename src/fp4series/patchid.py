"""Identity of a patch file: its sha256 (the bytes) and its stable patch-id (the change).

``git patch-id --stable`` ignores the message, line numbers and whitespace, so the same change
keeps its id through a reword or a rebase; the sha256 changes with any byte. The lint
cross-check (against a rebase-check matrix), ``Rebased-From:`` and the split record use them.

Public API (stable):
    file_sha256(path) -> str                  hex sha256 of the file's bytes
    stable_patch_id(text) -> str | None       40-hex `git patch-id --stable` of a patch text
                                              (None when it holds no diff); needs only git,
                                              no repository
    patch_identity(path) -> PatchIdentity     name, sha256, patch_id of one patch file
    PATCH_ID = re.compile("^[0-9a-f]{40}$")
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fp4series import gitops
from fp4series.digest import sha256_file
from fp4series.errors import SeriesError

PATCH_ID = re.compile(r"^[0-9a-f]{40}$")


def file_sha256(path: Path) -> str:
    return sha256_file(path)


def stable_patch_id(text: str) -> str | None:
    """`git patch-id --stable` of a patch (format-patch file or plain diff)."""
    proc = gitops.run(
        None, "patch-id", "--stable", input=text.encode("utf-8", "surrogateescape"), text=False
    )
    if proc.returncode != 0:
        raise SeriesError(
            f"git patch-id --stable failed: {proc.stderr.decode(errors='replace').strip()}",
            hint="check the patch file (git format-patch form)",
        )
    out = proc.stdout.decode().split()
    return out[0] if out else None


@dataclass(frozen=True)
class PatchIdentity:
    name: str
    sha256: str
    patch_id: str | None


def patch_identity(path: Path) -> PatchIdentity:
    data = path.read_bytes()
    return PatchIdentity(
        path.name, sha256_file(path), stable_patch_id(data.decode("utf-8", "surrogateescape"))
    )
