"""serve/make_checkpoints.py end to end at a toy size (Qwen2 with qkv bias, 2 steps)."""

import json

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="compressed-tensors not installed")
pytest.importorskip("tokenizers", reason="tokenizers not installed")
import make_checkpoints as mc  # noqa: E402
from nvfp4 import dequantized_state  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    args = ["--out", str(out), "--tiny", "--models", "dense-bias", "--steps", "2"]
    assert mc.main([*args, "--corpus-kb", "700", "--vocab", "512"]) == 0
    return out / "tiny" / "dense-bias"


def test_toy_run_writes_consistent_checkpoints(folder):
    record = json.loads((folder / "train.json").read_text())
    assert record["architecture"] == "Qwen2ForCausalLM"
    assert record["nvfp4_weights"] == 14  # 7 projections x 2 layers

    ct, ct_config = mc.load(folder / "ct-nvfp4")
    qc = ct_config["quantization_config"]
    assert qc["format"] == "nvfp4-pack-quantized" and "lm_head" in qc["ignore"]
    q = "model.layers.0.self_attn.q_proj"
    assert ct[f"{q}.weight_packed"].dtype == torch.uint8
    assert ct[f"{q}.weight_scale"].dtype == torch.float8_e4m3fn
    assert f"{q}.bias" in ct, "Qwen2's qkv bias must stay in the checkpoint"
    # fused q/k/v shards keep their own global scales (not unified to one)
    gs = {p: ct[f"model.layers.0.self_attn.{p}_proj.weight_global_scale"].item() for p in "qkv"}
    assert len(set(gs.values())) > 1

    ref, ref_config = mc.load(folder / "reference-ct")
    assert "quantization_config" not in ref_config
    expect = dequantized_state(ct, "compressed-tensors", torch.bfloat16)
    assert set(ref) == set(expect)
    assert all(torch.equal(ref[k], expect[k]) for k in ref)
    bf16, _ = mc.load(folder / "bf16")
    rel = (ref[f"{q}.weight"].float() - bf16[f"{q}.weight"].float()).norm()
    assert rel / bf16[f"{q}.weight"].float().norm() < 0.2


def test_sglang_reads_the_quantization_configs(folder):
    pytest.importorskip("sglang", reason="the (patched) pin is not installed")
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    ct = json.loads((folder / "ct-nvfp4" / "config.json").read_text())["quantization_config"]
    config = CompressedTensorsConfig.from_config(ct)
    assert config.quant_format == "nvfp4-pack-quantized"
    assert "lm_head" in config.ignore
    mo = folder / "modelopt-nvfp4" / "hf_quant_config.json"
    if mo.is_file():  # only when nvidia-modelopt made it
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

        mo_config = ModelOptFp4Config.from_config(json.loads(mo.read_text()))
        assert mo_config.group_size == 16 and mo_config.is_checkpoint_nvfp4_serialized
