"""Which JIT variant this process builds and runs, and how to build its modules ahead of time.

A variant is (python tree on PYTHONPATH, JIT build cache dir, target arch). The tree decides
what runs: the patched tree (the pin with its series, or a line's release with the line); for
the pin a copy of it whose ``jit_kernel`` CUDA sources are the pin's own
(``FP4SERIES_TEMPLATES=unpatched`` labels such a run); for a line the bare release it is made on
(``upstream``). ``FP4SERIES_FORCE_ARCH=compute_75`` makes every JIT module of the process a
compute_75 PTX-only build (no SASS), so that on an SM90 GPU the driver JIT-compiles the PTX and
the ``__CUDA_ARCH__ == 750`` code path runs. What differs between the pin's SGLang and a line's
(where the loaders are, how the arch is forced, which variable names the cache) is in
_sglang_api.py.

SGLang builds a JIT module on its first call (``cache_once`` + ``load_jit``); the module
factories build without a kernel call, which is what ``warm`` uses. The cache (the pin:
tvm-ffi's ``$TVM_FFI_CACHE_DIR``; 0.5.17 on: ``$SGLANG_JIT_CACHE_DIR``) is keyed by the
generated source (which holds absolute include paths) and flags, so the process that runs the
tests finds what a ``warm`` process of the same variant built.

Usage as a script (one process per variant, run in parallel by scripts/device/gpu_proof.py)::

    python tests/gpu/_jitenv.py warm gptq_marlin:bf16 moe_wna16_marlin:fp16 repack act:bf16
    python tests/gpu/_jitenv.py warm moe_wna16_marlin:bf16:expert_ids_are_sorted+is_ep
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

for _p in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[2] / "src"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
import _sglang_api as api  # noqa: E402

FORCE_ARCH_ENV = "FP4SERIES_FORCE_ARCH"
TEMPLATES_ENV = "FP4SERIES_TEMPLATES"
KERNEL_SET_ENV = "FP4SERIES_KERNEL_SET"  # set by gpu_proof.py when the trees are reduced
LINE_ENV = "FP4SERIES_LINE"  # the series line under test (unset: the pin's)
DRY_RUN_ENV = "FP4SERIES_GPU_DRY_RUN"  # 1: the harness on the CPU with stand-in kernels
SUPPORTED_FORCED_ARCHES = ("compute_75",)
# patched: the series (or a line) applied; unpatched: the pin's templates under the series'
# host code (the repro of patches 1-2); upstream: a line's bare release (its repro)
TEMPLATES = ("patched", "unpatched", "upstream")
_applied = False


def device() -> str:
    """Where the harness puts its tensors: "cuda", or "cpu" in a dry run (_dryrun.py)."""
    return "cpu" if os.environ.get(DRY_RUN_ENV) == "1" else "cuda"


def templates_label() -> str:
    """What runs: 'patched' (default), 'unpatched' (pin) or 'upstream' (a line's release)."""
    value = os.environ.get(TEMPLATES_ENV, "patched")
    if value not in TEMPLATES:
        raise ValueError(f"{TEMPLATES_ENV}={value!r}: expected one of {', '.join(TEMPLATES)}")
    return value


def line() -> str | None:
    """The series line under test (``FP4SERIES_LINE``), None for the pin's."""
    return os.environ.get(LINE_ENV) or None


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
    # -DSGL_CUDA_ARCH=750 for host code (and a distinct cache key); PTX only: code=compute_75
    # (the loaders would emit code=sm_75, which an SM90 GPU cannot load).
    api.force_arch(int(arch[-2]), int(arch[-1]), ptx_only=True)
    _applied = True


def describe() -> dict[str, object]:
    """What the report records about the variant."""
    import sglang

    info: dict[str, object] = {
        "templates": templates_label(),
        "forced_arch": forced_arch(),
        "sglang_tree": os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))),
        "jit_layout": api.layout(),
        "jit_cache_dir": os.environ.get(api.cache_env(), "(SGLang's default)"),
        "kernel_set": os.environ.get(KERNEL_SET_ENV, "full"),
    }
    try:
        from sglang.version import __version__ as version
    except ImportError:
        version = getattr(sglang, "__version__", "?")
    info["sglang_version"] = version
    if line():
        info["line"] = line()
    return info


