"""Shared fixtures for the CPU tests of the patched SGLang tree.

The CPU machine cannot answer "which GPU is this?", so the ``cuda_device``
fixture makes SGLang's code see a chosen compute capability on a CUDA
platform.  Everything else (config parsing, scheme selection, tensor helpers)
runs the real SGLang code from ``PYTHONPATH``.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

DATA_DIR = Path(__file__).parents[1] / "data" / "nvfp4-configs"

# Capability -> a device name of that generation (only used for messages/logs).
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

# SGLang module globals that cache a resolved backend; reset per test so one
# test's backend choice never leaks into the next.
_BACKEND_GLOBALS = (
    ("sglang.srt.layers.quantization.fp4_utils", "FP4_GEMM_RUNNER_BACKEND"),
    ("sglang.srt.layers.moe.utils", "MOE_RUNNER_BACKEND"),
)


@dataclass(frozen=True)
class FakeCudaDevice:
    """What the mocked CUDA device reports."""

    capability: tuple[int, int]
    name: str

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]


_CACHED_PROBES: dict[str, list] = {}


def _clear_sglang_caches() -> None:
    """Clear every functools cache in loaded SGLang modules.

    Platform probes (is_cuda, is_sm100_supported, is_blackwell_supported,
    is_flashinfer_available, ...) are lru_cached; a cached answer from an
    earlier capability would make the next test see the wrong GPU.
    """
    for name, module in list(sys.modules.items()):
        if not (name == "sglang" or name.startswith("sglang.")) or module is None:
            continue
        if name not in _CACHED_PROBES:
            found = []
            for value in list(vars(module).values()):
                # Look at the type only: some module attributes are lazy
                # importers whose attribute access would import more of SGLang.
                if isinstance(value, functools._lru_cache_wrapper) or (
                    isinstance(value, types.FunctionType) and "cache_clear" in vars(value)
                ):
                    found.append(value)
            _CACHED_PROBES[name] = found
        for fn in _CACHED_PROBES[name]:
            fn.cache_clear()


def _device_properties(dev: FakeCudaDevice) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name=dev.name,
        major=dev.capability[0],
        minor=dev.capability[1],
        multi_processor_count=132,
        total_memory=80 * 1024**3,
        L2_cache_size=50 * 1024**2,
        warp_size=32,
    )


_SCALAR_TYPES_STATE = {"loaded": False}


def _install_real_scalar_types() -> None:
    """Use sgl_kernel's real scalar type ids when the loader is present.

    ``tests/sglang/_scalar_types.py`` loads the stdlib-only
    ``sgl_kernel/scalar_type.py`` from the sglang-kernel 0.4.2 wheel (see its
    docstring for where it looks); without it the pin falls back to
    placeholder strings on a machine without a GPU driver. It must run before
    SGLang is imported, hence session start.
    """
    here = Path(__file__).parent
    if not (here / "_scalar_types.py").exists():
        return
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    module = importlib.import_module("_scalar_types")
    module.install()
    _SCALAR_TYPES_STATE["loaded"] = module.real_scalar_types_loaded()


def pytest_sessionstart(session: pytest.Session) -> None:
    _install_real_scalar_types()


def pytest_report_header(config) -> str:
    state = "real (sglang-kernel wheel)" if _SCALAR_TYPES_STATE["loaded"] else "placeholder"
    return f"sgl_kernel scalar types: {state}"


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
        if "test_capability_matrix.py::" in r.nodeid
    ]
    if cells or failed:
        terminalreporter.write_line(
            f"capability matrix: {len(cells)} cells asserted, {len(failed)} cells failed"
        )


@pytest.fixture
def cuda_device(request: pytest.FixtureRequest, monkeypatch) -> Iterator[FakeCudaDevice]:
    """Make all of SGLang see one CUDA GPU of a chosen capability.

    Parametrize indirectly with ``(major, minor)``; default (9, 0).  Patched:
    torch's CUDA device queries (what a CPU machine cannot answer), SGLang's
    cached platform probes (cleared before and after), and the FP4 GEMM / MoE
    runner backend globals (reset to "not initialised").  flashinfer and
    sgl_kernel availability stay what this machine really has.
    """
    capability = tuple(getattr(request, "param", (9, 0)))
    dev = FakeCudaDevice(capability, DEVICE_NAMES.get(capability, f"sm{capability}"))

    def get_device_capability(device=None):
        return dev.capability

    def get_device_properties(device=None):
        return _device_properties(dev)

    def get_device_name(device=None):
        return dev.name

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # A CUDA build of torch reports its CUDA version; a CPU build does not.
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.8")
    monkeypatch.setattr(torch.version, "hip", None)

    for module_name, attr in _BACKEND_GLOBALS:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        monkeypatch.setattr(module, attr, None)

    _clear_sglang_caches()
    try:
        yield dev
    finally:
        monkeypatch.undo()
        _clear_sglang_caches()


# --------------------------------------------------------------------------
# Tensor / expert parallel ranks and the Marlin kernels (tests of issue 20)
# --------------------------------------------------------------------------


@pytest.fixture
def parallel_ranks(cuda_device, monkeypatch):
    """``parallel_ranks(tp_rank, tp_size, ep_size=1, **server_args)``: SGLang sees that rank.

    Mocks only the parallel state (rank, group sizes: tests/sglang/_parallel.py) and publishes
    a real ``ServerArgs`` with the given backends; call it again for the next rank.
    """
    here = str(Path(__file__).parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import _parallel

    def use(tp_rank: int = 0, tp_size: int = 1, ep_size: int = 1, **server_args):
        ranks = _parallel.Ranks(tp_rank, tp_size, ep_size)
        return _parallel.use_ranks(monkeypatch, ranks, **server_args)

    return use


MARLIN_FP4 = "sglang.srt.layers.quantization.marlin_utils_fp4"
FUSED_MARLIN_MOE = "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe"


@dataclass
class Repack:
    """One gptq_marlin_repack call: the GPTQ-packed int32 [K/8, N] input and its shape."""

    size_k: int
    size_n: int
    qweight: torch.Tensor

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Packed FP4 bytes [len(index), K/2] of the given output rows (as the layer had them)."""
        return self.qweight[:, index].T.contiguous().view(torch.uint8)


