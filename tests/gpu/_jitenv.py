"""Which JIT variant this process builds and runs, and how to build its modules ahead of time.

A variant is (python tree on PYTHONPATH, tvm-ffi cache dir, target arch). The tree decides the
templates: the patched tree, or a copy of it whose ``jit_kernel`` CUDA sources are the pin's
(``FP4SERIES_TEMPLATES=unpatched`` labels such a run). ``FP4SERIES_FORCE_ARCH=compute_75`` makes
every JIT module of the process a compute_75 PTX-only build (no SASS), so that on an SM90 GPU
the driver JIT-compiles the PTX and the ``__CUDA_ARCH__ == 750`` code path runs.

SGLang builds a JIT module on its first call (``cache_once`` + tvm-ffi ``load_inline``); the
``_jit_*_module(dtype)`` factories build without a kernel call, which is what ``warm`` uses.
tvm-ffi caches builds under ``$TVM_FFI_CACHE_DIR`` (default ``~/.cache/tvm-ffi``) keyed by a
hash of the generated source (which holds absolute include paths) and flags.

Usage as a script (one process per variant, run in parallel by scripts/device/gpu_proof.py)::

    python tests/gpu/_jitenv.py warm gptq_marlin:bf16 moe_wna16_marlin:fp16 repack act:bf16
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FORCE_ARCH_ENV = "FP4SERIES_FORCE_ARCH"
TEMPLATES_ENV = "FP4SERIES_TEMPLATES"
SUPPORTED_FORCED_ARCHES = ("compute_75",)
_applied = False


def templates_label() -> str:
    """'patched' (default) or 'unpatched' (the pin's templates under the series' host code)."""
    value = os.environ.get(TEMPLATES_ENV, "patched")
    if value not in ("patched", "unpatched"):
        raise ValueError(f"{TEMPLATES_ENV}={value!r}: expected 'patched' or 'unpatched'")
    return value


def forced_arch() -> str | None:
    """The forced PTX target (``compute_75``) or None for the device's own arch."""
    value = os.environ.get(FORCE_ARCH_ENV, "").strip()
    if not value:
        return None
    if value not in SUPPORTED_FORCED_ARCHES:
        raise ValueError(
            f"{FORCE_ARCH_ENV}={value!r} is not supported; use one of {SUPPORTED_FORCED_ARCHES}"
        )
    return value


def apply_variant() -> None:
    """Install the forced-arch build hooks; call before the first JIT module is built."""
    global _applied
    arch = forced_arch()
    if _applied or arch is None:
        _applied = True
        return
    major, minor = int(arch[-2]), int(arch[-1])
    import tvm_ffi.cpp.extension as tvm_ext
    from sglang.jit_kernel import utils as jit_utils

    jit_utils.get_jit_cuda_arch()  # run the one-time device probe first, then override it
    # -DSGL_CUDA_ARCH=750 for host code, and a distinct tvm-ffi source hash.
    jit_utils._CUDA_ARCH = jit_utils.ArchInfo(major, minor, "")
    # PTX only: code=compute_75 (tvm-ffi would emit code=sm_75, which an SM90 GPU cannot load).
    target = f"-gencode=arch=compute_{major}{minor},code=compute_{major}{minor}"
    tvm_ext._get_cuda_target = lambda: target
    _applied = True


def describe() -> dict[str, object]:
    """What the report records about the variant."""
    import sglang

    return {
        "templates": templates_label(),
        "forced_arch": forced_arch(),
        "sglang_tree": os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))),
        "tvm_ffi_cache_dir": os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi"),
    }


# ----------------------------------------------------------------------------- variant workers
# A JIT variant cannot share a process with another (cache_once module factories), so the repro
# and compute_75 suites run test_marlin_numerics.py as worker processes. conftest starts them
# right after collection so that they overlap the main session; the tests collect the results.

HERE = Path(__file__).resolve().parent
WORKER_TIMEOUT_S = int(os.environ.get("FP4SERIES_WORKER_TIMEOUT", "420"))
_workers: dict[str, tuple[subprocess.Popen[str], Path, Path, float]] = {}


def _default_cache(suffix: str) -> str:
    base = os.environ.get("TVM_FFI_CACHE_DIR", os.path.expanduser("~/.cache/tvm-ffi"))
    return base + suffix


