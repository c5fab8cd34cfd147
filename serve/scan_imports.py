"""Where SGLang's source imports a third-party package, and how: read, not imported.

For each package name asked about, list the ``sglang`` modules that import it and how: at module
level outside any ``try``/``if`` (*unconditional*: the package must be installed whenever that
module is imported), at module level inside ``try`` or ``if`` (*guarded*: an ImportError is
survivable or the branch depends on the platform), or inside a function (*lazy*: loaded only
when that code path runs). The wheelhouse's left-out table cites these facts.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

KINDS = ("unconditional", "guarded", "lazy")


def _names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Import):
        return [a.name for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
        return [stmt.module]
    return []


def imports(tree: ast.Module) -> list[tuple[str, str]]:
    """(kind, dotted module) for every absolute import in ``tree``."""
    out: list[tuple[str, str]] = []

    def walk(stmts: list[ast.stmt], kind: str) -> None:
        for stmt in stmts:
            out.extend((kind, n) for n in _names(stmt))
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(stmt.body, "lazy")
            elif isinstance(stmt, ast.ClassDef):
                walk(stmt.body, kind)
            elif isinstance(stmt, ast.Try):
                inner = "lazy" if kind == "lazy" else "guarded"
                for part in (stmt.body, stmt.orelse, stmt.finalbody):
                    walk(part, inner)
                for handler in stmt.handlers:
                    walk(handler.body, inner)
            elif isinstance(stmt, ast.If):
                if _is_type_checking(stmt.test):
                    continue
                inner = "lazy" if kind == "lazy" else "guarded"
                walk(stmt.body, inner)
                walk(stmt.orelse, inner)
            elif isinstance(stmt, (ast.With, ast.For, ast.While)):
                walk(stmt.body, kind)

    walk(tree.body, "unconditional")
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_sites(root: Path, packages: set[str]) -> dict[str, dict[str, set[str]]]:
    """package -> kind -> modules under ``root/sglang`` that import it that way."""
    sites: dict[str, dict[str, set[str]]] = {p: defaultdict(set) for p in packages}
    for path in sorted((root / "sglang").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for kind, name in imports(tree):
            top = name.split(".")[0]
            if top in sites:
                sites[top][kind].add(module)
    return sites


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="folder that holds the sglang package")
    ap.add_argument("package", nargs="+", help="top-level import name, e.g. flashinfer")
    ap.add_argument("--all", action="store_true", help="list every importing module")
    args = ap.parse_args(argv)
    if not (args.root / "sglang" / "__init__.py").is_file():
        print(
            f"error: no sglang package under {args.root}: give the folder that holds it",
            file=sys.stderr,
        )
        return 2
    for package, by_kind in import_sites(args.root, set(args.package)).items():
        print(f"{package}:")
        for kind in KINDS:
            mods = sorted(by_kind[kind])
            shown = mods if args.all else mods[:6]
            more = "" if len(shown) == len(mods) else f" (+{len(mods) - len(shown)})"
            print(f"  {kind:<13} {len(mods):3d}  {', '.join(shown)}{more}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
