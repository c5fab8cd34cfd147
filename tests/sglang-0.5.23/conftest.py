"""Shared fixtures for the CPU tests of the 0.5.23 line's SGLang tree.

SGLang 0.5.23 is imported from ``PYTHONPATH`` (the line's checkout) as a CPU machine
sees it; then the ``cuda_device`` fixture makes its code see one CUDA GPU of a chosen
compute capability: torch's CUDA device queries are patched (what a CPU machine cannot
answer) and SGLang's cached platform probes (``sglang.srt.utils.common``, read through
``runtime_context.get_platform()``) are cleared before and after. ``published`` publishes
a real ``ServerArgs`` into the runtime context (``runtime_context.publish``, as
``sglang.test.test_utils.published_topology`` does) and runs 0.5.23's own
``initialize_fp4_gemm_config`` / ``initialize_moe_config`` from it. Everything else
(config parsing, scheme selection, weight creation, loaders, after-loading processing)
is 0.5.23's code; the CUDA kernels are stubbed by the tests that need them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
DATA_DIR = HERE.parent / "data" / "nvfp4-configs"

DEVICE_NAMES: dict[tuple[int, int], str] = {
    (7, 0): "Tesla V100-SXM2-32GB",
    (7, 5): "Tesla T4",
    (8, 0): "NVIDIA A100-SXM4-80GB",
    (8, 6): "NVIDIA GeForce RTX 3090",
    (8, 9): "NVIDIA L40S",
    (9, 0): "NVIDIA H200",
    (10, 0): "NVIDIA B200",
    (10, 3): "NVIDIA B300",
    (12, 0): "NVIDIA GeForce RTX 5090",
    (12, 1): "NVIDIA GB10",
}


@dataclass(frozen=True)
class FakeCudaDevice:
    capability: tuple[int, int]
    name: str


_CACHED_PROBES: dict[str, list] = {}


def _clear_sglang_caches() -> None:
    """Clear every functools cache of the loaded SGLang modules (platform probes)."""
    for name, module in list(sys.modules.items()):
        if not (name == "sglang" or name.startswith("sglang.")) or module is None:
            continue
        if name not in _CACHED_PROBES:
            found = []
            for value in list(vars(module).values()):
                # Type checks only: some attributes are lazy importers.
                if isinstance(value, functools._lru_cache_wrapper) or (
                    isinstance(value, types.FunctionType) and "cache_clear" in vars(value)
                ):
                    found.append(value)
            _CACHED_PROBES[name] = found
        for fn in _CACHED_PROBES[name]:
            fn.cache_clear()


_SCALAR_TYPES_STATE = {"loaded": False}


def _install_real_scalar_types() -> None:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    module = importlib.import_module("_scalar_types_0523")
    module.install()
    _SCALAR_TYPES_STATE["loaded"] = module.real_scalar_types_loaded()


# Imported once, as a CPU machine sees them, before any test mocks a GPU: several
# modules import CUDA-only packages at import time when is_cuda() is true.
SGLANG_MODULES = (
    "sglang.srt.layers.quantization",
    "sglang.srt.layers.quantization.marlin_utils_fp4",
    "sglang.srt.layers.quantization.modelopt_quant",
    "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors",
    "sglang.srt.layers.linear",
    "sglang.srt.layers.moe.fused_moe_triton",
    "sglang.srt.layers.moe.moe_runner.marlin",
    "sglang.srt.model_loader.weight_utils",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
)


# SGLang registers its custom ops for the CUDA dispatch key only; on the CPU machine the
# same Python implementation is registered for CPU tensors too (the kernels it calls are
# stubbed by the tests).
CUSTOM_OPS = {
    "apply_fp4_marlin_linear": "sglang.srt.layers.quantization.marlin_utils_fp4",
}
_CPU_LIBRARY: list = []


def _register_cpu_impls() -> None:
    library = torch.library.Library("sglang", "IMPL")
    for op_name, module_name in CUSTOM_OPS.items():
        wrapper = getattr(importlib.import_module(module_name), op_name)
        library.impl(op_name, getattr(wrapper, "__wrapped__", wrapper), "CPU")
    _CPU_LIBRARY.append(library)  # the registration lives as long as the library


LINE_VERSION = "0.5.23"


def _check_sglang_version() -> None:
    try:
        from sglang._version import __version__
    except ImportError as exc:
        raise pytest.UsageError(
            f"tests/sglang-{LINE_VERSION} need SGLang {LINE_VERSION} on the path "
            "(PYTHONPATH=<checkout of the line>/python)"
        ) from exc
    if __version__ != LINE_VERSION:
        raise pytest.UsageError(
            f"tests/sglang-{LINE_VERSION} run against SGLang {LINE_VERSION}, found "
            f"{__version__}: set PYTHONPATH=<checkout of the {LINE_VERSION} line>/python "
            f"and use .work/lines/{LINE_VERSION}/venv"
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    _check_sglang_version()
    _install_real_scalar_types()
    for name in SGLANG_MODULES:
        importlib.import_module(name)
    _register_cpu_impls()


def pytest_report_header(config) -> str:
    state = "real (sglang-kernel 0.4.10 wheel)" if _SCALAR_TYPES_STATE["loaded"] else "placeholder"
    return f"sgl_kernel scalar types (0.5.23 line): {state}"


_CELLS_KEY = pytest.StashKey[list]()


@pytest.fixture
def record_cell(request: pytest.FixtureRequest):
    """Call after a matrix cell's assertions passed; the count is printed at the end."""

    def record() -> None:
        request.config.stash.setdefault(_CELLS_KEY, []).append(request.node.nodeid)

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    cells = config.stash.get(_CELLS_KEY, [])
    failed = [
        r.nodeid
        for r in terminalreporter.stats.get("failed", [])
        if "test_capability_matrix_0523.py::" in r.nodeid
    ]
    if cells or failed:
        terminalreporter.write_line(
            f"capability matrix (0.5.23): {len(cells)} cells asserted, {len(failed)} cells failed"
        )


