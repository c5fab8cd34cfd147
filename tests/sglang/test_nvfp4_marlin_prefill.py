"""CPU tests of the NVFP4 prefill path: Marlin-layout weights dequantized for cuBLAS (patch 13).

The Triton kernel of ``nvfp4_marlin_prefill`` runs here in Triton's interpreter (the same
kernel source, executed with numpy: a CPU machine cannot run it as a GPU kernel), on layers
the real ``prepare_nvfp4_layer_for_marlin`` made, only its CUDA repack replaced by the layout
model (_marlin_layout.py, proven equal to the repack kernel on the GPU). The expected weights
come from the checkpoint tensors themselves (``nvfp4_weight``: codes and block scales), never
from the layout: a wrong nibble, row or scale byte changes them. Scales are non-uniform. The
interpreter rounds fp32 to bf16 by truncation where the GPU rounds to nearest even, so bf16
results are held to one bf16 ulp here (the GPU numerics check them bit for bit); fp16 is
bit-exact here too.

Against the pin before patch 13 every test fails: there is no ``nvfp4_marlin_prefill``.
"""

from __future__ import annotations

import importlib
import types

import _marlin_layout
import pytest
import torch
from _sglang_cpu import nvfp4_weight, prepare_nvfp4_dense, rel_l2

FP16, BF16 = torch.float16, torch.bfloat16
PREFILL = "sglang.srt.layers.quantization.nvfp4_marlin_prefill"
MARLIN_FP4 = "sglang.srt.layers.quantization.marlin_utils_fp4"


