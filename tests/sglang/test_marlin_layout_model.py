"""CPU proof of the new NVFP4 kernels' reading of the Marlin layout (bench/kernels/).

``tests/sglang/_marlin_layout.py`` models the layout ``prepare_nvfp4_layer_for_marlin`` leaves
(repack permutation, scale order and bytes, global scale) forward and inverse; the kernels in
``fp4_gemv.cu`` / ``fp4_dequant.cu`` decode it through the fragment and scale-byte tables the
model states. Here, without a GPU:

* the vectorized repack model against a literal transcription of the repack kernel's loops;
* the scale model against SGLang's real ``marlin_permute_scales`` +
  ``nvfp4_marlin_process_scales``;
* the real ``prepare_nvfp4_layer_for_marlin`` (only the CUDA repack replaced by the model)
  decoding back to the checkpoint, padded shapes included;
* the GEMV kernel's bit-level decode (FP4 nibbles, scale bytes, the 16-bit multiplies),
  emulated in torch, against the model's weights: bit-exact for bf16 and fp16.

The GPU run (bench/kernels/run_round.py) checks the real repack output against the model.
Scales are non-uniform throughout: with uniform scales a wrong order would go unnoticed.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "kernels"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
# sgl_kernel's scalar types: installed at session start by the harness (conftest, _sglang_cpu)

import _marlin_layout as ml  # noqa: E402
from _reference import dequant_nvfp4  # noqa: E402
from _sglang_cpu import prepare_nvfp4_dense  # noqa: E402

FP16, BF16 = torch.float16, torch.bfloat16


@pytest.fixture(scope="module")
def m():
    return importlib.import_module("sglang.srt.layers.quantization.marlin_utils_fp4")


def _codes(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)


def _gptq(codes: torch.Tensor) -> torch.Tensor:
    """Checkpoint packing then the int32 view _fp4_to_marlin hands the repack: [K/8, N]."""
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    return packed.view(torch.int32).T.contiguous()


def _repack_loops(gptq: torch.Tensor, size_k: int, size_n: int) -> torch.Tensor:
    """gptq_marlin_repack (4 bits, no act-order) transcribed loop by loop from its kernel."""
    q = gptq.to(torch.int64) & 0xFFFFFFFF
    k_tiles, n_tiles = size_k // 16, size_n // 64
    out = torch.zeros(k_tiles, size_n * 2, dtype=torch.int64)
    pack_idx = (0, 2, 4, 6, 1, 3, 5, 7)
    tc_offsets = (0, 1, 8, 9)
    for kt in range(k_tiles):
        for ntile in range(n_tiles):
            # the stage in shared memory: tile_ints (2) rows of packed k, 64 columns
            stage = q[kt * 2 : kt * 2 + 2, ntile * 64 : ntile * 64 + 64]
            for warp_id in range(4):
                for th_id in range(32):
                    tc_col, tc_row = th_id // 4, (th_id % 4) * 2
                    cur_n = warp_id * 16 + tc_col
                    vals = [0] * 8
                    for i in range(4):
                        cur_elem = tc_row + tc_offsets[i]
                        cur_int, cur_pos = cur_elem // 8, cur_elem % 8
                        vals[i] = int(stage[cur_int, cur_n] >> (cur_pos * 4)) & 0xF
                        vals[4 + i] = int(stage[cur_int, cur_n + 8] >> (cur_pos * 4)) & 0xF
                    res = 0
                    for i in range(8):
                        res |= vals[pack_idx[i]] << (i * 4)
                    out[kt, ntile * 128 + th_id * 4 + warp_id] = res
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


# ----------------------------------------------------------------------------- weights


@pytest.mark.parametrize("n, k", [(64, 16), (128, 64), (192, 32)])
def test_repack_model_matches_the_kernel_loops(n, k):
    codes = _codes(n, k, seed=n + k)
    assert torch.equal(ml.repack_codes(codes), _repack_loops(_gptq(codes), k, n))
    assert torch.equal(ml.gptq_marlin_repack_model(_gptq(codes), torch.empty(0), k, n, 4),
                       ml.repack_codes(codes))  # fmt: skip


@pytest.mark.parametrize("n, k", [(64, 16), (256, 128), (320, 48)])
def test_repack_model_round_trips(n, k):
    codes = _codes(n, k, seed=7 * n + k)
    q = ml.repack_codes(codes)
    assert q.shape == (k // 16, 2 * n) and q.dtype == torch.int32
    assert torch.equal(ml.unrepack_codes(q), codes)
    assert torch.equal(ml.codes_from_gptq(_gptq(codes)), codes)
    # a different matrix gives a different layout (the permutation is not degenerate)
    other = codes.clone()
    other[n - 1, k - 1] ^= 0x5
    assert not torch.equal(ml.repack_codes(other), q)


def test_tile_map_is_a_bijection():
    tk, tn = ml.tile_map()
    pairs = set(zip(tk.flatten().tolist(), tn.flatten().tolist(), strict=True))
    assert len(pairs) == 16 * 64
    assert {k for k, _ in pairs} == set(range(16)) and {n for _, n in pairs} == set(range(64))


def test_gemv_fragment_contract_matches_the_repack():
    """Int j of lane L, nibble p = KERNEL_NIBBLE[reg, half]: the A-fragment element (n, k)."""
    tk, tn = ml.tile_map()
    for lane in range(32):
        for j in range(4):
            for (reg, half), p in ml.KERNEL_NIBBLE.items():
                n, k = ml.fragment_coords(lane, j, reg, half)
                pos = lane * 4 + j
                assert (int(tk[pos, p]), int(tn[pos, p])) == (k, n), (lane, j, reg, half)


def test_scale_byte_contract_matches_the_permutation():
    for g in range(8):
        for b, (j, off) in enumerate(ml.KERNEL_SCALE_BYTE):
            assert ml.scale_byte_coords(g, b) == 16 * j + g + off


# ----------------------------------------------------------------------------- scales


def _e4m3(shape: tuple[int, int], lo: int, hi: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32)
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).float()


def test_scale_model_matches_sglang(m):
    from sglang.srt.layers.quantization.marlin_utils import marlin_permute_scales

    n, k = 192, 256
    s = _e4m3((n, k // 16), 0x01, 0x7E, seed=3)  # every positive E4M3 incl. subnormals
    real = m.nvfp4_marlin_process_scales(
        marlin_permute_scales(s.T.contiguous(), size_k=k, size_n=n, group_size=16)
    ).view(torch.uint8)
    assert torch.equal(ml.process_scales(s), real)
    assert torch.equal(ml.unprocess_scales(real), s)
    assert not torch.equal(real, ml.process_scales(s.flip(0)))  # the order is real


def test_scale_positions_form_a_permutation():
    pos = ml.scale_positions()
    assert sorted(pos.tolist()) == list(range(64))
    assert pos[:8].tolist() == [0, 16, 8, 24, 32, 48, 40, 56]


# ----------------------------------------------------------------------------- layers


def _prepare(m, monkeypatch, n: int, k: int, dtype: torch.dtype, smallest: float, g: float,
             scale_div: float = 1.0):  # fmt: skip
    return prepare_nvfp4_dense(m, monkeypatch, n, k, dtype, smallest=smallest, g=g,
                               scale_div=scale_div)  # fmt: skip


@pytest.mark.parametrize("dtype", [FP16, BF16])
@pytest.mark.parametrize("n, k", [(192, 256), (1000, 2080)])  # the second is padded
def test_prepared_layer_decodes_to_the_checkpoint(m, monkeypatch, dtype, n, k):
    smallest = 2.0**-9 if dtype == FP16 else 2.0**-6
    g = 0.5 / (448.0 * 6.0)
    w, layer = _prepare(m, monkeypatch, n, k, dtype, smallest, g)
    got = ml.dequant(layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
                     dtype)  # fmt: skip
    g_eff = ml.decode_global_scale(layer.weight_global_scale.data, dtype)
    assert abs(g_eff / g - 1) <= (2.0**-11 if dtype == FP16 else 2.0**-8)
    expected = dequant_nvfp4(w.packed, w.scales, g_eff)
    assert torch.equal(got[:n, :k], expected)
    assert not got[n:].any() and not got[:, k:].any()  # padding holds zero weights


def test_bf16_rescaled_scales_decode_with_the_global(m, monkeypatch):
    """Scales below 2^-6 in bf16: the host folds a power of two into scales and global."""
    n, k = 128, 128
    w, layer = _prepare(m, monkeypatch, n, k, BF16, 2.0**-5, 0.01, scale_div=8.0)
    assert bool((w.scales.float() < 2.0**-6).any())
    factor = ml.unprocess_scales(layer.weight_scale.data)[:n] / w.scales.float()
    (f,) = factor[w.scales.float() > 0].unique().tolist()  # one power of two, > 1
    assert f > 1 and f == 2.0 ** round(math.log2(f))
    got = ml.dequant(layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
                     BF16)  # fmt: skip
    g_eff = ml.decode_global_scale(layer.weight_global_scale.data, BF16) * f
    assert abs(g_eff / 0.01 - 1) <= 2.0**-8  # the 16-bit global scale's rounding only
    assert torch.equal(got, dequant_nvfp4(w.packed, w.scales, g_eff))


# ----------------------------------------------------------------------------- kernel decode


def _u32(x: torch.Tensor) -> torch.Tensor:
    return x & 0xFFFFFFFF


def _halves(word: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    lo = (word & 0xFFFF).to(torch.int32).to(torch.int16)
    hi = ((word >> 16) & 0xFFFF).to(torch.int32).to(torch.int16)
    return lo.view(dtype), hi.view(dtype)


def _fp4_pair(v: torch.Tensor, bf16: bool) -> torch.Tensor:
    shift = 6 if bf16 else 3
    return (v & 0x80008000) | ((v >> shift) & (0x70007000 >> shift))


def _fp4_pairs(word: torch.Tensor, bf16: bool) -> dict[int, torch.Tensor]:
    """fp4_pairs of fp4_gemv.cu: mma register -> its 16-bit pair. bf16 decodes with one
    multiply per pair (a nibble copied 12 and 6, or 8 and 2, bits up); fp16 with fp4_pair of
    the word shifted so that the register's nibbles sit at bits 12..15 and 28..31."""
    if not bf16:
        return {reg: _fp4_pair(_u32(word << sh), False) for reg, sh in SHIFTS.items()}
    keep, q8 = 0x81C081C0, word >> 8
    return {
        0: _u32((word & 0x000F000F) * 0x1040) & keep,
        1: _u32((q8 & 0x000F000F) * 0x1040) & keep,
        2: _u32((word & 0x00F000F0) * 0x0104) & keep,
        3: _u32((q8 & 0x00F000F0) * 0x0104) & keep,
    }


