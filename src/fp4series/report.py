"""GPU proof reports: the metadata every report carries, and the CI check of committed reports.

The GPU tests (tests/gpu), the conformance run (tests/gpu/run_conformance.py) and the benchmark
(bench/bench_fp4_marlin.py) write ``numerics.json``, ``turing_ptx.json``, ``conformance.json``
and ``bench.json``; CI cannot rerun them, so ``python -m fp4series check-reports`` checks their
schema and thresholds: every patched case within ``PATCHED_MAX_REL_L2``, every unpatched-template
repro case failing (above ``UNPATCHED_MIN_REL_L2``), the tracing checks passing, fused shards
with different global scales served within the gates (each shard too) or refused with a message
naming the scales, upstream's dense and capability NVFP4 Marlin tests passing, and the command,
series revision and pin recorded.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import subprocess
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fp4series.errors import SeriesError

PATCHED_MAX_REL_L2 = 1e-2
# bf16 MoE as shipped (upstream's atomicAdd split-K reduce into bf16); the same cases without
# it (rel_l2_no_atomic_add) keep PATCHED_MAX_REL_L2. tests/gpu/test_marlin_numerics.py agrees.
MOE_BF16_ATOMIC_MAX_REL_L2 = 1.5e-2
GATED_FIELDS = ("rel_l2", "rel_l2_small_scales", "rel_l2_no_atomic_add")
UNPATCHED_MIN_REL_L2 = 1e-1
DENSE_PATHS = ("modelopt-dense", "ct-dense")
MOE_PATHS = ("modelopt-moe", "ct-moe")
PATHS = DENSE_PATHS + MOE_PATHS
DTYPES = ("float16", "bfloat16")
TRACING_CHECKS = ("cuda_graph", "torch_compile")
BENCH_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
META_FIELDS = ("command", "series_revision", "pin", "device", "torch", "date")
REVISION_ENV = "FP4SERIES_SERIES_REVISION"  # JSON, set where the repo has no .git (device)
DEFAULT_REPORT_DIR = Path("reports") / "h200"
# Fused shards with different global scales (tests/gpu/test_fused_shards.py): every dense
# path x layer x ratio x dtype, and MoE with w1 != w3 per path x dtype.
FUSED_LAYERS = ("qkv", "gate_up")
FUSED_RATIOS = (2.0, 0.5, 1e-3)
FUSED_OUTCOMES = ("served", "refused")
# conformance.json: upstream's NVFP4 Marlin tests (fp4series.conformance)
CONFORMANCE_STATUSES = ("pass", "fail", "not-applicable")
CONFORMANCE_REQUIRED = (
    "test_nvfp4_marlin_support_and_scale_transforms_sm80_sm90",
    "test_nvfp4_marlin_dense_matches_dequant_reference",
)


# --------------------------------------------------------------------------- metadata


def _repo_root() -> Path:
    env = os.environ.get("FP4SERIES_ROOT")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[2]


def series_revision(repo: Path | None = None) -> dict[str, str]:
    """``git describe`` of the project and the sha256 of ``patches/series`` + every patch it lists.

    Where the repository has no git metadata (a copied tree on a GPU machine) the value comes
    from ``$FP4SERIES_SERIES_REVISION`` (JSON written by scripts/device/bundle.py).
    """
    env = os.environ.get(REVISION_ENV)
    if env:
        value = json.loads(env)
        if not isinstance(value, dict):
            raise SeriesError(f"{REVISION_ENV} is not a JSON object: {env!r}")
        return {str(k): str(v) for k, v in value.items()}
    root = repo or _repo_root()
    try:
        git = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--tags"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        git = "unknown (no git metadata)"
    return {"git": git, "series_sha256": series_sha256(root / "patches")}


def series_sha256(patches_dir: Path) -> str:
    """sha256 over ``series`` and, in order, every patch file it names (missing: 'absent')."""
    series = patches_dir / "series"
    if not series.is_file():
        return "absent"
    digest = hashlib.sha256()
    text = series.read_bytes()
    digest.update(text)
    for line in text.decode().splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        patch = patches_dir / name
        digest.update(name.encode())
        digest.update(patch.read_bytes() if patch.is_file() else b"absent")
    return digest.hexdigest()


def pin_info(repo: Path | None = None) -> dict[str, str]:
    """The pin as upstream.lock records it (tag, version, wheel sha256, commit)."""
    lock = (repo or _repo_root()) / "upstream.lock"
    try:
        data = tomllib.loads(lock.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SeriesError(
            f"cannot read the pin from {lock}: {exc}",
            hint="run from the project checkout (upstream.lock at its root)",
        ) from exc
    pin = data.get("pin", {})
    return {
        "tag": str(pin.get("tag", "")),
        "version": str(pin.get("version", "")),
        "wheel_sha256": str(pin.get("sha256", "")),
        "commit": str(pin.get("commit", "")),
    }


def run_metadata(command: str, device: str | None = None) -> dict[str, Any]:
    """The fields every report carries (command, series revision, pin, device, torch, date)."""
    try:
        import torch

        torch_version = torch.__version__
        if device is None and torch.cuda.is_available():
            device = torch.cuda.get_device_name()
    except ImportError:  # the tooling tests run without torch
        torch_version = "absent"
    return {
        "command": command,
        "series_revision": series_revision(),
        "pin": pin_info(),
        "device": device or "none",
        "torch": torch_version,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
    }


def json_number(value: float | None) -> float | None:
    """JSON has no inf/NaN: store them as None (the checker treats None as a failed run)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------- checks


