"""Load prebuilt SGLang JIT modules instead of compiling them (the one short device call).

``install()`` wraps ``tvm_ffi.cpp.load_inline`` (``sglang.jit_kernel.utils.load_jit`` imports it
at call time). A call is served from the manifest when one entry matches all of:
  - the JIT module name (``sgl_kernel_jit_gptq_marlin_bf16_t`` ...; it holds the dtype),
  - the arch list tvm-ffi would build for (``TVM_FFI_CUDA_ARCH_LIST``, set by load_jit) and
    PTX-only or not (``FP4SERIES_FORCE_ARCH=compute_75``),
  - the hash of the calling tree's ``jit_kernel`` CUDA/C++ sources (patched vs the pin's).
Otherwise it compiles as before and says so loudly on stderr. Enabled by ``sitecustomize``
when ``FP4SERIES_PREBUILT_DIR`` names a directory holding ``manifest.json`` and the ``.so``s.

Activation: the pin's ``jit_kernel/csrc/elementwise/activation.cuh`` does not compile with nvcc
13.0 (gcc 12 host: "no matching function for call to select_kernel<true>"; clang 19 host:
"cannot initialize return object of type decltype(activation_kernel<...>)"), so no prebuilt
exists and a device build would fail too. With ``FP4SERIES_ACT_FALLBACK=sgl_kernel`` the
activation module (silu/gelu-and-mul, used between the two Marlin MoE GEMMs) is served by
SGLang's AOT kernels in ``sgl_kernel`` (``silu_and_mul`` ...), logged as such.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DIR_ENV = "FP4SERIES_PREBUILT_DIR"
ACT_FALLBACK_ENV = "FP4SERIES_ACT_FALLBACK"
ACT_PREFIX = "sgl_kernel_jit_activation_"
LOG_ENV = "FP4SERIES_PREBUILT_LOG"
_hash_cache: dict[str, str] = {}


def tree_hash(jit_kernel_dir: Path) -> str:
    """sha256 over the non-Python files under ``jit_kernel`` (relative path + content)."""
    key = str(jit_kernel_dir)
    if key in _hash_cache:
        return _hash_cache[key]
    h = hashlib.sha256()
    files = sorted(
        p
        for p in Path(jit_kernel_dir).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    )
    for p in files:
        h.update(str(p.relative_to(jit_kernel_dir)).encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    _hash_cache[key] = h.hexdigest()
    return _hash_cache[key]


def _arch_key() -> tuple[str, bool]:
    forced = os.environ.get("FP4SERIES_FORCE_ARCH", "").strip()
    arch_list = os.environ.get("TVM_FFI_CUDA_ARCH_LIST", "").strip()
    return arch_list, forced.startswith("compute_")


def find(
    manifest: dict[str, Any], module: str, arch_list: str, ptx_only: bool, thash: str
) -> dict[str, Any] | None:
    """The manifest entry for this (module, arch, tree), or None."""
    for e in manifest.get("modules", []):
        hashes = [e["tree_hash"], *e.get("also_tree_hashes", [])]
        if (
            e["module"] == module
            and e["arch_list"] == arch_list
            and bool(e["ptx_only"]) == ptx_only
            and thash in hashes
        ):
            return e
    return None


def _say(msg: str) -> None:
    line = f"[prebuilt] {msg}"
    print(line, file=sys.stderr, flush=True)
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a") as fh:
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
    prebuilt_dir: Path,
    original: Callable[..., Any],
    load_module: Callable[[str], Any],
    kernel_dir: Callable[[], Path],
) -> Callable[..., Any]:
    """A load_inline replacement; split out so tests can give fake loaders and trees."""
    manifest = json.loads((prebuilt_dir / "manifest.json").read_text())
    loaded: dict[str, Any] = {}

    def load_inline(name: str, *args: Any, **kwargs: Any) -> Any:
        arch_list, ptx_only = _arch_key()
        try:
            kdir = kernel_dir()
        except ImportError as exc:
            _say(f"{name}: cannot locate this tree's JIT sources ({exc}) -> COMPILING")
            return original(name, *args, **kwargs)
        entry = find(manifest, name, arch_list, ptx_only, tree_hash(kdir))
        if (
            entry is None
            and name.startswith(ACT_PREFIX)
            and (os.environ.get(ACT_FALLBACK_ENV) == "sgl_kernel")
        ):
            _say(
                f"{name}: no prebuilt (the pin's activation.cuh does not compile with nvcc "
                "13.0) -> served by sgl_kernel's AOT silu/gelu_and_mul (FP4SERIES_ACT_FALLBACK)"
            )
            return SglKernelActivation(name)
        if entry is None:
            _say(
                f"NO PREBUILT for {name} arch={arch_list or '?'} ptx_only={ptx_only} "
                f"tree={kdir.parent.parent} -> COMPILING (minutes)"
            )
            return original(name, *args, **kwargs)
        so = prebuilt_dir / entry["file"]
        if so.suffix == ".xz":
            so = so.with_suffix("")
        if not so.is_file():
            _say(f"{so} missing (unpack the carry: xz -d) -> COMPILING {name}")
            return original(name, *args, **kwargs)
        if str(so) not in loaded:
            loaded[str(so)] = load_module(str(so))
            _say(f"loaded {so.name} for {name} (arch {arch_list}, ptx_only={ptx_only})")
        return loaded[str(so)]

    return load_inline


def install() -> bool:
    """Wrap tvm_ffi.cpp.load_inline if FP4SERIES_PREBUILT_DIR is set; True when installed."""
    d = os.environ.get(DIR_ENV)
    if not d:
        return False
    prebuilt_dir = Path(d)
    if not (prebuilt_dir / "manifest.json").is_file():
        _say(f"{DIR_ENV}={d} has no manifest.json: every JIT module compiles")
        return False
    import tvm_ffi
    import tvm_ffi.cpp

    if getattr(tvm_ffi.cpp.load_inline, "_fp4series_prebuilt", False):
        return True

    def kernel_dir() -> Path:
        try:  # the pin's layout
            from sglang.jit_kernel.utils import KERNEL_PATH
        except ImportError:  # upstream 0.5.23 (the benchmark's comparison tree)
            from sglang.kernels.jit.utils.compile.paths import KERNEL_PATH
        return Path(KERNEL_PATH).resolve()

    loader = make_loader(prebuilt_dir, tvm_ffi.cpp.load_inline, tvm_ffi.load_module, kernel_dir)
    loader._fp4series_prebuilt = True  # type: ignore[attr-defined]
    tvm_ffi.cpp.load_inline = loader
    return True
