"""GPU proof reports: the metadata every report carries, and the CI check of committed reports.

The GPU tests (tests/gpu), the conformance run (tests/gpu/run_conformance.py) and the benchmark
(bench/bench_fp4_marlin.py) write ``numerics.json``, ``turing_ptx.json``, ``conformance.json``
and ``bench.json``, and serve/e2e.py writes ``e2e.json`` (real checkpoints through SGLang's
engine); CI cannot rerun them, so ``python -m fp4series check-reports`` checks their schema and
thresholds: every patched case within ``PATCHED_MAX_REL_L2``, every unpatched-template
repro case failing (above ``UNPATCHED_MIN_REL_L2``), the tracing checks passing, fused shards
with different global scales served within the gates (each shard too) or refused with a message
naming the scales, tensor- and expert-parallel layers (numerics.json ``tensor_parallel``, where
present) served within the gates with padded and unpadded shapes, upstream's dense and
capability NVFP4 Marlin tests passing, and the command, series revision and pin recorded.
``e2e.json`` is checked only where it exists: every format x model x dtype served with
perplexity within ``E2E_PPL_REL`` of its dequantized reference and teacher-forced top-1
agreement of at least ``E2E_TOP1_MIN``, the HTTP requests answered, the bare pin refusing,
speed and memory rows side by side with the reference. Its ``parallel`` records (the
same checkpoints on two GPUs, ``--tp 2`` and for the MoE ``--ep 2``) are checked where present:
perplexity within ``E2E_PARALLEL_PPL_REL`` of the one-GPU NVFP4 run and top-1 agreement with it
of at least ``E2E_PARALLEL_TOP1_MIN``; where absent they are reported as pending, not as a failure.
The kernel rounds under ``kernels/`` (issue 23) are checked by ``fp4series.kernel_reports``.

A maintained series line keeps its reports in ``reports/h200/<V>/`` (``check-reports --line V``,
found from the directory's name too), made by ``scripts/gpu-proof.sh --line V``: numerics,
turing_ptx and conformance, every report naming the line's release as its ``pin`` and ``line``.
The gates are the pin's, except what shows the bugs: instead of the pin's templates, the bare
release the line is made on (``templates: upstream``), whose dense layers with a bias as large as
the output must be off by ``UPSTREAM_BIAS_MIN_REL_L2`` or more (the bias added in Marlin's
permuted order); its other cases (fused shards too) are recorded beside the line, not gated.
"""

from __future__ import annotations

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
# A line's bare release, dense with a bias the size of the output (bias_scale >= 1): the bias
# added in Marlin's permuted order gives ~1 (tests/gpu/test_kernel_repro.py agrees).
UPSTREAM_BIAS_MIN_REL_L2 = 0.5
STRONG_BIAS_SCALE = 1.0
LINE_ENV = "FP4SERIES_LINE"  # set where a line's reports are made (scripts/gpu-proof.sh --line)
DENSE_PATHS = ("modelopt-dense", "ct-dense")
MOE_PATHS = ("modelopt-moe", "ct-moe")
PATHS = DENSE_PATHS + MOE_PATHS
DTYPES = ("float16", "bfloat16")
TRACING_CHECKS = ("cuda_graph", "torch_compile")
# Where a dense case ran patch 13's dequant + cuBLAS path, the tracing checks at its M
PREFILL_TRACING_CHECKS = ("cuda_graph_m1024", "torch_compile_m1024")
BENCH_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# bench.json's dispatch_path: the GEMM the series' dense linear runs (nvfp4_marlin_prefill); a
# path other than Marlin may not be slower than Marlin in the same run beyond timing noise.
DISPATCH_PATHS = ("marlin", "dequant+cublas")
DISPATCH_SLACK = 1.02
BENCH_DISPATCH_REQUIRED = True
# bench.json's FP8 column (fp8_us: e4m3 through cuBLASLt) on every dense row; null with the
# run's fp8_note where the GPU has no FP8 GEMM (below SM89) or it failed.
BENCH_FP8_REQUIRED = True
META_FIELDS = ("command", "series_revision", "pin", "device", "torch", "date")
REVISION_ENV = "FP4SERIES_SERIES_REVISION"  # JSON, set where the repo has no .git (device)
DEFAULT_REPORT_DIR = Path("reports") / "h200"
# Fused shards with different global scales (tests/gpu/test_fused_shards.py): every dense
# path x layer x ratio x dtype, and MoE with w3 / w1 at every ratio, served, per path x dtype.
FUSED_LAYERS = ("qkv", "gate_up")
FUSED_RATIOS = (2.0, 0.5, 1e-3)
FUSED_OUTCOMES = ("served", "refused")
# Tensor/expert parallel layers (tests/gpu/test_tensor_parallel.py): rank by rank on one GPU,
# combined, against the unsharded fp32 reference. Checked in full where numerics.json has the
# list; required once TENSOR_PARALLEL_REQUIRED is set (after the GPU run that writes it).
TENSOR_PARALLEL_REQUIRED = True
TP_DENSE_LAYERS = ("qkv", "o", "gate_up", "down")
TP_LAYERS = (*TP_DENSE_LAYERS, "moe")
TP_SIZES = (2, 4, 8)
EP_SIZES = (2, 4)
TP_OUTCOMES = ("served", "refused")
# conformance.json: upstream's NVFP4 Marlin tests (fp4series.conformance)
CONFORMANCE_STATUSES = ("pass", "fail", "not-applicable")
CONFORMANCE_REQUIRED = (
    "test_nvfp4_marlin_support_and_scale_transforms_sm80_sm90",
    "test_nvfp4_marlin_dense_matches_dequant_reference",
)
# e2e.json (serve/e2e.py): real checkpoints through SGLang's engine (issue 13)
E2E_FORMATS = ("compressed-tensors", "modelopt")
E2E_MODELS = ("dense", "dense-bias", "moe")
E2E_PPL_REL = 0.01  # |ppl_nvfp4 / ppl_reference - 1|
E2E_TOP1_MIN = 0.98
E2E_MIN_PROMPTS = 8
E2E_MIN_NEW_TOKENS = 128
E2E_DECODE_BATCHES = (1, 8, 32)
E2E_MIN_PREFILL_TOKENS = 1024
# Speed models (random weights, big enough that decode reads weights): NVFP4 beside bf16 and
# FP8 (W8A8) checkpoints of the same model, per format.
E2E_LARGE_MODELS = ("dense-large", "moe-large")  # a full run's
E2E_SPEED_MODELS = (*E2E_LARGE_MODELS, "dense-8b")  # dense-8b: asked for alone (its disk)
E2E_LARGE_DECODE_BATCHES = (1, 8, 32, 128)
E2E_LARGE_PREFILL_TOKENS = (1024, 8192)
# Two GPUs (serve/e2e.py --parallel): the trained checkpoints of both formats in bf16 served with
# tensor parallelism (and the MoE also with expert parallelism), compared with the one-GPU NVFP4
# run of the same checkpoint; decode of the dense speed model beside its one-GPU rate.
E2E_PARALLEL_DTYPE = "bfloat16"
E2E_PARALLEL_RUNS = (  # (model, tp_size, ep_size), for every format
    ("dense", 2, 1),
    ("dense-bias", 2, 1),
    ("moe", 2, 1),
    ("moe", 2, 2),
)
E2E_PARALLEL_PPL_REL = 0.001  # |ppl_nvfp4 / ppl_tp1 - 1|
E2E_PARALLEL_TOP1_MIN = 0.99
E2E_PARALLEL_SPEED_MODEL = "dense-large"
E2E_PARALLEL_SPEED_TP = 2
E2E_PARALLEL_DECODE_BATCHES = (1, 32)
E2E_PARALLEL_PENDING = (
    "parallel records (tp 2, and ep 2 for the MoE) not run yet: they need a CUDA host with 2 "
    "GPUs (serve/gpu-host.sh --parallel)"
)


