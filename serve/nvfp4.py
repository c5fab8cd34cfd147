"""NVFP4 weight quantization in the two checkpoint conventions SGLang serves.

One set of stored numbers, two spellings:
- compressed-tensors (``nvfp4-pack-quantized``): ``weight_packed`` (uint8, two E2M1 codes a byte,
  the even column in the low nibble), ``weight_scale`` (FP8 E4M3, one per 16 columns) and
  ``weight_global_scale``, a DIVISOR: w = fp4 * weight_scale / weight_global_scale.
- ModelOpt (``NVFP4``): ``weight`` (the same packed bytes), ``weight_scale`` (the same FP8
  block scales) and ``weight_scale_2``, a MULTIPLIER equal to 1 / weight_global_scale.
The global scale maps the tensor's absolute maximum to 448 * 6 (FP8 max times FP4 max), as both
producers do, so block scales use FP8's full range.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 16
FP4_MAX = 6.0
FP8_MAX = 448.0
# E2M1 magnitudes by code 0..7; bit 3 is the sign.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class Nvfp4:
    """One stored NVFP4 weight [N, K]: packed codes [N, K/2], FP8 block scales [N, K/16].

    ``global_scale`` is stored as the checkpoint has it: a divisor (compressed-tensors'
    ``weight_global_scale``) when ``divisor`` is true, else a multiplier (ModelOpt's
    ``weight_scale_2``), so that dequantization applies it exactly as written.
    """

    packed: torch.Tensor  # uint8
    block_scale: torch.Tensor  # float8_e4m3fn
    global_scale: torch.Tensor  # float32, one element
    divisor: bool

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Exact value of the stored numbers, computed in float32, then cast to ``dtype``."""
        n = self.packed.shape[0]
        codes = torch.stack((self.packed & 0xF, self.packed >> 4), dim=-1).reshape(n, -1)
        table = torch.tensor(E2M1, dtype=torch.float32, device=codes.device)
        values = table[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
        block = self.block_scale.float().repeat_interleave(GROUP, dim=1)
        g = self.global_scale.float().reshape(())
        scale = block / g if self.divisor else block * g
        return (values * scale).to(dtype)


FORMATS = {
    # format: (packed, block scale, global scale, global scale is a divisor)
    "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale", True),
    "modelopt": ("weight", "weight_scale", "weight_scale_2", False),
}
DROP = {"compressed-tensors": ("input_global_scale",), "modelopt": ("input_scale",)}


def stored_weights(tensors: dict[str, torch.Tensor], fmt: str) -> dict[str, Nvfp4]:
    """module name -> its stored NVFP4 weight, for every quantized module in ``tensors``."""
    packed_key, scale_key, global_key, divisor = FORMATS[fmt]
    out = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf != packed_key or t.dtype != torch.uint8:
            continue
        try:
            bs, gs = tensors[f"{module}.{scale_key}"], tensors[f"{module}.{global_key}"]
        except KeyError as e:
            raise ValueError(f"{module}: packed NVFP4 weight without {e.args[0]}") from None
        out[module] = Nvfp4(t, bs, gs, divisor)
    return out


def dequantized_state(
    tensors: dict[str, torch.Tensor], fmt: str, dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors with every NVFP4 weight replaced by its exact dequantization."""
    weights = stored_weights(tensors, fmt)
    packed_key, scale_key, global_key, _ = FORMATS[fmt]
    quant_leaves = {packed_key, scale_key, global_key, *DROP[fmt]}
    out = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if module in weights and leaf in quant_leaves:
            continue
        out[name] = t
    for module, w in weights.items():
        out[f"{module}.weight"] = w.dequantize(dtype)
    return out


def nvfp4_scales(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 block scales [N, K/16], float32 global scale [1]) of a 2-D weight.

    The observer step of both producers: the global scale maps the tensor's absolute maximum
    to 448 * 6; each block's scale maps its maximum to 6 and is rounded to FP8 E4M3. Rounding
    the weight to E2M1 codes is left to the producer's own packer.
    """
    w = weight.detach().float()
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"NVFP4 needs columns divisible by {GROUP}, got {k}")
    amax = w.abs().max().clamp(min=torch.finfo(torch.float32).tiny)
    global_scale = (FP8_MAX * FP4_MAX / amax).reshape(1)
    block_amax = w.reshape(n, k // GROUP, GROUP).abs().amax(dim=-1)
    block_scale = (block_amax / FP4_MAX * global_scale).clamp(max=FP8_MAX)
    return block_scale.to(torch.float8_e4m3fn), global_scale


def activation_global_scale(amax: float) -> torch.Tensor:
    """compressed-tensors' ``input_global_scale`` (a divisor) for an activation maximum."""
    return torch.tensor([FP8_MAX * FP4_MAX / max(amax, 1e-12)], dtype=torch.float32)
