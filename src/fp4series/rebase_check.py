"""Rebase check: a verdict for every series patch against every newer upstream release.

For each release in ``upstream.lock`` the wheel is fetched (cached; its sha256 is recorded into the
lock the first time), materialized as a git repo under ``.work/upstream/<version>``, and every
patch is judged twice: on its own on top of the release (``alone`` in the JSON details), and in
series order on top of the release plus the earlier patches that applied. The in-series verdict is
the one reported; ``judged`` says whether all its prerequisites (``Depends-On:``, patches whose
lines it touches or whose files it edits) applied or are upstream (``in-series``) or not
(``partial-series``, with ``prerequisites_not_applied``).

Verdicts (no fuzz, ever):
  clean            ``git apply`` applies every hunk exactly at its line numbers
  offset           applies exactly, but some hunks sit at shifted lines
  three-way        only ``git apply --3way`` applies it (merging against the pin's blobs)
  conflict         does not apply; the failing file and hunks are named
  upstream         reverse-applies, or every hunk's post-image is present, or every symbol the
                   patch provides (``Provides:``, else the public defs/classes it adds) is defined
                   in the release and was not at the pin
  partly-upstream  some hunks/symbols are present, the rest does not apply (per hunk in details)
  moved            a file the patch edits is gone but a file with similar content exists
                   elsewhere (e.g. sglang/jit_kernel/csrc -> sglang/kernels/jit); the patch is
                   re-judged against the new path: ``details.moved_verdict``
  deleted          a file the patch edits is gone and nothing similar exists

Series order: each patch is judged on the release plus, in series order, every earlier patch
that applied there in full. When some of its prerequisites did not apply (``judged``:
``partial-series``), hunks on files that only those patches create are left out and listed in
``not_judged`` (naming the creator): a file the series itself failed to create is no evidence
that upstream deleted anything. ``deleted`` needs a file that exists at the pin.

Exit-status policy (``--policy``):
  newest (default)  exit 1 when, on the newest release checked, a patch's effective verdict
                    (``moved`` counts as its re-judged verdict) is ``conflict`` or ``deleted``:
                    a patch that is not already upstream stops applying. ``partly-upstream`` is
                    a warning (the patch must be trimmed), not a failure. Also exit 1 when the
                    newest release could not be checked at all.
  any               the same rule on every release checked.
  baseline          (CI) exit 1 only when the fresh matrix differs from the committed one
                    (``--baseline``, default reports/rebase-check.json): a patch edited, a
                    release added or dropped, an upstream re-release. Each changed cell is
                    printed (patch, release, old -> new; a moved patch as ``moved->x``) with the
                    command that regenerates the baseline. Known conflicts already in the
                    baseline do not fail. Also exit 1 when the baseline is missing, unreadable,
                    or lists other patches than patches/series. Exit 0 when identical.
  report            never fail (exit 0); for dashboards and for regenerating the baseline:
                    scripts/rebase-check.sh --policy report --json reports/rebase-check.json
                    --md reports/rebase-check.md
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4series.errors import SeriesError
from fp4series.overlap import FileDiff, Hunk, PatchDoc, derived_dependencies, load_patch_docs

VERDICTS = (
    "clean",
    "offset",
    "three-way",
    "conflict",
    "upstream",
    "partly-upstream",
    "moved",
    "deleted",
)
APPLIES = ("clean", "offset", "three-way")
FAILS = ("conflict", "deleted")
CODES = {
    "clean": "C",
    "offset": "O",
    "three-way": "3W",
    "conflict": "X",
    "upstream": "U",
    "partly-upstream": "P",
    "moved": "M",
    "deleted": "D",
}
POLICIES = ("newest", "any", "baseline", "report")
SIMILARITY = 0.5  # minimum content similarity for "moved"


# ---------------------------------------------------------------------------------------------
# git plumbing: a scratch repo whose object store reaches the pin and every release (alternates)


class JudgeRepo:
    """Scratch repository that judges patches against trees via ``git apply --cached``.

    Its object store borrows (alternates) the objects of the pin's and the releases' repos, so
    ``git apply --3way`` finds the pin's pre-image blobs named in the patches' ``index`` lines.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        if not (path / ".git").exists():
            self.git("init", "-q", ".")
        self._indexes = path / ".git" / "fp4-indexes"
        shutil.rmtree(self._indexes, ignore_errors=True)
        self._indexes.mkdir()
        self._ls: dict[str, dict[str, str]] = {}
        self._blobs: dict[str, str] = {}
        self._defs: dict[str, dict[str, list[Definition]]] = {}
        self._sources: dict[str, dict[str, str]] = {}
        self._wanted: set[str] = set()

    def git(
        self,
        *args: str,
        index: Path | None = None,
        stdin: str | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env.pop("GIT_DIR", None)
        env.pop("GIT_WORK_TREE", None)
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        proc = subprocess.run(
            ["git", *args],
            cwd=self.path,
            input=stdin,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="surrogateescape",
            env=env,
        )
        if check and proc.returncode != 0:
            raise SeriesError(
                f"git {' '.join(args[:3])} failed in {self.path}: {proc.stderr.strip()}",
                hint="delete the scratch repo (.work/rebase) and run again",
            )
        return proc

    def borrow(self, repo: Path) -> None:
        """Make REPO's objects reachable from here (idempotent)."""
        common = subprocess.run(
            ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
            cwd=repo,
            capture_output=True,
            text=True,
        )
        if common.returncode != 0:
            raise SeriesError(f"{repo} is not a git repository", hint="materialize it again")
        objects = Path(common.stdout.strip()) / "objects"
        alt = self.path / ".git" / "objects" / "info" / "alternates"
        alt.parent.mkdir(parents=True, exist_ok=True)
        have = alt.read_text().splitlines() if alt.exists() else []
        if str(objects) not in have:
            alt.write_text("\n".join([*have, str(objects)]) + "\n")

    def tree(self, rev: str) -> str:
        return self.git("rev-parse", f"{rev}^{{tree}}").stdout.strip()

    def index_for(self, tree: str) -> Path:
        """A cached index file holding TREE (``git apply --cached`` reads it, never our HEAD)."""
        idx = self._indexes / tree
        if not idx.exists():
            self.git("read-tree", tree, index=idx)
        return idx

    def ls(self, tree: str) -> dict[str, str]:
        """path -> blob id for every file of TREE."""
        if tree not in self._ls:
            out = self.git("ls-tree", "-r", "-z", tree).stdout
            files: dict[str, str] = {}
            for rec in out.split("\0"):
                if not rec:
                    continue
                meta, _, path = rec.partition("\t")
                parts = meta.split()
                if len(parts) == 3 and parts[1] == "blob":
                    files[path] = parts[2]
            self._ls[tree] = files
        return self._ls[tree]

    def blob_text(self, blob: str) -> str | None:
        if blob not in self._blobs:
            proc = self.git("cat-file", "blob", blob, check=False)
            if proc.returncode != 0:
                return None
            self._blobs[blob] = proc.stdout
        return self._blobs[blob]

    def file_text(self, tree: str, path: str) -> str | None:
        blob = self.ls(tree).get(path)
        return None if blob is None else self.blob_text(blob)

    def apply(
        self, patch: str, tree: str, *, reverse: bool = False, three_way: bool = False
    ) -> ApplyResult:
        """Try PATCH on TREE in a scratch index; exact unless ``three_way``; no fuzz."""
        args = ["apply", "--cached", "-v", "--whitespace=nowarn"]
        if reverse:
            args.append("-R")
        if three_way:
            fd, name = tempfile.mkstemp(dir=self._indexes, prefix="tmp-")
            os.close(fd)
            idx = Path(name)
            shutil.copyfile(self.index_for(tree), idx)
            args.append("--3way")
        else:
            idx = self.index_for(tree)
            args.append("--check")
        try:
            proc = self.git(*args, "-", index=idx, stdin=patch, check=False)
            ok = proc.returncode == 0
            unmerged: list[str] = []
            new_tree: str | None = None
            if three_way:
                unmerged = sorted(
                    {
                        ln.split("\t", 1)[1]
                        for ln in self.git("ls-files", "-u", index=idx).stdout.splitlines()
                        if "\t" in ln
                    }
                )
                if ok and not unmerged:
                    new_tree = self.git("write-tree", index=idx).stdout.strip()
        finally:
            if three_way:
                idx.unlink(missing_ok=True)
        return ApplyResult(
            ok and not unmerged, proc.stderr, _offsets(proc.stderr), unmerged, new_tree
        )

    def apply_to_tree(self, patch: str, tree: str, *, three_way: bool) -> str | None:
        """Apply for real and return the resulting tree id (None when it does not apply)."""
        if three_way:
            return self.apply(patch, tree, three_way=True).new_tree
        fd, name = tempfile.mkstemp(dir=self._indexes, prefix="tmp-")
        os.close(fd)
        idx = Path(name)
        try:
            shutil.copyfile(self.index_for(tree), idx)
            proc = self.git("apply", "--cached", "-", index=idx, stdin=patch, check=False)
            if proc.returncode != 0:
                return None
            return self.git("write-tree", index=idx).stdout.strip()
        finally:
            idx.unlink(missing_ok=True)

    def load_blobs(self, blobs: Sequence[str]) -> None:
        """Read many blobs with one ``git cat-file --batch`` (a subprocess per blob is slow)."""
        todo = [b for b in dict.fromkeys(blobs) if b not in self._blobs]
        if not todo:
            return
        proc = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=self.path,
            input=("\n".join(todo) + "\n").encode(),
            capture_output=True,
            check=True,
        )
        out = proc.stdout
        pos = 0
        for blob in todo:
            nl = out.index(b"\n", pos)
            head = out[pos:nl].split()
            pos = nl + 1
            if len(head) < 3 or head[1] == b"missing":
                continue
            size = int(head[2])
            self._blobs[blob] = out[pos : pos + size].decode("utf-8", "surrogateescape")
            pos += size + 1

    def source_texts(self, tree: str) -> dict[str, str]:
        """path -> text of TREE's Python and C/C++/CUDA sources (loaded once per tree)."""
        if tree not in self._sources:
            files = {p: b for p, b in self.ls(tree).items() if p.endswith(SOURCE_EXT)}
            self.load_blobs(list(files.values()))
            self._sources[tree] = {p: self._blobs[b] for p, b in files.items() if b in self._blobs}
        return self._sources[tree]

    def want(self, names: set[str]) -> None:
        """Names the symbol index must cover; the per-tree index is rebuilt when this grows."""
        if not names <= self._wanted:
            self._wanted |= names
            self._defs.clear()

    def defs(self, tree: str) -> dict[str, list[Definition]]:
        """name -> definitions in TREE of the wanted names: Python def/class anywhere,
        assignments and annotated names at module or class level (indent <= 4)."""
        if tree not in self._defs:
            index: dict[str, list[Definition]] = {}
            if self._wanted:
                alt = "|".join(sorted(re.escape(n) for n in self._wanted))
                pat = re.compile(
                    rf"^(?P<ind>[ \t]*)(?:async[ \t]+)?(?P<kw>def|class)[ \t]+(?P<a>{alt})\b"
                    rf"|^(?P<ind2> {{0,4}})(?P<b>{alt})[ \t]*"
                    rf"(?::[ \t]*[^\n=]+)?(?:=(?!=)|$)",
                    re.M,
                )
                wanted = sorted(self._wanted)
                for path, text in self.source_texts(tree).items():
                    if not path.endswith(".py") or not any(n in text for n in wanted):
                        continue
                    no, last = 1, 0
                    for m in pat.finditer(text):
                        no += text.count("\n", last, m.start())
                        last = m.start()
                        if m.group("a"):
                            kind = "def" if m.group("kw") == "def" else "class"
                            d = Definition(path, no, kind, len(m.group("ind")))
                            index.setdefault(m.group("a"), []).append(d)
                        else:
                            d = Definition(path, no, "var", len(m.group("ind2")))
                            index.setdefault(m.group("b"), []).append(d)
            self._defs[tree] = index
        return self._defs[tree]

    def forget(self, keep_trees: Sequence[str]) -> None:
        """Drop cached texts and indexes of trees no longer judged (memory on big releases)."""
        keep_blobs = {b for t in keep_trees for b in self.ls(t).values()}
        self._blobs = {b: t for b, t in self._blobs.items() if b in keep_blobs}
        self._defs = {t: d for t, d in self._defs.items() if t in keep_trees}
        self._sources = {t: d for t, d in self._sources.items() if t in keep_trees}
        self._ls = {t: f for t, f in self._ls.items() if t in keep_trees}


