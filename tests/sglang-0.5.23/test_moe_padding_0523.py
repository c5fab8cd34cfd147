"""NVFP4 Marlin MoE with an expert intermediate size off Marlin's tile (tensor parallelism).

Qwen3-30B-A3B at --tp 8 has 768 / 8 = 96 intermediate rows per expert and rank; Marlin
MoE needs them in multiples of 64 (with a hidden size that is a multiple of 128). 0.5.23
pads only non-gated experts. Through the real ModelOpt and compressed-tensors MoE methods
(repack recorded, device capability mocked): a gated layer's w1 and w3 halves are each
zero-padded ([w1, 0, w3, 0], so silu_and_mul's split stays aligned), w2 gains zero
columns, the padded block scales are zero, and the kernels are asked for the padded size.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import test_capability_matrix_0523 as matrix
import torch
from _sglang_cpu import BF16, FP16, MarlinStubs, kernel_scale_decode, marlin_scale_layout
from test_fused_shards_0523 import _moe_after_loading

MARLIN_FP4 = "sglang.srt.layers.quantization.marlin_utils_fp4"
SM90 = pytest.param((9, 0), id="sm90")


def _codes_nk(weight_uint8: torch.Tensor) -> torch.Tensor:
    """ModelOpt / compressed-tensors packing: uint8 [N, K/2], low nibble first -> [N, K]."""
    w = weight_uint8.to(torch.int64)
    return torch.stack([w & 0xF, w >> 4], dim=-1).reshape(w.shape[0], -1)


def _codes_from_repack_input(q: torch.Tensor, k: int) -> torch.Tensor:
    """What the repack is handed: int32 [K/8, N], 8 nibbles along K, low first -> [N, K]."""
    shifts = torch.arange(8, dtype=torch.int64) * 4
    codes = (q.to(torch.int64).unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF
    return codes.reshape(k, -1).T


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("ckpt_key", ["modelopt-moe", "ct-moe"])
def test_gated_moe_intermediate_padded_per_half(published, monkeypatch, ckpt_key, dtype):
    inter, padded, hidden, experts = 96, 128, matrix.HIDDEN, matrix.EXPERTS
    monkeypatch.setattr(matrix, "INTER", inter)
    stubs = MarlinStubs(importlib.import_module(MARLIN_FP4), monkeypatch)
    captured = {}
    real_prepare = importlib.import_module(MARLIN_FP4).prepare_moe_nvfp4_layer_for_marlin

    def keep_inputs(layer, *args, **kwargs):
        captured["w13"] = layer.w13_weight.data.clone()
        captured["w2"] = layer.w2_weight.data.clone()
        captured["s13"] = layer.w13_weight_scale.data.float().clone()
        captured["s2"] = layer.w2_weight_scale.data.float().clone()
        return real_prepare(layer, *args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "prepare_moe_nvfp4_layer_for_marlin", None) is real_prepare:
            monkeypatch.setattr(module, "prepare_moe_nvfp4_layer_for_marlin", keep_inputs)
    with published(moe_runner_backend="marlin"):
        layer, _ = _moe_after_loading(ckpt_key, dtype, torch.full((experts, 2), 0.5))
    assert "w13" in captured, "the Marlin MoE preparation did not run"

    sizes = [(k, n) for _, k, n, _ in stubs.repacks]
    assert sizes == [(hidden, 2 * padded)] * experts + [(padded, hidden)] * experts
    zeros13 = torch.zeros(padded - inter, hidden, dtype=torch.int64)
    zeros2 = torch.zeros(hidden, padded - inter, dtype=torch.int64)
    for e in range(experts):
        w13 = _codes_from_repack_input(stubs.repacks[e][0], hidden)
        gate, up = _codes_nk(captured["w13"][e][:inter]), _codes_nk(captured["w13"][e][inter:])
        assert torch.equal(w13, torch.cat([gate, zeros13, up, zeros13]))
        w2 = _codes_from_repack_input(stubs.repacks[experts + e][0], padded)
        assert torch.equal(w2, torch.cat([_codes_nk(captured["w2"][e]), zeros2], dim=1))

    block13 = kernel_scale_decode(layer.w13_weight_scale, dtype)  # [E, K/16, 2 * padded]
    block2 = kernel_scale_decode(layer.w2_weight_scale, dtype)  # [E, padded/16, hidden]
    assert block13.shape == (experts, hidden // 16, 2 * padded)
    assert block2.shape == (experts, padded // 16, hidden)
    for e in range(experts):
        pad = torch.zeros(padded - inter, hidden // 16)
        s13 = captured["s13"][e]
        s13 = torch.cat([s13[:inter], pad, s13[inter:], pad])
        assert torch.equal(block13[e] != 0, marlin_scale_layout(s13) != 0)
        s2 = torch.cat([captured["s2"][e], torch.zeros(hidden, (padded - inter) // 16)], dim=1)
        assert torch.equal(block2[e] != 0, marlin_scale_layout(s2) != 0)


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
def test_gated_moe_on_the_tile_not_padded(published, monkeypatch):
    stubs = MarlinStubs(importlib.import_module(MARLIN_FP4), monkeypatch)
    experts = matrix.EXPERTS
    with published(moe_runner_backend="marlin"):
        _moe_after_loading("modelopt-moe", BF16, torch.full((experts, 2), 0.5))
    sizes = [(k, n) for _, k, n, _ in stubs.repacks]
    assert (
        sizes
        == [(matrix.HIDDEN, 2 * matrix.INTER)] * experts + [(matrix.INTER, matrix.HIDDEN)] * experts
    )


@pytest.mark.parametrize(
    "hidden, inter, padded",
    [
        (2048, 96, 128),  # Qwen3-30B-A3B at --tp 8 (768 / 8)
        (4096, 192, 192),  # Qwen3-235B-A22B at --tp 8 (1536 / 8): on the tile
        (4096, 96, 128),  # Qwen3-235B-A22B at --tp 16
        (4096, 1792, 1792),  # Mixtral-8x7B at --tp 8 (14336 / 8): on the tile
        (2048, 768, 768),  # Qwen3-30B-A3B at --tp 1
        (2880, 96, 128),  # a hidden size that is a multiple of 64 only: K % 128 for w2
    ],
)
def test_gated_moe_padded_intermediate_real_models(hidden, inter, padded):
    module = importlib.import_module(MARLIN_FP4)
    assert module._gated_moe_padded_intermediate(hidden, inter) == padded
