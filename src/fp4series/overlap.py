"""The overlap graph between series patches, and why each patch needs an earlier one.

Patch B (later in the series) overlaps patch A when one of B's hunks covers lines that A added
or changed, after mapping A's lines forward through the patches between them; B then cannot be
applied (or reviewed as a PR) without A, so A must land first. The split orders its branches by
this, the rebase check stacks patches by it. Patches come from fp4series.patch (one model).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.patch import FileDiff, Hunk, Patch, line_kind

# ---------------------------------------------------------------------------------------------
# Line bookkeeping and overlaps


def changed_new_lines(h: Hunk) -> tuple[list[int], list[int]]:
    """(post-image line numbers of added lines, post-image points where lines were deleted).

    A deletion point ``p`` means removed lines sat just before post-image line ``p``.
    """
    added: list[int] = []
    points: list[int] = []
    n = h.new_start if h.new_len else h.new_start + 1
    prev_removed = False
    for ln in h.lines:
        tag = line_kind(ln)
        if tag == "+":
            added.append(n)
            n += 1
            prev_removed = False
        elif tag == "-":
            if not prev_removed:
                points.append(n)
            prev_removed = True
        elif tag == " ":
            n += 1
            prev_removed = False
    return added, points


def map_line(line: int, hunks: Sequence[Hunk]) -> int | None:
    """Map a pre-image line number through a file's hunks; ``None`` when the line was removed."""
    delta = 0
    for h in hunks:
        start = h.old_start if h.old_len else h.old_start + 1
        if line < start:
            break
        end = start + h.old_len
        if line >= end:
            delta += h.new_len - h.old_len
            continue
        o = start
        nn = h.new_start if h.new_len else h.new_start + 1
        for ln in h.lines:
            tag = line_kind(ln)
            if tag == " ":
                if o == line:
                    return nn
                o += 1
                nn += 1
            elif tag == "-":
                if o == line:
                    return None
                o += 1
            elif tag == "+":
                nn += 1
        return None
    return line + delta


@dataclass
class Overlap:
    """Lines of ``later`` (pre-image coordinates) that sit on lines ``earlier`` added/changed."""

    earlier: str
    later: str
    file: str
    later_ranges: list[tuple[int, int]]
    earlier_ranges: list[tuple[int, int]]
    kind: str  # "edits" (later changes those lines) or "context" (later only reads them)

    def as_dict(self) -> dict[str, object]:
        return {
            "earlier": self.earlier,
            "later": self.later,
            "file": self.file,
            "later_ranges": [list(r) for r in self.later_ranges],
            "earlier_ranges": [list(r) for r in self.earlier_ranges],
            "kind": self.kind,
        }


