"""Fused shards with their own global scales, through SGLang's real loaders (patch 10).

A real ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` (tensor parallel size 1) is built
with the quant config parsed from a checkpoint directory (ModelOpt: ``weight_scale_2``
multipliers; compressed-tensors: ``weight_global_scale`` divisors), every shard is loaded
through the layer's own ``weight_loader`` with its own global scale, and the real
``process_weights_after_loading`` prepares the Marlin tensors. Only the CUDA repack and the
device capability are stubbed. The check: what the kernel will apply (block scale x global
scale x output column scale, decoded from the produced bytes) equals each shard's own
block scales times its own global scale.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch
from _sglang_cpu import CHECKPOINTS, load_shards
from _sglang_cpu import effective_scales as _effective_scales
from _sglang_cpu import marlin_scale_layout as _marlin_scale_layout
from _sglang_cpu import quant_config as _quant_config
from test_marlin_utils_fp4 import _stub_kernels

HIDDEN = 256
HEAD = 64
# q, k, v of 4 query and 2 KV heads; gate and up of an MLP
QKV_SHARDS = {"q": 4 * HEAD, "k": 2 * HEAD, "v": 2 * HEAD}
GATE_UP_SHARDS = {0: 192, 1: 192}
G = 0.0123  # the first shard's multiplier


@pytest.fixture
def marlin_utils():
    return importlib.import_module("sglang.srt.layers.quantization.marlin_utils_fp4")


def _build(kind: str, ckpt_key: str, dtype: torch.dtype):
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
    from sglang.srt.layers.quantization import fp4_utils

    fp4_utils.initialize_fp4_gemm_config(types.SimpleNamespace(fp4_gemm_runner_backend="marlin"))
    quant_config = _quant_config(CHECKPOINTS[ckpt_key])
    common = dict(bias=False, params_dtype=dtype, quant_config=quant_config, tp_rank=0, tp_size=1)
    if kind == "qkv":
        layer = QKVParallelLinear(
            HIDDEN, HEAD, 4, 2, prefix="model.layers.0.self_attn.qkv_proj", **common
        )
        return layer, QKV_SHARDS
    layer = MergedColumnParallelLinear(
        HIDDEN, list(GATE_UP_SHARDS.values()), prefix="model.layers.0.mlp.gate_up_proj", **common
    )
    return layer, GATE_UP_SHARDS


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("ratio", [2.0, 0.5, 1e-3])
@pytest.mark.parametrize("ckpt_key", ["modelopt-dense", "ct-dense"])
@pytest.mark.parametrize("kind", ["qkv", "gate_up"])
def test_fused_shard_scales_through_the_loader(
    cuda_device, monkeypatch, marlin_utils, kind, ckpt_key, ratio, dtype
):
    _stub_kernels(marlin_utils, monkeypatch)
    layer, shards = _build(kind, ckpt_key, dtype)
    multipliers = [G, G * ratio, G / 2][: len(shards)]
    blocks = load_shards(layer, shards, multipliers, ckpt_key, len(shards), HIDDEN)
    assert list(layer.output_partition_sizes) == list(shards.values())

    layer.quant_method.process_weights_after_loading(layer)

    sizes = shards.values()
    per_row = torch.cat(
        [torch.full((n,), m, dtype=torch.float64) for n, m in zip(sizes, multipliers, strict=True)]
    )
    col = layer.weight_output_scale
    col = torch.ones(len(per_row)) if col is None else col
    got = _effective_scales(layer.weight_scale, layer.weight_global_scale, dtype)
    got = got * col.double()[None, :]
    expected = _marlin_scale_layout(blocks.double()) * per_row[None, :]
    rtol = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    torch.testing.assert_close(got, expected, rtol=rtol, atol=0)
    # and apply hands the column scale to the Marlin op (a CUDA custom op: recorded here)
    seen = []
    method = layer.quant_method
    owner = sys.modules[type(getattr(layer, "scheme", None) or method).__module__]
    monkeypatch.setattr(owner, "apply_fp4_marlin_linear", lambda **kw: seen.append(kw))
    method.apply(layer, torch.zeros(2, HIDDEN, dtype=dtype))
    (kw,) = seen
    assert kw["output_scale"] is layer.weight_output_scale
    assert kw["weight_global_scale"] is layer.weight_global_scale


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize("ckpt_key", ["modelopt-dense", "ct-dense"])
def test_fused_shard_scales_too_far_apart_are_refused(
    cuda_device, monkeypatch, marlin_utils, ckpt_key
):
    """fp16 folds the ratio's power of two into block scales: below 2^-12 it cannot."""
    calls = _stub_kernels(marlin_utils, monkeypatch)
    layer, shards = _build("qkv", ckpt_key, torch.float16)
    load_shards(layer, shards, [G, G * 1e-5, G], ckpt_key, 1, HIDDEN)
    with pytest.raises(ValueError) as err:
        layer.quant_method.process_weights_after_loading(layer)
    message = str(err.value)
    assert "model.layers.0.self_attn.qkv_proj" in message or "QKVParallelLinear" in message
    assert "global scales [0.0123, 1.23e-07, 0.0123]" in message
    assert not calls