@dataclass(frozen=True)
class Definition:
    path: str
    line: int
    kind: str  # def | class | var
    indent: int


SOURCE_EXT = (".py", ".h", ".cuh", ".cu", ".cpp", ".cc")


@dataclass
class ApplyResult:
    ok: bool
    stderr: str
    offsets: dict[str, list[int]]
    unmerged: list[str]
    new_tree: str | None


def _offsets(stderr: str) -> dict[str, list[int]]:
    """file -> hunk offsets from ``git apply -v`` output."""
    out: dict[str, list[int]] = {}
    cur = ""
    for ln in stderr.splitlines():
        m = re.match(r"^Checking patch (.+)\.\.\.$", ln)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"^Hunk #\d+ succeeded at \d+ \(offset (-?\d+) lines?\)\.", ln)
        if m:
            out.setdefault(cur, []).append(int(m.group(1)))
    return out


# ---------------------------------------------------------------------------------------------
# symbols


IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\([^)]*\))?$")


def added_symbols(doc: PatchDoc) -> list[str]:
    """Public defs/classes a patch adds to Python files (used when it declares no Provides:)."""
    out: list[str] = []
    for f in doc.diff.files:
        if not (f.new_path or "").endswith(".py"):
            continue
        for h in f.hunks:
            for ln in h.added():
                m = re.match(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)", ln)
                if m and not m.group(1).startswith(("_", "test")) and m.group(1) not in out:
                    out.append(m.group(1))
    return out