def _is_num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_meta(name: str, data: Mapping[str, Any], problems: list[str]) -> None:
    for field in META_FIELDS:
        if field not in data or data[field] in ("", None, {}):
            problems.append(f"{name}: missing top-level field {field!r}")
    rev = data.get("series_revision")
    if isinstance(rev, Mapping):
        for key in ("git", "series_sha256"):
            if not rev.get(key):
                problems.append(f"{name}: series_revision lacks {key!r}")
    elif rev is not None:
        problems.append(f"{name}: series_revision must be an object with git and series_sha256")
    pin = data.get("pin")
    if isinstance(pin, Mapping):
        if not pin.get("tag") and not pin.get("version"):
            problems.append(f"{name}: pin has neither tag nor version")
        if not pin.get("wheel_sha256"):
            problems.append(f"{name}: pin lacks wheel_sha256")
    elif pin is not None:
        problems.append(f"{name}: pin must be an object (tag, version, wheel_sha256)")


def _check_case(
    name: str, i: int, case: Mapping[str, Any], problems: list[str], *, arch: str | None = None
) -> bool:
    """Schema of one numerics case; True if usable for threshold checks."""
    where = f"{name}: cases[{i}]"
    ok = True
    path = case.get("path")
    if path not in PATHS:
        problems.append(f"{where}: path {path!r} is not one of {PATHS}")
        ok = False
    if case.get("dtype") not in DTYPES:
        problems.append(f"{where}: dtype {case.get('dtype')!r} is not one of {DTYPES}")
        ok = False
    for field in ("m", "n", "k") + (("e", "topk") if path in MOE_PATHS else ()):
        value = case.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(f"{where}: {field} must be a positive integer, got {value!r}")
            ok = False
    if not isinstance(case.get("bias"), bool):
        problems.append(f"{where}: bias must be true/false, got {case.get('bias')!r}")
        ok = False
    if case.get("templates") not in ("patched", "unpatched"):
        problems.append(f"{where}: templates must be 'patched' or 'unpatched'")
        ok = False
    if "rel_l2" not in case:
        problems.append(f"{where}: missing rel_l2")
        ok = False
    if arch is not None and case.get("arch") != arch:
        problems.append(f"{where}: arch must be {arch!r}, got {case.get('arch')!r}")
        ok = False
    return ok