def _ranges(nums: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for x in sorted(set(nums)):
        if out and x == out[-1][1] + 1:
            out[-1] = (out[-1][0], x)
        else:
            out.append((x, x))
    return out


def _file_key(fd: FileDiff) -> str:
    return fd.path


def compute_overlaps(docs: Sequence[Patch]) -> list[Overlap]:
    """Every (earlier, later, file) where the later patch touches lines the earlier one changed."""
    out: list[Overlap] = []
    for ai, a in enumerate(docs):
        for fa in a.changes:
            key = _file_key(fa)
            # marks: post-A line numbers of added lines and deletion points, walked forward.
            added: dict[int, int] = {}  # current line -> original post-A line
            points: dict[int, int] = {}
            for h in fa.hunks:
                ad, pts = changed_new_lines(h)
                added.update({x: x for x in ad})
                points.update({x: x for x in pts})
            if not added and not points and not fa.is_new:
                continue
            for b in docs[ai + 1 :]:
                fbs = [f for f in b.changes if f.old_path == key]
                for fb in fbs:
                    edit_hit: set[int] = set()
                    ctx_hit: set[int] = set()
                    src: set[int] = set()
                    for h in fb.hunks:
                        start = h.old_start if h.old_len else h.old_start + 1
                        o = start
                        prev: int | None = None
                        for ln in h.lines:
                            tag = line_kind(ln)
                            if tag not in (" ", "-"):
                                continue
                            if o in added:
                                (edit_hit if tag == "-" else ctx_hit).add(o)
                                src.add(added[o])
                            if o in points and prev is not None and prev == o - 1:
                                (edit_hit if tag == "-" else ctx_hit).add(o)
                                src.add(points[o])
                            prev = o
                            o += 1
                    if edit_hit or ctx_hit:
                        kind = "edits" if edit_hit else "context"
                        out.append(
                            Overlap(
                                a.name,
                                b.name,
                                key,
                                _ranges(edit_hit | ctx_hit),
                                _ranges(src),
                                kind,
                            )
                        )
                # walk A's marks through B so later patches are compared in their own coordinates
                for fb in fbs:
                    added = {
                        m: orig
                        for cur, orig in added.items()
                        if (m := map_line(cur, fb.hunks)) is not None
                    }
                    points = {
                        m: orig
                        for cur, orig in points.items()
                        if (m := map_line(cur, fb.hunks)) is not None
                    }
                if any(f.old_path == key and f.is_deleted for f in b.changes):
                    break
    return out


def use_patterns(doc: Patch) -> dict[str, str]:
    """name -> regex of a use in a later patch that means it needs DOC: plain ``Provides:``
    names anywhere, ``A.b`` as an attribute (``.b``) or keyword (``b=``), ``f(p)`` parameters
    as keywords (``p=``), and Python modules DOC creates (by module name)."""
    pats: dict[str, str] = {}
    for sym in doc.provides:
        m = re.match(r"^([^()]+)\((.*)\)$", sym)
        if m:
            for x in (x.strip() for x in m.group(2).split(",")):
                if re.fullmatch(r"[A-Za-z_]\w*", x):
                    pats[x] = rf"\b{x}\s*=(?!=)"
            continue
        last = sym.split(".")[-1]
        if not re.fullmatch(r"[A-Za-z_]\w*", last):
            continue
        if "." in sym:
            if len(last) >= 6 and "_" in last:
                pats[last] = rf"\.{last}\b|\b{last}\s*=(?!=)"
        else:
            pats[last] = rf"\b{last}\b"
    for f in doc.changes:
        if f.is_new and f.new_path and f.new_path.endswith(".py"):
            stem = Path(f.new_path).stem
            if len(stem) >= 6 and not stem.startswith("__"):
                pats[stem] = rf"\b{re.escape(stem)}\b"
    return pats


def explain_dependencies(docs: Sequence[Patch]) -> dict[str, dict[str, list[str]]]:
    """later patch -> earlier patch -> why it needs it: declared ``Depends-On``, overlapping
    lines, editing a file the earlier one created, or using a name it provides."""
    names = {d.name for d in docs}
    by_stem = {d.stem: d.name for d in docs}
    why: dict[str, dict[str, list[str]]] = {d.name: {} for d in docs}

    def add(later: str, earlier: str, reason: str) -> None:
        reasons = why[later].setdefault(earlier, [])
        if reason not in reasons:
            reasons.append(reason)

    for d in docs:
        for dep in d.depends_on:
            target = dep if dep in names else by_stem.get(re.sub(r"^\d{4}-|\.patch$", "", dep))
            if target is None:
                raise SeriesError(
                    f"{d.name}: Depends-On names {dep!r}, which is not in the series",
                    hint="use the patch file name, e.g. 0004-marlin-utils-fp4.patch",
                )
            add(d.name, target, "declared in Depends-On")
    for ov in compute_overlaps(docs):
        add(ov.later, ov.earlier, f"{ov.kind} lines it wrote in {ov.file}")
    created: dict[str, str] = {}
    for d in docs:
        for f in d.changes:
            if f.old_path is not None and f.old_path in created and created[f.old_path] != d.name:
                add(d.name, created[f.old_path], f"edits {f.old_path}, which it creates")
            if f.is_new and f.new_path:
                created[f.new_path] = d.name
    for i, a in enumerate(docs):
        pats = {name: re.compile(rx) for name, rx in use_patterns(a).items()}
        if not pats:
            continue
        for b in docs[i + 1 :]:
            added = [ln for f in b.changes for h in f.hunks for ln in h.added()]
            used = sorted(n for n, rx in pats.items() if any(rx.search(ln) for ln in added))
            if used:
                add(b.name, a.name, "uses " + ", ".join(used))
    return why


def derived_dependencies(docs: Sequence[Patch]) -> dict[str, set[str]]:
    """patch name -> earlier patches it needs (see ``explain_dependencies``)."""
    return {k: set(v) for k, v in explain_dependencies(docs).items()}


def dependency_closure(name: str, deps: dict[str, set[str]]) -> set[str]:
    """All patches ``name`` needs, transitively (``name`` excluded)."""
    seen: set[str] = set()
    stack = list(deps.get(name, ()))
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        stack.extend(deps.get(cur, ()))
    seen.discard(name)
    return seen


def format_overlaps(overlaps: Sequence[Overlap]) -> str:
    """Plain text listing, one line per (pair, file)."""
    if not overlaps:
        return "no two patches touch the same lines"

    def rs(r: Sequence[tuple[int, int]]) -> str:
        return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in r)

    lines = []
    for ov in overlaps:
        lines.append(
            f"{ov.earlier} -> {ov.later}: {ov.file}: {ov.later} {ov.kind} lines "
            f"{rs(ov.later_ranges)} (its pre-image), which {ov.earlier} wrote at lines "
            f"{rs(ov.earlier_ranges)} (its post-image)"
        )
    return "\n".join(lines)
