"""The kernel dispatch of a Marlin GEMM module, read from its source, and a reduced copy of it.

A Marlin JIT module (``gptq_marlin``, ``moe_wna16_marlin``) compiles one ``Marlin<...>`` kernel
for every ``_GET_IF(W_TYPE, M, N, K, M8, GROUP, THREADS, ZP_FLOAT)`` its dispatch function
``get_marlin_kernel_impl`` reaches through macros such as ``COMMON_GET_IF(host::kU4)`` or
``FP4_GET_IF(host::kFE2M1f)``: about 270 kernels for one activation dtype, of which the FP4
(``kFE2M1f``) ones the series changes are 15 (dense) or 12 (MoE, 24 with MXFP4 on bf16).

``reduce_source`` rewrites the module's top source so that its dispatch instantiates only the
kernels of chosen weight types; the rest of the module (host code, config search, the
arch/dtype checks, the exported entry point) is compiled as it is. ``dispatch_kernels`` lists
what a dispatch instantiates, so the reduction is checked rather than trusted: every kernel of
a kept weight type the full dispatch defines must still be in the reduced one.

Stdlib only: the compile check's parent process uses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from fp4series.errors import SeriesError

DISPATCH_FUNCTION = "get_marlin_kernel_impl"
#: Where the dispatch is, in order: ``get_marlin_kernel_impl`` (the pin; a line whose Turing
#: patch wraps the dispatch in a per-arch ``get_marlin_kernel``), else ``get_marlin_kernel``
#: (upstream from 0.5.17 on, e.g. bare v0.5.23).
DISPATCH_FUNCTIONS = (DISPATCH_FUNCTION, "get_marlin_kernel")
LEAF_MACRO = "_GET_IF"
#: Named kernel sets: the weight types (as the dispatch names them, ``host::k...``) a reduced
#: module keeps. ``fp4``: float4_e2m1f, NVFP4 (group_blocks 1) and MXFP4 (group_blocks 2).
KERNEL_SETS: dict[str, tuple[str, ...]] = {"fp4": ("kFE2M1f",), "fp4v": ("kFE2M1f",)}
#: Sets that also build one kernel of every other variant (weight type, group_blocks,
#: zero-point type, m_block_size_8): where the series changes every kernel body (SM75),
#: a compile error in another type's code path still shows, at ~35 kernels instead of 270.
VARIANT_SETS = frozenset({"fp4v"})
_LEAF_FIELDS = ("w_type", "m_blocks", "n_blocks", "k_blocks", "m_block_size_8", "group_blocks",
                "threads", "zp_float")  # fmt: skip


@dataclass(frozen=True, order=True)
class Kernel:
    """One ``_GET_IF`` leaf of a dispatch: the template arguments of one Marlin kernel."""

    w_type: str  # e.g. kFE2M1f (namespace dropped)
    m_blocks: str
    n_blocks: str
    k_blocks: str
    m_block_size_8: str
    group_blocks: str
    threads: str
    zp_float: str
    raw_type: str = field(default="", compare=False)  # W_TYPE as written, e.g. host::kU4

    @property
    def variant(self) -> tuple[str, str, str, str]:
        """What selects a different code path in the template (tile sizes do not)."""
        return (self.w_type, self.group_blocks, self.zp_float, self.m_block_size_8)

    def call(self) -> str:
        """The ``_GET_IF(...)`` statement that instantiates this kernel alone."""
        fields = [self.raw_type or self.w_type, *(getattr(self, f) for f in _LEAF_FIELDS[1:])]
        return f"{LEAF_MACRO}({', '.join(fields)})"

    def __str__(self) -> str:
        return f"{LEAF_MACRO}({', '.join(getattr(self, f) for f in _LEAF_FIELDS)})"


@dataclass(frozen=True)
class Reduction:
    text: str  # the reduced source
    kept: tuple[Kernel, ...]
    dropped: tuple[Kernel, ...]
    variants: bool = False

    def summary(self, keep: tuple[str, ...]) -> str:
        total = len(self.kept) + len(self.dropped)
        extra = " + one of each other variant" if self.variants else ""
        return f"{len(self.kept)} of {total} dispatch kernels ({'+'.join(keep)}{extra})"


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)(.*)$")
_INVOCATION = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_QUOTED_INCLUDE = re.compile(r'^(\s*#\s*include\s+)"([^"]+)"', re.M)


def _logical_lines(text: str) -> list[str]:
    """Source lines with backslash continuations joined (as the preprocessor sees them)."""
    return re.sub(r"\\[ \t]*\n", " ", text).splitlines()


def _strip_comments(text: str) -> str:
    """TEXT with comments blanked out, every offset kept (the reduction edits by offset)."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group())

    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)


