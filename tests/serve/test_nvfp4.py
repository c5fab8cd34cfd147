"""The exact NVFP4 decode behind the dequantized reference checkpoints (serve/nvfp4.py)."""

import pytest
import torch
from nvfp4 import GROUP, Nvfp4, dequantized_state, nvfp4_scales, stored_weights


def e2m1_from_bits(code: int) -> float:
    """E2M1 straight from its bit fields: sign, 2-bit exponent (bias 1), 1-bit mantissa."""
    sign = -1.0 if code & 0b1000 else 1.0
    exp, man = (code >> 1) & 0b11, code & 1
    mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
    return sign * mag


def decode_elementwise(packed, block_scale, global_scale, divisor):
    n, half = packed.shape
    out = torch.empty(n, half * 2, dtype=torch.float64)
    g = float(global_scale.reshape(()))
    for r in range(n):
        for c in range(half * 2):
            byte = int(packed[r, c // 2])
            code = byte & 0xF if c % 2 == 0 else byte >> 4
            s = float(block_scale[r, c // GROUP].float())
            out[r, c] = e2m1_from_bits(code) * (s / g if divisor else s * g)
    return out


def random_weight(seed: int, n: int = 8, k: int = 64):
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    # non-uniform block scales over most of FP8's range, including subnormals
    exps = torch.randint(-9, 8, (n, k // GROUP), generator=gen).float()
    mant = 1 + torch.rand(n, k // GROUP, generator=gen)
    block = (mant * 2.0**exps).to(torch.float8_e4m3fn)
    return packed, block


@pytest.mark.parametrize("divisor", [True, False])
def test_dequantize_equals_bitwise_decode_with_non_uniform_scales(divisor):
    packed, block = random_weight(0)
    gs = torch.tensor([2688.0 / 0.37])
    w = Nvfp4(packed, block, gs, divisor)
    expect = decode_elementwise(packed, block, gs, divisor)
    got = w.dequantize(torch.float32)
    # float32 product of an E2M1 value (exact) and one float32 scale: one rounding
    torch.testing.assert_close(got.double(), expect, rtol=2**-23, atol=0)
    assert torch.equal(w.dequantize(torch.bfloat16), got.to(torch.bfloat16))


def test_the_low_nibble_is_the_even_column():
    packed = torch.tensor([[0x71] + [0] * 7], dtype=torch.uint8)  # col0 code 1, col1 code 7
    block = torch.ones(1, 1, dtype=torch.float8_e4m3fn)
    w = Nvfp4(packed, block, torch.tensor([1.0]), divisor=True).dequantize()
    assert w[0, :2].tolist() == [0.5, 6.0]


def test_reference_matches_compressed_tensors_reader():
    ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors not installed")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(3)) * 0.02
    block, gs = nvfp4_scales(weight)
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    sd = {"weight": weight, "weight_scale": block.float(), "weight_global_scale": gs}
    packed = NVFP4PackedCompressor.compress(sd, scheme)["weight_packed"]
    theirs = NVFP4PackedCompressor.decompress(
        {"weight_packed": packed, "weight_scale": block, "weight_global_scale": gs}, scheme
    )["weight"]
    mine = Nvfp4(packed, block, gs, divisor=True).dequantize(torch.bfloat16)
    assert torch.equal(mine, theirs.to(torch.bfloat16)), ct.__version__
    # and the quantization is close to the weight it came from (4-bit: a few % relative)
    rel = (mine.float() - weight).norm() / weight.norm()
    assert rel < 0.15


def test_scales_map_the_maximum_to_fp8_times_fp4():
    weight = torch.zeros(2, 32)
    weight[0, 3] = -0.5
    weight[1, 20] = 0.25
    block, gs = nvfp4_scales(weight)
    assert gs.item() == pytest.approx(448 * 6 / 0.5)
    assert block.dtype == torch.float8_e4m3fn
    assert block.float()[0, 0].item() == 448.0  # the tensor's maximum block
    assert block.float()[0, 1].item() == 0.0  # an all-zero block


def test_scales_reject_columns_not_a_multiple_of_16():
    with pytest.raises(ValueError, match="divisible by 16"):
        nvfp4_scales(torch.ones(4, 40))


@pytest.mark.parametrize(
    "fmt,keys",
    [
        ("compressed-tensors", ("weight_packed", "weight_scale", "weight_global_scale")),
        ("modelopt", ("weight", "weight_scale", "weight_scale_2")),
    ],
)
def test_dequantized_state_replaces_quantized_modules_only(fmt, keys):
    packed, block = random_weight(1)
    extra = "input_global_scale" if fmt == "compressed-tensors" else "input_scale"
    m = "model.layers.0.self_attn.q_proj"
    tensors = {
        f"{m}.{keys[0]}": packed,
        f"{m}.{keys[1]}": block,
        f"{m}.{keys[2]}": torch.tensor([3.0]),
        f"{m}.{extra}": torch.tensor([1.0]),
        f"{m}.bias": torch.ones(8),
        "model.norm.weight": torch.ones(64),
    }
    out = dequantized_state(tensors, fmt)
    assert set(out) == {f"{m}.weight", f"{m}.bias", "model.norm.weight"}
    assert out[f"{m}.weight"].dtype == torch.bfloat16
    assert out[f"{m}.weight"].shape == (8, 64)
    assert torch.equal(out["model.norm.weight"], tensors["model.norm.weight"])


def test_a_packed_weight_without_its_scale_is_an_error():
    tensors = {"a.weight_packed": torch.zeros(2, 8, dtype=torch.uint8)}
    with pytest.raises(ValueError, match="a: packed NVFP4 weight without a.weight_scale"):
        stored_weights(tensors, "compressed-tensors")
