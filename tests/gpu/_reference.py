"""Independent fp32 reference for NVFP4 (ModelOpt / compressed-tensors) dense and MoE layers.

Written from the format's definition, not from any kernel's host code, so that it can judge
the Marlin path:

* FP4 E2M1 codes (4 bits: sign, 2 exponent bits, 1 mantissa bit), two per byte along K,
  element ``2i`` in the low nibble and ``2i + 1`` in the high nibble.
* One FP8 E4M3 block scale per 16 consecutive elements along K (``[N, K/16]``).
* One fp32 global factor per tensor: a multiplier for ModelOpt (``weight_scale_2``),
  a divisor for compressed-tensors (``weight_global_scale``).

Everything here runs on any device (CPU included) so the reference itself is tested on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# E2M1 magnitudes for codes 0..7; codes 8..15 are the same with the sign bit set.
FP4_E2M1_MAGNITUDES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_E2M1_VALUES: tuple[float, ...] = FP4_E2M1_MAGNITUDES + tuple(-v for v in FP4_E2M1_MAGNITUDES)
GROUP = 16
E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0**-6
E4M3_MIN_SUBNORMAL = 2.0**-9
# bf16 Marlin decodes block scales down to 2^-15 of a tensor's largest one; with the largest at
# 448 (what the NVFP4 recipe writes: global = 448 * 6 / amax) that is every E4M3 normal. Smaller
# ones (E4M3 subnormals) are flushed to zero with a warning at load; fp16 decodes all of them.
SMALLEST_BLOCK_SCALE = {torch.float16: E4M3_MIN_SUBNORMAL, torch.bfloat16: E4M3_MIN_NORMAL}


def fp4_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 E2M1 values indexed by code."""
    return torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=device)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes ``[..., K]`` (uint8, < 16) into bytes ``[..., K/2]``."""
    if codes.shape[-1] % 2:
        raise ValueError(f"K must be even to pack FP4 codes, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes ``[..., K/2]`` into 4-bit codes ``[..., K]`` (uint8)."""
    lo = packed & 0x0F
    hi = (packed >> 4) & 0x0F
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequant_nvfp4(
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_multiplier: torch.Tensor | float,
) -> torch.Tensor:
    """fp32 ``[..., N, K]`` from packed FP4 ``[..., N, K/2]`` and E4M3 scales ``[..., N, K/16]``.

    ``global_multiplier`` is a python float, a 0-d tensor, or one value per leading index
    (``[E]`` for MoE), applied as ``w = fp4 * block_scale * global_multiplier``.
    """
    codes = unpack_fp4(packed).long()
    values = fp4_table(packed.device)[codes]
    k = values.shape[-1]
    if block_scales.shape[-1] * GROUP != k:
        raise ValueError(f"block scales {tuple(block_scales.shape)} do not cover K={k}")
    scales = block_scales.float().repeat_interleave(GROUP, dim=-1)
    w = values * scales
    if isinstance(global_multiplier, torch.Tensor):
        g = global_multiplier.float().to(w.device)
        if g.numel() > 1:
            g = g.reshape(*g.shape, *([1] * (w.dim() - g.dim())))
        return w * g
    return w * float(global_multiplier)


@dataclass
class Nvfp4Weight:
    """Synthetic checkpoint tensors of one NVFP4 weight (or a stack of experts)."""

    packed: torch.Tensor  # uint8 [..., N, K/2]
    scales: torch.Tensor  # float8_e4m3fn [..., N, K/16]
    small_rows: torch.Tensor  # bool [..., N]: rows whose block scales all lie near the floor


