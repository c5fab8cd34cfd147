"""The verdict for one patch on one tree (no fuzz, ever): applies, upstream, moved, deleted."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fp4series.judging.repo import ApplyResult, JudgeRepo
from fp4series.judging.symbols import (
    SymbolHit,
)
from fp4series.judging.verdict import Verdict
from fp4series.patch import FileDiff, Hunk, Patch

SIMILARITY = 0.5  # minimum content similarity for "moved"


@dataclass(frozen=True)
class SeriesFile:
    """A file an earlier series patch creates: which patch, and its text as created."""

    creator: str
    text: str


def _similarity(a: str, b: str) -> float:
    al, bl = a.splitlines(), b.splitlines()
    sm = difflib.SequenceMatcher(None, al, bl, autojunk=False)
    if sm.real_quick_ratio() < SIMILARITY or sm.quick_ratio() < SIMILARITY:
        return 0.0
    return sm.ratio()


def _suffix_match(a: str, b: str) -> int:
    pa, pb = a.split("/")[::-1], b.split("/")[::-1]
    n = 0
    while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
        n += 1
    return n


def find_moved(
    repo: JudgeRepo, path: str, base_tree: str, pin_tree: str, pin_text: str | None
) -> tuple[str, float] | None:
    """Where PATH's content went: a file new since the pin with similar content, preferring the
    longest common path suffix (the dense and MoE ``marlin_template.h`` are look-alikes)."""
    if pin_text is None:
        return None
    pin_files = repo.ls(pin_tree)
    base_files = repo.ls(base_tree)
    name = path.rsplit("/", 1)[-1]
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    fresh = [p for p in base_files if p not in pin_files]
    same_name = [p for p in fresh if p.rsplit("/", 1)[-1] == name]
    pools = [same_name, [p for p in fresh if p.endswith("." + ext) and p not in same_name]]
    for pool in pools:
        scored = []
        repo.load_blobs([base_files[c] for c in pool])
        for cand in pool:
            text = repo.blob_text(base_files[cand]) or ""
            sim = _similarity(pin_text, text)
            if sim >= SIMILARITY:
                scored.append((_suffix_match(path, cand), sim, cand))
        if scored:
            scored.sort(reverse=True)
            return scored[0][2], round(scored[0][1], 3)
    return None


def _block_present(haystack: list[str], needle: list[str]) -> bool:
    if not needle:
        return False
    n = len(needle)
    first = needle[0]
    for i in range(len(haystack) - n + 1):
        if haystack[i] == first and haystack[i : i + n] == needle:
            return True
    return False


def _hunk_present(h: Hunk, text: str | None, fd: FileDiff) -> bool:
    """The hunk's post-image is already in the file (and, for pure deletions, its pre-image not)."""
    if text is None:
        return fd.is_deleted
    lines = [ln + "\n" if not ln.endswith("\n") else ln for ln in text.splitlines()]
    new = [ln if ln.endswith("\n") else ln + "\n" for ln in h.postimage()]
    old = [ln if ln.endswith("\n") else ln + "\n" for ln in h.preimage()]
    if fd.is_new:
        return lines == new or (len(new) >= 3 and _block_present(lines, new))
    if h.added():
        return _block_present(lines, new)
    return _block_present(lines, new) and not _block_present(lines, old)


def _norm(line: str) -> str:
    return " ".join(line.split())


def _hunk_lines_present(h: Hunk, text: str | None) -> bool:
    """Looser: the hunk's distinctive added lines (whitespace-normalized, >= 24 characters in
    all) all occur close together in the file and some distinctive removed line is gone:
    upstream made the same change, laid out differently. Only used when the patch does not
    apply; short one-liners (``"marlin",``) are too ambiguous to count."""
    if text is None:
        return False
    added = list(dict.fromkeys(_norm(x) for x in h.added() if len(_norm(x)) >= 8))
    if not added or sum(map(len, added)) < 24:
        return False
    where: dict[str, list[int]] = {a: [] for a in added}
    lines = [_norm(x) for x in text.splitlines()]
    for i, ln in enumerate(lines):
        if ln in where:
            where[ln].append(i)
    if any(not v for v in where.values()):
        return False
    span = 2 * len(h.lines) + 10
    anchor = added[0]
    if not any(
        all(any(abs(j - i) <= span for j in where[a]) for a in added[1:]) for i in where[anchor]
    ):
        return False
    have = set(lines)
    removed = {_norm(x) for x in h.removed() if len(_norm(x)) >= 8} - set(added)
    return not removed or bool(removed - have)