@dataclass
class MarlinKernels:
    """What the CUDA-only Marlin ops were handed (recorded instead of run)."""

    repacks: list[Repack]
    gemms: list[dict]  # gptq_marlin_gemm keyword arguments, plus "out": what it returned
    moe_calls: list[dict]  # fused_marlin_moe keyword arguments

    def clear(self) -> None:
        self.repacks.clear()
        self.gemms.clear()
        self.moe_calls.clear()


_CPU_OPS: list = []  # torch.library registrations live as long as their Library object


def _register_cpu_linear_op() -> None:
    """Run ``sglang::apply_fp4_marlin_linear`` on CPU tensors through its Python body.

    SGLang registers the op for CUDA only; its body (input padding, the GEMM call, output
    slicing, bias and column scales) is plain torch around ``gptq_marlin_gemm``, which the
    ``marlin_kernels`` fixture records. Registered once per session.
    """
    if _CPU_OPS or not hasattr(torch.ops.sglang, "apply_fp4_marlin_linear"):
        return
    module = importlib.import_module(MARLIN_FP4)

    def on_cpu(*args, **kwargs):
        return module._apply_fp4_marlin_linear(*args, **kwargs)

    library = torch.library.Library("sglang", "IMPL")  # noqa: TOR901
    library.impl("apply_fp4_marlin_linear", on_cpu, "CPU")
    _CPU_OPS.append(library)


@pytest.fixture
def marlin_kernels(cuda_device, monkeypatch) -> MarlinKernels:
    """Record the Marlin CUDA ops instead of running them; everything around them is real.

    ``gptq_marlin_repack`` (the repack of each weight at load), ``gptq_marlin_gemm`` (returns
    zeros of the shape asked for), the workspace, and ``fused_marlin_moe`` (returns zeros).
    """
    kernels = MarlinKernels([], [], [])
    marlin = importlib.import_module(MARLIN_FP4)

    def repack(b_q_weight, perm, size_k, size_n, num_bits):
        kernels.repacks.append(Repack(size_k, size_n, b_q_weight))
        return torch.empty(size_k // 16, size_n * 2, dtype=torch.int32)

    def gemm(**kwargs):
        out = torch.zeros(kwargs["size_m"], kwargs["size_n"], dtype=kwargs["a"].dtype)
        kernels.gemms.append({**kwargs, "out": out})
        return out

    def fused_marlin_moe(*args, **kwargs):
        if args:
            raise AssertionError("fused_marlin_moe is called with keyword arguments only")
        kernels.moe_calls.append(kwargs)
        return torch.zeros_like(kwargs["hidden_states"])

    monkeypatch.setattr(marlin, "gptq_marlin_repack", repack, raising=False)
    monkeypatch.setattr(marlin, "gptq_marlin_gemm", gemm, raising=False)
    monkeypatch.setattr(
        marlin, "marlin_make_workspace", lambda device, max_blocks_per_sm=1: torch.zeros(1)
    )
    moe_module = importlib.import_module(FUSED_MARLIN_MOE)
    monkeypatch.setattr(moe_module, "fused_marlin_moe", fused_marlin_moe)
    _register_cpu_linear_op()
    return kernels
