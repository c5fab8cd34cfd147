"""The documents' tables, generated from their sources so that they cannot drift.

A generated block sits between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``
in README.md or any docs/*.md (DOCUMENTS); everything else there is prose written by hand. A
block may stand in any of them: its NAME says what fills it (GENERATORS; to add a table, add
its function there and put the two markers where it belongs). Blocks:
  series      patches/series and each patch's subject, Upstream-Status and Tests: trailer
  line-V      the maintained line on release V (patches/V): its patches with the source patch
              each came from, then every source patch it dropped and where upstream has it
  gpu-numerics  reports/h200/numerics.json and turing_ptx.json (max relative L2 per group)
  gpu-bench   reports/h200/bench.json (time ratios per M range)
  tp-matrix   tests/sglang/_tp_spec.py: model x --tp -> served / padded / refused (the CPU
              tensor-parallel test's data)
``python -m fp4series readme`` rewrites the blocks in place; ``--check`` changes nothing and
exits 1 naming the blocks that differ (CI runs it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fp4series import report
from fp4series.errors import SeriesError

BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
    re.S,
)
DOCUMENTS = ("README.md", "docs/*.md")  # where generated blocks are looked for
M_RANGES = (("M <= 8", (1, 2, 4, 8)), ("M = 16", (16,)), ("M = 32", (32,)),
            ("M 64-128", (64, 128)), ("M = 256", (256,)), ("M 512-1024", (512, 1024)),
            ("M = 4096", (4096,)))  # fmt: skip


def span(values: Sequence[float], fmt: str = ".2f") -> str:
    """A range as a table cell: "lo" where both ends read alike, else "lo-hi"; "-" for none."""
    if not values:
        return "-"
    lo, hi = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return lo if lo == hi else f"{lo}-{hi}"


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _subject(p: Any) -> str:
    return re.sub(r"^\[[^\]]*\]\s*", "", p.subject)


def _tests(p: Any) -> str:
    from fp4series import prefix

    tests = p.tests()
    cpu = len(prefix.cpu_tests(tests))
    return f"{cpu} CPU, {len(tests) - cpu} GPU"


def series_table(root: Path) -> str:
    from fp4series import series

    rows = []
    for i, p in enumerate(series.load_series(root / "patches"), 1):
        name = p.name.removesuffix(".patch")
        rows.append((i, f"`{name}`", _subject(p), p.upstream_status or "(none)", _tests(p)))
    return _table(("#", "patch", "what", "Upstream-Status", "Tests"), rows)


def line_table(root: Path, version: str) -> str:
    """The line on VERSION: what it carries (and from which source patch), what it dropped."""
    from fp4series import series
    from fp4series.line import resolve_line
    from fp4series.replay.record import DROPPED, TRAILER, parse_dropped

    line = resolve_line(version, root=root)
    rows = []
    for i, p in enumerate(series.load_series(line.patches_dir), 1):
        source = p.trailers.get(TRAILER, "").split()
        origin = source[0].split("-", 1)[0] if source else "(new)"
        rows.append((i, _subject(p), origin, p.upstream_status or "(none)", _tests(p)))
    text = _table(("#", "what", "from", "Upstream-Status", "Tests"), rows)
    drops = line.patches_dir / DROPPED
    if drops.is_file():
        gone = []
        for st in parse_dropped(drops).stanzas:
            how = "by hand" if st.get("Resolution") else "as judged upstream"
            gone.append((st.get("Patch").split("-", 1)[0], st.get("Applied-Upstream") or "?",
                         f"{st.get('Verdict')}, dropped {how}"))  # fmt: skip
        text += "\nDropped (`" + str(drops.relative_to(root)) + "`):\n\n"
        text += _table(("source patch", "upstream since", "verdict"), gone)
    return text


def _e(x: float) -> str:
    """9.6e-4 below 0.1 (the errors that pass), 1.26 above (the repro's)."""
    return f"{x:.2f}" if x >= 0.1 else re.sub(r"e([+-])0(\d)", r"e\1\2", f"{x:.1e}")


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SeriesError(f"cannot read {path}: {exc}", hint="restore it from git") from exc


def numerics_table(root: Path) -> str:
    reports = root / report.DEFAULT_REPORT_DIR
    cases = _load(reports / "numerics.json")["cases"]
    turing = _load(reports / "turing_ptx.json")["cases"]
    rows = []

    def group(label: str, chosen: list[Mapping[str, Any]], dtype: str) -> None:
        if not chosen:
            return
        reduced = max(c.get("rel_l2_no_atomic_add", c["rel_l2"]) for c in chosen)
        shipped = max(c["rel_l2"] for c in chosen)
        rows.append((label, dtype, len(chosen), _e(reduced),
                     _e(shipped) if shipped != reduced else "same"))  # fmt: skip

    for templates, title in (("patched", "series"), ("unpatched", "the pin's templates")):
        for kind, kpaths in (("dense", report.DENSE_PATHS), ("MoE", report.MOE_PATHS)):
            for dtype in ("float16", "bfloat16"):
                chosen = [c for c in cases if c.get("templates", "patched") == templates
                          and c["path"] in kpaths and c["dtype"] == dtype]  # fmt: skip
                finite = [c for c in chosen if c.get("rel_l2") is not None]
                if len(finite) < len(chosen):
                    rows.append((f"{kind}, {title}", dtype, len(chosen),
                                 f"non-finite output ({len(chosen) - len(finite)} of "
                                 f"{len(chosen)})", ""))  # fmt: skip
                else:
                    group(f"{kind}, {title}", chosen, dtype)
    for kind, kpaths in (("dense", report.DENSE_PATHS), ("MoE", report.MOE_PATHS)):
        group(f"{kind}, compute_75 PTX", [c for c in turing if c["path"] in kpaths], "float16")
    header = ("layers, templates", "dtype", "cases", "max rel. L2 (fp32 split-K reduce)",
              "as shipped (atomicAdd reduce)")  # fmt: skip
    return _table(header, rows)


def bench_table(root: Path) -> str:
    rows = _load(root / report.DEFAULT_REPORT_DIR / "bench.json")["rows"]
    lines = []
    for label, field, over, kind in (
        ("bf16 cuBLAS time / FP4 time (dense)", "bf16_us", "fp4_us", "dense"),
        ("INT4 GPTQ Marlin time / FP4 time (dense)", "int4_us", "fp4_us", "dense"),
        ("HBM roofline / FP4 time (dense)", "roofline_us", "fp4_us", "dense"),
        ("upstream 0.5.23 FP4 time / patched FP4 time (dense)", "upstream_fp4_us", "fp4_us",
         "dense"),
        ("FP4 time / dequant + cuBLAS time (dense, patch 13)", "fp4_us", "dequant_us", "dense"),
        ("bf16 cuBLAS time / dequant + cuBLAS time (dense)", "bf16_us", "dequant_us", "dense"),
        ("bf16 cuBLAS time / the series' time as served (dense)", "bf16_us", "dispatch_us",
         "dense"),
        ("FP8 cuBLASLt time / the series' time as served (dense)", "fp8_us", "dispatch_us",
         "dense"),
        ("with column scale + bias / without (dense, as served)", "epilogue_us", "dispatch_us",
         "dense"),
        ("the same, the PyTorch ops patch 14 replaced (Marlin's rows)", "epilogue_unfused_us",
         "dispatch_us", "marlin"),
        ("bf16 time / FP4 time (MoE, E=64 top-8)", "bf16_us", "fp4_us", "moe"),
        ("INT4 time / FP4 time (MoE)", "int4_us", "fp4_us", "moe"),
        ("HBM roofline / FP4 time (MoE, touched experts)", "roofline_us", "fp4_us", "moe"),
    ):  # fmt: skip
        cells = []
        for _, ms in M_RANGES:
            chosen = [r for r in rows if r["m"] in ms and (r["kind"] == kind or (
                kind == "marlin" and r.get("dispatch_path") == "marlin"))]  # fmt: skip
            ratios = [r[field] / r[over] for r in chosen if r.get(field) and r.get(over)]
            cells.append(span(ratios))
        if any(c != "-" for c in cells):
            lines.append((label, *cells))
    return _table(("", *(name for name, _ in M_RANGES)), lines)


TP_SPEC = Path("tests") / "sglang" / "_tp_spec.py"


def tp_table(root: Path) -> str:
    """The tensor-parallel table of the CPU test's model data (pure Python, loaded by path)."""
    import importlib.util
    import sys

    path = root / TP_SPEC
    name = "_fp4series_tp_spec"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise SeriesError(f"cannot load {path}", hint="restore it from git")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
        return str(module.readme_table())
    finally:
        del sys.modules[name]


GENERATORS: dict[str, Callable[[Path], str]] = {
    "series": series_table,
    "gpu-numerics": numerics_table,
    "gpu-bench": bench_table,
    "tp-matrix": tp_table,
}


def _generator(name: str) -> Callable[[Path], str] | None:
    if name in GENERATORS:
        return GENERATORS[name]
    if name.startswith("line-"):
        return lambda root: line_table(root, name.removeprefix("line-"))
    return None


def render(text: str, root: Path) -> tuple[str, list[str]]:
    """TEXT with every generated block rewritten, and the names of the blocks that changed."""
    changed: list[str] = []
    unknown = [m["name"] for m in BLOCK.finditer(text) if _generator(m["name"]) is None]
    if unknown:
        raise SeriesError(f"README has unknown generated blocks {unknown}",
                          hint=f"known: {', '.join(GENERATORS)}, line-<VERSION>")  # fmt: skip

    def one(m: re.Match[str]) -> str:
        generate = _generator(m["name"])
        assert generate is not None
        body = generate(root)
        if body != m["body"]:
            changed.append(m["name"])
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(one, text), changed


def documents(root: Path) -> list[Path]:
    """The files that may hold generated blocks, in a stable order."""
    found: list[Path] = []
    for pattern in DOCUMENTS:
        found += sorted(root.glob(pattern))
    return found
