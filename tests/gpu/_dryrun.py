"""The GPU harness on a CPU machine: SGLang's real layer code, stand-in kernels, no numbers.

What a GPU run would trip over first is the harness meeting another SGLang (a line's release,
the GPU host's torch): an import the host lacks, an API that moved, an attribute a quant method
now reads. ``python tests/gpu/_dryrun.py`` runs the worker suites of test_marlin_numerics.py on
the CPU with the python tree on PYTHONPATH, as a GPU would run them, except that:

* torch's CUDA device queries answer for one SM90 GPU (the layers' ``is_cuda()`` branches and
  their imports are the GPU's), tensors live on the CPU (``FP4SERIES_GPU_DRY_RUN=1``);
* ``sgl_kernel`` is its real ``scalar_type`` module plus recording stand-ins (its compiled ops
  need a GPU driver; fake impls registered for them are skipped); custom ops SGLang registers
  for CUDA are registered for the CPU too;
* a JIT module is not built: SGLang's loader runs up to the build (sources resolved, flags,
  build key) and hands back a module whose functions do nothing; Triton launches do nothing.

Every JIT module a suite asks for is recorded (name and template arguments) and compared with
the modules the stage table warms (``--warm SPEC ...``): one missing there would be built
inside the test process on the GPU host, one at a time. The kernels' outputs are garbage, so
rel L2 values mean nothing; a case that raised (its ``error``) is what fails the dry run.
``collect DIR ARGS...`` runs ``pytest --collect-only`` there under the same stand-ins (upstream's
conformance tests import sgl_kernel at module level).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parents[1] / "src"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
os.environ["FP4SERIES_GPU_DRY_RUN"] = "1"

import _sglang_api as api  # noqa: E402

CAPABILITY = (9, 0)
REQUESTS: list[dict[str, Any]] = []  # every JIT module asked for, in order
AOT_CALLS: dict[str, int] = {}  # sgl_kernel stand-ins called


def _record_aot(name: str) -> Callable[..., Any]:
    def stand_in(*args: Any, **kwargs: Any) -> None:
        AOT_CALLS[name] = AOT_CALLS.get(name, 0) + 1

    stand_in.__name__ = name
    return stand_in


def _moe_sum_reduce(inp: Any, out: Any, routed_scaling_factor: float = 0.0) -> None:
    """sgl_kernel.moe_sum_reduce: the top-k sum, scaled (its stand-in can compute it)."""
    AOT_CALLS["moe_sum_reduce"] = AOT_CALLS.get("moe_sum_reduce", 0) + 1
    out.copy_(inp.sum(dim=1) * (routed_scaling_factor or 1.0))


class _SglKernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel`` and its submodules: recording stand-ins, except ``scalar_type`` (real)."""

    def __init__(self, scalar_type: Path | None) -> None:
        self.scalar_type = scalar_type

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "sgl_kernel" and not name.startswith("sgl_kernel."):
            return None
        if name == "sgl_kernel.scalar_type" and self.scalar_type is not None:
            return importlib.util.spec_from_file_location(name, self.scalar_type)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__file__ = f"<dry-run stand-in for {spec.name}>"

        def stand_in(attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _moe_sum_reduce if attr == "moe_sum_reduce" else _record_aot(attr)

        module.__getattr__ = stand_in  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _real_scalar_type() -> Path | None:
    """sgl_kernel/scalar_type.py of the sgl_kernel on the path (a bundle's), read not run."""
    spec = importlib.util.find_spec("sgl_kernel")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "scalar_type.py").is_file():
            return Path(folder) / "scalar_type.py"
    return None


class _FakeModule:
    """What a JIT module build returns here: every entry point does nothing."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Callable[..., None]:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return lambda *args, **kwargs: None


def _requester() -> str:
    """The loader function that asked for the module (first frame outside the JIT utils)."""
    for frame in inspect.stack()[2:]:
        mod = frame.frame.f_globals.get("__name__", "")
        if not mod.startswith(("sglang.kernels.jit.utils", "sglang.jit_kernel.utils", "torch",
                               "tvm_ffi", __name__, "functools")):  # fmt: skip
            return f"{mod}.{frame.function}"
    return "?"


def _install_jit_stand_in() -> None:
    if api.layout() == api.KERNELS_LAYOUT:
        from sglang.kernels.jit.utils.compile import cache, loader, ninja

        def build(*, spec: Any, build_dir: Path, build_file: str) -> Path:
            REQUESTS.append({"module": spec.module_name, "args": list(spec.module_args),
                             "loader": _requester()})  # fmt: skip
            return Path(build_dir) / f"{spec.module_name}.so"

        ninja.build = build
        loader._find_prebuilt = lambda **kwargs: None
        loader._load = lambda library: _FakeModule(Path(library).stem)
        cache.commit_build = lambda *args, **kwargs: None
    else:
        import tvm_ffi.cpp

        def load_inline(name: str, *args: Any, **kwargs: Any) -> _FakeModule:
            REQUESTS.append({"module": name, "args": [], "loader": _requester()})
            return _FakeModule(name)

        tvm_ffi.cpp.load_inline = load_inline


def _install_cpu_custom_ops() -> None:
    """SGLang registers its custom ops for the CUDA key; register the same impl for the CPU."""
    import torch

    impl = torch.library.Library.impl

    def impl_also_cpu(self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *a: Any,
                      **k: Any) -> Any:  # fmt: skip
        result = impl(self, op_name, fn, dispatch_key, *a, **k)
        if dispatch_key == "CUDA" and getattr(self, "ns", None) == "sglang":
            impl(self, op_name, fn, "CPU", *a, **k)
        return result

    torch.library.Library.impl = impl_also_cpu  # type: ignore[method-assign]
    register_fake = torch.library.register_fake

    def register_fake_unless_stand_in(op: Any, *args: Any, **kwargs: Any) -> Any:
        """sgl_kernel's compiled ops are not loaded here: their fake impls have no op."""
        if isinstance(op, str) and op.startswith("sgl_kernel::"):
            namespace, _, name = op.partition("::")
            if not hasattr(getattr(torch.ops, namespace), name.split(".")[0]):
                return (lambda fn: fn) if not args else None
        return register_fake(op, *args, **kwargs)

    torch.library.register_fake = register_fake_unless_stand_in