@dataclass
class SymbolHit:
    symbol: str
    found: bool
    where: list[str]
    at_pin: bool
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"symbol": self.symbol, "found": self.found, "where": self.where}
        if self.at_pin:
            d["at_pin"] = True
        if self.note:
            d["note"] = self.note
        return d


def _class_body(text: str, line: int) -> list[tuple[int, str]]:
    """(line number, text) of the indented body of the class defined at LINE (1-based)."""
    lines = text.splitlines()
    head = lines[line - 1]
    indent = len(head) - len(head.lstrip())
    body: list[tuple[int, str]] = []
    for i in range(line, len(lines)):
        ln = lines[i]
        if ln.strip() and (len(ln) - len(ln.lstrip())) <= indent:
            break
        body.append((i + 1, ln))
    return body


def _signature(text: str, line: int) -> str:
    lines = text.splitlines()
    sig = ""
    for i in range(line - 1, min(len(lines), line + 60)):
        sig += lines[i] + "\n"
        if re.search(r"\)\s*(->[^:]*)?:\s*(#.*)?$", lines[i]):
            break
    return sig


def find_symbol(repo: JudgeRepo, tree: str, symbol: str) -> list[str]:
    """``path:line`` of each definition of SYMBOL in TREE (``A.b`` inside class/module A,
    ``f(p, q)`` a def whose signature names p and q; a bare name not defined in Python counts
    when it appears as a word in a C/C++/CUDA source)."""
    params: list[str] = []
    m = re.match(r"^([^()]+)\((.*)\)$", symbol)
    if m:
        symbol = m.group(1)
        params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    defs = repo.defs(tree)
    parts = symbol.split(".")
    hits: list[tuple[str, int]] = []
    if len(parts) == 1:
        hits = [(d.path, d.line) for d in defs.get(symbol, [])]
        if not hits and not params:
            word = re.compile(rf"\b{re.escape(symbol)}\b")
            for path, text in repo.source_texts(tree).items():
                if path.endswith(".py") or not word.search(text):
                    continue
                no = next(i for i, ln in enumerate(text.splitlines(), 1) if word.search(ln))
                hits.append((path, no))
    else:
        outer, inner = parts[-2], parts[-1]
        inner_defs = defs.get(inner, [])
        for cls in (d for d in defs.get(outer, []) if d.kind == "class"):
            body = _class_body(repo.file_text(tree, cls.path) or "", cls.line)
            if not body:
                continue
            first, last = body[0][0], body[-1][0]
            hits += [
                (d.path, d.line)
                for d in inner_defs
                if d.path == cls.path and first <= d.line <= last and d.indent > cls.indent
            ]
        if not hits:  # A.b with A a module: a top-level definition in A.py
            hits = [
                (d.path, d.line) for d in inner_defs if d.indent == 0 and Path(d.path).stem == outer
            ]
    if params:
        kept = []
        for p, n in hits:
            sig = _signature(repo.file_text(tree, p) or "", n)
            if all(re.search(rf"\b{re.escape(x)}\b", sig) for x in params):
                kept.append((p, n))
        hits = kept
    return [f"{p}:{n}" for p, n in hits]