def _label(case: Mapping[str, Any]) -> str:
    extra = f" e={case.get('e')} topk={case.get('topk')}" if case.get("path") in MOE_PATHS else ""
    return (
        f"{case.get('path')} {case.get('dtype')} m={case.get('m')} n={case.get('n')} "
        f"k={case.get('k')} bias={case.get('bias')}{extra} [{case.get('templates')}]"
    )


def max_rel_l2(case: Mapping[str, Any], field: str) -> float:
    """The threshold of one gated field of a patched case."""
    if field == "rel_l2" and case.get("path") in MOE_PATHS and case.get("dtype") == "bfloat16":
        return MOE_BF16_ATOMIC_MAX_REL_L2
    return PATCHED_MAX_REL_L2


def _check_patched_case(name: str, case: Mapping[str, Any], problems: list[str]) -> None:
    for field in GATED_FIELDS:
        if field not in case:
            continue
        value, limit = case[field], max_rel_l2(case, field)
        if not _is_num(value):
            problems.append(f"{name}: {_label(case)}: {field} is {value!r} (run failed?)")
        elif value > limit:
            problems.append(f"{name}: {_label(case)}: {field} {value:.3e} > {limit:.1e}")
    bf16_moe = case.get("path") in MOE_PATHS and case.get("dtype") == "bfloat16"
    if bf16_moe and "rel_l2_no_atomic_add" not in case:
        problems.append(
            f"{name}: {_label(case)}: bf16 MoE needs rel_l2_no_atomic_add (the series' own "
            f"error, gated at {PATCHED_MAX_REL_L2:.0e})"
        )


def check_numerics(data: Mapping[str, Any], problems: list[str]) -> None:
    name = "numerics.json"
    _check_meta(name, data, problems)
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: 'cases' must be a non-empty list")
        return
    patched: list[Mapping[str, Any]] = []
    unpatched: list[Mapping[str, Any]] = []
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping) or not _check_case(name, i, case, problems):
            continue
        (patched if case["templates"] == "patched" else unpatched).append(case)
    for case in patched:
        _check_patched_case(name, case, problems)
    for case in unpatched:
        value = case["rel_l2"]
        garbage = (
            value is None
            and isinstance(case.get("nonfinite_outputs"), int)
            and (case["nonfinite_outputs"] > 0)
        )  # non-finite output: fails as expected
        if garbage:
            continue
        if not _is_num(value):
            problems.append(f"{name}: {_label(case)}: repro rel_l2 is {value!r} (run failed?)")
        elif value <= UNPATCHED_MIN_REL_L2:
            problems.append(
                f"{name}: {_label(case)}: the unpatched templates should fail, but rel_l2 "
                f"{value:.3e} <= {UNPATCHED_MIN_REL_L2:.0e}"
            )
    for path in PATHS:
        for dtype in DTYPES:
            if not any(c["path"] == path and c["dtype"] == dtype for c in patched):
                problems.append(f"{name}: no patched case for {path} {dtype}")
    for group, paths in (("dense", DENSE_PATHS), ("moe", MOE_PATHS)):
        if not any(c["path"] in paths for c in unpatched):
            problems.append(f"{name}: no unpatched-template repro case for {group}")
    tracing = data.get("tracing")
    if not isinstance(tracing, list):
        problems.append(f"{name}: missing 'tracing' (list of {{name, passed}})")
    else:
        for check in TRACING_CHECKS:
            entries = [t for t in tracing if isinstance(t, Mapping) and t.get("name") == check]
            if not entries:
                problems.append(f"{name}: tracing check {check!r} not recorded")
            elif not all(t.get("passed") is True for t in entries):
                problems.append(f"{name}: tracing check {check!r} did not pass")
    check_fused_shards(data, problems)


def _fused_label(case: Mapping[str, Any]) -> str:
    return (
        f"{case.get('path')} {case.get('layer')} {case.get('dtype')} ratio={case.get('ratio')} "
        f"m={case.get('m')}"
    )