# --------------------------------------------------------------------------- metadata


def _repo_root() -> Path:
    env = os.environ.get("FP4SERIES_ROOT")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[2]


def series_revision(repo: Path | None = None, line: str | None = None) -> dict[str, str]:
    """``git describe`` of the project and the sha256 of ``patches/series`` + every patch it lists
    (a line's: ``patches/<line>/``).

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
    patches = root / "patches" if line is None else _line_patches(root, line)
    return {"git": git, "series_sha256": series_sha256(patches)}


def _line_patches(root: Path, line: str) -> Path:
    from fp4series.line import resolve_line

    return resolve_line(line, root=root).patches_dir


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


def pin_info(repo: Path | None = None, line: str | None = None) -> dict[str, str]:
    """The pin as upstream.lock records it (tag, version, wheel sha256, commit); for a series
    line, the release it is made on."""
    if line is not None:
        from fp4series.line import resolve_line

        release = resolve_line(line, root=repo or _repo_root()).release
        return {"tag": release.tag, "version": release.version,
                "wheel_sha256": release.sha256, "commit": release.commit}  # fmt: skip
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
    """The fields every report carries (command, series revision, pin, device, torch, date);
    for a line's run (``$FP4SERIES_LINE``) the line, its series and its release as the pin."""
    try:
        import torch

        torch_version = torch.__version__
        if device is None and torch.cuda.is_available():
            device = torch.cuda.get_device_name()
    except ImportError:  # the tooling tests run without torch
        torch_version = "absent"
    line = os.environ.get(LINE_ENV) or None
    meta = {
        "command": command,
        "series_revision": series_revision(line=line),
        "pin": pin_info(line=line),
        "device": device or "none",
        "torch": torch_version,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
    }
    if line:
        meta["line"] = line
    return meta


def json_number(value: float | None) -> float | None:
    """JSON has no inf/NaN: store them as None (the checker treats None as a failed run)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def repo_relative(value: Any, root: Path) -> Any:
    """VALUE with every string naming a path under ROOT made relative to it: a report says
    where things were in the repository, not on the machine it ran on."""
    prefix = str(root).rstrip("/") + "/"
    if isinstance(value, str):
        return value[len(prefix) :] if value.startswith(prefix) else value
    if isinstance(value, Mapping):
        return {k: repo_relative(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [repo_relative(v, root) for v in value]
    return value


def host_paths(value: Any) -> list[str]:
    """Absolute paths into a working tree (``/.../.work/...``) anywhere in VALUE."""
    if isinstance(value, str):
        return [value] if value.startswith("/") and "/.work/" in value else []
    if isinstance(value, Mapping):
        return [p for v in value.values() for p in host_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in host_paths(v)]
    return []


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------- checks


def _is_num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_meta(
    name: str, data: Mapping[str, Any], problems: list[str], line: str | None = None
) -> None:
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
    recorded = data.get("line")
    if line is None and recorded:
        problems.append(f"{name}: a report of the {recorded} line in the pin's report directory")
    elif line is not None:
        if recorded != line:
            problems.append(f"{name}: line is {recorded!r}, expected {line!r} (made with "
                            f"scripts/gpu-proof.sh --line {line}?)")  # fmt: skip
        if isinstance(pin, Mapping) and pin.get("version") != line:
            problems.append(f"{name}: pin.version {pin.get('version')!r} is not the line's "
                            f"release {line}")  # fmt: skip


def _repro_label(line: str | None) -> str:
    """What a case's ``templates`` is when it is the repro: the pin's templates, or the bare
    release a line is made on."""
    return "unpatched" if line is None else "upstream"


def _check_case(
    name: str,
    i: int,
    case: Mapping[str, Any],
    problems: list[str],
    *,
    arch: str | None = None,
    line: str | None = None,
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
    if case.get("templates") not in ("patched", _repro_label(line)):
        problems.append(f"{where}: templates must be 'patched' or '{_repro_label(line)}'")
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


def _strong_bias(case: Mapping[str, Any]) -> bool:
    scale = case.get("bias_scale")
    return case.get("bias") is True and _is_num(scale) and scale >= STRONG_BIAS_SCALE


def _check_upstream_repro(
    name: str, patched: list[Mapping[str, Any]], upstream: list[Mapping[str, Any]],
    problems: list[str],
) -> None:  # fmt: skip
    """A line's bare release: its strong-bias dense cases fail (the line's bias fix), for
    every dense path and dtype, beside the line's own strong-bias cases."""
    for case in upstream:
        if not _strong_bias(case):
            continue  # recorded beside the line, not gated
        value = case["rel_l2"]
        if value is None and case.get("nonfinite_outputs"):
            continue  # garbage: fails as expected
        if not _is_num(value):
            problems.append(f"{name}: {_label(case)}: repro rel_l2 is {value!r} (run failed?)")
        elif value < UPSTREAM_BIAS_MIN_REL_L2:
            problems.append(
                f"{name}: {_label(case)}: the bare release should add the bias wrong, but "
                f"rel_l2 {value:.3e} < {UPSTREAM_BIAS_MIN_REL_L2}"
            )
    for path in DENSE_PATHS:
        for dtype in DTYPES:
            for what, group in (("bare-release", upstream), ("patched", patched)):
                if not any(c["path"] == path and c["dtype"] == dtype and _strong_bias(c)
                           for c in group):  # fmt: skip
                    problems.append(f"{name}: no {what} dense case with a bias the size of the "
                                    f"output for {path} {dtype}")  # fmt: skip


