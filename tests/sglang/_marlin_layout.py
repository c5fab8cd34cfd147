"""CPU model of the Marlin NVFP4 weight layout, forward and inverse, in plain torch.

The series stores an NVFP4 linear layer once, as ``prepare_nvfp4_layer_for_marlin`` leaves it:

* ``weight``: int32 ``[K/16, 2N]``, what ``gptq_marlin_repack`` (4 bits, no act-order) makes
  of the GPTQ packing of the checkpoint (int32 ``[K/8, N]``, code ``k`` of a column in nibble
  ``k % 8``). One row per k-tile of 16; in it, per n-tile of 64 columns, 128 int32 (512 bytes)
  at ``thread * 4 + warp`` for the repack kernel's 32 threads x 4 warps.
* ``weight_scale``: bytes ``[K/16, N]``: ``marlin_permute_scales`` order (within 64 columns,
  position ``8i + j`` holds column ``i + 8j``), then ``0,2,1,3`` within fours, each byte the
  high byte of ``half(scale * 2^7) << 1`` (sign-less E5M3).
* ``weight_global_scale``: one 16-bit value of the activation dtype, ``g * 2^(bias - 7)``
  (bias 14 for fp16, 126 for bf16).

This module writes those facts as index maps so that the new kernels' reading of the layout is
proven on a CPU: ``repack_codes`` is the model of the repack, ``unrepack_codes`` its inverse,
``fragment_coords`` the view the GEMV kernel decodes (weights as the A operand of
``mma.m16n8k16``), ``scale_byte_coords`` the view of its 8-byte scale load, and ``dequant``
the fp32 weights the whole layout stands for.

It lives beside the SGLang CPU harness because the series' CPU tests build Marlin layers with
it (``_sglang_cpu.prepare_nvfp4_dense``) wherever they run, PR branches included; the GPU
kernel rounds (bench/kernels/run_round.py) check it against the real repack on the GPU.
"""

from __future__ import annotations

import torch

TILE_K = 16
TILE_N = 64
INTS_PER_TILE = TILE_K * TILE_N // 8  # 128
GLOBAL_SCALE_BIAS = {torch.float16: 14, torch.bfloat16: 126}
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_VALUES = _MAGNITUDES + tuple(-v for v in _MAGNITUDES)  # code = sign bit 3 | E2M1

# Nibble p of a repacked int32 holds the repack kernel's vals[_PACK_IDX[p]].
_PACK_IDX = (0, 2, 4, 6, 1, 3, 5, 7)
# vals[i] and vals[4 + i] hold k offset _K_OFFSETS[i] (columns n and n + 8).
_K_OFFSETS = (0, 1, 8, 9)


def tile_map() -> tuple[torch.Tensor, torch.Tensor]:
    """(k, n) inside a 16 x 64 tile of the value at int ``pos`` (0..127), nibble ``p`` (0..7).

    The repack kernel: thread ``th`` (0..31) of warp ``w`` (0..3) writes int ``th * 4 + w``;
    its column is ``w * 16 + th // 4`` (``+ 8`` for vals[4..7]), its rows
    ``(th % 4) * 2 + {0, 1, 8, 9}``.
    """
    k = torch.empty(INTS_PER_TILE, 8, dtype=torch.int64)
    n = torch.empty(INTS_PER_TILE, 8, dtype=torch.int64)
    for th in range(32):
        for w in range(4):
            pos = th * 4 + w
            for p in range(8):
                val = _PACK_IDX[p]
                k[pos, p] = (th % 4) * 2 + _K_OFFSETS[val % 4]
                n[pos, p] = w * 16 + th // 4 + (8 if val >= 4 else 0)
    return k, n


def _check_shape(n: int, k: int) -> None:
    if n % TILE_N or k % TILE_K:
        raise ValueError(f"Marlin FP4 layout needs N % 64 == 0 and K % 16 == 0, got N={n}, K={k}")