def _reset_backend_state() -> None:
    from sglang.srt.layers.quantization import fp4_utils
    from sglang.srt.runtime_context import get_flags

    fp4_utils.FP4_GEMM_RUNNER_BACKEND = None
    moe = get_flags().moe
    for attr in ("runner_backend", "a2a_backend", "speculative_runner_backend"):
        if hasattr(moe, attr):
            setattr(moe, attr, None)


@pytest.fixture
def cuda_device(request: pytest.FixtureRequest, monkeypatch) -> Iterator[FakeCudaDevice]:
    """Make SGLang see one CUDA GPU of a chosen capability (indirect param, default 9.0)."""
    capability = tuple(getattr(request, "param", (9, 0)))
    dev = FakeCudaDevice(capability, DEVICE_NAMES.get(capability, f"sm{capability}"))
    props = types.SimpleNamespace(
        name=dev.name,
        major=capability[0],
        minor=capability[1],
        multi_processor_count=132,
        total_memory=80 * 1024**3,
        L2_cache_size=50 * 1024**2,
        warp_size=32,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: dev.name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    _clear_sglang_caches()
    _reset_backend_state()
    try:
        yield dev
    finally:
        monkeypatch.undo()
        _clear_sglang_caches()
        _reset_backend_state()


@contextlib.contextmanager
def _published(**server_args_fields):
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", **server_args_fields)
    reset_context()
    try:
        publish(server_args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
        _reset_backend_state()
        initialize_fp4_gemm_config()
        initialize_moe_config()
        yield server_args
    finally:
        reset_context()
        _reset_backend_state()


@pytest.fixture
def published(cuda_device):
    """``published(fp4_gemm_runner_backend=..., moe_runner_backend=...)``: a context
    manager that publishes those server args on the mocked GPU."""
    return _published
