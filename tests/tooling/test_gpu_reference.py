"""The GPU proof's fp32 NVFP4 reference (tests/gpu/_reference.py), checked on CPU.

Against a plain element-by-element decode written from the bit layouts (E2M1 codes,
E4M3 bytes), so a mistake in the vectorized reference cannot hide behind the kernel under test.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import _reference as ref  # noqa: E402 (needs torch: imported after the skip)


def _e2m1(code: int) -> float:
    sign = -1.0 if code & 0b1000 else 1.0
    exp, man = (code >> 1) & 0b11, code & 0b1
    mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1.0 + man / 2.0)
    return sign * mag


def _e4m3(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0:
        return sign * (man / 8.0) * 2.0**-6
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


def _plain_dequant(packed: torch.Tensor, scales: torch.Tensor, mult: float) -> list[list[float]]:
    rows = []
    sbytes = scales.view(torch.uint8)
    for n in range(packed.shape[0]):
        row = []
        for byte_idx in range(packed.shape[1]):
            byte = int(packed[n, byte_idx])
            for k, code in ((2 * byte_idx, byte & 0xF), (2 * byte_idx + 1, byte >> 4)):
                row.append(_e2m1(code) * _e4m3(int(sbytes[n, k // 16])) * mult)
        rows.append(row)
    return rows


def test_code_table_matches_bit_layout() -> None:
    assert list(ref.FP4_E2M1_VALUES) == [_e2m1(c) for c in range(16)]


def test_pack_unpack_roundtrip() -> None:
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 5, 64), generator=gen, dtype=torch.uint8)
    packed = ref.pack_fp4(codes)
    assert packed.shape == (3, 5, 32)
    assert torch.equal(ref.unpack_fp4(packed), codes)
    assert int(ref.pack_fp4(torch.tensor([[1, 2]], dtype=torch.uint8))[0, 0]) == 0x21  # low first


def test_scales_are_non_uniform_with_small_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    w = ref.random_nvfp4_weight(256, 512, gen)
    s = w.scales.float()
    assert w.scales.dtype == torch.float8_e4m3fn and s.min() > 0 and s.max() == 448
    assert s.unique().numel() > 50  # non-uniform
    assert w.small_rows.any() and (~w.small_rows).any()
    assert (s[w.small_rows] < 2.0**-6).all()
    assert (s[~w.small_rows] >= 2.0**-3 * 0.9).all()
    assert (s < 2.0**-7).any() and s.min() == 2.0**-9  # E4M3 subnormals down to the smallest


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scales_follow_the_recipe_per_expert(dtype: torch.dtype) -> None:
    """Every expert's largest scale is 448; bf16 small rows sit on the E4M3 normal floor."""
    gen = torch.Generator().manual_seed(5)
    floor = ref.SMALLEST_BLOCK_SCALE[dtype]
    w = ref.random_nvfp4_weight(64, 256, gen, lead=(3,), smallest=floor)
    s = w.scales.float()
    assert torch.equal(s.amax(dim=(1, 2)), torch.full((3,), 448.0))
    assert s.min() >= floor and w.small_rows.any()
    assert (s[w.small_rows] < 8 * floor).all()


@pytest.mark.parametrize("mult", [1.0, 8.27e-4])
def test_dequant_matches_plain_decode(mult: float) -> None:
    gen = torch.Generator().manual_seed(2)
    w = ref.random_nvfp4_weight(8, 48, gen)
    got = ref.dequant_nvfp4(w.packed, w.scales, mult)
    want = torch.tensor(_plain_dequant(w.packed, w.scales, mult), dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0)


def test_dense_reference_matches_plain_matmul() -> None:
    gen = torch.Generator().manual_seed(3)
    w = ref.random_nvfp4_weight(16, 64, gen)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(16, generator=gen).to(torch.bfloat16)
    plain = _plain_dequant(w.packed, w.scales, 0.5)
    want = [
        [sum(float(x[i, k]) * plain[n][k] for k in range(64)) + float(bias[n]) for n in range(16)]
        for i in range(5)
    ]
    got = ref.dense_reference(x, w, 0.5, bias)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-5)


def test_moe_reference_matches_per_token_loop() -> None:
    gen = torch.Generator().manual_seed(4)
    e, topk, hidden, inter, m = 4, 2, 32, 16, 6
    w13 = ref.random_nvfp4_weight(2 * inter, hidden, gen, lead=(e,))
    w2 = ref.random_nvfp4_weight(hidden, inter, gen, lead=(e,))
    g13 = torch.rand(e, generator=gen) + 0.5
    g2 = torch.rand(e, generator=gen) + 0.5
    x = torch.randn(m, hidden, generator=gen).to(torch.float16)
    logits = torch.randn(m, e, generator=gen)
    weights, ids = ref.route(logits, topk)
    assert ids.dtype == torch.int32 and torch.allclose(weights.sum(-1), torch.ones(m))
    got = ref.moe_reference(
        x, ref.dequant_experts(w13, g13), ref.dequant_experts(w2, g2), weights, ids
    )
    for t in range(m):
        acc = torch.zeros(hidden)
        for j in range(topk):
            ex = int(ids[t, j])
            a = ref.dequant_nvfp4(w13.packed[ex], w13.scales[ex], float(g13[ex]))
            b = ref.dequant_nvfp4(w2.packed[ex], w2.scales[ex], float(g2[ex]))
            h = a @ x[t].float()
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]  # gate rows first, then up
            acc += weights[t, j] * (b @ act)
        # fp32 sums in another order: tolerance relative to the row's magnitude
        torch.testing.assert_close(got[t], acc, rtol=1e-5, atol=1e-5 * float(acc.abs().max()))


def test_moe_reference_rounds_what_the_layer_stores() -> None:
    """store_dtype rounds the first GEMM's output and the activation, nothing else."""
    gen = torch.Generator().manual_seed(6)
    e, hidden, inter = 2, 32, 16
    w13 = ref.dequant_experts(ref.random_nvfp4_weight(2 * inter, hidden, gen, lead=(e,)),
                              torch.ones(e))  # fmt: skip
    w2 = ref.dequant_experts(ref.random_nvfp4_weight(hidden, inter, gen, lead=(e,)), torch.ones(e))
    x = torch.randn(3, hidden, generator=gen).to(torch.bfloat16)
    weights, ids = ref.route(torch.randn(3, e, generator=gen), 1)
    got = ref.moe_reference(x, w13, w2, weights, ids, store_dtype=torch.bfloat16)
    want = torch.zeros(3, hidden)
    for t in range(3):
        ex = int(ids[t, 0])
        h = (w13[ex] @ x[t].float()).to(torch.bfloat16).float()
        act = (torch.nn.functional.silu(h[:inter]) * h[inter:]).to(torch.bfloat16).float()
        want[t] = weights[t, 0] * (w2[ex] @ act)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got, ref.moe_reference(x, w13, w2, weights, ids), rtol=1e-5)


def test_rel_l2() -> None:
    r = torch.tensor([3.0, 4.0])
    assert ref.rel_l2(r, r) == 0.0
    assert ref.rel_l2(torch.tensor([3.0, 4.5]), r) == pytest.approx(0.1)
    assert ref.rel_l2(torch.tensor([float("nan"), 4.0]), r) == float("inf")
    with pytest.raises(ValueError, match="all zeros"):
        ref.rel_l2(r, torch.zeros(2))