def check_numerics(data: Mapping[str, Any], problems: list[str], line: str | None = None) -> None:
    name = "numerics.json"
    _check_meta(name, data, problems, line)
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: 'cases' must be a non-empty list")
        return
    patched: list[Mapping[str, Any]] = []
    unpatched: list[Mapping[str, Any]] = []
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping) or not _check_case(name, i, case, problems, line=line):
            continue
        (patched if case["templates"] == "patched" else unpatched).append(case)
    for case in patched:
        _check_patched_case(name, case, problems)
    if line is not None:
        _check_upstream_repro(name, patched, unpatched, problems)
    for case in unpatched if line is None else ():
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
        if line is None and not any(c["path"] in paths for c in unpatched):
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
        for entry in tracing:  # further checks (e.g. "cuda_graph_m1024"): passed where recorded
            named = isinstance(entry, Mapping) and entry.get("name") in TRACING_CHECKS
            if isinstance(entry, Mapping) and not named and entry.get("passed") is not True:
                problems.append(f"{name}: tracing check {entry.get('name')!r} did not pass")
    for record in data.get("prefill_dequant") or ():  # patch 13's kernel, bit for bit
        if not (isinstance(record, Mapping) and record.get("bit_equal") is True):
            problems.append(f"{name}: prefill dequant not bit-equal to the checkpoint: {record}")
    if not data.get("marlin_epilogue"):  # patch 14's kernel, bit for bit
        problems.append(f"{name}: no marlin_epilogue records (the kernel after Marlin)")
    for record in data.get("marlin_epilogue") or ():
        if not (isinstance(record, Mapping) and record.get("bit_equal") is True):
            problems.append(f"{name}: Marlin epilogue not bit-equal to the float32 ops: {record}")
    if any(c.get("gemm") == "dequant+cublas" for c in patched):  # patch 13's path ran: its proof
        if not data.get("prefill_dequant"):
            problems.append(f"{name}: dense cases ran the dequant path, but no prefill_dequant")
        names = {t.get("name") for t in tracing or () if isinstance(t, Mapping)}
        for check in PREFILL_TRACING_CHECKS:
            if check not in names:
                problems.append(f"{name}: dense cases ran the dequant path, but no {check!r}")
    check_fused_shards(data, problems)
    # a line's proof does not run the tensor-parallel suite (yet): checked where present
    check_tensor_parallel(data, problems, required=TENSOR_PARALLEL_REQUIRED and line is None)


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
        if case.get("templates") == "upstream":  # a line's bare release: recorded, not gated
            if case.get("outcome") not in FUSED_OUTCOMES:
                problems.append(f"{name}: {_fused_label(case)} [upstream]: outcome must be one "
                                f"of {FUSED_OUTCOMES}")  # fmt: skip
            continue
        check_fused_shard_case(name, case, problems)
        seen.add((case.get("path"), case.get("layer"), case.get("dtype"), case.get("ratio")))
    for path in DENSE_PATHS:
        for layer in FUSED_LAYERS:
            for dtype in DTYPES:
                for ratio in FUSED_RATIOS:
                    if (path, layer, dtype, ratio) not in seen:
                        problems.append(f"{name}: no case for {path} {layer} {dtype} ratio {ratio}")
    served = {
        (c.get("path"), c.get("dtype"), c.get("ratio"))
        for c in cases
        if isinstance(c, Mapping)
        and c.get("layer") == "moe_w13"
        and c.get("outcome") == "served"
        and c.get("templates") != "upstream"
    }
    for path in MOE_PATHS:
        for dtype in DTYPES:
            for ratio in FUSED_RATIOS:  # w3 / w1: any ratio is served exactly (patch 10)
                if (path, dtype, ratio) not in served:
                    problems.append(f"{name}: no served w1 != w3 case for {path} {dtype} "
                                    f"w3/w1 {ratio}")  # fmt: skip