def check_fused_shard_case(name: str, case: Mapping[str, Any], problems: list[str]) -> None:
    """One fused-shards case: served within the gates (whole layer and each shard) or refused
    with an error that names the global scales."""
    where = f"{name}: {_fused_label(case)}"
    if case.get("path") not in PATHS or case.get("dtype") not in DTYPES:
        problems.append(f"{where}: path/dtype must be one of {PATHS} / {DTYPES}")
        return
    if not _is_num(case.get("ratio")) or case["ratio"] <= 0:
        problems.append(f"{where}: ratio must be a positive number")
    outcome = case.get("outcome")
    if outcome not in FUSED_OUTCOMES:
        problems.append(f"{where}: outcome must be one of {FUSED_OUTCOMES}, got {outcome!r}")
        return
    if outcome == "refused":
        error = case.get("error")
        if not isinstance(error, str) or "global scale" not in error:
            problems.append(f"{where}: a refusal must carry the error naming the global scales")
        return
    limit = max_rel_l2(case, "rel_l2")
    values = [("rel_l2", case.get("rel_l2", "absent"))]
    if case.get("path") in DENSE_PATHS:
        shards = case.get("rel_l2_per_shard")
        if not isinstance(shards, list) or not shards:
            problems.append(f"{where}: missing rel_l2_per_shard")
        else:
            values += [(f"rel_l2_per_shard[{i}]", v) for i, v in enumerate(shards)]
    for field, value in values:
        if not _is_num(value):
            problems.append(f"{where}: {field} is {value!r} (run failed?)")
        elif value > limit:
            problems.append(f"{where}: {field} {value:.3e} > {limit:.1e}")


def check_fused_shards(data: Mapping[str, Any], problems: list[str]) -> None:
    name = "numerics.json fused_shards"
    cases = data.get("fused_shards")
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: missing (the cases of tests/gpu/test_fused_shards.py)")
        return
    seen: set[tuple[Any, ...]] = set()
    for case in cases:
        if not isinstance(case, Mapping):
            problems.append(f"{name}: every case must be an object")
            continue
        check_fused_shard_case(name, case, problems)
        seen.add((case.get("path"), case.get("layer"), case.get("dtype"), case.get("ratio")))
    for path in DENSE_PATHS:
        for layer in FUSED_LAYERS:
            for dtype in DTYPES:
                for ratio in FUSED_RATIOS:
                    if (path, layer, dtype, ratio) not in seen:
                        problems.append(f"{name}: no case for {path} {layer} {dtype} ratio {ratio}")
    for path in MOE_PATHS:
        for dtype in DTYPES:
            if not any(k[0] == path and k[1] == "moe_w13" and k[2] == dtype for k in seen):
                problems.append(f"{name}: no w1 != w3 case for {path} {dtype}")


def check_conformance(data: Mapping[str, Any], problems: list[str]) -> None:
    """Upstream's NVFP4 Marlin tests on the series: schema, listed edits, required passes."""
    name = "conformance.json"
    _check_meta(name, data, problems)
    upstream = data.get("upstream")
    if not isinstance(upstream, Mapping) or not all(
        upstream.get(k) for k in ("version", "wheel", "sha256")
    ):
        problems.append(f"{name}: 'upstream' must name version, wheel and sha256")
    edits = data.get("edits")
    if not isinstance(edits, list) or not edits:
        problems.append(f"{name}: 'edits' must list every mechanical edit (file, line, kind)")
    else:
        for i, edit in enumerate(edits):
            ok = isinstance(edit, Mapping) and all(edit.get(k) for k in ("file", "line", "kind"))
            if not ok:
                problems.append(f"{name}: edits[{i}] needs file, line and kind")
    tests = data.get("tests")
    if not isinstance(tests, list) or not tests:
        problems.append(f"{name}: 'tests' must be a non-empty list (one record per test)")
        return
    passed: dict[str, list[bool]] = {}
    for i, test in enumerate(tests):
        where = f"{name}: tests[{i}]"
        if not isinstance(test, Mapping) or not isinstance(test.get("id"), str):
            problems.append(f"{where}: needs an id")
            continue
        status = test.get("status")
        if status not in CONFORMANCE_STATUSES:
            problems.append(f"{where} {test['id']}: status {status!r} is not one of the three")
            continue
        if status == "not-applicable" and not test.get("needs"):
            problems.append(f"{where} {test['id']}: not-applicable without the feature it needs")
        base = test["id"].rsplit("::", 1)[-1].split("[", 1)[0]
        passed.setdefault(base, []).append(status == "pass")
    for required in CONFORMANCE_REQUIRED:
        results = passed.get(required)
        if not results:
            problems.append(f"{name}: upstream test {required} was not run")
        elif not all(results):
            problems.append(f"{name}: upstream test {required} does not pass on the series")