def unpatched_env() -> tuple[dict[str, str] | None, str]:
    """Environment of the repro worker (the pin's templates), or (None, why not)."""
    tree = os.environ.get("FP4SERIES_UNPATCHED_TREE")
    if not tree or not (Path(tree) / "sglang" / "jit_kernel").is_dir():
        return None, (
            "FP4SERIES_UNPATCHED_TREE is not set to a python tree holding sglang/jit_kernel with "
            "the pin's templates (scripts/gpu-proof.sh builds one)"
        )
    import sglang

    patched_root = Path(sglang.__file__).resolve().parents[1]
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in rest if Path(p).resolve() != patched_root]
    return {
        "PYTHONPATH": os.pathsep.join([tree, *rest]),
        TEMPLATES_ENV: "unpatched",
        "TVM_FFI_CACHE_DIR": os.environ.get("FP4SERIES_UNPATCHED_CACHE")
        or _default_cache("-unpatched"),
    }, ""


def turing_enabled() -> tuple[bool, str]:
    """Whether the series claims SM75 (fp16) support, per marlin_utils_fp4's own check."""
    if os.environ.get("FP4SERIES_SKIP_TURING") == "1":
        return False, "FP4SERIES_SKIP_TURING=1 (compute_75 modules not built on this run)"
    import torch

    try:
        from sglang.srt.layers.quantization.marlin_utils_fp4 import check_fp4_marlin_supported
    except ImportError as exc:
        return False, f"marlin_utils_fp4 not importable: {exc}"
    try:
        check_fp4_marlin_supported(torch.float16, capability=(7, 5))
    except ValueError as exc:
        return False, f"the series refuses SM75 with fp16: {exc}"
    return True, ""


def c75_env() -> dict[str, str]:
    return {
        FORCE_ARCH_ENV: "compute_75",
        "TVM_FFI_CACHE_DIR": os.environ.get("FP4SERIES_C75_CACHE") or _default_cache("-c75"),
        "CUDA_MODULE_LOADING": "LAZY",
    }


def start_worker(suite: str, env_updates: dict[str, str]) -> None:
    if suite in _workers:
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"fp4-{suite}-"))
    out, log = tmp / "result.json", tmp / "worker.log"
    cmd = [
        sys.executable,
        str(HERE / "test_marlin_numerics.py"),
        "--worker",
        suite,
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd, env=dict(os.environ, **env_updates), stdout=log.open("w"), stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    _workers[suite] = (proc, out, log, time.time())


def worker_result(suite: str, env_updates: dict[str, str]) -> dict[str, Any]:
    """Wait for (or start) a worker; its JSON result, or AssertionError with its log tail."""
    start_worker(suite, env_updates)
    proc, out, log, t0 = _workers[suite]
    try:
        proc.wait(timeout=max(1.0, WORKER_TIMEOUT_S - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{suite} worker timed out:\n{log.read_text()[-4000:]}") from None
    if proc.returncode != 0 or not out.is_file():
        raise AssertionError(
            f"{suite} worker failed (exit {proc.returncode}):\n{log.read_text()[-6000:]}"
        )
    return json.loads(out.read_text())


def _dtype(name: str):  # noqa: ANN202 - torch is imported lazily
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def warm_one(spec: str) -> float:
    """Build one module (``name[:dtype]``) without calling a kernel; returns seconds."""
    name, _, dt = spec.partition(":")
    start = time.time()
    if name == "gptq_marlin":
        from sglang.jit_kernel.gptq_marlin import _jit_gptq_marlin_module

        _jit_gptq_marlin_module(_dtype(dt))
    elif name == "moe_wna16_marlin":
        from sglang.jit_kernel.moe_wna16_marlin import _jit_moe_wna16_marlin_module

        _jit_moe_wna16_marlin_module(_dtype(dt))
    elif name == "repack":
        from sglang.jit_kernel.gptq_marlin_repack import _jit_gptq_marlin_repack_module

        _jit_gptq_marlin_repack_module()
    elif name == "act":
        from sglang.jit_kernel.activation import _jit_activation_module

        _jit_activation_module(_dtype(dt))
    elif name == "up_gptq_marlin":  # upstream 0.5.23 tree (sglang.kernels.*)
        from sglang.kernels.ops.gemm.gptq_marlin import _jit_gptq_marlin_module as up_gemm

        up_gemm(_dtype(dt))
    elif name == "up_repack":
        from sglang.kernels.ops.quantization.gptq_marlin_repack import (
            _jit_gptq_marlin_repack_module as up_repack,
        )

        up_repack()
    else:
        raise ValueError(f"unknown module spec {spec!r}")
    return time.time() - start


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "warm":
        print(__doc__, file=sys.stderr)
        return 2
    if not any(s.startswith("up_") for s in argv[1:]):
        apply_variant()
    failed = 0
    for spec in argv[1:]:
        try:
            print(f"[warm] {spec}: built in {warm_one(spec):.0f} s", flush=True)
        except Exception as exc:  # report every module, then fail
            failed += 1
            print(f"[warm] {spec}: FAILED: {type(exc).__name__}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
