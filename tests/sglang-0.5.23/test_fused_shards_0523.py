"""Fused shards with their own NVFP4 global scales on FP4 Marlin (0.5.23 line).

A fused layer (QKV, gate/up; MoE w1/w3) holds one global scale per shard, but one Marlin
GEMM applies one. 0.5.23 serves a ModelOpt fused layer with the largest shard scale for
every shard, silently (wrong for the others), refuses compressed-tensors ones, and for
MoE warns "w1_weight_scale_2 must match w3_weight_scale_2" and uses w1's for w3.

Dense: a real ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` (unsharded) is built
with the ModelOpt or compressed-tensors quant config parsed from a checkpoint
directory, every shard is loaded through the layer's own ``weight_loader`` with its own
global scale, and the real ``process_weights_after_loading`` prepares the Marlin tensors
(only the CUDA repack / GEMM / workspace and the device capability are stubbed). The
check: what the kernel applies (block scale x kernel global scale, decoded from the
produced bytes) times the output-column scale handed to the GEMM's output equals each
shard's own block scales times its own global scale; and the layer's forward applies that
column scale before the bias. MoE: the real ModelOpt / compressed-tensors MoE methods'
after-loading code with w1 != w3 per expert, any ratio: the kernel applies w1's scale,
fp16 folds the power of two of a ratio below 1 into w3's block scales, and the rest is the
per-expert factor ``layer.w3_output_scale`` that fused_marlin_moe puts on the router
weights; non-positive scales, fp16 ratios below 2^-12 and experts with biases are refused.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from _sglang_cpu import ALL_CHECKPOINTS as CHECKPOINTS
from _sglang_cpu import (
    BF16,
    FP16,
    GLOBAL_BIAS,
    MarlinStubs,
    decode_16bit,
    effective_scales,
    fp8_scales,
    kernel_scale_decode,
    load_shards,
    marlin_scale_layout,
    quant_config,
)
from test_capability_matrix_0523 import EXPERTS, HIDDEN, INTER, _build

HEAD = 64
# q, k, v of 4 query and 2 KV heads; gate and up of an MLP
QKV_SHARDS = {"q": 4 * HEAD, "k": 2 * HEAD, "v": 2 * HEAD}
GATE_UP_SHARDS = {0: 192, 1: 192}
G = 0.0123  # the first shard's multiplier
SM90 = pytest.param((9, 0), id="sm90")


@pytest.fixture
def marlin_fp4():
    return importlib.import_module("sglang.srt.layers.quantization.marlin_utils_fp4")


def _fused_layer(kind: str, ckpt_key: str, dtype: torch.dtype, bias: bool = False):
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    config = quant_config(CHECKPOINTS[ckpt_key])
    common = dict(bias=bias, params_dtype=dtype, quant_config=config, parallel_group="replicated")
    if kind == "qkv":
        layer = QKVParallelLinear(
            HIDDEN, HEAD, 4, 2, prefix="model.layers.0.self_attn.qkv_proj", **common
        )
        return layer, QKV_SHARDS
    layer = MergedColumnParallelLinear(
        HIDDEN, list(GATE_UP_SHARDS.values()), prefix="model.layers.0.mlp.gate_up_proj", **common
    )
    return layer, GATE_UP_SHARDS


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("ratio", [2.0, 0.5, 1e-3])
@pytest.mark.parametrize("ckpt_key", ["modelopt-dense", "modelopt-a16-dense", "ct-dense"])
@pytest.mark.parametrize("kind", ["qkv", "gate_up"])
def test_fused_shard_scales_through_the_loader(
    published, monkeypatch, marlin_fp4, kind, ckpt_key, ratio, dtype
):
    stubs = MarlinStubs(marlin_fp4, monkeypatch)
    with published(fp4_gemm_runner_backend="marlin"):
        layer, shards = _fused_layer(kind, ckpt_key, dtype, bias=True)
        multipliers = [G, G * ratio, G / 2][: len(shards)]
        blocks = load_shards(layer, shards, multipliers, ckpt_key, len(shards), HIDDEN)
        n = sum(shards.values())
        bias = (torch.linspace(-2.0, 3.0, n) + torch.arange(n) % 5 * 0.5).to(dtype)
        layer.bias.data.copy_(bias)
        assert list(layer.output_partition_sizes) == list(shards.values())

        layer.quant_method.process_weights_after_loading(layer)

        per_row = torch.cat(
            [
                torch.full((s,), m, dtype=torch.float64)
                for s, m in zip(shards.values(), multipliers, strict=True)
            ]
        )
        col = getattr(layer, "weight_output_scale", None)
        col = torch.ones(n) if col is None else col.detach()[:n]
        got = effective_scales(layer.weight_scale, layer.weight_global_scale, dtype)
        got = got[:, :n] * col.double()[None, :]
        expected = marlin_scale_layout(blocks.double()) * per_row[None, :]
        rtol = 2.0**-10 if dtype == FP16 else 2.0**-7
        torch.testing.assert_close(got, expected, rtol=rtol, atol=0)

        # forward: GEMM output (stub) x column scale + bias, in float32, rounded once
        x = torch.zeros(3, HIDDEN, dtype=dtype)
        out, _ = layer(x)
    (call,) = stubs.gemm_calls
    gemm = (torch.arange(3 * call["size_n"], dtype=torch.float32) % 61 - 30).view(3, -1) / 8
    want = (gemm.to(dtype).float()[:, :n] * col.float() + bias.float()).to(dtype)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", ["modelopt-dense", "modelopt-a16-dense", "ct-dense"])
def test_fused_shard_scales_too_far_apart_are_refused(published, monkeypatch, marlin_fp4, ckpt_key):
    """fp16 folds the ratio's power of two into block scales: below 2^-12 it cannot."""
    stubs = MarlinStubs(marlin_fp4, monkeypatch)
    with published(fp4_gemm_runner_backend="marlin"):
        layer, shards = _fused_layer("qkv", ckpt_key, FP16)
        load_shards(layer, shards, [G, G * 1e-5, G], ckpt_key, 1, HIDDEN)
        with pytest.raises(ValueError) as err:
            layer.quant_method.process_weights_after_loading(layer)
    message = str(err.value)
    # (QKVParallelLinear keeps no prefix: its class name stands for it)
    assert "model.layers.0.self_attn.qkv_proj" in message or "QKVParallelLinear" in message
    assert "global scales [0.0123, 1.23e-07, 0.0123]" in message
    assert not stubs.repacks


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_apply_scales_output_columns_before_bias(cuda_device, monkeypatch, marlin_fp4, dtype):
    """apply_fp4_marlin_linear(output_scale=...): out * column scale + bias in float32."""
    stubs = MarlinStubs(marlin_fp4, monkeypatch)
    n, k = 128, 128
    col = torch.linspace(1.0, 1.99, n)
    bias = torch.linspace(-1, 1, n).to(dtype)
    out = marlin_fp4.apply_fp4_marlin_linear(
        input=torch.zeros(3, k, dtype=dtype),
        weight=torch.zeros(k // 16, 2 * n, dtype=torch.int32),
        weight_scale=torch.zeros(k // 16, n, dtype=torch.float8_e4m3fn),
        weight_global_scale=torch.ones(1, dtype=dtype),
        workspace=torch.zeros(4),
        size_n=n,
        size_k=k,
        bias=bias,
        output_scale=col,
    )
    (call,) = stubs.gemm_calls
    gemm = (torch.arange(3 * n, dtype=torch.float32) % 61 - 30).view(3, n) / 8
    expected = (gemm.to(dtype).float() * col + bias.float()).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# --------------------------------------------------------------------------
# MoE: w1 and w3 of an expert with different global scales
# --------------------------------------------------------------------------


def _moe_after_loading(ckpt_key: str, dtype, w13_scale_2: torch.Tensor):
    """Real MoE method, weights created, checkpoint tensors filled, after-loading run."""
    layer, method = _build(CHECKPOINTS[ckpt_key], dtype, True)
    gen = torch.Generator().manual_seed(3)
    layer.w13_weight_scale.data.copy_(fp8_scales(layer.w13_weight_scale.shape, 0x30, 0x5F, 3))
    layer.w2_weight_scale.data.copy_(fp8_scales(layer.w2_weight_scale.shape, 0x30, 0x5F, 4))
    blocks = layer.w13_weight_scale.data.clone()
    if ckpt_key.startswith("modelopt"):
        layer.w13_weight_scale_2.data.copy_(w13_scale_2)
        layer.w2_weight_scale_2.data.fill_(0.25)
        layer.w13_input_scale.data.fill_(0.5)
        layer.w2_input_scale.data.fill_(0.5)
    else:  # compressed-tensors: divisors
        layer.w13_weight_global_scale.data.copy_(1.0 / w13_scale_2)
        layer.w2_weight_global_scale.data.fill_(4.0)
        layer.w13_input_global_scale.data.fill_(2.0)
        layer.w2_input_global_scale.data.fill_(2.0)
    for name in ("w13_weight", "w2_weight", "w13_weight_packed", "w2_weight_packed"):
        if hasattr(layer, name):
            getattr(layer, name).data.copy_(
                torch.randint(0, 256, getattr(layer, name).shape, generator=gen).to(torch.uint8)
            )
    method.process_weights_after_loading(layer)
    return layer, blocks


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("ckpt_key", ["modelopt-moe", "ct-moe"])
def test_moe_w1_w3_any_ratio_served(published, monkeypatch, marlin_fp4, ckpt_key, dtype):
    MarlinStubs(marlin_fp4, monkeypatch)
    # per expert w3 / w1: equal, powers of two both ways, 3, 1/3, 1e-3, ...
    ratios = torch.tensor([1.0, 2.0, 0.25, 3.0, 1.0 / 3.0, 1e-3, 0.5, 1.0], dtype=torch.float64)
    ratios = ratios[:EXPERTS]
    g13 = torch.stack([torch.full((EXPERTS,), 0.01, dtype=torch.float64), 0.01 * ratios], dim=1)
    with published(moe_runner_backend="marlin"):
        layer, blocks = _moe_after_loading(ckpt_key, dtype, g13.float())
    g13 = g13.float().double()
    block = kernel_scale_decode(layer.w13_weight_scale, dtype)
    glob = decode_16bit(layer.w13_weight_scale_2.view(torch.int16), dtype)
    factor = layer.w3_output_scale.double()
    assert factor.shape == (EXPERTS,)
    if dtype == FP16:  # ratios below 1: the power of two is folded, [1, 2) is left
        small = ratios < 1
        assert bool(((factor[small] >= 1) & (factor[small] < 2)).all())
    else:  # bf16 keeps its block scales: the factor is the ratio itself
        torch.testing.assert_close(factor, g13[:, 1] / g13[:, 0], rtol=1e-6, atol=0)
    rtol = 2.0**-10 if dtype == FP16 else 2.0**-7
    for e in range(EXPERTS):
        per_row = torch.cat([torch.full((INTER,), v) for v in g13[e].tolist()]).double()
        half = torch.cat([torch.ones(INTER), torch.full((INTER,), factor[e].item())])
        got = block[e] * glob[e] * 2.0 ** -GLOBAL_BIAS[dtype] * half.double()[None, :]
        expected = marlin_scale_layout(blocks[e].double() * per_row[:, None])
        torch.testing.assert_close(got, expected, rtol=rtol, atol=0)


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", ["modelopt-moe", "ct-moe"])
def test_moe_w1_w3_equal_needs_no_factor(published, monkeypatch, marlin_fp4, ckpt_key):
    MarlinStubs(marlin_fp4, monkeypatch)
    with published(moe_runner_backend="marlin"):
        layer, _ = _moe_after_loading(ckpt_key, BF16, torch.full((EXPERTS, 2), 0.5))
    assert layer.w3_output_scale is None


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", ["modelopt-moe", "ct-moe"])
def test_moe_fp16_ratio_beyond_the_scale_format_refused(
    published, monkeypatch, marlin_fp4, ckpt_key
):
    """w3 = w1 * 1e-5 in fp16: 2^-17 cannot be folded into the scale bytes and a w3 half
    computed with w1's scale could overflow; bf16 needs no fold and serves it."""
    g13 = torch.full((EXPERTS, 2), 0.5)
    g13[2, 1] = 0.5e-5
    with published(moe_runner_backend="marlin"):
        stubs = MarlinStubs(marlin_fp4, monkeypatch)
        with pytest.raises(ValueError, match=r"expert 2 \(w1 global scale 0.5, w3 global.*2\^-12"):
            _moe_after_loading(ckpt_key, FP16, g13)
        assert not stubs.repacks
    with published(moe_runner_backend="marlin"):
        stubs = MarlinStubs(marlin_fp4, monkeypatch)
        layer, _ = _moe_after_loading(ckpt_key, BF16, g13)
        assert stubs.repacks
        assert layer.w3_output_scale[2].item() == pytest.approx(1e-5, rel=1e-5)


def test_fused_marlin_moe_router_weights_carry_the_w3_factor():
    """w3_output_scale reaches the w2 GEMM as router weights x factor[local expert]; a
    layer whose output is not linear in w3's half is refused (the kernels need a GPU:
    the GPU test of fused shards serves such layers against an fp32 reference)."""
    mod = importlib.import_module("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe")
    gen = torch.Generator().manual_seed(2)
    weights = torch.rand(5, 2, generator=gen)
    ids = torch.randint(0, 6, (5, 2), generator=gen)
    factor = torch.tensor([1.0, 3.0, 0.001, 1.5])
    expert_map = torch.tensor([0, 1, -1, 2, 3, -1])  # global -> local, -1 elsewhere
    got = mod._router_weights_with_w3_scale(weights, ids, factor, expert_map)
    local = expert_map[ids]
    expected = torch.where(local >= 0, weights * factor[local.clamp(min=0)], weights * factor[0])
    torch.testing.assert_close(got[local >= 0], expected[local >= 0], rtol=0, atol=0)
    for kw in ({"activation": "relu2"}, {"is_gated": False}, {"linear_in_w3": False}):
        with pytest.raises(ValueError, match="plain SiLU-gated experts"):
            mod._router_weights_with_w3_scale(weights, ids, factor, None, **kw)
