"""Raw diff model of series patches and the overlap graph between them.

The rebase check and the split need more than a patch's hunks: they rebuild single-hunk patches,
rewrite paths when upstream moved a file, and walk line numbers through the series. This module
keeps each file's git header (``index <old>..<new>`` with full blob ids, modes) so rebuilt patches
stay usable by ``git apply --3way``.

Overlap: patch B (later in the series) overlaps patch A when one of B's hunks covers lines that A
added or changed, after mapping A's lines forward through the patches between them; B then cannot
be applied (or reviewed as a PR) without A, so A must land first.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.paths import default_patches_dir
from fp4series.series import SERIES_FILE, load_series, parse_trailers

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclass
class Hunk:
    """One ``@@`` hunk; ``lines`` keep their ' ', '+', '-', '\\' prefixes and newlines."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    lines: list[str]

    @property
    def section(self) -> str:
        """The function/section name git printed after the ``@@`` (may be empty)."""
        m = HUNK_RE.match(self.header.rstrip("\n"))
        return m.group(5).strip() if m else ""

    def old_lines(self) -> list[str]:
        """Pre-image text lines (context + removed), without prefixes."""
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    def new_lines(self) -> list[str]:
        """Post-image text lines (context + added), without prefixes."""
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "+")]

    def added(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] == "+"]

    def removed(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] == "-"]

    def text(self) -> str:
        return self.header + "".join(self.lines)

    def label(self, index: int) -> str:
        """Human name of the hunk: number, ranges and section."""
        sec = f" {self.section}" if self.section else ""
        return (
            f"hunk #{index + 1} @@ -{self.old_start},{self.old_len} "
            f"+{self.new_start},{self.new_len} @@{sec}"
        )