def _tp_label(case: Mapping[str, Any]) -> str:
    size = f"ep={case.get('ep_size')}" if "ep_size" in case else f"tp={case.get('tp_size')}"
    return (
        f"{case.get('path')} {case.get('model', '?')} {case.get('layer')} {size} "
        f"{case.get('dtype')} n={case.get('n')} k={case.get('k')} m={case.get('m')}"
    )


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_tensor_parallel_case(name: str, case: Mapping[str, Any], problems: list[str]) -> bool:
    """One tensor/expert-parallel case: schema, served (a refusal is a failure), within the gates.

    True if its keys are valid (it counts for coverage)."""
    where = f"{name}: {_tp_label(case)}"
    path, layer = case.get("path"), case.get("layer")
    ok = True
    if path not in PATHS or case.get("dtype") not in DTYPES or layer not in TP_LAYERS:
        problems.append(f"{where}: path/dtype/layer must be one of {PATHS} / {DTYPES} / "
                        f"{TP_LAYERS}")  # fmt: skip
        return False
    if (layer == "moe") != (path in MOE_PATHS):
        problems.append(f"{where}: layer {layer!r} does not go with path {path!r}")
        ok = False
    sizes = [f for f in ("tp_size", "ep_size") if f in case]
    if len(sizes) != 1:
        problems.append(f"{where}: needs exactly one of tp_size and ep_size")
        ok = False
    elif sizes[0] == "ep_size" and (layer != "moe" or case["ep_size"] not in EP_SIZES):
        problems.append(f"{where}: ep_size must be one of {EP_SIZES}, for MoE layers only")
        ok = False
    elif sizes[0] == "tp_size" and case["tp_size"] not in TP_SIZES:
        problems.append(f"{where}: tp_size must be one of {TP_SIZES}")
        ok = False
    for field in ("n", "k"):
        if not _positive_int(case.get(field)):
            problems.append(f"{where}: {field} must be a positive integer")
            ok = False
    if not isinstance(case.get("padded"), bool):
        problems.append(f"{where}: padded must be true/false")
        ok = False
    if not isinstance(case.get("model"), str) or not case.get("model"):
        problems.append(f"{where}: model must name the model whose shapes were run")
        ok = False
    outcome = case.get("outcome")
    if outcome not in TP_OUTCOMES:
        problems.append(f"{where}: outcome must be one of {TP_OUTCOMES}, got {outcome!r}")
        return False
    if outcome == "refused":
        error = case.get("error")
        detail = error if isinstance(error, str) and error else "(no error recorded)"
        problems.append(f"{where}: refused at load, every case must be served: {detail[:200]}")
        return ok
    if not _positive_int(case.get("m")):
        problems.append(f"{where}: m must be a positive integer")
        ok = False
    value, limit = case.get("rel_l2", "absent"), max_rel_l2(case, "rel_l2")
    if not _is_num(value):
        problems.append(f"{where}: rel_l2 is {value!r} (run failed?)")
    elif value > limit:
        problems.append(f"{where}: rel_l2 {value:.3e} > {limit:.1e}")
    return ok


def check_tensor_parallel(
    data: Mapping[str, Any], problems: list[str], required: bool = True
) -> None:
    """numerics.json ``tensor_parallel``: every case served within the gates; per path and
    dtype a padded and an unpadded TP case, a column and a row layer (dense), EP 2 and 4 (MoE)."""
    name = "numerics.json tensor_parallel"
    cases = data.get("tensor_parallel")
    if cases is None and not required:
        return
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: missing (the cases of tests/gpu/test_tensor_parallel.py)")
        return
    served: list[Mapping[str, Any]] = []
    for case in cases:
        if not isinstance(case, Mapping):
            problems.append(f"{name}: every case must be an object")
        elif check_tensor_parallel_case(name, case, problems) and case["outcome"] == "served":
            served.append(case)
    for path in PATHS:
        for dtype in DTYPES:
            mine = [c for c in served if c["path"] == path and c["dtype"] == dtype]
            tp = [c for c in mine if "tp_size" in c]
            where = f"{name}: {path} {dtype}"
            for padded, what in ((True, "a padded"), (False, "an unpadded")):
                if not any(c["padded"] is padded for c in tp):
                    problems.append(f"{where}: no served tensor-parallel case with {what} shape")
            if path in DENSE_PATHS:
                if not any(c["layer"] in ("qkv", "gate_up") for c in tp):
                    problems.append(f"{where}: no column-parallel layer (qkv or gate_up)")
                if not any(c["layer"] in ("o", "down") for c in tp):
                    problems.append(f"{where}: no row-parallel layer (o or down)")
            else:
                for ep in EP_SIZES:
                    if not any(c.get("ep_size") == ep for c in mine):
                        problems.append(f"{where}: no served expert-parallel case with ep {ep}")


def check_conformance(
    data: Mapping[str, Any], problems: list[str], line: str | None = None
) -> None:
    """Upstream's NVFP4 Marlin tests on the series: schema, listed edits, required passes (on a
    line: every test its conformance profile requires, fp4series.conformance)."""
    name = "conformance.json"
    _check_meta(name, data, problems, line)
    required = CONFORMANCE_REQUIRED
    if line is not None:
        from fp4series.conformance import profile

        required = profile(line).required
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
    for test in required:
        results = passed.get(test)
        if not results:
            problems.append(f"{name}: upstream test {test} was not run")
        elif not all(results):
            problems.append(f"{name}: upstream test {test} does not pass on the series")


