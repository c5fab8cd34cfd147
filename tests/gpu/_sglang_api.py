"""What the GPU harness needs from SGLang that differs between the pin's tree and a line's.

The harness (conftest, _jitenv, test_*.py) is one harness for every series line. What moved or
changed between the releases it runs on is here, chosen from the tree ``import sglang`` finds
(by its layout on disk, so nothing is imported to decide):

    what                  the pin (0.5.11)                  0.5.17 on (the 0.5.23 line)
    JIT sources, loader   sglang/jit_kernel/, tvm-ffi's     sglang/kernels/jit/ + ops/, SGLang's
                          load_inline                       own ninja loader
    JIT build cache       $TVM_FFI_CACHE_DIR                $SGLANG_JIT_CACHE_DIR
    target arch, PTX      jit_kernel.utils._CUDA_ARCH,      kernels.jit.utils.arch._CUDA_ARCH,
    only                  tvm-ffi's _get_cuda_target        compile.toolchain.target_flags
    runner backends       fp4_utils, moe.utils globals      fp4_utils global, the runtime
                                                            context's get_flags().moe
    fused linear, TP 1    tp_rank=0, tp_size=1              parallel_group="replicated"
    SM75 check            check_fp4_marlin_supported(       (dtype, device_capability=...)
                          dtype, capability=...)

A JIT module is named for warming (``warm_call``) as ``NAME[:DTYPE][:FLAG+FLAG]``: NAME is the
module ``load_jit`` builds (its loader is found in the tree by fp4series.compile_check), one of
the short names in ALIASES, or a dotted ``package.module.function`` loader; DTYPE is fp16, bf16,
int32, int64 or ``-`` (none); FLAGs are the loader's boolean parameters set to True (the others
without a default False, as in the compile check).

Stdlib-only at import time: the GPU proof's runner and the tooling tests import it without torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

PIN_LAYOUT = "jit_kernel"  # sglang/jit_kernel/ (up to 0.5.16)
KERNELS_LAYOUT = "kernels"  # sglang/kernels/jit/ + sglang/kernels/ops/ (0.5.17 on)
CACHE_ENV = {PIN_LAYOUT: "TVM_FFI_CACHE_DIR", KERNELS_LAYOUT: "SGLANG_JIT_CACHE_DIR"}
# Short module names of the stage table -> the loader: a load_jit module name (found in the
# tree) or, where the name differs between layouts, the loader function per layout.
ALIASES: dict[str, dict[str, str]] = {
    "repack": {PIN_LAYOUT: "gptq_marlin_repack", KERNELS_LAYOUT: "gptq_marlin_repack"},
    "act": {
        PIN_LAYOUT: "sglang.jit_kernel.activation._jit_activation_module",
        KERNELS_LAYOUT: "sglang.kernels.ops.activation.activation.activation_module",
    },
}
DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "int32": "int32", "int64": "int64"}


def sglang_dir() -> Path | None:
    """The ``sglang`` package directory this interpreter would import (nothing imported)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def layout(tree: Path | None = None) -> str:
    """PIN_LAYOUT or KERNELS_LAYOUT of an ``sglang`` package dir (default: the importable one)."""
    tree = tree or sglang_dir()
    if tree is None:
        raise ImportError("no sglang package on the path")
    if (tree / "jit_kernel" / "csrc").is_dir():
        return PIN_LAYOUT
    if (tree / "kernels" / "jit" / "csrc").is_dir():
        return KERNELS_LAYOUT
    raise ImportError(f"{tree}: neither sglang/jit_kernel/ nor sglang/kernels/jit/ (JIT sources)")


def cache_env(tree_layout: str | None = None) -> str:
    """The environment variable that holds this layout's JIT build cache."""
    return CACHE_ENV[tree_layout or layout()]


def kernel_dir() -> Path:
    """The folder whose CUDA/C++ sources the JIT modules are built from (csrc/ + include/)."""
    if layout() == PIN_LAYOUT:
        from sglang.jit_kernel.utils import KERNEL_PATH
    else:
        from sglang.kernels.jit.utils.compile.paths import KERNEL_PATH
    return Path(KERNEL_PATH).resolve()


def _arch_module() -> Any:
    """The module holding ``_CUDA_ARCH`` / ``ArchInfo`` / ``get_jit_cuda_arch``."""
    if layout() == PIN_LAYOUT:
        return importlib.import_module("sglang.jit_kernel.utils")
    return importlib.import_module("sglang.kernels.jit.utils.arch")