def function_macros(text: str) -> dict[str, tuple[list[str], str]]:
    """Every function-like ``#define NAME(params) body`` of TEXT: name -> (params, body)."""
    out: dict[str, tuple[list[str], str]] = {}
    for line in _logical_lines(_strip_comments(text)):
        m = _DEFINE.match(line)
        if m:
            params = [p.strip() for p in m.group(2).split(",") if p.strip()]
            out[m.group(1)] = (params, m.group(3).strip())
    return out


def _call_args(text: str, open_paren: int) -> tuple[list[str], int]:
    """The comma-separated arguments of the call whose ``(`` is at OPEN_PAREN, and the index
    after its ``)``."""
    depth, start, args = 0, open_paren + 1, []
    for i in range(open_paren, len(text)):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(text[start:i].strip())
                return ([] if args == [""] else args), i + 1
        elif c == "," and depth == 1:
            args.append(text[start:i].strip())
            start = i + 1
    raise SeriesError(f"unbalanced parentheses in {text[open_paren : open_paren + 80]!r}")


def _leaves(text: str, macros: dict[str, tuple[list[str], str]], depth: int = 0) -> list[Kernel]:
    """The ``_GET_IF`` leaves TEXT reaches, expanding the function-like MACROS it invokes."""
    if depth > 16:
        raise SeriesError("the Marlin dispatch macros nest deeper than 16 levels")
    found: list[Kernel] = []
    pos = 0
    while m := _INVOCATION.search(text, pos):
        name = m.group(1)
        if name != LEAF_MACRO and name not in macros:
            pos = m.end()
            continue
        args, pos = _call_args(text, m.end() - 1)
        if name == LEAF_MACRO:
            if len(args) != len(_LEAF_FIELDS):
                raise SeriesError(
                    f"{LEAF_MACRO} with {len(args)} arguments ({', '.join(args)}); the compile "
                    f"check knows the {len(_LEAF_FIELDS)}-argument form "
                    f"({', '.join(_LEAF_FIELDS)})",
                    hint="the Marlin dispatch changed shape: teach fp4series.marlin_dispatch "
                    "the new form, or compile the full module (a target without @SET)",
                )
            fields = [args[0].rpartition("::")[2], *args[1:]]
            found.append(Kernel(*fields, raw_type=args[0]))
            continue
        params, body = macros[name]
        if len(params) != len(args):
            raise SeriesError(f"macro {name} takes {len(params)} arguments, given {len(args)}")
        for param, arg in zip(params, args, strict=True):
            body = re.sub(rf"\b{re.escape(param)}\b", lambda _m, a=arg: a, body)
        found += _leaves(body, macros, depth + 1)
    return found


def _candidates(text: str) -> tuple[str, list[tuple[int, int]]]:
    """The dispatch function's name and the spans of its definitions: the first name of
    DISPATCH_FUNCTIONS defined in TEXT; for upstream's ``get_marlin_kernel`` only definitions
    that instantiate kernels (a line's wrapper of the same name instantiates none)."""
    clean = _strip_comments(text)
    for name in DISPATCH_FUNCTIONS:
        spans = _definitions(clean, name)
        if name != DISPATCH_FUNCTION:
            macros = function_macros(text)
            spans = [(a, b) for a, b in spans if _leaves(clean[a:b], macros)]
        if spans:
            return name, spans
    return " or ".join(DISPATCH_FUNCTIONS), []


def has_dispatch(text: str) -> bool:
    """Whether TEXT (a module source) defines a Marlin dispatch function."""
    return bool(_candidates(text)[1])


def _dispatch_span(text: str) -> tuple[int, int]:
    """Start and end (after the closing brace) of the dispatch function's body in TEXT."""
    name, spans = _candidates(text)
    if len(spans) != 1:
        raise SeriesError(
            f"found {len(spans)} definitions of {name} in the module source, expected one",
            hint="the Marlin dispatch moved or changed shape: compile the full module (a target "
            "without @SET) and teach fp4series.marlin_dispatch where the dispatch is",
        )
    return spans[0]


def _definitions(clean: str, name: str) -> list[tuple[int, int]]:
    """The body spans of every definition of function NAME in CLEAN (comments stripped)."""
    spans = []
    for m in re.finditer(rf"\b{name}\s*\(", clean):
        _, after = _call_args(clean, m.end() - 1)
        brace = re.match(r"\s*\{", clean[after:])
        if brace is None:
            continue  # a call or a declaration, not the definition
        open_at = after + brace.end() - 1
        depth = 0
        for i in range(open_at, len(clean)):
            depth += {"{": 1, "}": -1}.get(clean[i], 0)
            if depth == 0:
                spans.append((open_at, i + 1))
                break
    return spans