def _what_is_there(h: Hunk, text: str | None) -> str:
    """Where the hunk's pre-image best matches the file, the first line that differs: turns
    'patch failed' into 'expects `return 100`, line 1142 has `return 80`'."""
    if not text:
        return ""
    lines = text.splitlines()
    old = [x.rstrip("\n") for x in h.preimage()]
    n = len(old)
    if n == 0 or len(lines) < n:
        return ""
    best: tuple[int, int] | None = None  # (score, -distance) -> start
    start_at = 0
    for i in range(len(lines) - n + 1):
        score = sum(1 for a, b in zip(old, lines[i : i + n], strict=True) if a == b)
        key = (score, -abs(i + 1 - h.old_start))
        if best is None or key > best:
            best, start_at = key, i
    if best is None or best[0] * 2 < n or best[0] == n:
        return ""
    for k, (a, b) in enumerate(zip(old, lines[start_at : start_at + n], strict=True)):
        if a != b:
            return (
                f"expects `{a.strip()}`, line {start_at + k + 1} has `{b.strip()}` "
                f"(best match at line {start_at + 1}, {best[0]}/{n} lines equal)"
            )
    return ""


def judge(
    repo: JudgeRepo,
    doc: Patch,
    base_tree: str,
    *,
    release_tree: str,
    pin_tree: str,
    symbols: tuple[list[SymbolHit], str] | None = None,
    series_files: dict[str, SeriesFile] | None = None,
) -> Verdict:
    """Verdict of DOC on BASE_TREE (the release, or the release plus earlier series patches).

    SERIES_FILES names the files earlier series patches create (not at the pin). A hunk on such
    a file that BASE_TREE lacks is no evidence about upstream (its creator did not apply here):
    it is left out, recorded in ``not_judged``, and the patch is judged by its other files.
    """
    files = repo.ls(base_tree)
    pin_files = repo.ls(pin_tree)
    series_files = series_files or {}
    base_dirs = {p.rsplit("/", 1)[0] for p in files}
    renames: dict[str, str] = {}
    missing: list[str] = []
    unjudged: dict[str, SeriesFile] = {}
    sims: dict[str, float] = {}
    for fd in doc.changes:
        if fd.is_new or fd.old_path is None or fd.old_path in files:
            continue
        pin_blob = pin_files.get(fd.old_path)
        origin = series_files.get(fd.old_path) if pin_blob is None else None
        if pin_blob is not None:
            ref_text = repo.blob_text(pin_blob)
        else:  # deterministic: the creator's text, never a blob that may or may not be stored
            ref_text = origin.text if origin is not None else None
        found = find_moved(repo, fd.old_path, base_tree, pin_tree, ref_text)
        if found:
            renames[fd.old_path], sims[fd.old_path] = found
        elif pin_blob is not None:
            missing.append(fd.old_path)  # at the pin, gone now, nothing similar: deleted
        elif origin is not None:
            unjudged[fd.old_path] = origin
        # else: neither at the pin nor from an earlier patch: its hunks fail as conflicts
    judged_files = [fd for fd in doc.changes if fd.old_path not in unjudged]
    # new files whose directory moved follow their siblings
    dir_moves = {
        old.rsplit("/", 1)[0]: new.rsplit("/", 1)[0]
        for old, new in renames.items()
        if old.rsplit("/", 1)[-1] == new.rsplit("/", 1)[-1]
    }
    for fd in judged_files:
        if fd.is_new and fd.new_path:
            d = fd.new_path.rsplit("/", 1)[0]
            if d in base_dirs:
                continue
            if d not in dir_moves:  # no edited sibling: follow one of the pin's files there
                sibling = next((p for p in pin_files if p.rsplit("/", 1)[0] == d), None)
                if sibling is not None:
                    sib_text = repo.blob_text(pin_files[sibling])
                    moved = find_moved(repo, sibling, base_tree, pin_tree, sib_text)
                    if moved and moved[0].rsplit("/", 1)[-1] == sibling.rsplit("/", 1)[-1]:
                        dir_moves[d] = moved[0].rsplit("/", 1)[0]
            if d in dir_moves:
                renames[fd.new_path] = dir_moves[d] + "/" + fd.new_path.rsplit("/", 1)[1]
    text = "".join(fd.text(rename=renames or None) for fd in judged_files)

    def target(fd: FileDiff) -> str:
        p = fd.old_path or fd.new_path or ""
        return renames.get(p, p)

    sym_hits, sym_source = symbols if symbols is not None else ([], "")
    evidence_syms = [s for s in sym_hits if not s.at_pin]
    found_syms = [s for s in evidence_syms if s.found]

    # per-hunk post-image presence (cheap, Python side)
    hunk_rows: list[dict[str, Any]] = []
    for fd in judged_files:
        cur = repo.file_text(base_tree, target(fd))
        for i, h in enumerate(fd.hunks):
            hunk_rows.append(
                {
                    "file": target(fd),
                    "hunk": h.label(i),
                    "present": _hunk_present(h, cur, fd) if target(fd) not in missing else False,
                }
            )

    v = Verdict("conflict", symbols=sym_hits, symbol_source=sym_source, hunks=hunk_rows)
    v.missing_files = missing
    v.not_judged = [
        {
            "file": fd.old_path or "",
            "hunks": len(fd.hunks),
            "from": unjudged[fd.old_path or ""].creator,
            "reason": f"the file comes from {unjudged[fd.old_path or ''].creator}, "
            "which is not applied on this tree: no evidence about upstream",
        }
        for fd in doc.changes
        if fd.old_path in unjudged
    ]
    if renames:
        v.moved_to = renames
        v.evidence = "; ".join(
            f"{o} -> {n}" + (f" (similarity {sims[o]})" if o in sims else " (directory moved)")
            for o, n in renames.items()
        )

    def finish(verdict: str, evidence: str) -> Verdict:
        if v.not_judged:
            skipped = "; ".join(
                f"{n['file']} ({n['hunks']} hunk(s), from {n['from']})" for n in v.not_judged
            )
            what = "not judged, their creator is not applied here: " + skipped
            evidence = f"{evidence}; {what}" if evidence else what
        if renames:
            v.verdict, v.moved_verdict = "moved", verdict
            v.evidence = f"{v.evidence}; then {verdict}: {evidence}" if evidence else v.evidence
        else:
            v.verdict = verdict
            v.evidence = evidence
        return v

    if not judged_files:
        creators = sorted({n["from"] for n in v.not_judged})
        return finish(
            "conflict",
            f"nothing to judge: every file it edits comes from {', '.join(creators)}",
        )
    fwd = repo.apply(text, base_tree)
    rev = repo.apply(text, base_tree, reverse=True) if not fwd.ok else None
    if not fwd.ok:  # same change, other layout: count hunks whose changed lines are all there
        k = 0
        for fd in judged_files:
            cur = repo.file_text(base_tree, target(fd)) if target(fd) not in missing else None
            for h in fd.hunks:
                row = hunk_rows[k]
                k += 1
                if not row["present"] and not fd.is_new and _hunk_lines_present(h, cur):
                    row["present"] = True
                    row["match"] = "lines"
    all_present = bool(hunk_rows) and all(r["present"] for r in hunk_rows)
    loose = sum(1 for r in hunk_rows if r.get("match") == "lines")
    if rev is not None and rev.ok:
        return finish("upstream", "the patch reverse-applies")
    if evidence_syms and len(found_syms) == len(evidence_syms):
        where = "; ".join(f"{s.symbol} at {', '.join(s.where[:2])}" for s in found_syms)
        extra = " (the diff still applies: it would duplicate them)" if fwd.ok else ""
        return finish(
            "upstream", f"every symbol it {_src_verb(sym_source)} is defined: {where}{extra}"
        )
    if all_present:
        how = f" ({loose} of them line by line, laid out differently)" if loose else ""
        return finish("upstream", "every hunk's post-image is already present" + how)
    if fwd.ok:
        v.offsets = {k: x for k, x in fwd.offsets.items() if any(x)}
        v.apply_text = text
        if v.offsets:
            return finish("offset", "applies exactly at shifted lines: " + _fmt_offsets(v.offsets))
        return finish("clean", "")
    if missing:
        present = [r for r in hunk_rows if r["present"]]
        if present or found_syms:
            return _partly(v, repo, judged_files, base_tree, renames, missing, found_syms, finish)
        return finish("deleted", "gone without a similar file: " + ", ".join(missing))
    three = repo.apply(text, base_tree, three_way=True)
    if three.ok:
        v.apply_text = text
        v.three_way = True
        return finish("three-way", "applies only with git apply --3way (merged against the pin)")
    return _partly(v, repo, judged_files, base_tree, renames, missing, found_syms, finish, three)