def random_block_scales(
    shape: tuple[int, ...],
    gen: torch.Generator,
    smallest: float = E4M3_MIN_SUBNORMAL,
    small_row_fraction: float = 0.125,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-uniform E4M3 block scales ``[..., N, G]`` and the mask of "small" rows ``[..., N]``.

    Shaped like a real NVFP4 checkpoint: the largest scale of every tensor (every expert) is
    448, other rows are log-uniform in [2^-3, 448]. Small rows are log-uniform in
    [smallest, 2^2.8 * smallest]: a kernel that mis-decodes scales near the floor gets these
    rows wrong although they carry little energy, so the tests check them separately.
    ``smallest`` is 2^-9 (E4M3 subnormals) for fp16 and 2^-6 for bf16 (SMALLEST_BLOCK_SCALE).
    """
    *lead, n, g = shape
    dev = gen.device
    log2 = torch.empty(shape, device=dev).uniform_(-3.0, math.log2(E4M3_MAX), generator=gen)
    small = torch.rand((*lead, n), generator=gen, device=dev) < small_row_fraction
    small[..., 0] = False  # row 0 holds the tensor's largest scale
    floor = math.log2(smallest)
    small_log2 = torch.empty(shape, device=dev).uniform_(floor, floor + 2.8, generator=gen)
    log2 = torch.where(small.unsqueeze(-1), small_log2, log2)
    log2[..., 0, 0] = math.log2(E4M3_MAX)
    # E4M3 rounding may land a subnormal on zero: keep every scale >= smallest.
    scales = torch.exp2(log2).clamp(min=smallest, max=E4M3_MAX).to(torch.float8_e4m3fn)
    return scales, small


def random_nvfp4_weight(
    n: int,
    k: int,
    gen: torch.Generator,
    lead: tuple[int, ...] = (),
    smallest: float = E4M3_MIN_SUBNORMAL,
) -> Nvfp4Weight:
    """Random FP4 codes (all 16 codes, incl. -0) with non-uniform block scales."""
    if k % GROUP:
        raise ValueError(f"K={k} is not a multiple of the NVFP4 group size {GROUP}")
    codes = torch.randint(0, 16, (*lead, n, k), generator=gen, dtype=torch.uint8, device=gen.device)
    scales, small = random_block_scales((*lead, n, k // GROUP), gen, smallest)
    return Nvfp4Weight(pack_fp4(codes), scales, small)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN/inf in ``out`` gives inf (never a pass)."""
    o = out.detach().double()
    r = ref.detach().double().to(o.device)
    if not torch.isfinite(o).all():
        return float("inf")
    denom = torch.linalg.vector_norm(r).item()
    if denom == 0.0:
        raise ValueError("reference is all zeros: the check would prove nothing")
    return torch.linalg.vector_norm(o - r).item() / denom


def dense_reference(
    x: torch.Tensor,
    weight: Nvfp4Weight,
    global_multiplier: float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W^T (+ bias)`` in fp32 with ``x`` taken as given (already rounded to its dtype)."""
    w = dequant_nvfp4(weight.packed.to(x.device), weight.scales.to(x.device), global_multiplier)
    y = x.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y


def route(
    router_logits: torch.Tensor, topk: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing in fp32: (weights float32 [M, topk], ids int32 [M, topk])."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def dequant_experts(weight: Nvfp4Weight, multipliers: torch.Tensor) -> torch.Tensor:
    """fp32 ``[E, N, K]`` for a stack of experts (one global multiplier per expert)."""
    return dequant_nvfp4(weight.packed, weight.scales, multipliers)


def moe_reference(
    x: torch.Tensor,
    w13_f32: torch.Tensor,
    w2_f32: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    store_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """fp32 MoE: per token, sum_k w_k * down_e(silu(gate_e(x)) * up_e(x)).

    ``w13_f32`` is ``[E, 2I, H]`` with the gate rows first, then the up rows (w1 then w3),
    ``w2_f32`` is ``[E, H, I]`` (both from ``dequant_experts``). With ``store_dtype`` the
    first GEMM's output and the activation are rounded to it, as a layer that keeps them in
    its activation dtype does; the arithmetic stays fp32.
    """

    def stored(t: torch.Tensor) -> torch.Tensor:
        return t if store_dtype is None else t.to(store_dtype).float()

    dev = x.device
    xf = x.float()
    num_experts = w13_f32.shape[0]
    inter = w13_f32.shape[1] // 2
    out = torch.zeros(xf.shape[0], w2_f32.shape[1], dtype=torch.float32, device=dev)
    ids = topk_ids.long().to(dev)
    wts = topk_weights.float().to(dev)
    for e in range(num_experts):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        w13_e = w13_f32[e].to(dev)
        w2_e = w2_f32[e].to(dev)
        h = stored(xf[tok] @ w13_e.t())
        act = stored(torch.nn.functional.silu(h[:, :inter]) * h[:, inter:])
        y = act @ w2_e.t()
        out.index_add_(0, tok, y * wts[tok, slot].unsqueeze(-1))
    return out
