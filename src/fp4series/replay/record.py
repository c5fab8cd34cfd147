"""The record a line keeps of how each source patch was resolved: the line is its own record.

A line's patch that came from source patch P carries ``Rebased-From: <P's file name> <P's
stable patch-id>``; a source patch the line does not carry has a stanza in the line's
``dropped`` file (``Patch:`` and ``Patch-Id:``, then where upstream has it and why). A rerun of
the rebase replays what is recorded instead of re-deciding, so the committed line is
reproduced byte for byte; a record whose patch-id is not P's current one is stale (P was
edited since) and P is treated as new.

Public API:
    stable_patch_id(text) -> str             ``git patch-id --stable`` of a patch file's text
    Stanza(text)                             one drop stanza; .get(key), .fields
    stanza(fields) -> Stanza                 a new stanza from (key, value) pairs
    Dropped(header, stanzas)                 the drop file; .render(); parse_dropped(path)
    write_dropped(path, dropped)             atomic replace
    Record, load_record(line_dir) -> Record | None, Record.resolution(name, patch_id),
    Record.orphans (line patches with no ``Rebased-From:``: a rebase does not carry them)
    TRAILER ("Rebased-From"), DROPPED ("dropped"), DEFAULT_HEADER
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from fp4series import patchid
from fp4series.errors import SeriesError
from fp4series.paths import write_atomically
from fp4series.series import load_series

TRAILER = "Rebased-From"
DROPPED = "dropped"
DEFAULT_HEADER = (
    "# Patches of the source line that this line does not carry, one stanza each, in the",
    "# source's series order (written by scripts/rebase.sh; a rerun replays them as they are).",
)
_ID = patchid.PATCH_ID
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(.*)$")


def stable_patch_id(text: str) -> str:
    """The stable patch-id of a patch (fp4series.patchid); a patch without a diff is an error."""
    found = patchid.stable_patch_id(text)
    if found is None:
        raise SeriesError(
            "git patch-id found no diff in the patch",
            hint="regenerate the patch with scripts/export.sh",
        )
    return found


@dataclass(frozen=True)
class Stanza:
    """One stanza of the drop file, kept as written so a replayed record is byte-stable."""

    text: str

    @property
    def fields(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for line in self.text.splitlines():
            m = _FIELD.match(line)
            if m:
                out.append((m.group(1), m.group(2).strip()))
            elif out:  # a continuation line
                out[-1] = (out[-1][0], f"{out[-1][1]} {line.strip()}".strip())
        return out

    def get(self, key: str) -> str:
        return next((v for k, v in self.fields if k == key), "")


def stanza(fields: list[tuple[str, str]]) -> Stanza:
    """A new stanza; values are flattened to one line (the format has no escaping)."""
    return Stanza("\n".join(f"{k}: {' '.join(v.split())}" for k, v in fields))


@dataclass
class Dropped:
    header: list[str] = field(default_factory=lambda: list(DEFAULT_HEADER))
    stanzas: list[Stanza] = field(default_factory=list)

    def render(self) -> str:
        blocks = ["\n".join(self.header)] if self.header else []
        blocks += [s.text for s in self.stanzas]
        return "\n\n".join(blocks) + "\n" if blocks else ""


def parse_dropped(path: Path) -> Dropped:
    """Read a drop file; every problem names the file and line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header: list[str] = []
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or not lines[i].strip()):
        if lines[i].startswith("#"):
            header.append(lines[i])
        i += 1
    stanzas: list[Stanza] = []
    seen: dict[str, int] = {}
    while i < len(lines):
        start = i
        block: list[str] = []
        while i < len(lines) and lines[i].strip():
            line = lines[i]
            if not _FIELD.match(line) and not (block and line[:1] in (" ", "\t")):
                raise _bad(path, i + 1, f"{line!r} is neither 'Key: value' nor a continuation")
            block.append(line)
            i += 1
        s = Stanza("\n".join(block))
        name, pid = s.get("Patch"), s.get("Patch-Id")
        if not name or not _ID.match(pid):
            raise _bad(path, start + 1, "a stanza needs 'Patch:' and a 40-hex 'Patch-Id:'")
        if name in seen:
            raise _bad(path, start + 1, f"{name} is dropped twice (first on line {seen[name]})")
        seen[name] = start + 1
        stanzas.append(s)
        while i < len(lines) and not lines[i].strip():
            i += 1
    return Dropped(header, stanzas)


def _bad(path: Path, line: int, what: str) -> SeriesError:
    return SeriesError(
        f"{path}:{line}: {what}",
        hint="fix the drop file by hand (stanzas of 'Key: value' lines separated by blank "
        "lines, '#' comments only at the top), or remove it and rerun the rebase",
    )


def write_dropped(path: Path, dropped: Dropped) -> None:
    """Replace PATH atomically (a kill leaves the old or the new file, never half of one),
    keeping its mode."""
    write_atomically(path, dropped.render().encode("utf-8"))


@dataclass(frozen=True)
class RecordedPatch:
    path: Path  # the line's patch file
    source: str  # the source patch it came from
    patch_id: str  # the source's patch-id when it was made


@dataclass
class Record:
    """What a committed line says about each source patch (see the module doc)."""

    where: Path
    patches: dict[str, list[RecordedPatch]] = field(default_factory=dict)
    drops: dict[str, Stanza] = field(default_factory=dict)
    orphans: list[Path] = field(default_factory=list)  # line patches naming no source patch

    def resolution(
        self, name: str, patch_id: str
    ) -> tuple[list[RecordedPatch], Stanza | None, str | None]:
        """(line patches to replay, drop stanza to keep, why the record is stale) for NAME."""
        made = self.patches.get(name, [])
        drop = self.drops.get(name)
        fresh = [p for p in made if p.patch_id == patch_id]
        if fresh:
            return fresh, None, None
        if drop is not None and drop.get("Patch-Id") == patch_id:
            return [], drop, None
        old = [f"{p.path.name} (from {p.patch_id[:12]})" for p in made]
        if drop is not None:
            old.append(f"its drop stanza (from {drop.get('Patch-Id')[:12]})")
        if not old:
            return [], None, None
        return (
            [],
            None,
            (
                f"stale record for {name}: {', '.join(old)} in {self.where} was made from another "
                f"version of it (now {patch_id[:12]}); treating it as new"
            ),
        )


def load_record(line_dir: Path) -> Record | None:
    """The record a line directory holds, or None when it has no series yet."""
    if not (line_dir / "series").is_file():
        return None
    rec = Record(line_dir)
    for patch in load_series(line_dir):
        raw = patch.trailers.get(TRAILER, "")
        if not raw.strip():
            rec.orphans.append(patch.path)
        for entry in [raw.strip()] if raw.strip() else []:  # one source patch per line patch
            parts = entry.split()
            if len(parts) != 2 or not _ID.match(parts[1]):
                raise SeriesError(
                    f"{patch.path}: '{TRAILER}: {entry}' is not '<source patch> <patch-id>'",
                    hint=f"write it as '{TRAILER}: 0004-x.patch <40-hex stable patch-id>'",
                )
            rec.patches.setdefault(parts[0], []).append(
                RecordedPatch(patch.path, parts[0], parts[1])
            )
    if (line_dir / DROPPED).is_file():
        for s in parse_dropped(line_dir / DROPPED).stanzas:
            rec.drops[s.get("Patch")] = s
    return rec
