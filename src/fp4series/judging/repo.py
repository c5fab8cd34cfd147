"""Git plumbing for judging patches: a scratch repo whose object store reaches the pin and
every release (alternates), with cached trees, blobs and definitions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fp4series import gitops
from fp4series.errors import SeriesError


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
        env = {"GIT_INDEX_FILE": str(index)} if index is not None else None
        proc = gitops.run(self.path, *args, input=stdin, env=env)
        if check and proc.returncode != 0:
            raise SeriesError(
                f"git {' '.join(args[:3])} failed in {self.path}: {proc.stderr.strip()}",
                hint="delete the scratch repo (.work/rebase) and run again",
            )
        return proc

    def borrow(self, repo: Path) -> None:
        """Make REPO's objects reachable from here (idempotent)."""
        common = gitops.run(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
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
            ok and not unmerged, proc.stderr, offsets(proc.stderr), unmerged, new_tree
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
        proc = gitops.run(
            self.path,
            "cat-file",
            "--batch",
            input=("\n".join(todo) + "\n").encode(),
            text=False,
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


def offsets(stderr: str) -> dict[str, list[int]]:
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
