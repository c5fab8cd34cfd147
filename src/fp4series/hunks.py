"""Where does each hunk of a patch fit in a file, and if nowhere, which lines disagree.

`git apply` only says "patch does not apply"; this module says which hunk and which lines, by
searching the file for the hunk's pre-image exactly as git does (full context, no fuzz).

Public API (stable):
    locate_patch(patch, read) -> list[HunkFit]
        read(path) -> bytes | None gives a file's content before the patch (None: absent).
        One HunkFit per hunk (plus one per file-level problem such as a missing file).
    HunkFit: patch, file, header, status ("exact" | "offset" | "missing-file" | "exists" |
             "mismatch"), line (1-based where it fits / best guess), offset, mismatches
             [(line, expected, actual)], describe() -> str
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fp4series.patch import Hunk, Patch

MAX_SHOWN = 6


@dataclass
class HunkFit:
    patch: str
    file: str
    header: str
    status: str
    line: int = 0
    offset: int = 0
    mismatches: list[tuple[int, str, str | None]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("exact", "offset")

    def describe(self) -> str:
        head = f"{self.patch}: {self.file}: {self.header}".rstrip(": ")
        if self.status == "exact":
            return f"{head}: applies at line {self.line}"
        if self.status == "offset":
            return f"{head}: applies at line {self.line} (offset {self.offset:+d} lines)"
        if self.status == "missing-file":
            return f"{head}: the file does not exist in the checkout"
        if self.status == "exists":
            return f"{head}: the patch creates this file but it already exists"
        out = [f"{head}: does not match the file (closest fit near line {self.line}):"]
        for line, expected, actual in self.mismatches[:MAX_SHOWN]:
            out.append(f"    line {line}: patch expects {expected!r}")
            out.append(f"    {' ' * len(str(line))}       file has     {actual!r}")
            if actual is None:
                out[-1] = f"    {' ' * len(str(line))}       file has     <end of file>"
        if len(self.mismatches) > MAX_SHOWN:
            out.append(f"    ... {len(self.mismatches) - MAX_SHOWN} more differing lines")
        return "\n".join(out)


def _lines(data: bytes) -> list[str]:
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _fit(patch: str, hunk: Hunk, lines: list[str], shift: int) -> HunkFit:
    pre = hunk.preimage()
    want = max(hunk.old_start - 1, 0) + shift if hunk.old_len else hunk.old_start + shift
    fit = HunkFit(patch, hunk.file, hunk.header, "exact", want + 1)
    if not pre:
        return fit
    n = len(pre)
    exact = [p for p in range(len(lines) - n + 1) if lines[p : p + n] == pre]
    if exact:
        best = min(exact, key=lambda p: (abs(p - want), p))
        fit.line, fit.offset = best + 1, best - want
        fit.status = "exact" if best == want else "offset"
        return fit

    # no exact match: the alignment with the most equal lines, nearest the expected place
    def score(p: int) -> int:
        return sum(1 for i in range(n) if p + i < len(lines) and lines[p + i] == pre[i])

    candidates = range(max(len(lines) - n + 1, 1))
    best = max(candidates, key=lambda p: (score(p), -abs(p - want)))
    if score(best) == 0:
        best = min(max(want, 0), max(len(lines) - 1, 0))
    fit.status, fit.line, fit.offset = "mismatch", best + 1, best - want
    for i, expected in enumerate(pre):
        actual = lines[best + i] if best + i < len(lines) else None
        if actual != expected:
            fit.mismatches.append((best + i + 1, expected, actual))
    return fit


def locate_patch(patch: Patch, read: Callable[[str], bytes | None]) -> list[HunkFit]:
    """Fit every hunk of PATCH against the files READ returns (content before the patch)."""
    fits: list[HunkFit] = []
    for change in patch.changes:
        hunks = [h for h in patch.hunks if h.file == change.path]
        if change.old_path is None:
            if change.new_path and read(change.new_path) is not None:
                fits.append(HunkFit(patch.name, change.new_path, "", "exists"))
            continue
        data = read(change.old_path)
        if data is None:
            fits.append(HunkFit(patch.name, change.old_path, "", "missing-file"))
            continue
        lines = _lines(data)
        shift = 0
        for hunk in hunks:
            fit = _fit(patch.name, hunk, lines, shift)
            fit.file = change.old_path
            if fit.ok:
                shift = fit.offset
            fits.append(fit)
    return fits