@pytest.fixture
def pf(monkeypatch):
    """The prefill module with its kernel run by Triton's interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    module = importlib.import_module(PREFILL)
    kernel = module._dequant_nvfp4_marlin_kernel
    monkeypatch.setattr(module, "_dequant_nvfp4_marlin_kernel", InterpretedFunction(kernel.fn))
    return module


@pytest.fixture
def m():
    return importlib.import_module(MARLIN_FP4)


def _apply(m):
    """The linear's implementation: the pin's _apply_fp4_marlin_linear, or the registered op
    where that is the function itself (0.5.23's apply_fp4_marlin_linear)."""
    return getattr(m, "_apply_fp4_marlin_linear", None) or m.apply_fp4_marlin_linear


def _layer(m, monkeypatch, n: int, k: int, dtype: torch.dtype, g: float = 0.0123):
    smallest = 2.0**-9 if dtype == FP16 else 2.0**-6
    w, layer = prepare_nvfp4_dense(m, monkeypatch, n, k, dtype, smallest=smallest, g=g)
    g_eff = _marlin_layout.decode_global_scale(layer.weight_global_scale.data, dtype)
    return w, layer, nvfp4_weight(w.codes, w.scales, g_eff).float()


def _output_sized_bias(x: torch.Tensor, w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A bias as large as the layer's output (its rms): dropped, doubled or scaled by the
    column scale, it moves the result far past the tolerances below."""
    rms = (x.double() @ w.double().T).pow(2).mean().sqrt().item()
    return torch.randn(w.shape[0], generator=gen) * rms


def _assert_rounded_once(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == FP16:
        assert torch.equal(got, ref.to(FP16))
        return
    ulp = torch.where(ref == 0, torch.zeros_like(ref), ref.abs() * 2.0**-7)
    assert bool(((got.float() - ref).abs() <= ulp).all())


@pytest.mark.parametrize("dtype", [FP16, BF16])
@pytest.mark.parametrize("n, k", [(192, 256), (1000, 2080)])  # the second is padded in N and K
def test_dequant_gives_the_checkpoint_weights(m, pf, monkeypatch, dtype, n, k):
    w, layer, ref = _layer(m, monkeypatch, n, k, dtype)
    out = torch.full((n, k), float("nan"), dtype=dtype)
    pf.dequant_nvfp4_marlin(
        layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data, 0, n, k, out
    )
    _assert_rounded_once(out, ref, dtype)


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_dequant_of_a_chunk_and_its_column_scales(m, pf, monkeypatch, dtype):
    """Rows [128, 320) only, times a per-column output scale (fused shards)."""
    n, k = 384, 512
    w, layer, ref = _layer(m, monkeypatch, n, k, dtype)
    col = torch.linspace(0.5, 2.0, n) * torch.where(torch.arange(n) % 3 == 0, 1.0, 0.75)
    out = torch.full((256, k), float("nan"), dtype=dtype)
    pf.dequant_nvfp4_marlin(
        layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
        128, 192, k, out, output_scale=col,
    )  # fmt: skip
    expected = ref[128:320] * col[128:320, None]
    rtol, atol = (2.0**-11, 2.0**-25) if dtype == FP16 else (2.0**-7, 0.0)  # fp16: subnormals
    assert torch.allclose(out[:192].float(), expected, rtol=rtol, atol=atol)
    assert torch.isnan(out[192:].float()).all()  # rows past the chunk untouched


def test_dequant_refuses_what_the_layout_does_not_hold(m, pf, monkeypatch):
    _, layer, _ = _layer(m, monkeypatch, 128, 256, BF16)
    args = (layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data)
    with pytest.raises(ValueError, match=r"rows \[64, 192\) or K 256 outside"):
        pf.dequant_nvfp4_marlin(*args, 64, 128, 256, torch.empty(128, 256, dtype=BF16))
    with pytest.raises(ValueError, match="must be the same float16 or bfloat16"):
        pf.dequant_nvfp4_marlin(*args, 0, 128, 256, torch.empty(128, 256, dtype=FP16))


@pytest.mark.parametrize(
    "n, k, expected",
    [
        (6144, 4096, 6144),  # Llama-3.1-8B qkv: the whole layer in one chunk
        (28672, 4096, 20480),  # gate_up: 160 MiB / (2 x 4096) rows
        (10240, 8192, 10240),
        (57344, 8192, 10240),
        (4096, 14336, 4096),
        (8192, 28672, 2880),  # 2925 rounded down to 64
        (1000, 2080, 1024),  # N rounded up to the tile
    ],
)
def test_dequant_chunk_rows_fit_the_scratch(n, k, expected):
    pf = importlib.import_module(PREFILL)
    assert pf.dequant_chunk_rows(n, k) == expected
    assert expected * k * 2 <= pf.SCRATCH_BYTES
    assert pf.dequant_chunk_rows(n, k, scratch_bytes=1) == 64


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_dequant_gemm_over_several_chunks_with_bias(m, pf, monkeypatch, dtype):
    """A scratch of 128 rows: chunks [0, 128), [128, 256), [256, 320) of N = 320."""
    n, k, rows = 320, 256, 40
    w, layer, ref = _layer(m, monkeypatch, n, k, dtype)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    bias = _output_sized_bias(x, ref, gen).to(dtype)
    got = pf.dequant_gemm_nvfp4_marlin(
        x, layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
        n, k, bias=bias, scratch_bytes=128 * k * 2,
    )  # fmt: skip
    expected = x.double() @ ref.double().T + bias.double()
    assert got.shape == (rows, n) and got.dtype == dtype
    assert rel_l2(got, expected) < (2e-3 if dtype == FP16 else 1e-2)
    # each chunk lands in its own columns: a chunk written twice or shifted would fail here
    for n0, n1 in ((0, 128), (128, 256), (256, 320)):
        assert rel_l2(got[:, n0:n1], expected[:, n0:n1]) < (2e-3 if dtype == FP16 else 1e-2)


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_apply_fp4_marlin_linear_takes_the_dequant_path(m, pf, monkeypatch, dtype):
    """The real apply_fp4_marlin_linear: with the path chosen, no Marlin GEMM runs and the
    output (3-D input, padded layer, bias and fused shards' column scale) is the reference."""
    n, k = 1000, 2080
    w, layer, ref = _layer(m, monkeypatch, n, k, dtype)
    seen = []
    monkeypatch.setattr(m, "use_dequant_gemm", lambda rows, dev, dt: seen.append(rows) or True)

    def no_marlin(**kwargs):
        raise AssertionError("the Marlin GEMM ran on the dequant path")

    monkeypatch.setattr(m, "gptq_marlin_gemm", no_marlin, raising=False)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, k, generator=gen).to(dtype)
    col = torch.linspace(0.5, 1.5, n)
    bias = _output_sized_bias(x.reshape(6, k), ref * col[:, None], gen).to(dtype)
    got = _apply(m)(
        x, layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
        layer.workspace, n, k, bias=bias, output_scale=col,
    )  # fmt: skip
    assert seen == [6]
    expected = x.reshape(6, k).double() @ (ref * col[:, None]).double().T + bias.double()
    assert got.shape == (2, 3, n)
    assert rel_l2(got.reshape(6, n), expected) < (2e-3 if dtype == FP16 else 1e-2)


CAPABILITIES = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]


@pytest.mark.parametrize("cuda_device", CAPABILITIES, indirect=True)
@pytest.mark.parametrize("rows", [1, 16, 256, 511, 512, 1024, 8192])
def test_dequant_path_only_where_measured(cuda_device, rows):
    """SM90 and bf16 from PREFILL_MIN_M (512) rows on; every other GPU, fp16 and fewer rows
    keep Marlin."""
    pf = importlib.import_module(PREFILL)
    assert pf.PREFILL_MIN_M == 512
    cuda = types.SimpleNamespace(type="cuda", index=0)
    expected = cuda_device.capability == (9, 0) and rows >= 512
    assert pf.use_dequant_gemm(rows, cuda, BF16) is expected
    assert pf.use_dequant_gemm(rows, cuda, FP16) is False
    assert pf.use_dequant_gemm(rows, torch.device("cpu"), BF16) is False


@pytest.mark.parametrize("rows, marlin", [(511, True), (512, False)])
def test_apply_takes_the_path_from_the_threshold(m, pf, monkeypatch, rows, marlin):
    """apply_fp4_marlin_linear asks the real use_dequant_gemm (the CPU tensor standing in for
    an SM90 device): Marlin's GEMM below PREFILL_MIN_M rows, the dequant path from it."""
    n, k = 192, 256
    _, layer, _ = _layer(m, monkeypatch, n, k, BF16)
    calls = []

    def gemm(**kwargs):
        calls.append(kwargs["size_m"])
        return torch.zeros(kwargs["size_m"], kwargs["size_n"], dtype=BF16)

    monkeypatch.setattr(m, "gptq_marlin_gemm", gemm, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = types.SimpleNamespace(type="cuda", index=0)
    real = pf.use_dequant_gemm
    monkeypatch.setattr(m, "use_dequant_gemm", lambda r, device, dtype: real(r, cuda, dtype))
    x = torch.randn(rows, k).to(BF16)
    out = _apply(m)(
        x, layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
        layer.workspace, n, k,
    )  # fmt: skip
    assert calls == ([rows] if marlin else [])
    assert bool(out.abs().sum() > 0) is not marlin  # the stand-in GEMM returns zeros