@dataclass
class FileDiff:
    """One ``diff --git`` section: its header lines (up to the first hunk) and its hunks."""

    old_path: str | None
    new_path: str | None
    header: list[str]
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False

    @property
    def path(self) -> str:
        """The path the patch reads (old side), or the created path for new files."""
        return self.old_path or self.new_path or ""

    @property
    def is_new(self) -> bool:
        return self.old_path is None

    @property
    def is_deleted(self) -> bool:
        return self.new_path is None

    @property
    def is_rename(self) -> bool:
        return (
            self.old_path is not None
            and self.new_path is not None
            and self.old_path != self.new_path
        )

    @property
    def blobs(self) -> tuple[str, str] | None:
        """(pre-image blob id, post-image blob id) from the ``index`` line."""
        for ln in self.header:
            m = re.match(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", ln)
            if m:
                return m.group(1), m.group(2)
        return None

    def text(
        self, hunks: Sequence[Hunk] | None = None, rename: dict[str, str] | None = None
    ) -> str:
        """Render the section, optionally with a subset of hunks and paths rewritten."""
        header = list(self.header)
        if rename:
            header = [_rewrite_header_line(ln, rename) for ln in header]
        chosen = self.hunks if hunks is None else hunks
        return "".join(header) + "".join(h.text() for h in chosen)


def _rewrite_header_line(line: str, rename: dict[str, str]) -> str:
    body = line.rstrip("\n")
    for old, new in rename.items():
        if body.startswith("diff --git "):
            body = body.replace(f" a/{old}", f" a/{new}").replace(f" b/{old}", f" b/{new}")
        elif body in (f"--- a/{old}", f"+++ b/{old}"):
            body = body[:6] + new
        elif body.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            words = body.split(" ", 2)
            if words[2] == old:
                body = f"{words[0]} {words[1]} {new}"
    return body + "\n"


@dataclass
class ParsedDiff:
    """A format-patch file split into its mail header and its per-file diffs."""

    preamble: str
    files: list[FileDiff]

    def text(self, rename: dict[str, str] | None = None) -> str:
        """The diff part only (what ``git apply`` needs), optionally with paths rewritten."""
        return "".join(f.text(rename=rename) for f in self.files)

    def all_hunks(self) -> list[tuple[FileDiff, int, Hunk]]:
        return [(f, i, h) for f in self.files for i, h in enumerate(f.hunks)]


def _strip_prefix(p: str) -> str | None:
    p = p.strip()
    if p == "/dev/null":
        return None
    if p.startswith('"') and p.endswith('"'):
        p = p[1:-1]
    return p[2:] if p[:2] in ("a/", "b/") else p


def parse_diff(text: str) -> ParsedDiff:
    """Parse a format-patch (or git diff) text; hunk bodies are bounded by their line counts."""
    lines = text.splitlines(keepends=True)
    i = 0
    n = len(lines)
    while i < n and not lines[i].startswith("diff --git "):
        i += 1
    preamble = "".join(lines[:i])
    files: list[FileDiff] = []
    while i < n:
        if not lines[i].startswith("diff --git "):
            i += 1  # trailing signature ("-- \n2.39.5") or junk between sections
            continue
        m = re.match(r"^diff --git (\S+) (\S+)", lines[i])
        a_path = _strip_prefix(m.group(1)) if m else None
        b_path = _strip_prefix(m.group(2)) if m else None
        header = [lines[i]]
        i += 1
        old_path, new_path = a_path, b_path
        binary = False
        while i < n and not lines[i].startswith(("@@ ", "diff --git ")):
            ln = lines[i]
            if ln.startswith("--- "):
                old_path = _strip_prefix(ln[4:].rstrip("\n"))
            elif ln.startswith("+++ "):
                new_path = _strip_prefix(ln[4:].rstrip("\n"))
            elif ln.startswith("new file mode"):
                old_path = None
            elif ln.startswith("deleted file mode"):
                new_path = None
            elif ln.startswith("rename from "):
                old_path = ln[len("rename from ") :].rstrip("\n")
            elif ln.startswith("rename to "):
                new_path = ln[len("rename to ") :].rstrip("\n")
            elif ln.startswith(("GIT binary patch", "Binary files ")):
                binary = True
            header.append(ln)
            i += 1
        fd = FileDiff(old_path, new_path, header, binary=binary)
        while i < n and lines[i].startswith("@@ "):
            hm = HUNK_RE.match(lines[i].rstrip("\n"))
            if not hm:
                raise SeriesError(
                    f"malformed hunk header: {lines[i].rstrip()!r}",
                    hint="regenerate the patch with `git format-patch --full-index`",
                )
            old_len = int(hm.group(2)) if hm.group(2) is not None else 1
            new_len = int(hm.group(4)) if hm.group(4) is not None else 1
            hunk = Hunk(int(hm.group(1)), old_len, int(hm.group(3)), new_len, lines[i], [])
            i += 1
            o, nn = old_len, new_len
            while i < n and (o > 0 or nn > 0):
                ln = lines[i]
                tag = ln[:1]
                if tag == " " or ln in ("\n", "\r\n"):
                    if ln in ("\n", "\r\n"):  # context line whose leading space was eaten
                        ln = " " + ln
                    o -= 1
                    nn -= 1
                elif tag == "-":
                    o -= 1
                elif tag == "+":
                    nn -= 1
                elif tag == "\\":
                    pass
                else:
                    raise SeriesError(
                        f"hunk {hunk.header.strip()!r} of {fd.path} ends early at {ln.rstrip()!r}",
                        hint="the patch file is truncated or hand-edited; regenerate it",
                    )
                hunk.lines.append(ln)
                i += 1
            while i < n and lines[i].startswith("\\"):
                hunk.lines.append(lines[i])
                i += 1
            fd.hunks.append(hunk)
        files.append(fd)
    return ParsedDiff(preamble, files)


def split_list(value: str) -> list[str]:
    """Split a trailer value on commas and whitespace."""
    return [t for t in re.split(r"[,\s]+", value.strip()) if t]


@dataclass
class PatchDoc:
    """One series patch: file name, raw text, parsed diff and trailers."""

    name: str
    path: Path
    text: str
    diff: ParsedDiff
    subject: str
    message: str
    trailers: dict[str, str]

    @property
    def stem(self) -> str:
        """``0004-marlin-utils-fp4.patch`` -> ``marlin-utils-fp4``."""
        base = self.name[: -len(".patch")] if self.name.endswith(".patch") else self.name
        return re.sub(r"^\d{4}-", "", base)

    @property
    def provides(self) -> list[str]:
        return split_provides(self.trailers.get("Provides", ""))

    @property
    def depends_on(self) -> list[str]:
        return split_list(self.trailers.get("Depends-On", ""))

    @property
    def tests(self) -> list[str]:
        return split_list(self.trailers.get("Tests", ""))

    @property
    def group(self) -> str | None:
        g = self.trailers.get("Group", "").strip()
        return g or None

    @property
    def files(self) -> list[str]:
        return [f.new_path or f.old_path or "" for f in self.diff.files]


def split_provides(value: str) -> list[str]:
    """Split ``Provides:`` on commas, keeping ``func(a, b)`` parameter lists together."""
    out: list[str] = []
    depth = 0
    cur = ""
    for ch in value:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if (ch == "," or ch.isspace()) and depth == 0:
            if cur.strip():
                out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _subject_and_message(preamble: str) -> tuple[str, str]:
    lines = preamble.splitlines()
    subject = ""
    body_start = len(lines)
    for idx, ln in enumerate(lines):
        if ln.startswith("Subject: "):
            subject = ln[len("Subject: ") :]
            j = idx + 1
            while j < len(lines) and lines[j].startswith((" ", "\t")):  # folded subject
                subject += " " + lines[j].strip()
                j += 1
            body_start = j
            break
    body: list[str] = []
    for ln in lines[body_start:]:
        if ln == "---":
            break
        body.append(ln)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    return subject, "\n".join(body).strip("\n")


def load_patch(path: Path) -> PatchDoc:
    """Read and parse one patch file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SeriesError(f"cannot read patch {path}: {exc}", hint="check the series file") from exc
    diff = parse_diff(text)
    if not diff.files:
        raise SeriesError(
            f"{path.name} holds no diff", hint="regenerate it with `git format-patch --full-index`"
        )
    subject, message = _subject_and_message(diff.preamble)
    return PatchDoc(path.name, path, text, diff, subject, message, parse_trailers(message))


def load_patch_docs(patches_dir: Path, only: Iterable[str] | None = None) -> list[PatchDoc]:
    """Load the series in order; series.load_series validates the order file and its names."""
    loaded = load_series(patches_dir)
    paths = [Path(item.path) for item in loaded]
    trailers = {Path(item.path).name: item.trailers for item in loaded}
    docs: list[PatchDoc] = []
    wanted = set(only) if only else None
    for p in paths:
        doc = load_patch(p)
        for key, val in trailers.get(p.name, {}).items():
            if (
                isinstance(val, str)
                and key not in doc.trailers
                and key
                in (
                    "Tests",
                    "Provides",
                    "Depends-On",
                    "Upstream-Status",
                    "Group",
                )
            ):
                doc.trailers[key] = val
        docs.append(doc)
    if wanted is not None:
        known = {d.name for d in docs} | {d.stem for d in docs}
        unknown = sorted(w for w in wanted if w not in known)
        if unknown:
            raise SeriesError(
                f"not in the series: {', '.join(unknown)}",
                hint=f"choose from: {', '.join(d.name for d in docs)}",
            )
    return docs


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
        tag = ln[:1]
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
            tag = ln[:1]
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
    return fd.new_path or fd.old_path or ""


def compute_overlaps(docs: Sequence[PatchDoc]) -> list[Overlap]:
    """Every (earlier, later, file) where the later patch touches lines the earlier one changed."""
    out: list[Overlap] = []
    for ai, a in enumerate(docs):
        for fa in a.diff.files:
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
                fbs = [f for f in b.diff.files if f.old_path == key]
                for fb in fbs:
                    edit_hit: set[int] = set()
                    ctx_hit: set[int] = set()
                    src: set[int] = set()
                    for h in fb.hunks:
                        start = h.old_start if h.old_len else h.old_start + 1
                        o = start
                        prev: int | None = None
                        for ln in h.lines:
                            tag = ln[:1]
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
                if any(f.old_path == key and f.is_deleted for f in b.diff.files):
                    break
    return out


def use_patterns(doc: PatchDoc) -> dict[str, str]:
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
    for f in doc.diff.files:
        if f.is_new and f.new_path and f.new_path.endswith(".py"):
            stem = Path(f.new_path).stem
            if len(stem) >= 6 and not stem.startswith("__"):
                pats[stem] = rf"\b{re.escape(stem)}\b"
    return pats


def explain_dependencies(docs: Sequence[PatchDoc]) -> dict[str, dict[str, list[str]]]:
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
        for f in d.diff.files:
            if f.old_path is not None and f.old_path in created and created[f.old_path] != d.name:
                add(d.name, created[f.old_path], f"edits {f.old_path}, which it creates")
            if f.is_new and f.new_path:
                created[f.new_path] = d.name
    for i, a in enumerate(docs):
        pats = {name: re.compile(rx) for name, rx in use_patterns(a).items()}
        if not pats:
            continue
        for b in docs[i + 1 :]:
            added = [ln for f in b.diff.files for h in f.hunks for ln in h.added()]
            used = sorted(n for n, rx in pats.items() if any(rx.search(ln) for ln in added))
            if used:
                add(b.name, a.name, "uses " + ", ".join(used))
    return why


def derived_dependencies(docs: Sequence[PatchDoc]) -> dict[str, set[str]]:
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


def cmd_overlap(args: argparse.Namespace) -> int:
    docs = load_patch_docs(Path(args.patches_dir), args.patches or None)
    if not docs and not args.patches:
        raise SeriesError(
            f"{args.patches_dir} holds no series (no {SERIES_FILE} file listing patches), "
            "so there is nothing to compare",
            hint="pass --patches-dir with the directory holding series and NNNN-*.patch "
            f"(default: the project's {default_patches_dir()})",
        )
    if args.patches:
        wanted = set(args.patches)
        all_ov = compute_overlaps(load_patch_docs(Path(args.patches_dir)))
        docs_names = {d.name for d in docs if d.name in wanted or d.stem in wanted}
        overlaps = [o for o in all_ov if o.earlier in docs_names or o.later in docs_names]
    else:
        overlaps = compute_overlaps(docs)
    if args.json:
        json.dump([o.as_dict() for o in overlaps], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_overlaps(overlaps))
        why = explain_dependencies(load_patch_docs(Path(args.patches_dir)))
        rows = [
            f"  {later} needs {earlier}: {'; '.join(reasons)}"
            for later, deps in why.items()
            for earlier, reasons in deps.items()
        ]
        print("\nPR order constraints (why each patch needs an earlier one):")
        print("\n".join(rows) if rows else "  none: every patch stands on the pin alone")
    return 0


def register_overlap(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "overlap",
        help="show which lines two patches both touch (so PRs can be ordered)",
        description=format_overlaps.__doc__,
    )
    p.add_argument(
        "--patches-dir",
        type=Path,
        default=default_patches_dir(),
        help="directory with series + patches (default: the project's patches/, from any cwd)",
    )
    p.add_argument("patches", nargs="*", help="limit to pairs involving these patches")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_overlap)