def check_turing(
    data: Mapping[str, Any] | None,
    numerics: Mapping[str, Any] | None,
    problems: list[str],
    line: str | None = None,
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
    _check_meta(name, data, problems, line)
    if data.get("arch") != "compute_75":
        problems.append(f"{name}: top-level arch must be 'compute_75'")
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: 'cases' must be a non-empty list")
        return
    good = []
    for i, case in enumerate(cases):
        if isinstance(case, Mapping) and _check_case(
            name, i, case, problems, arch="compute_75", line=line
        ):
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
        if BENCH_DISPATCH_REQUIRED or "dispatch_us" in row:
            _check_dispatch(where, shape, row, problems)
        if is_dense and (BENCH_FP8_REQUIRED or "fp8_us" in row):
            fp8 = row.get("fp8_us", "absent")
            if fp8 == "absent":
                problems.append(f"{where} ({shape}): missing fp8_us (null + fp8_note if not run)")
            elif fp8 is None and not data.get("fp8_note"):
                problems.append(f"{where} ({shape}): fp8_us is null without the run's fp8_note")
            elif fp8 is not None and not (_is_num(fp8) and fp8 > 0):
                problems.append(f"{where} ({shape}): fp8_us must be a positive number or null")
        for field in ("epilogue_us", "epilogue_unfused_us"):  # where the run timed them
            value = row.get(field)
            if value is not None and not (_is_num(value) and value > 0):
                problems.append(f"{where} ({shape}): {field} must be a positive number or null")
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


def _check_dispatch(where: str, shape: str, row: Mapping[str, Any], problems: list[str]) -> None:
    """The series' linear as served beside FP4 Marlin: its time and path, and where it leaves
    Marlin, not slower than Marlin in the same run (its crossovers were measured)."""
    label = f"{where} ({shape} m={row.get('m')})"
    dispatch, fp4 = row.get("dispatch_us"), row.get("fp4_us")
    if not (_is_num(dispatch) and dispatch > 0):
        problems.append(f"{label}: dispatch_us missing or <= 0")
        return
    dequant = row.get("dequant_us")
    if dequant is not None and not (_is_num(dequant) and dequant > 0):
        problems.append(f"{label}: dequant_us must be a positive number or null")
    path = row.get("dispatch_path")
    if path not in DISPATCH_PATHS:
        problems.append(f"{label}: dispatch_path {path!r} is not one of {DISPATCH_PATHS}")
    elif path != "marlin" and _is_num(fp4) and dispatch > fp4 * DISPATCH_SLACK:
        problems.append(
            f"{label}: the dispatch ({path}, {dispatch:.1f} us) is slower than FP4 Marlin "
            f"({fp4:.1f} us): move its crossover"
        )


def _positive(value: object) -> bool:
    return _is_num(value) and value > 0  # type: ignore[operator]


def _brief(error: object) -> str:
    """A unit's error on one line: what failed, without the log tail serve/e2e.py appends."""
    head = str(error).split("--- log tail:", 1)[0].strip().splitlines()
    return " / ".join(head)[:300]


def _e2e_key(row: Mapping[str, Any], *fields: str) -> str:
    return " ".join(str(row.get(f)) for f in fields)


def check_e2e_case(name: str, case: Mapping[str, Any], problems: list[str]) -> bool:
    """One served checkpoint: schema and the two accuracy gates; True if its keys are valid."""
    where = f"{name}: {_e2e_key(case, 'format', 'model', 'dtype')}"
    keys_ok = (
        case.get("format") in E2E_FORMATS
        and case.get("model") in E2E_MODELS
        and case.get("dtype") in DTYPES
    )
    if not keys_ok:
        problems.append(
            f"{where}: format/model/dtype must be one of {E2E_FORMATS} / {E2E_MODELS} / {DTYPES}"
        )
    if case.get("error"):
        problems.append(f"{where}: failed: {_brief(case['error'])}")
    nv, ref, top1 = case.get("ppl_nvfp4"), case.get("ppl_reference"), case.get("top1_agreement")
    for field, value in (("ppl_nvfp4", nv), ("ppl_reference", ref), ("top1_agreement", top1)):
        if not _positive(value):
            problems.append(f"{where}: {field} is {value!r} (run failed?)")
    if _positive(nv) and _positive(ref):
        rel = abs(nv / ref - 1.0)
        if rel > E2E_PPL_REL:
            problems.append(
                f"{where}: perplexity {nv:.4f} vs reference {ref:.4f}: {rel:.2%} apart "
                f"(gate {E2E_PPL_REL:.0%})"
            )
    if _is_num(top1) and top1 < E2E_TOP1_MIN:
        problems.append(f"{where}: top-1 agreement {top1:.4f} < {E2E_TOP1_MIN}")
    for field, least in (
        ("tokens_scored", 1),
        ("agreement_prompts", E2E_MIN_PROMPTS),
        ("agreement_new_tokens", E2E_MIN_NEW_TOKENS),
    ):
        value = case.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            problems.append(f"{where}: {field} must be an integer >= {least}, got {value!r}")
    return keys_ok


def _check_e2e_http(name: str, http: object, problems: list[str], *, marlin: bool) -> None:
    if not isinstance(http, Mapping):
        problems.append(f"{name}: missing (an OpenAI-client request to sglang.launch_server)")
        return
    if http.get("ok") is not True:
        problems.append(f"{name}: the server did not answer: {_brief(http.get('error'))}")
    request = http.get("request")
    if not isinstance(request, Mapping) or "/v1/completions" not in str(request.get("endpoint")):
        problems.append(f"{name}: 'request' must record the /v1/completions request it made")
    elif request.get("temperature") != 0:
        problems.append(f"{name}: the request must be greedy (temperature 0)")
    if marlin and http.get("fp4_gemm_backend") != "marlin":
        problems.append(f"{name}: must be the run with --fp4-gemm-backend marlin given")


def _check_e2e_run(name: str, data: Mapping[str, Any], problems: list[str]) -> None:
    """What every e2e report records of its run: metadata, its commands, the versions."""
    _check_meta(name, data, problems)
    commands = data.get("commands")
    if (
        not isinstance(commands, list)
        or not commands
        or not all(isinstance(c, str) and c for c in commands)
    ):
        problems.append(f"{name}: 'commands' must list every command the run made")
    versions = data.get("versions")
    if not isinstance(versions, Mapping) or not all(versions.get(k) for k in ("sglang", "torch")):
        problems.append(f"{name}: 'versions' must name at least sglang and torch")


def e2e_speed_models_ran(units: object) -> list[str]:
    """The speed models whose units an e2e report ran, when it ran speed units alone
    (serve/gpu-host.sh --speed); empty when any other unit ran (a full run) or none did."""
    ran = [str(u) for u, rec in (units.items() if isinstance(units, Mapping) else [])
           if isinstance(rec, Mapping) and rec.get("status")]  # fmt: skip
    if not ran or not all(u.startswith("speed/") for u in ran):
        return []
    return sorted({u.split("/")[1] for u in ran})


def check_e2e(
    data: Mapping[str, Any], problems: list[str], pending: list[str] | None = None
) -> None:
    """e2e.json: the patched pin serving real NVFP4 checkpoints through its engine (issue 13);
    ``pending`` gets what the report does not hold yet and is no failure (the two-GPU run)."""
    name = "e2e.json"
    _check_e2e_run(name, data, problems)
    cases = data.get("cases")
    seen: dict[tuple[Any, ...], int] = {}
    if not isinstance(cases, list) or not cases:
        problems.append(f"{name}: 'cases' must be a non-empty list")
        cases = []
    for case in cases:
        if not isinstance(case, Mapping):
            problems.append(f"{name}: every case must be an object")
        elif check_e2e_case(name, case, problems):
            key = (case["format"], case["model"], case["dtype"])
            seen[key] = seen.get(key, 0) + 1
    for fmt in E2E_FORMATS:
        for model in E2E_MODELS:
            for dtype in DTYPES:
                count = seen.get((fmt, model, dtype), 0)
                if count != 1:
                    what = "no case" if count == 0 else f"{count} cases"
                    problems.append(f"{name}: {what} for {fmt} {model} {dtype}")
    unquantized = data.get("unquantized")
    rows = unquantized if isinstance(unquantized, list) else []
    for model in E2E_MODELS:
        for dtype in DTYPES:
            if not any(
                isinstance(r, Mapping) and r.get("model") == model and r.get("dtype") == dtype
                and _positive(r.get("ppl"))
                for r in rows
            ):  # fmt: skip
                problems.append(f"{name}: no unquantized (bf16 checkpoint) perplexity for "
                                f"{model} {dtype}")  # fmt: skip
    _check_e2e_http(f"{name} http", data.get("http"), problems, marlin=False)
    _check_e2e_http(f"{name} http_marlin", data.get("http_marlin"), problems, marlin=True)
    neg = data.get("negative_control")
    if not isinstance(neg, Mapping):
        problems.append(f"{name}: missing 'negative_control' (the bare pin on the same checkpoint)")
    else:
        if neg.get("refused") is not True:
            problems.append(f"{name}: negative_control: the bare pin did not refuse the checkpoint")
        if "capability" not in str(neg.get("message", "")).lower():
            problems.append(f"{name}: negative_control: no minimum-capability message recorded")
        if neg.get("bare") is not True:
            problems.append(f"{name}: negative_control: not run on the bare pin (bare != true)")
    _check_e2e_speed(name, data.get("speed"), problems)
    _check_e2e_memory(name, data.get("memory"), problems)
    units = data.get("units") if isinstance(data.get("units"), Mapping) else {}
    if data.get("speed_large") is not None or any(str(u).startswith("speed/") for u in units):
        _check_e2e_large(name, data.get("speed_large"), data.get("memory_large"), problems)
    if data.get("parallel") is not None or any(str(u).startswith("parallel/") for u in units):
        _check_e2e_parallel(name, data.get("parallel"), data.get("parallel_speed"), problems)
    elif pending is not None:
        pending.append(f"{name}: {E2E_PARALLEL_PENDING}")


# serve/gpu-host.sh --speed: the speed models' units alone, rerun after the series' GEMM paths
# changed; beside the full e2e.json, whose other units it leaves pending. Every folder whose
# name starts so (e2e-speed/, e2e-speed-8b/) holds one such run.
E2E_SPEED_RERUN = "e2e-speed"


def check_e2e_speed_rerun(
    data: Mapping[str, Any], problems: list[str], folder: str = E2E_SPEED_RERUN
) -> None:
    """e2e-speed*/e2e.json: every speed unit of the models it ran done, and those models' rows
    and weight memory as the full report has them; the units it did not run (the trained
    models', a speed model not asked for) are no failure there."""
    name = f"{folder}/e2e.json"
    _check_e2e_run(name, data, problems)
    units = data.get("units") if isinstance(data.get("units"), Mapping) else {}
    ran = e2e_speed_models_ran(units)
    if not ran:
        problems.append(f"{name}: no speed/ unit ran, or other units did too (serve/gpu-host.sh "
                        "--speed runs the speed units alone)")  # fmt: skip
    for unit, rec in sorted(units.items()):
        kind, model = (str(unit).split("/") + [""])[:2]
        status = rec.get("status") if isinstance(rec, Mapping) else None
        if kind == "speed" and model in ran and status != "done":
            problems.append(f"{name}: unit {unit} is {status!r}, not done")
    _check_e2e_large(name, data.get("speed_large"), data.get("memory_large"), problems, ran)


def check_e2e_parallel_record(name: str, rec: Mapping[str, Any], problems: list[str]) -> bool:
    """One checkpoint on two GPUs against its one-GPU NVFP4 run; True if its keys are valid."""
    key = _e2e_key(rec, "format", "model", "dtype")
    where = f"{name}: parallel {key} tp {rec.get('tp_size')} ep {rec.get('ep_size')}"
    runs = {(m, tp, ep) for m, tp, ep in E2E_PARALLEL_RUNS}
    keys_ok = (
        rec.get("format") in E2E_FORMATS
        and rec.get("dtype") == E2E_PARALLEL_DTYPE
        and (rec.get("model"), rec.get("tp_size"), rec.get("ep_size")) in runs
    )
    if not keys_ok:
        problems.append(
            f"{where}: format must be one of {E2E_FORMATS}, dtype {E2E_PARALLEL_DTYPE}, "
            f"(model, tp_size, ep_size) one of {sorted(runs)}"
        )
    if rec.get("error"):
        problems.append(f"{where}: failed: {_brief(rec['error'])}")
    nv, tp1, top1 = rec.get("ppl_nvfp4"), rec.get("ppl_tp1"), rec.get("top1_agreement")
    for field, value in (("ppl_nvfp4", nv), ("ppl_tp1", tp1), ("top1_agreement", top1)):
        if not _positive(value):
            problems.append(f"{where}: {field} is {value!r} (run failed?)")
    if _positive(nv) and _positive(tp1):
        rel = abs(nv / tp1 - 1.0)
        if rel > E2E_PARALLEL_PPL_REL:
            problems.append(
                f"{where}: perplexity {nv:.4f} vs one GPU {tp1:.4f}: {rel:.3%} apart "
                f"(gate {E2E_PARALLEL_PPL_REL:.1%})"
            )
    if _is_num(top1) and top1 < E2E_PARALLEL_TOP1_MIN:
        problems.append(
            f"{where}: top-1 agreement with one GPU {top1:.4f} < {E2E_PARALLEL_TOP1_MIN}"
        )
    for field, least in (("tokens_scored", 1),
                         ("agreement_tokens", E2E_MIN_PROMPTS * E2E_MIN_NEW_TOKENS)):  # fmt: skip
        value = rec.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            problems.append(f"{where}: {field} must be an integer >= {least}, got {value!r}")
    return keys_ok


def _check_e2e_parallel(name: str, records: object, speed: object, problems: list[str]) -> None:
    """The two-GPU run: every format x (model, tp, ep) of E2E_PARALLEL_RUNS once and within the
    gates; decode of the dense speed model at E2E_PARALLEL_DECODE_BATCHES beside one GPU."""
    if not isinstance(records, list) or not records:
        problems.append(f"{name}: 'parallel' must be a non-empty list (serve/e2e.py --parallel)")
        records = []
    seen: dict[tuple[Any, ...], int] = {}
    for rec in records:
        if not isinstance(rec, Mapping):
            problems.append(f"{name}: every parallel record must be an object")
        elif check_e2e_parallel_record(name, rec, problems):
            key = (rec["format"], rec["model"], rec["tp_size"], rec["ep_size"])
            seen[key] = seen.get(key, 0) + 1
    for fmt in E2E_FORMATS:
        for model, tp, ep in E2E_PARALLEL_RUNS:
            count = seen.get((fmt, model, tp, ep), 0)
            if count != 1:
                what = "no parallel record" if count == 0 else f"{count} parallel records"
                problems.append(f"{name}: {what} for {fmt} {model} tp {tp} ep {ep}")
    rows = [r for r in speed if isinstance(r, Mapping)] if isinstance(speed, list) else []
    for fmt in E2E_FORMATS:
        for batch in E2E_PARALLEL_DECODE_BATCHES:
            where = (f"{name}: parallel_speed {fmt} {E2E_PARALLEL_SPEED_MODEL} tp "
                     f"{E2E_PARALLEL_SPEED_TP} decode batch {batch}")  # fmt: skip
            row = next(
                (r for r in rows
                 if r.get("format") == fmt and r.get("model") == E2E_PARALLEL_SPEED_MODEL
                 and r.get("tp_size") == E2E_PARALLEL_SPEED_TP and r.get("kind") == "decode"
                 and r.get("batch") == batch),
                None,
            )  # fmt: skip
            if row is None:
                problems.append(f"{where}: no row")
                continue
            bad = [f for f in ("tok_s", "tp1_tok_s") if not _positive(row.get(f))]
            if bad:
                problems.append(f"{where}: {', '.join(bad)} missing")


def _check_e2e_large(
    name: str,
    speed: object,
    memory: object,
    problems: list[str],
    models: Iterable[str] = E2E_LARGE_MODELS,
) -> None:
    """The speed models: every format x model has decode and prefill rows with NVFP4, bf16
    and FP8 rates, and weight memory of all three."""
    rows = [r for r in speed if isinstance(r, Mapping)] if isinstance(speed, list) else []
    mem = [r for r in memory if isinstance(r, Mapping)] if isinstance(memory, list) else []
    fields = ("nvfp4_tok_s", "reference_tok_s", "fp8_tok_s")
    for fmt in E2E_FORMATS:
        for model in models:
            where = f"{name}: speed_large {fmt} {model}"
            mine = [r for r in rows if r.get("format") == fmt and r.get("model") == model]
            wanted = [("decode", "batch", b) for b in E2E_LARGE_DECODE_BATCHES]
            wanted += [("prefill", "prompt_tokens", t) for t in E2E_LARGE_PREFILL_TOKENS]
            for kind, key, value in wanted:
                row = next((r for r in mine if r.get("kind") == kind and r.get(key) == value),
                           None)  # fmt: skip
                if row is None:
                    problems.append(f"{where}: no {kind} row for {key} {value}")
                    continue
                bad = [f for f in fields if not _positive(row.get(f))]
                if bad:
                    problems.append(f"{where} {kind} {key} {value}: {', '.join(bad)} missing")
            ok = any(
                r.get("format") == fmt
                and r.get("model") == model
                and all(_positive(r.get(f"{k}_weight_gib")) for k in ("nvfp4", "reference", "fp8"))
                for r in mem
            )
            if not ok:
                problems.append(f"{name}: memory_large: no weight memory (nvfp4, bf16 and fp8) "
                                f"for {fmt} {model}")  # fmt: skip


def _check_e2e_speed(name: str, speed: object, problems: list[str]) -> None:
    if not isinstance(speed, list) or not speed:
        problems.append(f"{name}: 'speed' must be a non-empty list of rows")
        return
    have: dict[tuple[Any, Any], set[Any]] = {}
    for i, row in enumerate(speed):
        if not isinstance(row, Mapping):
            problems.append(f"{name}: speed[{i}] is not an object")
            continue
        where = f"{name}: speed {_e2e_key(row, 'format', 'model', 'dtype', 'kind', 'batch')}"
        for field in ("nvfp4_tok_s", "reference_tok_s"):
            if not _positive(row.get(field)):
                problems.append(f"{where}: {field} is {row.get(field)!r}")
        kind = row.get("kind")
        if kind == "prefill":
            tokens = row.get("prompt_tokens")
            if not isinstance(tokens, int) or tokens < E2E_MIN_PREFILL_TOKENS:
                problems.append(f"{where}: prefill of {tokens!r} tokens (>= "
                                f"{E2E_MIN_PREFILL_TOKENS} needed)")  # fmt: skip
            else:
                have.setdefault((row.get("format"), row.get("model")), set()).add("prefill")
        elif kind == "decode":
            have.setdefault((row.get("format"), row.get("model")), set()).add(row.get("batch"))
        else:
            problems.append(f"{where}: kind must be 'decode' or 'prefill'")
    for fmt in E2E_FORMATS:
        for model in E2E_MODELS:
            missing = [
                str(b)
                for b in (*E2E_DECODE_BATCHES, "prefill")
                if b not in have.get((fmt, model), set())
            ]
            if missing:
                problems.append(f"{name}: speed for {fmt} {model} lacks {', '.join(missing)}")


def _check_e2e_memory(name: str, memory: object, problems: list[str]) -> None:
    rows = memory if isinstance(memory, list) else []
    if not rows:
        problems.append(f"{name}: 'memory' must be a non-empty list of rows")
        return
    for fmt in E2E_FORMATS:
        for model in E2E_MODELS:
            ok = any(
                isinstance(r, Mapping)
                and r.get("format") == fmt
                and r.get("model") == model
                and _positive(r.get("nvfp4_weight_gib"))
                and _positive(r.get("reference_weight_gib"))
                for r in rows
            )
            if not ok:
                problems.append(f"{name}: no weight memory (nvfp4 and reference) for {fmt} {model}")


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
    absolute = host_paths(data)
    if absolute:
        problems.append(
            f"{path.name}: {len(absolute)} absolute path(s) of the machine it ran on, e.g. "
            f"{absolute[0]!r}: write them relative to the repository (report.repo_relative)"
        )
    return data


# Any of these present makes --allow-none check the directory in full; e2e.json itself is
# checked only where it exists (it comes from its own GPU run, serve/e2e.py).
REPORT_FILES = ("numerics.json", "bench.json", "turing_ptx.json", "conformance.json", "e2e.json")


def check_report_dir(
    report_dir: Path, line: str | None = None, pending: list[str] | None = None
) -> list[str]:
    """All problems found in a report directory (empty list: the reports pass); ``line``: the
    series line whose reports these are (None: the pin's); ``pending`` gets the parts a report
    does not hold yet, which are no failure."""
    problems: list[str] = []
    numerics = _load(report_dir / "numerics.json", problems)
    if numerics is None and not (report_dir / "numerics.json").is_file():
        problems.append(f"numerics.json: not found in {report_dir}")
    elif numerics is not None:
        check_numerics(numerics, problems, line)
    bench = _load(report_dir / "bench.json", problems)
    if bench is None and not (report_dir / "bench.json").is_file():
        if line is None:  # a line's benchmark is not part of its proof (yet)
            problems.append(f"bench.json: not found in {report_dir}")
    elif bench is not None:
        check_bench(bench, problems)
    turing_path = report_dir / "turing_ptx.json"
    turing = _load(turing_path, problems)
    if turing is not None or not turing_path.is_file():
        check_turing(turing, numerics, problems, line)
    conformance = _load(report_dir / "conformance.json", problems)
    if conformance is None and not (report_dir / "conformance.json").is_file():
        problems.append(
            f"conformance.json: not found in {report_dir} (tests/gpu/run_conformance.py)"
        )
    elif conformance is not None:
        check_conformance(conformance, problems, line)
    e2e = _load(report_dir / "e2e.json", problems)
    if e2e is not None:
        check_e2e(e2e, problems, pending)
    for folder in sorted(report_dir.glob(f"{E2E_SPEED_RERUN}*/")):
        speed_rerun = _load(folder / "e2e.json", problems)
        if speed_rerun is not None:
            check_e2e_speed_rerun(speed_rerun, problems, folder.name)
    if line is None and (report_dir / "kernels").is_dir():
        from fp4series.kernel_reports import check_kernel_rounds

        check_kernel_rounds(report_dir / "kernels", problems)
    return problems


def summarize(problems: Iterable[str]) -> str:
    return "\n".join(f"  - {p}" for p in problems)


def line_of_report_dir(report_dir: Path, root: Path | None = None) -> str | None:
    """The series line a report directory belongs to: ``reports/h200/<V>`` of a line in
    upstream.lock's ``[[lines]]``; None for the pin's (or any other) directory."""
    from fp4series.lock import load_lock

    root = root or _repo_root()
    try:
        rel = report_dir.resolve().relative_to((root / DEFAULT_REPORT_DIR).resolve())
    except ValueError:
        return None
    if len(rel.parts) != 1:
        return None
    lock = load_lock(root / "upstream.lock")
    return rel.parts[0] if lock.line(rel.parts[0]) is not None else None