# ----------------------------------------------------------------------------- variant workers
# A JIT variant cannot share a process with another (cache_once module factories), so the repro
# and compute_75 suites run test_marlin_numerics.py as worker processes. conftest starts them
# right after collection so that they overlap the main session; the tests collect the results.

HERE = Path(__file__).resolve().parent
WORKER_TIMEOUT_S = int(os.environ.get("FP4SERIES_WORKER_TIMEOUT", "420"))
_workers: dict[str, tuple[subprocess.Popen[str], Path, Path, float]] = {}


def _default_cache(suffix: str) -> str:
    default = "~/.cache/tvm-ffi" if api.layout() == api.PIN_LAYOUT else "~/.cache/sglang/jit"
    return os.environ.get(api.cache_env(), os.path.expanduser(default)) + suffix


def _tree_env(tree: str, label: str, cache: str) -> dict[str, str]:
    """A worker on another python tree: first on PYTHONPATH instead of the tree under test."""
    import sglang

    patched_root = Path(sglang.__file__).resolve().parents[1]
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in rest if Path(p).resolve() != patched_root]
    return {
        "PYTHONPATH": os.pathsep.join([tree, *rest]),
        TEMPLATES_ENV: label,
        api.cache_env(api.layout(Path(tree) / "sglang")): cache,
    }


def unpatched_env() -> tuple[dict[str, str] | None, str]:
    """Environment of the repro worker (the pin's templates), or (None, why not)."""
    tree = os.environ.get("FP4SERIES_UNPATCHED_TREE")
    if not tree or not (Path(tree) / "sglang" / "jit_kernel").is_dir():
        return None, (
            "FP4SERIES_UNPATCHED_TREE is not set to a python tree holding sglang/jit_kernel with "
            "the pin's templates (scripts/gpu-proof.sh builds one)"
        )
    cache = os.environ.get("FP4SERIES_UNPATCHED_CACHE") or _default_cache("-unpatched")
    return _tree_env(tree, "unpatched", cache), ""


def upstream_env() -> tuple[dict[str, str] | None, str]:
    """Environment of a line's repro worker (the bare release the line is made on), or
    (None, why not)."""
    tree = os.environ.get("FP4SERIES_BARE_TREE")
    if not tree or not (Path(tree) / "sglang").is_dir():
        return None, (
            "FP4SERIES_BARE_TREE is not set to the python tree of the release the line is "
            "made on (scripts/gpu-proof.sh --line VERSION sets it)"
        )
    cache = os.environ.get("FP4SERIES_BARE_CACHE") or _default_cache("-upstream")
    return _tree_env(tree, "upstream", cache), ""


def turing_enabled() -> tuple[bool, str]:
    """Whether the series claims SM75 (fp16) support, per marlin_utils_fp4's own check."""
    if os.environ.get("FP4SERIES_SKIP_TURING") == "1":
        return False, "FP4SERIES_SKIP_TURING=1 (compute_75 modules not built on this run)"
    import torch

    ok, why = api.fp4_marlin_supported(torch.float16, (7, 5))
    return (True, "") if ok else (False, f"the series refuses SM75 with fp16: {why}")


def c75_env() -> dict[str, str]:
    return {
        FORCE_ARCH_ENV: "compute_75",
        api.cache_env(): os.environ.get("FP4SERIES_C75_CACHE") or _default_cache("-c75"),
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


def warm_one(spec: str) -> float:
    """Build one module (``NAME[:DTYPE][:FLAG+FLAG]``, see _sglang_api) without calling a
    kernel; returns seconds."""
    start = time.time()
    fn, args, kwargs = api.warm_call(spec)
    fn(*args, **kwargs)
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