SHIFTS = {0: 12, 1: 4, 2: 8, 3: 0}  # reg -> left shift that brings its nibbles to 12..15


def _scale_pair(w: torch.Tensor, odd: bool, dtype: torch.dtype) -> tuple:
    if dtype == BF16:
        bits = ((w >> 4) if odd else _u32(w << 4)) & 0x0FF00FF0
        lo, hi = _halves(bits, BF16)
        two127 = torch.tensor(2.0**127, dtype=BF16)
        return lo * two127, hi * two127
    bits = ((w >> 1) if odd else _u32(w << 7)) & 0x7F807F80
    return _halves(bits, FP16)


def _emulate_gemv_decode(qweight: torch.Tensor, scale_bytes: torch.Tensor, dtype: torch.dtype):
    """The A operands fp4_gemv.cu feeds the mma, scattered to [N, K] (as float32)."""
    kt_n, n2 = qweight.shape
    n, k = n2 // 2, kt_n * 16
    bf16 = dtype == BF16
    q = (qweight.to(torch.int64) & 0xFFFFFFFF).view(kt_n, n // 64, 32, 4)  # [kt, nt, lane, j]
    sb = scale_bytes.view(torch.uint8).to(torch.int64).view(kt_n, n // 64, 8, 8)  # [.., g, b]
    words = [sum(sb[..., 4 * h + b] << (8 * b) for b in range(4)) for h in range(2)]
    out = torch.full((n, k), float("nan"))
    for lane in range(32):
        g = lane // 4
        for j in range(4):
            s_lo, s_hi = _scale_pair(words[j // 2][:, :, g], j % 2 == 1, dtype)
            pairs = _fp4_pairs(q[:, :, lane, j], bf16)
            for reg, pair in pairs.items():
                a_lo, a_hi = _halves(pair, dtype)
                s = s_lo if reg in (0, 2) else s_hi  # rows g (regs 0, 2), g + 8 (regs 1, 3)
                for half, a in ((0, a_lo), (1, a_hi)):
                    nn, kk = ml.fragment_coords(lane, j, reg, half)
                    val = (a * s).float()  # the 16-bit multiply (__hmul2), then the mma's fp32
                    rows = torch.arange(n // 64) * 64 + nn
                    cols = torch.arange(kt_n) * 16 + kk
                    out[rows.view(1, -1), cols.view(-1, 1)] = val
    return out


def test_bf16_pair_decode_by_multiply_equals_the_shifts():
    """Every byte pattern in every nibble position: the multiply decode gives fp4_pair's bits
    (both halves of a word decode alike and apart, so 16 bits per half cover them)."""
    half = torch.arange(1 << 16, dtype=torch.int64)
    for word in (half, half << 16, half | ((half.flip(0)) << 16)):
        got = _fp4_pairs(word, bf16=True)
        for reg, sh in SHIFTS.items():
            assert torch.equal(got[reg], _fp4_pair(_u32(word << sh), True)), reg


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_gemv_decode_is_exact(m, monkeypatch, dtype):
    """fp4 * 2^-126 (bf16) or 2^-14 (fp16) times the decoded scale: w * 2^-104 or w * 2^-7."""
    n, k = 128, 64
    smallest = 2.0**-9  # bf16 too: the new decode reads every scale byte (no 2^-112 loss)
    w, layer = _prepare(m, monkeypatch, n, k, dtype, smallest, 0.01)
    got = _emulate_gemv_decode(layer.weight.data, layer.weight_scale.data, dtype)
    want = ml.dequant(layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
                      dtype, with_global=False)  # fmt: skip
    operand_scale = 2.0**-104 if dtype == BF16 else 2.0**-7
    assert torch.equal(got, want * operand_scale)
    assert bool((w.scales.float() < 2.0**-6).any())  # the small scales are really there