def symbol_names(symbols: Sequence[str]) -> set[str]:
    """Identifiers the index must know for SYMBOLS (``A.b(p)`` -> A, b)."""
    out: set[str] = set()
    for sym in symbols:
        out.update(x for x in re.split(r"[.()]", sym.split("(")[0]) if x)
    return out


def patch_symbols(doc: PatchDoc) -> tuple[list[str], str]:
    """The symbols the rule checks: ``Provides:`` when declared, else the public defs added."""
    declared = [s for s in doc.provides if IDENT.match(s)]
    if declared:
        return declared, "Provides"
    return added_symbols(doc), "added defs"


def judge_symbols(
    repo: JudgeRepo, doc: PatchDoc, release_tree: str, pin_tree: str
) -> tuple[list[SymbolHit], str]:
    """Symbol evidence for DOC in the release (vs the pin) and where the symbol list came from."""
    declared, source = patch_symbols(doc)
    repo.want(symbol_names(declared))
    hits: list[SymbolHit] = []
    for sym in declared:
        where = find_symbol(repo, release_tree, sym)
        at_pin = bool(find_symbol(repo, pin_tree, sym))
        note = "defined at the pin already: not evidence" if at_pin else ""
        hits.append(SymbolHit(sym, bool(where), where[:5], at_pin, note))
    return hits, source


# ---------------------------------------------------------------------------------------------
# the verdict for one patch on one tree


@dataclass
class Verdict:
    verdict: str
    evidence: str = ""
    offsets: dict[str, list[int]] = field(default_factory=dict)
    hunks: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    moved_to: dict[str, str] = field(default_factory=dict)
    moved_verdict: str | None = None
    missing_files: list[str] = field(default_factory=list)
    not_judged: list[dict[str, Any]] = field(default_factory=list)  # files of failed creators
    symbols: list[SymbolHit] = field(default_factory=list)
    symbol_source: str = ""
    apply_text: str | None = None  # the (possibly path-rewritten) patch that applies
    three_way: bool = False

    @property
    def effective(self) -> str:
        """The verdict that counts for the policy: moved patches count as their re-judged one."""
        if self.verdict == "moved":
            return self.moved_verdict or "moved"
        return self.verdict

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"verdict": self.verdict}
        if self.moved_to:
            d["moved_to"] = self.moved_to
            d["moved_verdict"] = self.moved_verdict
        if self.evidence:
            d["evidence"] = self.evidence
        if self.offsets:
            d["offsets"] = self.offsets
        if self.conflicts:
            d["conflicts"] = self.conflicts
        if self.hunks and self.effective not in ("clean", "offset"):
            d["hunks"] = self.hunks
        if self.missing_files:
            d["missing_files"] = self.missing_files
        if self.not_judged:
            d["not_judged"] = self.not_judged
        if self.symbols:
            d["symbols"] = {
                "source": self.symbol_source,
                "checked": [s.as_dict() for s in self.symbols],
            }
        return d


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
    new = [ln if ln.endswith("\n") else ln + "\n" for ln in h.new_lines()]
    old = [ln if ln.endswith("\n") else ln + "\n" for ln in h.old_lines()]
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
    old = [x.rstrip("\n") for x in h.old_lines()]
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
    doc: PatchDoc,
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
    for fd in doc.diff.files:
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
    judged_files = [fd for fd in doc.diff.files if fd.old_path not in unjudged]
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
        for fd in doc.diff.files
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


# ---------------------------------------------------------------------------------------------
# one release, in series order