def _src_verb(source: str) -> str:
    return "declares in Provides:" if source == "Provides" else "adds"


def _fmt_offsets(offsets: dict[str, list[int]]) -> str:
    return "; ".join(f"{f} {', '.join(f'{x:+d}' for x in xs)}" for f, xs in offsets.items())


def _partly(
    v: Verdict,
    repo: JudgeRepo,
    judged_files: Sequence[FileDiff],
    base_tree: str,
    renames: dict[str, str],
    missing: list[str],
    found_syms: list[SymbolHit],
    finish: Callable[[str, str], Verdict],
    three: ApplyResult | None = None,
) -> Verdict:
    """Per-hunk classification when the whole patch does not apply: present / applies / fails."""
    k = 0
    base_files = repo.ls(base_tree)
    for fd in judged_files:
        path = fd.old_path or fd.new_path or ""
        tgt = renames.get(path, path)
        for i, h in enumerate(fd.hunks):
            row = v.hunks[k]
            k += 1
            if tgt in missing:
                row["status"] = "file missing"
                continue
            if row["present"]:
                row["status"] = "present"
                continue
            single = fd.text(hunks=[h], rename=renames or None)
            if repo.apply(single, base_tree).ok:
                row["status"] = "applies"
            elif repo.apply(single, base_tree, reverse=True).ok:
                row["status"] = "present"
                row["present"] = True
            else:
                row["status"] = "fails"
                reason = "context or removed lines not found"
                if fd.is_new:
                    reason = "file already exists with different content"
                elif tgt not in base_files:
                    reason = "no such file here: not at the pin, no earlier patch creates it"
                else:
                    found = _what_is_there(h, repo.file_text(base_tree, tgt))
                    if found:
                        reason = found
                v.conflicts.append({"file": tgt, "hunk": h.label(i), "reason": reason})
    present = [r for r in v.hunks if r.get("present")]
    if three is not None and three.unmerged and not v.conflicts:
        v.conflicts = [
            {"file": f, "hunk": "(3-way merge)", "reason": "unmerged"} for f in three.unmerged
        ]
    if present or found_syms:
        bits = []
        if present:
            lines_only = sum(1 for r in present if r.get("match") == "lines")
            how = f" ({lines_only} line by line)" if lines_only else ""
            bits.append(f"{len(present)}/{len(v.hunks)} hunks already present{how}")
        if found_syms:
            bits.append("symbols defined: " + ", ".join(s.symbol for s in found_syms))
        if v.conflicts:
            bits.append("fails: " + "; ".join(f"{c['file']} {c['hunk']}" for c in v.conflicts))
        return finish("partly-upstream", "; ".join(bits))
    return finish(
        "conflict",
        "; ".join(f"{c['file']} {c['hunk']} ({c['reason']})" for c in v.conflicts)
        or "does not apply (git apply gave no hunk detail)",
    )