def check_turing(
    data: Mapping[str, Any] | None, numerics: Mapping[str, Any] | None, problems: list[str]
) -> None:
    name = "turing_ptx.json"
    status = (numerics or {}).get("turing_ptx", {})
    if data is None:
        if not (isinstance(status, Mapping) and status.get("status") == "not run"):
            problems.append(
                f"{name}: missing, and numerics.json does not say "
                "turing_ptx: {status: 'not run', reason: ...}"
            )
        elif not status.get("reason"):
            problems.append("numerics.json: turing_ptx says 'not run' without a reason")
        return
    _check_meta(name, data, problems)
    if data.get("arch") != "compute_75":
        problems.append(f"{name}: top-level arch must be 'compute_75'")
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: 'cases' must be a non-empty list")
        return
    good = []
    for i, case in enumerate(cases):
        if isinstance(case, Mapping) and _check_case(name, i, case, problems, arch="compute_75"):
            good.append(case)
            if case["dtype"] != "float16":
                problems.append(f"{name}: {_label(case)}: SM75 runs fp16 only")
            _check_patched_case(name, case, problems)
    for group, paths in (("dense", DENSE_PATHS), ("moe", MOE_PATHS)):
        if not any(c["path"] in paths for c in good):
            problems.append(f"{name}: no {group} case")