@dataclass
class PatchResult:
    verdict: Verdict
    alone: Verdict
    in_series: Verdict | None
    judged: str  # "in-series" (prerequisites applied) or "partial-series" (some did not)
    prerequisites: list[str]
    failed_prerequisites: list[str] = field(default_factory=list)
    stacked: list[str] = field(default_factory=list)  # earlier patches applied under it

    def as_dict(self) -> dict[str, Any]:
        d = self.verdict.as_dict()
        d["judged"] = self.judged
        if self.prerequisites:
            d["prerequisites"] = self.prerequisites
        if self.failed_prerequisites:
            d["prerequisites_not_applied"] = self.failed_prerequisites
            d["judged_on"] = ["release", *self.stacked]
        if self.in_series is not None and self.in_series is not self.verdict:
            d["in_series"] = self.in_series.verdict
        if self.alone is not self.verdict:
            d["alone"] = self.alone.verdict
        return d


@dataclass(frozen=True)
class SeriesFile:
    """A file an earlier series patch creates: which patch, and its text as created."""

    creator: str
    text: str


def check_tree(
    repo: JudgeRepo,
    docs: Sequence[PatchDoc],
    release_tree: str,
    pin_tree: str,
    deps: dict[str, set[str]] | None = None,
) -> dict[str, PatchResult]:
    """Judge every patch on RELEASE_TREE, alone and stacked in series order.

    The reported verdict is always the stacked one: the release plus, in series order, every
    earlier patch that applied in full. When some prerequisites did not apply, hunks on files
    only they create are left out (``not_judged``), never taken as upstream deletions.
    """
    deps = deps if deps is not None else derived_dependencies(docs)
    stack = release_tree
    stacked: list[str] = []
    created: dict[str, SeriesFile] = {}
    results: dict[str, PatchResult] = {}
    for doc in docs:  # one index scan per tree for the whole series
        repo.want(symbol_names(patch_symbols(doc)[0]))
    for doc in docs:
        syms = judge_symbols(repo, doc, release_tree, pin_tree)
        alone = judge(
            repo,
            doc,
            release_tree,
            release_tree=release_tree,
            pin_tree=pin_tree,
            symbols=syms,
            series_files=created,
        )
        in_series = alone
        if stack != release_tree:
            in_series = judge(
                repo,
                doc,
                stack,
                release_tree=release_tree,
                pin_tree=pin_tree,
                symbols=syms,
                series_files=created,
            )
        prereqs = sorted(deps.get(doc.name, set()))
        failed = [
            p
            for p in prereqs
            if p not in stacked
            and not (
                p in results
                and results[p].verdict.effective == "upstream"
                and not results[p].verdict.not_judged
            )
        ]
        results[doc.name] = PatchResult(
            in_series,
            alone,
            in_series,
            "partial-series" if failed else "in-series",
            prereqs,
            failed,
            list(stacked),
        )
        if (
            in_series.effective in APPLIES
            and in_series.apply_text is not None
            and not in_series.not_judged
        ):
            new = repo.apply_to_tree(in_series.apply_text, stack, three_way=in_series.three_way)
            if new is not None:
                stack = new
                stacked.append(doc.name)
        for fd in doc.diff.files:
            if fd.is_new and fd.new_path and fd.new_path not in created:
                body = "".join(ln for h in fd.hunks for ln in h.new_lines())
                created[fd.new_path] = SeriesFile(doc.name, body)
    return results


# ---------------------------------------------------------------------------------------------
# the matrix


@dataclass
class Target:
    """A materialized release: its version and a git repo + revision holding its tree."""

    version: str
    repo: Path
    rev: str


@dataclass
class Matrix:
    releases: list[str]
    patches: list[str]
    results: dict[str, dict[str, PatchResult]]  # release -> patch -> result
    errors: dict[str, str]
    timings: dict[str, float]
    pin: str

    def verdict(self, patch: str, release: str) -> Verdict | None:
        r = self.results.get(release, {}).get(patch)
        return r.verdict if r else None

    def to_json(self, policy: str, exit_status: int, failures: list[str]) -> dict[str, Any]:
        return {
            "pin": self.pin,
            "releases": self.releases,
            "patches": self.patches,
            "verdicts": {
                p: {
                    r: self.results[r][p].verdict.verdict
                    for r in self.releases
                    if r in self.results
                }
                for p in self.patches
            },
            "details": {
                p: {r: self.results[r][p].as_dict() for r in self.releases if r in self.results}
                for p in self.patches
            },
            "errors": self.errors,
            "timings_s": {k: round(v, 2) for k, v in self.timings.items()},
            "policy": {"name": policy, "exit_status": exit_status, "failures": failures},
        }