def _install_triton_stand_in() -> None:
    try:
        from triton.runtime import autotuner, jit
    except ImportError:
        return

    def launch(self: Any, *args: Any, **kwargs: Any) -> None:
        name = getattr(getattr(self, "fn", self), "__name__", "?")
        AOT_CALLS[f"triton:{name}"] = AOT_CALLS.get(f"triton:{name}", 0) + 1

    jit.JITFunction.run = launch  # type: ignore[method-assign]
    autotuner.Autotuner.run = launch  # type: ignore[method-assign]


def install(capability: tuple[int, int] = CAPABILITY) -> None:
    """Make this process a dry-run GPU process. Call before anything imports sglang."""
    import torch

    props = types.SimpleNamespace(name="dry run (CPU)", major=capability[0], minor=capability[1],
                                  multi_processor_count=132, total_memory=80 * 2**30,
                                  L2_cache_size=50 * 2**20, warp_size=32,
                                  max_shared_memory_per_block_optin=227 * 2**10)  # fmt: skip
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: capability
    cuda.get_device_properties = lambda device=None: props
    cuda.get_device_name = lambda device=None: props.name
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None
    torch.version.cuda = torch.version.cuda or "13.0"
    torch.version.hip = None
    sys.meta_path.insert(0, _SglKernelFinder(_real_scalar_type()))
    _install_cpu_custom_ops()
    _install_triton_stand_in()


def _key(request: dict[str, Any]) -> str:
    return " ".join([request["module"], *map(str, request["args"])])


def warmed_keys(specs: list[str]) -> dict[str, str]:
    """Request key -> spec, for the modules the stage table warms (built here as stand-ins)."""
    keys: dict[str, str] = {}
    for spec in specs:
        before = len(REQUESTS)
        fn, args, kwargs = api.warm_call(spec)
        inspect.unwrap(fn)(*args, **kwargs)  # past cache_once: the suite asks for it again
        for request in REQUESTS[before:]:
            keys[_key(request)] = spec
        del REQUESTS[before:]
    return keys


def run(suite: str, warm: list[str], out: Path | None) -> int:
    install()
    _install_jit_stand_in()
    import _jitenv
    import test_marlin_numerics as numerics
    import torch

    _jitenv.apply_variant()
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.time()
    warmed = warmed_keys(warm)
    failed, found = [], {"cases": [], "fused_shards": []}
    for kind, case in numerics.run_suite(suite):
        found[kind].append(case)
        what = " ".join(f"{k}={case.get(k)}" for k in ("path", "layer", "dtype", "m", "outcome"))
        if case.get("error") and case.get("outcome") != "refused":
            failed.append(f"{what}: {case['error']}")
            print(f"[dry-run {suite}] FAILED {what}: {case['error']}", flush=True)
        else:
            print(f"[dry-run {suite}] ran {what}", flush=True)
    modules: dict[str, dict[str, Any]] = {}
    for request in REQUESTS:
        modules.setdefault(_key(request), {**request, "warmed_by": warmed.get(_key(request))})
    for key, info in modules.items():
        state = f"warmed by {info['warmed_by']}" if info["warmed_by"] else "NOT WARMED (built "
        state += "" if info["warmed_by"] else "inside the test process on the GPU host)"
        print(f"[dry-run {suite}] JIT module {key} ({info['loader']}): {state}", flush=True)
    result = {"suite": suite, "variant": _jitenv.describe(), "failed": failed, **found,
              "jit_modules": list(modules.values()), "sgl_kernel_and_triton": AOT_CALLS,
              "seconds": round(time.time() - start, 1)}  # fmt: skip
    if out is not None:
        out.write_text(json.dumps(result, indent=1, default=str))
    print(f"[dry-run {suite}] {len(found['cases']) + len(found['fused_shards'])} cases, "
          f"{len(failed)} failed, {len(modules)} JIT modules "
          f"({sum(1 for m in modules.values() if not m['warmed_by'])} not warmed), "
          f"{time.time() - start:.0f} s", flush=True)  # fmt: skip
    return 1 if failed else 0


def collect(folder: Path, args: list[str]) -> int:
    install()
    _install_jit_stand_in()
    import pytest

    os.chdir(folder)
    return int(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a worker suite of test_marlin_numerics.py")
    r.add_argument("--suite", required=True, help="repro, turing or upstream")
    r.add_argument("--warm", nargs="*", default=[], help="the module specs the stage warms")
    r.add_argument("--out", type=Path, help="write the result as JSON")
    c = sub.add_parser("collect", help="pytest --collect-only in DIR under the stand-ins")
    c.add_argument("dir", type=Path)
    c.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.cmd == "run":
        return run(args.suite, args.warm, args.out)
    return collect(args.dir, args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
