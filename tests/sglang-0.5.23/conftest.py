"""Fixtures of the CPU tests of the 0.5.23 line's SGLang tree: the one SGLang CPU harness
(_sglang_cpu.py, which the pin's tests use too) for the 0.5.23 line.

SGLang 0.5.23 is imported from ``PYTHONPATH`` (the line's checkout) as a CPU machine sees it;
``cuda_device`` makes it see one CUDA GPU of a chosen capability, and ``published`` publishes a
real ``ServerArgs`` into its runtime context and runs 0.5.23's own
``initialize_fp4_gemm_config`` / ``initialize_moe_config`` from it. The CUDA kernels are
stubbed by the tests that need them.
"""

from __future__ import annotations

import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "sglang"
if (HARNESS / "_sglang_cpu.py").is_file() and str(HARNESS) not in sys.path:
    sys.path.insert(0, str(HARNESS))  # (where the tests are placed beside it, it is found there)

import _sglang_cpu  # noqa: E402

_sglang_cpu.conftest(globals(), _sglang_cpu.LINES["0.5.23"], check_version=True)
