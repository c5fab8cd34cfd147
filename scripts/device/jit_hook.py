"""Serve SGLang's JIT modules from prebuilt .so files, and build them ahead of time.

SGLang builds each JIT module on first use through ``tvm_ffi.cpp.load_inline``. On a GPU host
where building takes longer than the run should, ``install()`` (called from
``site/sitecustomize.py`` when ``FP4SERIES_PREBUILT_DIR`` is set) wraps that function: a call
is served from ``manifest.json`` when an entry matches the module name (it holds the dtype),
the arch list tvm-ffi builds for, PTX-only or not, and the hash of the calling tree's
``jit_kernel`` CUDA/C++ sources, so a module is never loaded for a tree it was not built from.
Anything else compiles as usual, and says so on stderr.

The activation module: the pin's ``jit_kernel/csrc/elementwise/activation.cuh`` does not compile
with nvcc 13.0. With ``FP4SERIES_ACT_FALLBACK=sgl_kernel`` it is served by sgl_kernel's
ahead-of-time ``silu_and_mul`` / ``gelu_and_mul`` (the MoE path calls it between its GEMMs).

``python jit_hook.py build --arch sm_90|compute_75 --out DIR SPEC...`` builds modules without a
GPU (compile and link, no load) for the tree ``sglang`` imports from, and writes one record per
module for ``make_bundle.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DIR_ENV = "FP4SERIES_PREBUILT_DIR"
ACT_FALLBACK_ENV = "FP4SERIES_ACT_FALLBACK"
LOG_ENV = "FP4SERIES_PREBUILT_LOG"
ACT_PREFIX = "sgl_kernel_jit_activation_"
_hash_cache: dict[str, str] = {}


def tree_hash(jit_kernel_dir: Path) -> str:
    """sha256 over the non-Python files under ``jit_kernel`` (relative path + content)."""
    key = str(jit_kernel_dir)
    if key not in _hash_cache:
        h = hashlib.sha256()
        for p in sorted(Path(jit_kernel_dir).rglob("*")):
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(jit_kernel_dir)).encode() + b"\0" + p.read_bytes())
                h.update(b"\0")
        _hash_cache[key] = h.hexdigest()
    return _hash_cache[key]


def arch_key(arch: str) -> tuple[str, bool]:
    """``sm_90`` -> ("9.0", False), ``compute_75`` -> ("7.5", True): how tvm-ffi sees a build."""
    num = arch.split("_")[1]
    return f"{num[:-1]}.{num[-1]}", arch.startswith("compute_")


def find(
    manifest: dict[str, Any], module: str, arch_list: str, ptx_only: bool, thash: str
) -> dict[str, Any] | None:
    """The manifest entry for this (module, arch, tree), or None."""
    for e in manifest.get("modules", []):
        if (e["module"], e["arch_list"], bool(e["ptx_only"])) == (module, arch_list, ptx_only) and (
            thash in (e["tree_hash"], *e.get("also_tree_hashes", []))
        ):
            return e
    return None


def _say(msg: str) -> None:
    line = f"[prebuilt] {msg}"
    print(line, file=sys.stderr, flush=True)
    if os.environ.get(LOG_ENV):
        with open(os.environ[LOG_ENV], "a") as fh:
            fh.write(f"{os.getpid()} {line}\n")


class SglKernelActivation:
    """The JIT activation module's two entry points on top of sgl_kernel's AOT kernels."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def _fn(op_name: str) -> Callable[..., Any]:
        table = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}
        if op_name not in table:
            raise ValueError(f"activation {op_name!r}: sgl_kernel fallback knows {sorted(table)}")
        import sgl_kernel

        return getattr(sgl_kernel, table[op_name])

    def run_activation(self, input_2d: Any, out_2d: Any, op_name: str) -> None:
        self._fn(op_name)(input_2d, out_2d)

    def run_activation_filtered(
        self, input_2d: Any, out_2d: Any, expert_ids: Any, expert_step: int, op_name: str
    ) -> None:
        import torch

        tmp = torch.empty_like(out_2d)
        self._fn(op_name)(input_2d, tmp)
        rows = torch.arange(out_2d.shape[0], device=out_2d.device) // expert_step
        keep = (expert_ids[rows] != -1).unsqueeze(-1)  # rows of unrouted tokens stay untouched
        out_2d.copy_(torch.where(keep, tmp, out_2d))


