"""CPU tests of the NVFP4 Marlin epilogue: padding, column scale and bias in one kernel (patch 14).

The Triton kernel of ``nvfp4_marlin_epilogue`` runs here in Triton's interpreter (the same kernel
source executed with numpy; a CPU machine cannot run it as a GPU kernel), chosen as it is on a
GPU (only the device test is mocked). It is held to the float32 operations it replaces
(``(out.float() * scale + bias).to(dtype)``) on non-uniform column scales as fused shards have
them (three shards, ratios 1, 0.5 and 2^-9 times a per-column spread), a bias the size of the
output and padding columns full of NaN. fp16 is bit-exact here; bf16 is held to 2^-7 of the
value (the interpreter truncates fp32 to bf16 where the GPU rounds to nearest even). That the
kernel multiplies and then adds (no fused multiply-add), and so gives those ops' bits, only the
GPU test shows (tests/gpu/test_marlin_numerics.py compares them bit for bit).

Against the series before patch 14 every test fails: there is no ``nvfp4_marlin_epilogue``.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

FP16, BF16 = torch.float16, torch.bfloat16
EPILOGUE = "sglang.srt.layers.quantization.nvfp4_marlin_epilogue"
MARLIN_FP4 = "sglang.srt.layers.quantization.marlin_utils_fp4"
SHARDS = (512, 256, 232)  # a padded fused QKV: 1000 columns, Marlin's output has 1024


@pytest.fixture
def ep(monkeypatch):
    """The epilogue module with its kernel run by Triton's interpreter, on CPU tensors too; the
    kernel's launches are counted in ``ep.launches``."""
    from triton.runtime.interpreter import InterpretedFunction

    module = importlib.import_module(EPILOGUE)
    kernel = InterpretedFunction(module._marlin_fp4_epilogue_kernel.fn)
    launches: list[tuple] = []

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(module, "_marlin_fp4_epilogue_kernel", Counted())
    monkeypatch.setattr(module, "_runs_kernel", lambda t: True)
    monkeypatch.setattr(module, "launches", launches, raising=False)
    return module


def _column_scale(n: int, gen: torch.Generator) -> torch.Tensor:
    """Three shards (the last one takes what SHARDS leaves of N) at ratios 1, 0.5, 2^-9."""
    sizes = (SHARDS[0], SHARDS[1], n - SHARDS[0] - SHARDS[1])
    ratios = torch.cat(
        [torch.full((s,), r) for s, r in zip(sizes, (1.0, 0.5, 2.0**-9), strict=True)]
    )
    return (ratios * (1 + torch.rand(n, generator=gen))).float()