def _gather_index(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source (row n, column k) of every nibble of the ``[K/16, 2N]`` output, ``[K/16, 2N, 8]``."""
    _check_shape(n, k)
    tk, tn = tile_map()
    kt = torch.arange(k // TILE_K).view(-1, 1, 1, 1)
    nt = torch.arange(n // TILE_N).view(1, -1, 1, 1)
    rows = (nt * TILE_N + tn.view(1, 1, INTS_PER_TILE, 8)).expand(k // TILE_K, -1, -1, -1)
    cols = (kt * TILE_K + tk.view(1, 1, INTS_PER_TILE, 8)).expand(-1, n // TILE_N, -1, -1)
    shape = (k // TILE_K, 2 * n, 8)
    return rows.reshape(shape), cols.reshape(shape)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def repack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Model of ``gptq_marlin_repack``: FP4 codes ``[N, K]`` (0..15) -> int32 ``[K/16, 2N]``."""
    n, k = codes.shape
    rows, cols = _gather_index(n, k)
    nib = codes.to(torch.int64)[rows, cols]
    shifts = torch.arange(8, dtype=torch.int64) * 4
    return _to_int32((nib << shifts).sum(-1))


def unrepack_codes(qweight: torch.Tensor) -> torch.Tensor:
    """Inverse of ``repack_codes``: int32 ``[K/16, 2N]`` -> codes ``[N, K]`` (uint8)."""
    kt, n2 = qweight.shape
    n, k = n2 // 2, kt * TILE_K
    rows, cols = _gather_index(n, k)
    shifts = torch.arange(8, dtype=torch.int64) * 4
    nib = (qweight.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF
    codes = torch.empty(n, k, dtype=torch.uint8)
    codes[rows.reshape(-1), cols.reshape(-1)] = nib.reshape(-1).to(torch.uint8)
    return codes


def codes_from_checkpoint(packed: torch.Tensor) -> torch.Tensor:
    """NVFP4 checkpoint bytes ``[N, K/2]`` (element 2i in the low nibble) -> codes ``[N, K]``."""
    p = packed.to(torch.int64)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(p.shape[0], -1).to(torch.uint8)


def codes_from_gptq(qweight: torch.Tensor) -> torch.Tensor:
    """GPTQ-packed int32 ``[K/8, N]`` (code k in nibble k % 8) -> codes ``[N, K]``."""
    shifts = torch.arange(8, dtype=torch.int64) * 4
    nib = (qweight.to(torch.int64).unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF
    return nib.reshape(-1, qweight.shape[1]).T.contiguous().to(torch.uint8)


def gptq_marlin_repack_model(
    b_q_weight: torch.Tensor, perm: torch.Tensor, size_k: int, size_n: int, num_bits: int
) -> torch.Tensor:
    """Drop-in CPU stand-in for ``gptq_marlin_repack`` (4 bits, no act-order only)."""
    if num_bits != 4 or perm.numel():
        raise ValueError("the model covers 4-bit repacks without act-order only")
    if tuple(b_q_weight.shape) != (size_k // 8, size_n):
        raise ValueError(f"expected [{size_k // 8}, {size_n}], got {list(b_q_weight.shape)}")
    return repack_codes(codes_from_gptq(b_q_weight))


# ----------------------------------------------------------------------------- kernel views


def fragment_coords(lane: int, j: int, reg: int, half: int) -> tuple[int, int]:
    """(n, k) in the 64 x 16 tile of one A-fragment element of the GEMV kernel.

    The warp's lane loads the 16 bytes at int ``lane * 4``: int ``j`` (0..3) covers columns
    ``16j .. 16j + 15``. With the weights as the A operand (rows = n) of ``mma.m16n8k16``,
    register ``reg`` (0..3) and its 16-bit ``half`` hold row ``g`` (+8 for reg 1, 3),
    column ``2t + half`` (+8 for reg 2, 3), ``g = lane // 4``, ``t = lane % 4``.
    """
    g, t = lane // 4, lane % 4
    n = 16 * j + g + (8 if reg in (1, 3) else 0)
    k = 2 * t + half + (8 if reg in (2, 3) else 0)
    return n, k


# The nibble the kernel decodes into (reg, half): reg 3 = nibbles (3, 7), reg 1 = (2, 6),
# reg 2 = (1, 5), reg 0 = (0, 4) (fp4_gemv.cu: shifts of 0, 4, 8, 12 bits).
KERNEL_NIBBLE = {(0, 0): 0, (0, 1): 4, (1, 0): 2, (1, 1): 6,
                 (2, 0): 1, (2, 1): 5, (3, 0): 3, (3, 1): 7}  # fmt: skip
# Byte b of the 8 bytes lane g reads at column 8g of a 64-column scale chunk:
# (subtile j, row offset 0 or 8).
KERNEL_SCALE_BYTE = ((0, 0), (1, 0), (0, 8), (1, 8), (2, 0), (3, 0), (2, 8), (3, 8))


def scale_positions() -> torch.Tensor:
    """Column (0..63) of the scale stored at each of the 64 byte positions of a chunk."""
    cols = []
    for q in range(64):
        p = 4 * (q // 4) + (0, 2, 1, 3)[q % 4]  # undo the 0,2,1,3 swap
        cols.append(p // 8 + 8 * (p % 8))  # marlin_permute_scales: 8i + j <- i + 8j
    return torch.tensor(cols, dtype=torch.int64)


def scale_byte_coords(g: int, b: int) -> int:
    """Column (0..63) of byte ``b`` (0..7) of the 8 bytes at position ``8g`` of a chunk."""
    return int(scale_positions()[8 * g + b])


# ----------------------------------------------------------------------------- scales


def process_scales(scales: torch.Tensor) -> torch.Tensor:
    """E4M3 block scales ``[N, K/16]`` (any float dtype) -> Marlin bytes ``[K/16, N]`` (uint8).

    The closed form of ``marlin_permute_scales`` + ``nvfp4_marlin_process_scales`` (without a
    rescale factor: multiply the scales first).
    """
    s = scales.float().T.contiguous()  # [K/16, N]
    groups, n = s.shape
    _check_shape(n, TILE_K)
    bits = (s * 128.0).to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    byte = ((bits << 1) >> 8) & 0xFF
    src = scale_positions()
    chunks = byte.view(groups, n // TILE_N, TILE_N)
    return chunks[:, :, src].reshape(groups, n).to(torch.uint8)


def unprocess_scales(scale_bytes: torch.Tensor) -> torch.Tensor:
    """Marlin scale bytes ``[K/16, N]`` -> float32 scales ``[N, K/16]`` (exact)."""
    b = scale_bytes.view(torch.uint8).to(torch.int64)
    groups, n = b.shape
    _check_shape(n, TILE_K)
    value = (b << 7).to(torch.int16).view(torch.float16).float() / 128.0
    out = torch.empty(groups, n // TILE_N, TILE_N)
    out[:, :, scale_positions()] = value.view(groups, n // TILE_N, TILE_N)
    return out.reshape(groups, n).T.contiguous()


def decode_global_scale(kernel_global: torch.Tensor, act_dtype: torch.dtype) -> float:
    """The multiplier ``g`` a prepared layer's 16-bit global scale stands for."""
    value = kernel_global.reshape(-1)[0].to(act_dtype).float().item()
    return value * 2.0 ** -(GLOBAL_SCALE_BIAS[act_dtype] - 7)


def dequant(
    qweight: torch.Tensor,
    scale_bytes: torch.Tensor,
    kernel_global: torch.Tensor,
    act_dtype: torch.dtype,
    with_global: bool = True,
) -> torch.Tensor:
    """fp32 ``[N, K]`` weights a prepared layer stands for: fp4 * block scale (* g)."""
    codes = unrepack_codes(qweight.cpu())
    values = torch.tensor(FP4_VALUES)[codes.long()]
    scales = unprocess_scales(scale_bytes.cpu()).repeat_interleave(TILE_K, dim=1)
    w = values * scales
    return w * decode_global_scale(kernel_global.cpu(), act_dtype) if with_global else w
