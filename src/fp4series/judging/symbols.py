"""Symbol evidence: the public names a patch provides, and where a tree defines them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp4series.judging.repo import JudgeRepo
from fp4series.patch import Patch

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\([^)]*\))?$")


def added_symbols(doc: Patch) -> list[str]:
    """Public defs/classes a patch adds to Python files (used when it declares no Provides:)."""
    out: list[str] = []
    for f in doc.changes:
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


def patch_symbols(doc: Patch) -> tuple[list[str], str]:
    """The symbols the rule checks: ``Provides:`` when declared, else the public defs added."""
    declared = [s for s in doc.provides if IDENT.match(s)]
    if declared:
        return declared, "Provides"
    return added_symbols(doc), "added defs"


def judge_symbols(
    repo: JudgeRepo, doc: Patch, release_tree: str, pin_tree: str
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
