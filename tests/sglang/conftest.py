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