def force_arch(major: int, minor: int, *, ptx_only: bool = True) -> str:
    """Every JIT module this process builds from now on targets compute capability
    ``major.minor`` (``-DSGL_CUDA_ARCH`` and the gencode), PTX only; returns the gencode.

    Call before the first JIT module is built: the loaders cache their modules per process."""
    arch = _arch_module()
    arch.get_jit_cuda_arch()  # the one-time device probe first, then overridden
    arch._CUDA_ARCH = arch.ArchInfo(major, minor, "")
    code = f"compute_{major}{minor}" if ptx_only else f"sm_{major}{minor}"
    target = f"-gencode=arch=compute_{major}{minor},code={code}"
    if layout() == PIN_LAYOUT:
        import tvm_ffi.cpp.extension as tvm_ext

        tvm_ext._get_cuda_target = lambda: target
    else:
        from sglang.kernels.jit.utils.compile import toolchain

        toolchain.target_flags = lambda: [target]
    return target


def use_marlin_backends() -> None:
    """Select the Marlin FP4 GEMM and MoE runner backends, as the server args would."""
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.quantization import fp4_utils

    fp4_utils.FP4_GEMM_RUNNER_BACKEND = fp4_utils.Fp4GemmRunnerBackend("marlin")
    backend = moe_utils.MoeRunnerBackend("marlin")
    if hasattr(moe_utils, "MOE_RUNNER_BACKEND"):  # the pin: a module global
        moe_utils.MOE_RUNNER_BACKEND = backend
    else:  # 0.5.23: the runtime context's flags
        from sglang.srt.runtime_context import get_flags

        get_flags().moe.runner_backend = backend


def fused_linear_kwargs() -> dict[str, Any]:
    """How a QKV / MergedColumn parallel linear is built unsharded (tensor parallel size 1)."""
    from sglang.srt.layers.linear import QKVParallelLinear

    params = inspect.signature(QKVParallelLinear.__init__).parameters
    if "parallel_group" in params:
        return {"parallel_group": "replicated"}
    return {"tp_rank": 0, "tp_size": 1}


def fp4_marlin_supported(dtype: Any, capability: tuple[int, int]) -> tuple[bool, str]:
    """(True, "") when the tree's NVFP4 Marlin check lets ``dtype`` run on ``capability``,
    else (False, its message): the series' ``check_fp4_marlin_supported``."""
    try:
        from sglang.srt.layers.quantization.marlin_utils_fp4 import check_fp4_marlin_supported
    except ImportError as exc:
        return False, f"marlin_utils_fp4 has no check_fp4_marlin_supported: {exc}"
    params = inspect.signature(check_fp4_marlin_supported).parameters
    key = "capability" if "capability" in params else "device_capability"
    try:
        check_fp4_marlin_supported(dtype, **{key: capability})
    except ValueError as exc:
        return False, str(exc)
    return True, ""


# ----------------------------------------------------------------------------- JIT modules


def parse_spec(spec: str) -> tuple[str, str, tuple[str, ...]]:
    """``NAME[:DTYPE][:FLAG+FLAG]`` -> (name, dtype or "-", flags)."""
    name, _, rest = spec.partition(":")
    dtype, _, flags = rest.partition(":")
    dtype = dtype or "-"
    if not name or (dtype != "-" and dtype not in DTYPE_NAMES):
        raise ValueError(f"JIT module spec {spec!r}: expected NAME[:DTYPE][:FLAG+FLAG], DTYPE "
                         f"one of {', '.join(DTYPE_NAMES)} or -")  # fmt: skip
    return name, dtype, tuple(f for f in flags.split("+") if f)


def resolve_loader(name: str) -> Callable[..., Any]:
    """The loader function of a module spec's NAME in the importable tree."""
    name = name.removeprefix("up_")  # the benchmark's upstream-tree names
    name = ALIASES.get(name, {}).get(layout(), name)
    if "." in name:
        module, _, function = name.rpartition(".")
        return getattr(importlib.import_module(module), function)
    from fp4series.compile_check import discover_layout

    mod = discover_layout(sglang_dir()).module(name)  # type: ignore[arg-type]
    return getattr(importlib.import_module(mod.py_module), mod.loader)


def warm_call(spec: str) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
    """(loader, args, kwargs) that build the module ``spec`` names, without a kernel call."""
    import torch

    from fp4series.compile_check import _loader_args

    name, dtype, flags = parse_spec(spec)
    fn = resolve_loader(name)
    torch_dtype = None if dtype == "-" else getattr(torch, DTYPE_NAMES[dtype])
    try:
        args, kwargs = _loader_args(fn, torch_dtype, flags)
    except SystemExit as exc:  # the compile check's worker exits; here it is a bad spec
        raise ValueError(f"JIT module spec {spec!r}: {exc}") from None
    return fn, args, kwargs
