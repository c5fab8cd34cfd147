"""Fixtures of the CPU tests of the pin's patched SGLang tree: the one SGLang CPU harness
(_sglang_cpu.py, shared with every maintained line's tests) for the pin's line.

The CPU machine cannot answer "which GPU is this?", so the ``cuda_device``
fixture makes SGLang's code see a chosen compute capability on a CUDA
platform.  Everything else (config parsing, scheme selection, tensor helpers)
runs the real SGLang code from ``PYTHONPATH``. Also here: ``record_cell`` (the
capability matrix's count), ``FakeCudaDevice``, ``DATA_DIR``, ``DEVICE_NAMES``; and the pin's
own ``parallel_ranks`` and ``marlin_kernels`` (below).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import _sglang_cpu
import pytest
import torch

_sglang_cpu.conftest(globals(), _sglang_cpu.LINES["0.5.11"], check_version=False)


# --------------------------------------------------------------------------
# Tensor / expert parallel ranks and the Marlin kernels (tests of issue 20)
# --------------------------------------------------------------------------


@pytest.fixture
def parallel_ranks(cuda_device, monkeypatch):
    """``parallel_ranks(tp_rank, tp_size, ep_size=1, **server_args)``: SGLang sees that rank.

    Mocks only the parallel state (rank, group sizes: _parallel.py beside this file) and publishes
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