def make_loader(
    prebuilt_dir: Path | None,
    original: Callable[..., Any],
    load_module: Callable[[str], Any],
    kernel_dir: Callable[[], Path],
) -> Callable[..., Any]:
    """A load_inline replacement; the loaders and the tree are parameters so tests can fake them."""
    manifest = {"modules": []}
    if prebuilt_dir is not None:
        manifest = json.loads((prebuilt_dir / "manifest.json").read_text())
    loaded: dict[str, Any] = {}

    def load_inline(name: str, *args: Any, **kwargs: Any) -> Any:
        arch_list = os.environ.get("TVM_FFI_CUDA_ARCH_LIST", "").strip()
        ptx_only = os.environ.get("FP4SERIES_FORCE_ARCH", "").startswith("compute_")
        try:
            kdir = kernel_dir()
        except ImportError as exc:
            _say(f"{name}: cannot locate this tree's JIT sources ({exc}) -> COMPILING")
            return original(name, *args, **kwargs)
        entry = find(manifest, name, arch_list, ptx_only, tree_hash(kdir))
        fallback = os.environ.get(ACT_FALLBACK_ENV) == "sgl_kernel"
        if entry is None and name.startswith(ACT_PREFIX) and fallback:
            _say(f"{name}: served by sgl_kernel's AOT silu/gelu_and_mul ({ACT_FALLBACK_ENV})")
            return SglKernelActivation(name)
        if entry is None:
            _say(f"NO PREBUILT for {name} arch={arch_list or '?'} ptx_only={ptx_only} "
                 f"tree={kdir.parent.parent} -> COMPILING (minutes)")  # fmt: skip
            return original(name, *args, **kwargs)
        so = prebuilt_dir / entry["file"]  # type: ignore[operator]
        if str(so) not in loaded:
            loaded[str(so)] = load_module(str(so))
            _say(f"loaded {so.name} for {name} (arch {arch_list}, ptx_only={ptx_only})")
        return loaded[str(so)]

    return load_inline


def _kernel_dir() -> Path:
    try:  # the pin's layout
        from sglang.jit_kernel.utils import KERNEL_PATH
    except ImportError:  # upstream 0.5.23 (the benchmark's comparison tree)
        from sglang.kernels.jit.utils.compile.paths import KERNEL_PATH
    return Path(KERNEL_PATH).resolve()


def install() -> bool:
    """Wrap tvm_ffi.cpp.load_inline when FP4SERIES_PREBUILT_DIR or the fallback is set."""
    d = os.environ.get(DIR_ENV, "")
    if not d and os.environ.get(ACT_FALLBACK_ENV) != "sgl_kernel":
        return False
    prebuilt_dir = Path(d) if d and (Path(d) / "manifest.json").is_file() else None
    import tvm_ffi
    import tvm_ffi.cpp

    if getattr(tvm_ffi.cpp.load_inline, "_fp4series_prebuilt", False):
        return True
    loader = make_loader(prebuilt_dir, tvm_ffi.cpp.load_inline, tvm_ffi.load_module, _kernel_dir)
    loader._fp4series_prebuilt = True  # type: ignore[attr-defined]
    tvm_ffi.cpp.load_inline = loader
    return True


def build(arch: str, out: Path, specs: list[str]) -> int:
    """Compile SPECs for ``arch`` without a GPU; one JSON record per module into ``out``."""
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    import tvm_ffi.cpp
    import tvm_ffi.cpp.extension as tvm_ext

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
    import _jitenv
    from sglang.jit_kernel import utils as jit_utils

    built: dict[str, str] = {}

    def build_only(name: str, *, keep_module_alive: bool = True, build_directory=None, **kw):  # noqa: ANN001, ANN003, ANN202, ARG001
        so = tvm_ffi.cpp.build_inline(name, build_directory=str(out / name), **kw)
        built[name] = str(so)
        return so

    tvm_ffi.cpp.load_inline = build_only  # load_jit looks it up at call time
    num = arch.split("_")[1]
    jit_utils._init_jit_cuda_arch_once()  # the probe warns without a GPU; then overridden
    jit_utils._CUDA_ARCH = jit_utils.ArchInfo(int(num[:-1]), int(num[-1]), "")
    code = f"compute_{num}" if arch.startswith("compute_") else f"sm_{num}"
    tvm_ext._get_cuda_target = lambda: f"-gencode=arch=compute_{num},code={code}"
    kdir = _kernel_dir()
    arch_list, ptx_only = arch_key(arch)
    rc = 0
    for spec in specs:
        t0, before = time.time(), set(built)
        try:
            _jitenv.warm_one(spec)
        except Exception as exc:  # noqa: BLE001 - report every spec, then fail
            print(f"[prebuild] {spec} {arch}: FAILED {type(exc).__name__}: {exc}", flush=True)
            rc = 1
            continue
        for name in set(built) - before:
            rec = {"module": name, "spec": spec, "arch": arch, "arch_list": arch_list,
                   "ptx_only": ptx_only, "tree_hash": tree_hash(kdir),
                   "so": built[name]}  # fmt: skip
            (out / f"{name}.{arch}.json").write_text(json.dumps(rec, indent=1))
            print(f"[prebuild] {spec} {arch}: {name} in {time.time() - t0:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    if len(sys.argv) < 6 or sys.argv[1:2] != ["build"] or sys.argv[2] != "--arch":
        sys.exit("usage: jit_hook.py build --arch sm_90|compute_75 --out DIR SPEC...")
    sys.exit(build(sys.argv[3], Path(sys.argv[5]), sys.argv[6:]))