def _case(dtype: torch.dtype, m: int, n: int, padded_n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((m, padded_n), float("nan"), dtype=dtype)
    out[:, :n] = (torch.randn(m, n, generator=gen) * 30).to(dtype)
    bias = (torch.randn(n, generator=gen) * 30).to(dtype)
    return out, _column_scale(n, gen), bias


def _assert_rounded_once(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """GOT is REF (float32) rounded once to DTYPE: exactly for fp16, within 2^-7 of it for bf16."""
    assert got.dtype == dtype and not bool(got.isnan().any())
    if dtype == FP16:
        assert torch.equal(got, ref.to(FP16))
        return
    ulp = ref.abs() * 2.0**-7
    assert bool(((got.float() - ref).abs() <= ulp).all())


@pytest.mark.parametrize("dtype", [FP16, BF16])
@pytest.mark.parametrize("padded_n", [1000, 1024])
@pytest.mark.parametrize("with_scale, with_bias", [(True, True), (True, False), (False, True)])
def test_kernel_is_the_float32_ops(ep, dtype, padded_n, with_scale, with_bias):
    out, scale, bias = _case(dtype, 5, 1000, padded_n)
    ref = out[:, :1000].float()
    if with_scale:
        ref = ref * scale
    if with_bias:
        ref = ref + bias.float()
    got = ep.marlin_fp4_epilogue(
        out.clone(), 1000, scale if with_scale else None, bias if with_bias else None
    )
    assert got.shape == (5, 1000) and got.is_contiguous()
    _assert_rounded_once(got, ref, dtype)
    assert ep.launches == [(5, 1)]  # one kernel: a program per row and 1024 columns


def test_in_place_without_padding_and_nothing_to_do(ep):
    out, scale, bias = _case(BF16, 3, 1024, 1024)
    assert ep.marlin_fp4_epilogue(out, 1024) is out and ep.launches == []
    got = ep.marlin_fp4_epilogue(out, 1024, scale, bias)
    assert got.data_ptr() == out.data_ptr() and ep.launches == [(3, 1)]
    padded, _, _ = _case(BF16, 3, 1000, 1024)
    dropped = ep.marlin_fp4_epilogue(padded, 1000)
    assert dropped.shape == (3, 1000) and not bool(dropped.isnan().any())
    assert ep.launches == [(3, 1)]  # dropping the padding alone is a copy, not this kernel


def test_off_cuda_the_float32_ops_run(monkeypatch):
    """Off CUDA (a CPU test of the layers) the wrapper runs the PyTorch ops themselves, with the
    output's dtype also where the bias has another (float32)."""
    module = importlib.import_module(EPILOGUE)
    monkeypatch.setattr(module, "_marlin_fp4_epilogue_kernel", None)  # never launched
    out, scale, bias = _case(BF16, 4, 1000, 1024)
    got = module.marlin_fp4_epilogue(out.clone(), 1000, scale, bias)
    ref = (out[:, :1000].float() * scale + bias.float()).to(BF16)
    assert torch.equal(got, ref)
    got = module.marlin_fp4_epilogue(out.clone(), 1000, None, bias.float())
    assert got.dtype == BF16 and torch.equal(got, out[:, :1000] + bias)


def test_a_strided_output_is_not_written_in_place(ep):
    """An output whose rows are longer than size_n without being padding of it (a view): the
    kernel writes rows of size_n, so the result goes to a new tensor and the view's rows stay."""
    big, scale, bias = _case(BF16, 3, 1000, 1024)
    view = big[:, :1000]
    before = big.clone()
    got = ep.marlin_fp4_epilogue(view, 1000, scale, bias)
    assert got.data_ptr() != big.data_ptr() and got.is_contiguous()
    assert torch.equal(big.isnan(), before.isnan())
    assert torch.equal(big.nan_to_num(), before.nan_to_num())  # untouched
    _assert_rounded_once(got, view.float() * scale + bias.float(), BF16)


@pytest.mark.parametrize(
    ("capability", "kernel"), [((7, 5), False), ((8, 0), True), ((9, 0), True)]
)
def test_the_kernel_runs_from_sm80(monkeypatch, capability, kernel):
    """Triton's NVIDIA GPUs start at SM80: the Turing path (SM75, fp16) keeps the PyTorch ops."""
    module = importlib.import_module(EPILOGUE)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    module._kernel_on.cache_clear()  # asked once per device, then remembered
    on_gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert module._runs_kernel(on_gpu) is kernel
    assert module._runs_kernel(torch.zeros(1)) is False  # a CPU tensor: the PyTorch ops
    module._kernel_on.cache_clear()


@pytest.mark.parametrize(
    "scale, bias, match",
    [
        (torch.ones(1000, dtype=BF16), None, "output_scale must be float32"),
        (torch.ones(999), None, r"output_scale has shape \(999,\), expected \(1000,\)"),
        (None, torch.ones(2, 1000, dtype=BF16), r"bias has shape \(2, 1000\)"),
    ],
)
def test_wrong_vectors_are_named(ep, scale, bias, match):
    out, _, _ = _case(BF16, 2, 1000, 1024)
    with pytest.raises(ValueError, match=match):
        ep.marlin_fp4_epilogue(out, 1000, scale, bias)


def test_apply_runs_one_epilogue_after_marlin(ep, monkeypatch):
    """The real linear (the pin's _apply_fp4_marlin_linear, 0.5.23's apply_fp4_marlin_linear) on
    a padded fused layer with a column scale and a bias: Marlin's output (stubbed: its GEMM needs
    a GPU) goes through the one kernel, nothing else."""
    m = importlib.import_module(MARLIN_FP4)
    apply = getattr(m, "_apply_fp4_marlin_linear", None) or m.apply_fp4_marlin_linear
    marlin_out, scale, bias = _case(BF16, 3, 1000, 1024, seed=7)
    monkeypatch.setattr(m, "gptq_marlin_gemm", lambda **kw: marlin_out.clone(), raising=False)
    monkeypatch.setattr(m, "use_dequant_gemm", lambda *a: False)
    weight = torch.zeros(256 // 16, 2 * 1024, dtype=torch.int32)
    x = torch.zeros(3, 256, dtype=BF16)
    got = apply(
        x, weight, torch.zeros(16, 1024, dtype=torch.float8_e4m3fn), torch.ones(1, dtype=BF16),
        torch.zeros(1, dtype=torch.int32), 1000, 256, bias, output_scale=scale,
    )  # fmt: skip
    _assert_rounded_once(got, marlin_out[:, :1000].float() * scale + bias.float(), BF16)
    assert ep.launches == [(3, 1)]
