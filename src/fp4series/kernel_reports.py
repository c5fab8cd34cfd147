"""The kernel rounds' reports (issue 23): ``reports/h200/kernels/round-*/``.

Each GPU round of ``bench/kernels/run_round.py`` writes ``kernels.json`` (every check and
timing), ``kernels.md``, ``dispatch.json`` and ``build.txt``. CI cannot rerun a round, so this
checks what a committed round claims: the run's metadata (command, series revision, device),
that it ran to the end, every gated numerics case and layout check passed, every timing is
positive and none beats the HBM roofline (weights served from L2), and that the dispatch in
``bench/kernels/fp4_kernels.py`` names a round that is committed and, where that round's
``dispatch.json`` gives per-shape entries, holds exactly those. Where a round also ran
``bench/kernels/compile_check.py`` (``compile.json``), every compiled case must equal eager.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fp4series.report import _check_meta, _load, _positive

ROUND_FILES = ("kernels.json", "kernels.md", "dispatch.json", "build.txt")
ROUND_GLOB = "round-*"
COMPILE_FILE = "compile.json"  # bench/kernels/compile_check.py's report, where a round has one
DISPATCH_SOURCE = re.compile(r'DISPATCH_SOURCE = "measured: (\S+)')
TIMING_FIELDS = ("marlin_us", "bf16_us", "roofline_us")
OPEN_END = 1 << 30  # fp4_kernels.OPEN_END: the last path's upper bound


def check_round(round_dir: Path, problems: list[str]) -> None:
    """Problems of one round directory, each naming the round and the field."""
    name = f"{round_dir.name}/kernels.json"
    for file in ROUND_FILES:
        if not (round_dir / file).is_file():
            problems.append(f"{round_dir.name}: {file} missing (run_round.py writes it)")
    data = _load_round_file(round_dir, "kernels.json", problems)
    if data is None:
        return
    _check_meta(name, data, problems)
    if data.get("complete") is not True:
        problems.append(f"{name}: the round did not run to its end (complete is not true)")
    if data.get("errors"):
        problems.append(f"{name}: errors recorded: {data['errors']!r:.200}")
    _check_cases(name, data, problems)
    _check_rows(name, data, problems)
    if (round_dir / COMPILE_FILE).is_file():
        _check_compile(round_dir, problems, data)


def _load_round_file(round_dir: Path, file: str, problems: list[str]) -> Any:
    """A round's JSON file, or None with its problem named after the round."""
    found: list[str] = []
    data = _load(round_dir / file, found)
    problems += [f"{round_dir.name}/{p}" for p in found]
    return data


def _check_compile(round_dir: Path, problems: list[str], kernels: Mapping[str, Any]) -> None:
    """torch.compile(fullgraph=True) and its CUDA graphs gave the eager bits in every case, on
    the round's kernel sources where the report names them."""
    name = f"{round_dir.name}/{COMPILE_FILE}"
    data = _load_round_file(round_dir, COMPILE_FILE, problems)
    if data is None:
        return
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: cases must be a non-empty list")
        cases = []
    for case in cases:
        if not isinstance(case, Mapping) or not (case.get("bitwise_equal") and case.get("finite")):
            what = (
                {k: case.get(k) for k in ("mode", "m", "path")}
                if isinstance(case, Mapping)
                else case
            )
            problems.append(f"{name}: compiled output differs from eager: {what}")
    if data.get("cudagraph_skips") != 0:
        problems.append(f"{name}: Inductor skipped CUDA graphs ({data.get('cudagraph_skips')!r})")
    if data.get("passed") is not True:
        problems.append(f"{name}: passed is not true")
    sources = data.get("kernel_sources")
    if sources is not None and sources != kernels.get("kernel_sources"):
        problems.append(f"{name}: kernel_sources differ from the round's kernels.json")