def check_bench(data: Mapping[str, Any], problems: list[str]) -> None:
    name = "bench.json"
    _check_meta(name, data, problems)
    if not _is_num(data.get("copy_bandwidth_tb_s")):
        problems.append(f"{name}: missing copy_bandwidth_tb_s (the roofline's bandwidth)")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        problems.append(f"{name}: 'rows' must be a non-empty list")
        return
    ms_by_shape: dict[str, set[int]] = {}
    for i, row in enumerate(rows):
        where = f"{name}: rows[{i}]"
        if not isinstance(row, Mapping):
            problems.append(f"{where}: not an object")
            continue
        shape = row.get("shape")
        if not isinstance(shape, str) or not shape:
            problems.append(f"{where}: shape must be a non-empty string")
            continue
        for field in ("m", "n", "k"):
            value = row.get(field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{where} ({shape}): {field} must be a positive integer")
        is_dense = row.get("kind", "dense") == "dense"
        for field in ("fp4_us", "bf16_us", "int4_us", "roofline_us"):
            value = row.get(field, "absent")
            if value is None and not is_dense and field in ("bf16_us", "int4_us"):
                if not row.get("note"):
                    problems.append(f"{where} ({shape}): {field} is null without a note")
            elif not (_is_num(value) and value > 0):
                problems.append(f"{where} ({shape} m={row.get('m')}): {field} missing or <= 0")
        up = row.get("upstream_fp4_us", "absent")
        if up == "absent":
            problems.append(f"{where} ({shape}): missing upstream_fp4_us (null + note if not run)")
        elif up is None and not (row.get("note") or data.get("upstream_note")):
            problems.append(f"{where} ({shape}): upstream_fp4_us is null without a note")
        elif up is not None and not (_is_num(up) and up > 0):
            problems.append(f"{where} ({shape}): upstream_fp4_us must be a positive number")
        fp4, roof = row.get("fp4_us"), row.get("roofline_us")
        if _is_num(fp4) and _is_num(roof) and fp4 < 0.98 * roof:
            problems.append(
                f"{where} ({shape} m={row.get('m')}): fp4_us {fp4:.2f} beats the "
                f"HBM roofline {roof:.2f}: weights were served from L2"
            )
        if isinstance(row.get("m"), int) and row.get("kind", "dense") == "dense":
            ms_by_shape.setdefault(shape, set()).add(row["m"])
    for shape, ms in ms_by_shape.items():
        missing = sorted(set(BENCH_MS) - ms)
        if missing:
            problems.append(f"{name}: shape {shape} lacks M in {missing}")


def _load(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        problems.append(f"{path.name}: not valid JSON: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name}: top level must be an object")
        return None
    return data


REPORT_FILES = ("numerics.json", "bench.json", "turing_ptx.json", "conformance.json")


def check_report_dir(report_dir: Path) -> list[str]:
    """All problems found in a report directory (empty list: the reports pass)."""
    problems: list[str] = []
    numerics = _load(report_dir / "numerics.json", problems)
    if numerics is None and not (report_dir / "numerics.json").is_file():
        problems.append(f"numerics.json: not found in {report_dir}")
    elif numerics is not None:
        check_numerics(numerics, problems)
    bench = _load(report_dir / "bench.json", problems)
    if bench is None and not (report_dir / "bench.json").is_file():
        problems.append(f"bench.json: not found in {report_dir}")
    elif bench is not None:
        check_bench(bench, problems)
    turing_path = report_dir / "turing_ptx.json"
    turing = _load(turing_path, problems)
    if turing is not None or not turing_path.is_file():
        check_turing(turing, numerics, problems)
    conformance = _load(report_dir / "conformance.json", problems)
    if conformance is None and not (report_dir / "conformance.json").is_file():
        problems.append(
            f"conformance.json: not found in {report_dir} (tests/gpu/run_conformance.py)"
        )
    elif conformance is not None:
        check_conformance(conformance, problems)
    return problems


def summarize(problems: Iterable[str]) -> str:
    return "\n".join(f"  - {p}" for p in problems)


def _cmd_check(args: argparse.Namespace) -> int:
    report_dir = Path(args.dir)
    if not report_dir.is_dir():
        raise SeriesError(
            f"report directory {report_dir} does not exist",
            hint="run scripts/gpu-proof.sh on a GPU machine and commit its reports/h200 output",
        )
    if args.allow_none and not any((report_dir / name).exists() for name in REPORT_FILES):
        # Nothing committed yet is a state of its own (GPU proof pending); any report that
        # is committed must pass every check below.
        print(f"no GPU reports in {report_dir} yet: nothing to check (GPU proof pending)")
        return 0
    problems = check_report_dir(report_dir)
    if problems:
        print(f"{len(problems)} problem(s) in {report_dir}:\n{summarize(problems)}")
        raise SeriesError(
            f"GPU reports in {report_dir} fail the schema/threshold checks",
            hint="rerun scripts/gpu-proof.sh with the current series and commit the new reports",
        )
    print(f"reports in {report_dir}: OK")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "check-reports",
        help="check reports/h200 (numerics, turing_ptx, conformance, bench) for schema and "
        "thresholds",
    )
    p.add_argument("--dir", default=str(DEFAULT_REPORT_DIR), help="report directory")
    p.add_argument(
        "--allow-none",
        action="store_true",
        help="pass when the directory holds none of the report files yet (CI before the "
        "first GPU proof); any report that is present is still checked in full",
    )
    p.set_defaults(func=_cmd_check)
