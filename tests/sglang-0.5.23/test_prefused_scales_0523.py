"""NVFP4 per-tensor scales a checkpoint may not hold: pre-fused w13 experts, missing shards.

0.5.23 already loads a pre-fused qkv_proj / gate_up_proj scale into every shard
(linear.py, weight_loader_v2). What it still lacks: FusedMoE's per-tensor scale loader has
no case for a fused w13 (gate_up) expert tensor, so neither half is written; and the
NVFP4 weight scales are created with ``torch.empty``, so a scale the checkpoint does not
hold (one shard's, one expert's) is served as whatever the memory held. Through the real
layers, loaders and after-loading code (only the CUDA repack / GEMM and the device
capability stubbed): pre-fused w13 scales fill both halves, and a never-loaded scale is
refused naming the scale, the shard or expert and the layer.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from _sglang_cpu import ALL_CHECKPOINTS as CHECKPOINTS
from _sglang_cpu import BF16, MarlinStubs, load, load_shards
from test_capability_matrix_0523 import EXPERTS, HIDDEN, _build
from test_fused_shards_0523 import G, _fused_layer

SM90 = pytest.param((9, 0), id="sm90")
DENSE = ["modelopt-dense", "modelopt-a16-dense", "ct-dense"]


@pytest.fixture
def marlin_fp4():
    return importlib.import_module("sglang.srt.layers.quantization.marlin_utils_fp4")


def _scale_name(ckpt_key: str) -> str:
    return "weight_scale_2" if ckpt_key.startswith("modelopt") else "weight_global_scale"


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", DENSE)
@pytest.mark.parametrize("kind", ["qkv", "gate_up"])
def test_pre_fused_dense_scale_fills_every_shard(
    published, monkeypatch, marlin_fp4, kind, ckpt_key
):
    """One scale for the fused tensor (loaded_shard_id None) reaches every shard's slot."""
    MarlinStubs(marlin_fp4, monkeypatch)
    with published(fp4_gemm_runner_backend="marlin"):
        layer, shards = _fused_layer(kind, ckpt_key, BF16)
        value = G if ckpt_key.startswith("modelopt") else 1.0 / G
        load(layer, _scale_name(ckpt_key), torch.tensor(value), None)
    slots = getattr(layer, _scale_name(ckpt_key)).data
    assert slots.shape == (len(shards),)
    torch.testing.assert_close(slots, torch.full((len(shards),), value), rtol=0, atol=0)


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", DENSE)
@pytest.mark.parametrize("missing", [1, 2])
def test_never_loaded_dense_scale_is_refused(published, monkeypatch, marlin_fp4, ckpt_key, missing):
    stubs = MarlinStubs(marlin_fp4, monkeypatch)
    with published(fp4_gemm_runner_backend="marlin"):
        layer, shards = _fused_layer("qkv", ckpt_key, BF16)
        load_shards(layer, shards, [G, G, G], ckpt_key, 5, HIDDEN)
        getattr(layer, _scale_name(ckpt_key)).data[missing] = float("nan")  # as never loaded
        with pytest.raises(ValueError) as err:
            layer.quant_method.process_weights_after_loading(layer)
    message = str(err.value)
    assert f"{_scale_name(ckpt_key)} never loaded for shard {missing} of layer " in message
    assert "model.layers.0.self_attn.qkv_proj" in message
    assert not stubs.repacks


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", ["modelopt-dense", "ct-dense"])
def test_dense_scales_start_unloaded(published, ckpt_key):
    """Created scales read NaN until a loader writes them (torch.empty held any memory)."""
    with published(fp4_gemm_runner_backend="marlin"):
        layer, _ = _fused_layer("qkv", ckpt_key, BF16)
    assert bool(torch.isnan(getattr(layer, _scale_name(ckpt_key)).data).all())


def _moe(ckpt_key: str):
    layer, method = _build(CHECKPOINTS[ckpt_key], BF16, True)
    names = (
        ("w13_weight_scale_2", "w2_weight_scale_2")
        if ckpt_key.startswith("modelopt")
        else ("w13_weight_global_scale", "w2_weight_global_scale")
    )
    return layer, method, names


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", ["modelopt-moe", "ct-moe"])
@pytest.mark.parametrize(
    "value", [torch.tensor(0.25), torch.tensor([0.25, 0.5])], ids=["one", "two"]
)
def test_pre_fused_w13_scale_fills_both_halves(published, ckpt_key, value):
    """A checkpoint storing gate_up fused per expert: shard_id "w13" writes w1's and w3's."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    with published(moe_runner_backend="marlin"):
        layer, _, (w13, _) = _moe(ckpt_key)
        param = getattr(layer, w13)
        FusedMoE._load_per_tensor_weight_scale(
            layer, shard_id="w13", param=param, loaded_weight=value, expert_id=1
        )
    torch.testing.assert_close(param.data[1], value.reshape(-1).expand(2).float(), rtol=0, atol=0)
    assert bool(torch.isnan(param.data[0]).all()), "another expert's scales were written"


@pytest.mark.parametrize("cuda_device", [SM90], indirect=True)
@pytest.mark.parametrize("ckpt_key", ["modelopt-moe", "ct-moe"])
@pytest.mark.parametrize(("which", "slot", "says"), [
    (0, (1, 1), "expert 1 w3"),
    (1, (2,), "expert 2 w2"),
])  # fmt: skip
def test_never_loaded_expert_scale_is_refused(
    published, monkeypatch, marlin_fp4, ckpt_key, which, slot, says
):
    stubs = MarlinStubs(marlin_fp4, monkeypatch)
    with published(moe_runner_backend="marlin"):
        layer, method, names = _moe(ckpt_key)
        for name in names:
            getattr(layer, name).data.fill_(0.5)
        for name in ("w13_input_scale", "w2_input_scale", "w13_input_global_scale",
                     "w2_input_global_scale"):  # fmt: skip
            if hasattr(layer, name):
                getattr(layer, name).data.fill_(2.0)
        getattr(layer, names[which]).data[slot] = float("nan")  # as never loaded
        with pytest.raises(ValueError) as err:
            method.process_weights_after_loading(layer)
    message = str(err.value)
    assert f"{names[which]} never loaded for {says} of layer " in message, message
    assert slot[0] < EXPERTS
    assert not stubs.repacks