def _check_cases(name: str, data: Mapping[str, Any], problems: list[str]) -> None:
    layout = data.get("layout_checks")
    if not isinstance(layout, list) or not layout:
        problems.append(f"{name}: layout_checks must be a non-empty list")
    else:
        for check in layout:
            if not isinstance(check, Mapping) or check.get("passed") is not True:
                what = check.get("check") if isinstance(check, Mapping) else check
                problems.append(f"{name}: layout check failed: {what}")
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: cases must be a non-empty list")
        return
    gated = [c for c in cases if isinstance(c, Mapping) and "passed" in c]
    if not any(str(c.get("path", "")).startswith("gemv") for c in gated):
        problems.append(f"{name}: no gated gemv case")
    for case in gated:
        if case.get("passed") is not True:
            problems.append(
                f"{name}: case failed: {case.get('shape')} {case.get('dtype')} "
                f"m={case.get('m')} {case.get('path')} (rel_l2 {case.get('rel_l2')}"
                f"{', ' + str(case['error']) if case.get('error') else ''})"
            )


def _check_rows(name: str, data: Mapping[str, Any], problems: list[str]) -> None:
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        problems.append(f"{name}: rows must be a non-empty list")
        return
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            problems.append(f"{name}: rows[{i}] is not an object")
            continue
        where = f"{name}: rows[{i}] ({row.get('shape')} m={row.get('m')})"
        for field in TIMING_FIELDS:
            if not _positive(row.get(field)):
                problems.append(f"{where}: {field} missing or <= 0")
        paths = row.get("paths_us")
        if not isinstance(paths, Mapping):
            problems.append(f"{where}: paths_us must be an object")
            continue
        roof = row.get("roofline_us")
        for path, us in paths.items():
            if not _positive(us):
                problems.append(f"{where}: {path} time missing or <= 0")
            elif _positive(roof) and us < 0.98 * roof:
                problems.append(
                    f"{where}: {path} {us:.2f} us beats the HBM roofline {roof:.2f} us: "
                    "weights were served from L2"
                )


def check_kernel_rounds(kernels_dir: Path, problems: list[str], repo: Path | None = None) -> None:
    """Every ``round-*`` under ``kernels_dir``, and the dispatch's measured source (read from
    ``bench/kernels/fp4_kernels.py`` under ``repo``) among them."""
    rounds = sorted(p for p in kernels_dir.glob(ROUND_GLOB) if p.is_dir())
    if not rounds:
        problems.append(f"{kernels_dir}: no {ROUND_GLOB} directory")
    for round_dir in rounds:
        check_round(round_dir, problems)
    root = repo or kernels_dir.parents[2]
    source = root / "bench" / "kernels" / "fp4_kernels.py"
    if not source.is_file():
        return
    text = source.read_text()
    m = DISPATCH_SOURCE.search(text)
    if m is None:
        problems.append(f"{source.name}: DISPATCH_SOURCE does not name a measured report")
    elif not (root / m.group(1)).is_file():
        problems.append(f"{source.name}: the dispatch's source {m.group(1)} is not committed")
    else:
        _check_dispatch(source.name, dispatch_in_code(text), root / m.group(1), problems)


class _OpenEnd(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(OPEN_END) if node.id == "OPEN_END" else node


def dispatch_in_code(text: str) -> dict[str, list[tuple[int, str]]] | None:
    """The DISPATCH literal of fp4_kernels.py (OPEN_END read as its value); None if absent."""
    for node in ast.parse(text).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "DISPATCH" and node.value is not None:
            value = ast.literal_eval(_OpenEnd().visit(node.value))
            return {k: [tuple(e) for e in v] for k, v in value.items()}
    return None


def _check_dispatch(name: str, code: dict[str, list[tuple[int, str]]] | None, measured: Path,
                    problems: list[str]) -> None:  # fmt: skip
    if code is None or "*" not in code:
        problems.append(f"{name}: DISPATCH must hold a '*' entry (shapes the round did not time)")
        return
    try:
        shapes = json.loads(measured.read_text()).get("shapes", {})
    except (json.JSONDecodeError, AttributeError) as exc:
        problems.append(f"{measured.name}: not a dispatch table: {exc}")
        return
    for shape, table in shapes.items():
        entries = table.get("dispatch") if isinstance(table, Mapping) else None
        if entries is None:
            continue  # an older round: crossovers only
        want = [tuple(e) for e in entries]
        if code.get(shape) != want:
            problems.append(f"{name}: DISPATCH[{shape!r}] is {code.get(shape)}, the round "
                            f"measured {want}")  # fmt: skip
