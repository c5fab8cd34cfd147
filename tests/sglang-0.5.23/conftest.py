"""Fixtures of the CPU tests of the 0.5.23 line's SGLang tree: the one SGLang CPU harness
(tests/sglang/_sglang_cpu.py, the pin's tests use it too) for the 0.5.23 line.

SGLang 0.5.23 is imported from ``PYTHONPATH`` (the line's checkout) as a CPU machine sees it;
``cuda_device`` makes it see one CUDA GPU of a chosen capability, and ``published`` publishes a
real ``ServerArgs`` into its runtime context and runs 0.5.23's own
``initialize_fp4_gemm_config`` / ``initialize_moe_config`` from it. The CUDA kernels are
stubbed by the tests that need them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "sglang"
if (HARNESS / "_sglang_cpu.py").is_file() and str(HARNESS) not in sys.path:
    sys.path.insert(0, str(HARNESS))  # (where the tests are placed beside it, it is found there)

import _sglang_cpu as harness  # noqa: E402
from _sglang_cpu import DATA_DIR, DEVICE_NAMES, FakeCudaDevice  # noqa: E402,F401

LINE = harness.LINES["0.5.23"]


def pytest_sessionstart(session: pytest.Session) -> None:
    harness.start_session(LINE, check_version=True)


def pytest_report_header(config) -> str:
    return harness.report_header(LINE)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    harness.terminal_summary(LINE, terminalreporter, config)


@pytest.fixture
def record_cell(request: pytest.FixtureRequest):
    """Call after a matrix cell's assertions passed; the count is printed at the end."""
    return harness.record_cell_fixture(request)


@pytest.fixture
def cuda_device(request: pytest.FixtureRequest, monkeypatch) -> Iterator[FakeCudaDevice]:
    """Make SGLang see one CUDA GPU of a chosen capability (indirect param, default 9.0)."""
    yield from harness.mock_cuda_device(LINE, request, monkeypatch)


@pytest.fixture
def published(cuda_device):
    """``published(fp4_gemm_runner_backend=..., moe_runner_backend=...)``: a context
    manager that publishes those server args on the mocked GPU."""
    return functools.partial(harness.published, LINE)