def dispatch_kernels(text: str) -> list[Kernel]:
    """Every kernel the dispatch function of a module source instantiates, in source order."""
    start, end = _dispatch_span(text)
    return _leaves(_strip_comments(text)[start:end], function_macros(text))


def reduce_source(text: str, keep: tuple[str, ...], *, variants: bool = False) -> Reduction:
    """TEXT with every dispatch statement that instantiates only other weight types than KEEP
    commented out. A statement that mixes kept and other types stays (more is compiled, nothing
    of KEEP is lost). VARIANTS: in place of a dropped statement, one ``_GET_IF`` for each
    kernel variant (``Kernel.variant``) not built yet. Raises when the result would lose a kept
    kernel (or, with VARIANTS, a variant) or keep none."""
    macros = function_macros(text)
    start, end = _dispatch_span(text)
    body = text[start:end]
    clean = _strip_comments(body)  # same offsets as BODY
    pieces: list[str] = []
    dropped: list[Kernel] = []
    seen: set[tuple[str, str, str, str]] = set()
    cursor = pos = 0
    while m := _INVOCATION.search(clean, pos):
        if m.group(1) not in macros and m.group(1) != LEAF_MACRO:
            pos = m.end()
            continue
        _, after = _call_args(clean, m.end() - 1)
        leaves = _leaves(clean[m.start() : after], macros)
        if leaves and all(k.w_type not in keep for k in leaves):
            call = " ".join(clean[m.start() : after].split())
            pieces += [
                body[cursor : m.start()],
                f"/* fp4series compile check: not built: {call} */",
            ]
            for k in leaves:
                if variants and k.variant not in seen:
                    seen.add(k.variant)
                    pieces.append(f" {k.call()}")
                else:
                    dropped.append(k)
            cursor = after
        else:
            seen.update(k.variant for k in leaves)
        pos = after
    pieces.append(body[cursor:])
    reduced = text[:start] + "".join(pieces) + text[end:]
    kept = verify_reduction(text, reduced, keep, variants=variants)
    return Reduction(reduced, tuple(kept), tuple(dropped), variants)


def verify_reduction(
    full: str, reduced: str, keep: tuple[str, ...], *, variants: bool = False
) -> list[Kernel]:
    """The kernels REDUCED's dispatch builds; raises unless that includes every kernel of
    KEEP's weight types that FULL's dispatch defines (and at least one), and with VARIANTS a
    kernel of every variant FULL has."""
    kept = dispatch_kernels(reduced)
    every = dispatch_kernels(full)
    want = [k for k in every if k.w_type in keep]
    missing = [k for k in want if k not in kept]
    if variants:
        have = {k.variant for k in kept}
        lost = sorted({k.variant for k in every} - have)
        if lost:
            raise SeriesError(
                f"the reduced Marlin dispatch builds no kernel of {len(lost)} variant(s) the "
                f"module has, e.g. {', '.join(lost[0])}",
                hint="compile the full module (a target without @SET) and fix "
                "fp4series.marlin_dispatch.reduce_source",
            )
    if missing or not want:
        raise SeriesError(
            f"the reduced Marlin dispatch builds {len(want) - len(missing)} of the "
            f"{len(want)} {'+'.join(keep)} kernel(s) the module defines"
            + (f"; lost: {', '.join(map(str, missing[:3]))}" if missing else ""),
            hint="compile the full module (a target without @SET) and fix "
            "fp4series.marlin_dispatch.reduce_source",
        )
    return kept


def absolute_includes(text: str, folder: Path) -> str:
    """TEXT with each quoted ``#include "x"`` that names a file beside it (in FOLDER) made
    absolute, so a copy of the source compiles from anywhere against the original headers."""

    def fix(m: re.Match[str]) -> str:
        target = (folder / m.group(2)).resolve()
        return f'{m.group(1)}"{target}"' if target.is_file() else m.group(0)

    return _QUOTED_INCLUDE.sub(fix, text)


def write_reduced(
    source: Path, dest: Path, keep: tuple[str, ...], *, variants: bool = False
) -> Reduction:
    """Write SOURCE with its dispatch reduced to KEEP's weight types (VARIANTS: plus one kernel
    of every other variant) to DEST, its quoted includes pointing at SOURCE's folder; returns
    what was kept and dropped."""
    reduction = reduce_source(source.read_text(), keep, variants=variants)
    dest.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"// fp4series compile check: {source.name} with its Marlin dispatch reduced to "
        f"{'+'.join(keep)}\n// ({reduction.summary(keep)}); everything else as in {source}\n"
    )
    dest.write_text(header + absolute_includes(reduction.text, source.parent))
    return reduction