def run_matrix(
    repo: JudgeRepo,
    docs: Sequence[PatchDoc],
    pin: Target,
    targets: Sequence[Target | tuple[str, str]],
    *,
    log: Callable[[str], None] | None = None,
) -> Matrix:
    """Judge every patch against every target; a target given as (version, error) is skipped."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    repo.borrow(pin.repo)
    pin_tree = repo.tree(_resolve(pin))
    deps = derived_dependencies(docs)
    m = Matrix([], [d.name for d in docs], {}, {}, {}, pin.version)
    for i, t in enumerate(targets, 1):
        version = t.version if isinstance(t, Target) else t[0]
        m.releases.append(version)
        start = time.monotonic()
        if not isinstance(t, Target):
            m.errors[version] = t[1]
            log(f"[{i}/{len(targets)}] {version}: not checked: {t[1]}")
            continue
        try:
            repo.borrow(t.repo)
            tree = repo.tree(_resolve(t))
            m.results[version] = check_tree(repo, docs, tree, pin_tree, deps)
            repo.forget([pin_tree])
        except SeriesError as exc:
            m.errors[version] = str(exc)
            log(f"[{i}/{len(targets)}] {version}: failed: {exc}")
            continue
        took = time.monotonic() - start
        m.timings[version] = took
        counts: dict[str, int] = {}
        for r in m.results[version].values():
            counts[r.verdict.verdict] = counts.get(r.verdict.verdict, 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        log(
            f"[{i}/{len(targets)}] {version}: {len(docs)} patches judged in {took:.1f}s ({summary})"
        )
    return m


def _resolve(t: Target) -> str:
    """The commit of T in its repo, as an object id the judge repo can read via alternates."""
    proc = subprocess.run(
        ["git", "rev-parse", f"{t.rev}^{{commit}}"], cwd=t.repo, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SeriesError(
            f"{t.repo} has no revision {t.rev} ({proc.stderr.strip()})",
            hint=f"delete {t.repo} so it is materialized again",
        )
    return proc.stdout.strip()


def regenerate_command(json_path: str, md_path: str) -> str:
    """The commands that rewrite and commit the baseline (printed when it is stale)."""
    return (
        f"bash scripts/rebase-check.sh --policy report --json {json_path} --md {md_path}"
        f" && git add {json_path} {md_path}"
        " && git commit -m 'Rebase check: regenerate the verdict matrix'"
    )


def load_baseline(path: Path, patches: Sequence[str], regen: str = "") -> dict[str, Any]:
    """The committed matrix, checked to be usable as a baseline for PATCHES (the series)."""
    hint = f"regenerate and commit it: {regen}" if regen else "regenerate it (--policy report)"
    if not path.is_file():
        raise SeriesError(f"baseline {path} does not exist", hint=hint)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SeriesError(f"baseline {path} is not readable JSON: {exc}", hint=hint) from exc
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("releases"), list)
        or not isinstance(data.get("patches"), list)
        or not isinstance(data.get("verdicts"), dict)
    ):
        raise SeriesError(f"baseline {path} lacks `releases`, `patches` or `verdicts`", hint=hint)
    if data["patches"] != list(patches):
        old, new = data["patches"], list(patches)
        diff = [f"-{x}" for x in old if x not in new] + [f"+{x}" for x in new if x not in old]
        what = ", ".join(diff) if diff else "same patches, other order"
        raise SeriesError(
            f"baseline {path} was made for another series than patches/series ({what})",
            hint=hint,
        )
    return data


def _baseline_cell(data: dict[str, Any], patch: str, release: str) -> str:
    if release not in data["releases"]:
        return "(release not in matrix)"
    v = data["verdicts"].get(patch, {}).get(release)
    if v is None:
        return "(not checked)"
    if v == "moved":
        moved = data.get("details", {}).get(patch, {}).get(release, {}).get("moved_verdict")
        return f"moved->{moved}" if moved else v
    return str(v)


def _fresh_cell(m: Matrix, patch: str, release: str) -> str:
    if release not in m.releases:
        return "(release not in matrix)"
    v = m.verdict(patch, release)
    if v is None:
        return "(not checked)"
    if v.verdict == "moved":
        return f"moved->{v.moved_verdict}" if v.moved_verdict else v.verdict
    return v.verdict


def baseline_changes(m: Matrix, data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(patch, release, old, new) for every cell where M differs from the baseline DATA."""
    releases = list(dict.fromkeys([*m.releases, *data["releases"]]))
    patches = list(dict.fromkeys([*m.patches, *data["patches"]]))
    out: list[tuple[str, str, str, str]] = []
    for p in patches:
        for r in releases:
            old, new = _baseline_cell(data, p, r), _fresh_cell(m, p, r)
            if old != new:
                out.append((p, r, old, new))
    return out


def apply_policy(
    m: Matrix, policy: str, baseline: dict[str, Any] | None = None
) -> tuple[int, list[str]]:
    """Exit status and the reasons, per the documented policy."""
    if policy not in POLICIES:
        raise SeriesError(f"unknown policy {policy!r}", hint=f"use one of: {', '.join(POLICIES)}")
    failures: list[str] = []
    if policy == "baseline":
        if baseline is None:
            raise SeriesError("policy baseline needs the committed matrix", hint="pass --baseline")
        failures = [f"{p} on {r}: {o} -> {n}" for p, r, o, n in baseline_changes(m, baseline)]
        return (1 if failures else 0), failures
    if policy == "report" or not m.releases:
        return 0, failures
    releases = m.releases if policy == "any" else m.releases[-1:]
    for rel in releases:
        if rel in m.errors or rel not in m.results:
            failures.append(f"{rel}: not checked ({m.errors.get(rel, 'no result')})")
            continue
        for p in m.patches:
            v = m.results[rel][p].verdict
            if v.effective in FAILS:
                what = v.verdict if v.verdict == v.effective else f"moved, then {v.effective}"
                failures.append(f"{p} on {rel}: {what}: {v.evidence}")
    return (1 if failures else 0), failures


