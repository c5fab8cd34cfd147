"""NVFP4 Marlin dense linears add their bias in its original column order (SGLang 0.5.23).

0.5.23's ``prepare_nvfp4_layer_for_marlin`` stores ``marlin_permute_bias(bias)``, while
``apply_fp4_marlin_linear`` adds ``layer.bias`` to the output of ``gptq_marlin_gemm``,
which takes no bias and returns its columns in the original order: every NVFP4 Marlin
linear with a non-constant bias is wrong (rel L2 0.83-0.89 measured on an H200).

The CUDA ops (``gptq_marlin_repack``, ``gptq_marlin_gemm``, ``marlin_make_workspace``)
are stubbed by the CPU harness (``MarlinStubs`` in _sglang_cpu.py): the GEMM returns a known
tensor, so the layer's output must be that tensor plus the checkpoint's bias, column by
column. Everything else is 0.5.23's code: the helper itself, and a real
``ReplicatedLinear`` built with the ModelOpt / compressed-tensors quant config parsed
from a checkpoint directory, its real ``process_weights_after_loading`` and ``forward``.
On bare v0.5.23 every test here fails (the bias comes out permuted).
"""

from __future__ import annotations

import importlib

import _sglang_cpu
import pytest
import torch
from _sglang_cpu import ALL_CHECKPOINTS as CHECKPOINTS
from _sglang_cpu import MarlinStubs, fp8_scales, quant_config

FP16, BF16 = torch.float16, torch.bfloat16


@pytest.fixture
def marlin_fp4():
    return importlib.import_module("sglang.srt.layers.quantization.marlin_utils_fp4")


def _bias(n: int, dtype: torch.dtype) -> torch.Tensor:
    # Non-constant, and different under any permutation of its 64-column tiles.
    return (torch.linspace(-3.0, 5.0, n) + torch.arange(n) % 7 * 0.25).to(dtype)


def _helper_layer(n: int, k: int, dtype: torch.dtype, bias: torch.Tensor) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(n + k)
    layer = torch.nn.Module()
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.params_dtype = dtype
    w = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(
        fp8_scales((n, k // 16), 0x30, 0x5F, n), requires_grad=False
    )
    layer.weight_global_scale = torch.nn.Parameter(torch.tensor(0.0123), requires_grad=False)
    layer.bias = torch.nn.Parameter(bias.clone(), requires_grad=False)
    return layer


def _expected(stubs: MarlinStubs, m: int, n: int, bias: torch.Tensor, dtype) -> torch.Tensor:
    (call,) = stubs.gemm_calls
    stub_out = (torch.arange(m * call["size_n"], dtype=torch.float32) % 61 - 30).view(
        m, call["size_n"]
    ) / 8
    return (stub_out.to(dtype)[:, :n].float() + bias.float()).to(dtype)


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "n, k", [(256, 512), (192, 512), (96, 256)], ids=["n256", "n192", "n96-padded"]
)
def test_helper_adds_bias_in_original_order(cuda_device, monkeypatch, marlin_fp4, n, k, dtype):
    stubs = MarlinStubs(marlin_fp4, monkeypatch)
    bias = _bias(n, dtype)
    layer = _helper_layer(n, k, dtype, bias)
    marlin_fp4.prepare_nvfp4_layer_for_marlin(layer)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1)).to(dtype)

    out = marlin_fp4.apply_fp4_marlin_linear(
        input=x,
        weight=layer.weight,
        weight_scale=layer.weight_scale,
        weight_global_scale=layer.weight_global_scale,
        workspace=layer.workspace,
        size_n=n,
        size_k=k,
        bias=layer.bias,
    )

    assert out.shape == (3, n)
    torch.testing.assert_close(out, _expected(stubs, 3, n, bias, dtype), rtol=0, atol=0)
    if _sglang_cpu.real_scalar_types_loaded():
        assert stubs.gemm_calls[0]["b_q_type"].id == _sglang_cpu.FLOAT4_E2M1F_ID


def _real_linear(ckpt_key: str, n: int, k: int, dtype: torch.dtype):
    from sglang.srt.layers.linear import ReplicatedLinear

    ckpt = CHECKPOINTS[ckpt_key]
    return ReplicatedLinear(
        k, n, bias=True, params_dtype=dtype, quant_config=quant_config(ckpt), prefix=ckpt.prefix
    )


def _load(layer, ckpt_key: str, n: int, k: int, bias: torch.Tensor) -> None:
    """Fill the checkpoint tensors through each parameter's own weight_loader."""
    gen = torch.Generator().manual_seed(5)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    tensors = {"weight_scale": fp8_scales((n, k // 16), 0x30, 0x5F, 5), "bias": bias}
    if ckpt_key.startswith("modelopt"):
        tensors.update(
            weight=packed, weight_scale_2=torch.tensor(0.0123), input_scale=torch.tensor(0.5)
        )
    else:  # compressed-tensors: weight_packed, global scales as divisors
        tensors.update(
            weight_packed=packed,
            weight_global_scale=torch.tensor([1 / 0.0123]),
            input_global_scale=torch.tensor([2.0]),
        )
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor)


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("n", [256, 96], ids=["n256", "n96-padded"])
@pytest.mark.parametrize("ckpt_key", ["modelopt-dense", "ct-dense"])
def test_linear_method_adds_bias_in_original_order(
    published, monkeypatch, marlin_fp4, ckpt_key, n, dtype
):
    """A real ReplicatedLinear with a bias, ModelOpt or compressed-tensors NVFP4, on Marlin."""
    k = 256
    stubs = MarlinStubs(marlin_fp4, monkeypatch)
    bias = _bias(n, dtype)
    with published(
        fp4_gemm_runner_backend="marlin", dtype="float16" if dtype == FP16 else "bfloat16"
    ):
        layer = _real_linear(ckpt_key, n, k, dtype)
        _load(layer, ckpt_key, n, k, bias)
        layer.quant_method.process_weights_after_loading(layer)
        x = torch.randn(4, k, generator=torch.Generator().manual_seed(2)).to(dtype)
        out, out_bias = layer(x)

    assert out_bias is None and len(stubs.repacks) == 1
    torch.testing.assert_close(out, _expected(stubs, 4, n, bias, dtype), rtol=0, atol=0)