def _cell(v: Verdict | None) -> str:
    if v is None:
        return "!"
    if v.verdict == "moved":
        return f"M→{CODES.get(v.moved_verdict or '', '?')}"
    return CODES[v.verdict]


def _short(path: str) -> str:
    return path.removeprefix("python/").removeprefix("sglang/")


def _hunk_no(label: str) -> str:
    return label.split(" ", 2)[1] if label.startswith("hunk #") else label


def note_text(v: Verdict) -> str:
    """Compact evidence for a Markdown footnote (the JSON keeps lines and full labels)."""
    bits: list[str] = []
    if v.moved_to:
        bits.append(
            "moved: " + "; ".join(f"{_short(o)} → {_short(n)}" for o, n in v.moved_to.items())
        )
    eff = v.effective
    found = [s for s in v.symbols if s.found and not s.at_pin]
    missing_syms = [s.symbol for s in v.symbols if not s.found and not s.at_pin]
    if eff == "upstream":
        if found and "symbol" in v.evidence:
            where = sorted({_short(w.rsplit(":", 1)[0]) for s in found for w in s.where[:1]})
            bits.append(
                f"all {len(found)} symbols it provides are defined upstream "
                f"({', '.join(s.symbol for s in found)}) in {', '.join(where)}"
            )
        else:
            bits.append(v.evidence)
    if eff == "partly-upstream":
        present = [r for r in v.hunks if r.get("present")]
        if present:
            loose = sum(1 for r in present if r.get("match") == "lines")
            how = f", {loose} of them line by line" if loose else ""
            bits.append(f"{len(present)}/{len(v.hunks)} hunks present{how}")
        if found:
            bits.append(
                f"symbols defined upstream: {', '.join(s.symbol for s in found)}"
                + (f"; not (yet): {', '.join(missing_syms)}" if missing_syms else "")
            )
    if eff in ("conflict", "partly-upstream"):
        per_file: dict[str, list[dict[str, str]]] = {}
        for c in v.conflicts:
            per_file.setdefault(c["file"], []).append(c)
        for f, cs in per_file.items():
            label = cs[0]["hunk"]
            first = label.split(" ", 2)[2] if label.startswith("hunk #") else label
            why = cs[0]["reason"].split(" (best match")[0]
            why = f": {why}" if why.startswith("expects") else ""
            nos = ", ".join(_hunk_no(c["hunk"]) for c in cs)
            bits.append(f"does not apply: {_short(f)} hunk {nos} (first: `{first}`{why})")
    if eff == "deleted":
        bits.append("gone, nothing similar found: " + ", ".join(map(_short, v.missing_files)))
    if eff == "three-way":
        bits.append("needs git apply --3way")
    if v.not_judged:
        by_creator: dict[str, list[str]] = {}
        for n in v.not_judged:
            by_creator.setdefault(n["from"], []).append(_short(n["file"]))
        for creator, paths in by_creator.items():
            bits.append(
                f"not judged: its hunks on {', '.join(paths)} (files {creator} creates; "
                "that patch is not applied here, so they say nothing about upstream)"
            )
    return "; ".join(bits)


def result_note(r: PatchResult) -> str:
    """Footnote for a cell: the verdict's evidence plus what it was judged on when some
    prerequisites did not apply (an "applies" cell must not read as "fully verified")."""
    v = r.verdict
    text = note_text(v)
    if r.failed_prerequisites and (v.effective in APPLIES or v.not_judged):
        on = ", ".join(r.stacked) if r.stacked else "nothing else"
        extra = (
            f"judged on the release plus the earlier patches that applied ({on}); "
            f"prerequisites not applied: {', '.join(r.failed_prerequisites)}"
        )
        text = f"{text}; {extra}" if text else extra
    return text


def to_markdown(m: Matrix, policy: str, exit_status: int, failures: list[str]) -> str:
    """Patch × release table with short codes and footnotes for conflicts and evidence."""
    notes: dict[str, int] = {}

    def note(text: str) -> str:
        if text not in notes:
            notes[text] = len(notes) + 1
        return f"[{notes[text]}]"

    out = [
        "# Rebase check",
        "",
        f"Series patches judged against every upstream release after the pin ({m.pin}).",
        "Each cell is the verdict of the patch on the release plus the earlier patches that",
        "applied there, in series order. When some prerequisites did not apply (`judged`:",
        "`partial-series` in the JSON, which also has every hunk), hunks on files only they",
        "create are not judged (`not_judged`): they say nothing about upstream.",
        "",
        "Codes: C clean · O offset · 3W three-way · X conflict · U upstream · P partly-upstream ·",
        "M→x moved (then re-judged as x) · D deleted · ! release not checked.",
        "",
        "| patch | " + " | ".join(m.releases) + " |",
        "|---|" + "---|" * len(m.releases),
    ]
    for p in m.patches:
        cells = []
        for r in m.releases:
            res = m.results.get(r, {}).get(p)
            v = res.verdict if res else None
            c = _cell(v)
            if (
                res is not None
                and v is not None
                and (
                    v.effective in ("conflict", "deleted", "partly-upstream")
                    or (v.effective == "upstream" and "symbol" in v.evidence)
                    or v.verdict == "moved"
                    or v.not_judged
                    or (res.failed_prerequisites and v.effective in APPLIES)
                )
            ):
                c += note(f"{p}: {result_note(res)}")
            cells.append(c)
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    out.append("")
    if notes:
        out.append("Notes (the same note is shared by every cell where it holds):")
        out.append("")
        for text, n in notes.items():
            out.append(f"- [{n}] {text}")
        out.append("")
    if m.errors:
        out.append("Releases not checked:")
        out += [f"- {r}: {e}" for r, e in m.errors.items()]
        out.append("")
    if m.timings:
        out.append(
            "Time per release (s): "
            + ", ".join(f"{r} {t:.1f}" for r, t in m.timings.items())
            + f"; total {sum(m.timings.values()):.1f}"
        )
        out.append("")
    out.append(f"Policy `{policy}`: exit status {exit_status}.")
    out += [f"- {f}" for f in failures]
    out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# CLI


def _materialized(dest: Path, tag: str) -> bool:
    if not (dest / ".git").exists():
        return False
    proc = subprocess.run(
        ["git", "rev-parse", "-q", "--verify", f"refs/tags/{tag}"],
        cwd=dest,
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0


def prepare_release(lock: Any, version: str, work: Path, cache: Path) -> Target:
    """Fetch (recording a target's sha256 into the lock on first resolve) and materialize one
    release under ``.work/upstream/<version>``; a materialized release is reused as it is."""
    from fp4series import lock as lock_mod
    from fp4series import upstream
    from fp4series.paths import remove_tree_inside

    release = lock.release(version)
    dest = work / "upstream" / version
    tag = release.tag or f"v{version}"
    if not _materialized(dest, tag):
        if version != lock.pin.version and not release.sha256:
            upstream.fetch_and_record(lock.path, version, cache)
            lock = lock_mod.load_lock(lock.path)
            release = lock.release(version)
        if dest.exists():
            remove_tree_inside(dest, work / "upstream")
        upstream.materialize(release, dest, cache, lock=lock)
    return Target(version, dest, tag)


def cmd_rebase_check(args: argparse.Namespace) -> int:
    from fp4series import lock as lock_mod
    from fp4series import paths

    root = paths.project_root()
    lock_path = Path(args.lock) if args.lock else paths.default_lock_path()
    patches_dir = Path(args.patches_dir) if args.patches_dir else paths.default_patches_dir()
    cache = paths.default_cache_dir()
    work = root / ".work"
    lock = lock_mod.load_lock(lock_path)
    docs = load_patch_docs(patches_dir)
    if not docs:
        raise SeriesError(f"the series in {patches_dir} is empty", hint="add patches first")
    baseline: dict[str, Any] | None = None
    regen = ""
    if args.policy == "baseline":  # fail before the (minutes long) check when it cannot pass
        base_path = Path(args.baseline) if args.baseline else root / "reports/rebase-check.json"
        shown = _display(base_path, root)
        regen = regenerate_command(shown, str(Path(shown).with_suffix(".md")))
        baseline = load_baseline(base_path, [d.name for d in docs], regen)
    wanted = args.releases or [t.version for t in lock.targets]
    releases = [lock.release(v) for v in wanted]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    pin = prepare_release(lock, lock.pin.version, work, cache)
    targets: list[Target | tuple[str, str]] = []
    for rel in releases:
        start = time.monotonic()
        try:
            targets.append(prepare_release(lock, rel.version, work, cache))
            lock = lock_mod.load_lock(lock_path)
        except (SeriesError, OSError, subprocess.SubprocessError) as exc:
            targets.append((rel.version, f"fetch/materialize failed: {exc}"))
        took = time.monotonic() - start
        if took > 1:
            log(f"    {rel.version}: fetched and materialized in {took:.1f}s")
    repo = JudgeRepo(work / "rebase" / "judge")
    m = run_matrix(repo, docs, pin, targets, log=log)
    status, failures = apply_policy(m, args.policy, baseline)
    data = m.to_json(args.policy, status, failures)
    md = to_markdown(m, args.policy, status, failures)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(md)
    if not args.quiet:
        print(md)
    for f in failures:
        log(f"policy {args.policy}: {f}")
    if args.policy == "baseline":
        if status:
            log(
                f"policy baseline: {len(failures)} cell(s) differ from the committed matrix; "
                "if the change is expected (patch edited, new or re-released upstream), "
                f"regenerate and commit the baseline:\n    {regen}"
            )
        else:
            log("policy baseline: the matrix equals the committed baseline")
    return status


def _display(path: Path, root: Path) -> str:
    """PATH relative to the project root when it lies inside it (for copy-paste commands)."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rebase-check",
        help="verdict of every patch against every newer upstream release",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--releases", nargs="+", metavar="VERSION", help="default: all lock targets")
    p.add_argument("--json", metavar="OUT", help="write the JSON matrix here")
    p.add_argument("--md", metavar="OUT", help="write the Markdown table here")
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="newest",
        help="exit-status policy (see above); CI uses baseline",
    )
    p.add_argument(
        "--baseline",
        metavar="JSON",
        help="committed matrix for --policy baseline (default: reports/rebase-check.json)",
    )
    p.add_argument("--lock", help="upstream.lock (default: the project's)")
    p.add_argument("--patches-dir", help="series directory (default: the project's patches/)")
    p.add_argument("--quiet", action="store_true", help="do not echo the table")
    p.set_defaults(func=cmd_rebase_check)
