"""Synthetic NVFP4 checkpoint tensors, loaded through SGLang's own weight loaders.

The tensors are laid out as a checkpoint stores them (unsharded, one set per projection or per
expert and projection) in both formats: ModelOpt (``weight``, ``weight_scale``,
``weight_scale_2`` multiplier, ``input_scale``) and compressed-tensors (``weight_packed``,
``weight_scale``, ``weight_global_scale`` divisor, ``input_global_scale``). Their bytes tell
every row and every column apart (a pattern of row, column and tensor), so what a rank loaded
can be compared with the slice tensor parallelism gives it, and what the Marlin repack was
handed with the padded layout. Block scales are positive normal FP8-E4M3 values; global
scales are powers of two and differ per shard / half (a slot filled from the wrong shard
shows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 16
FORMATS = ("modelopt", "ct")
# param names per format: packed weight, block scales, global scale, input scale
NAMES = {
    "modelopt": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    "ct": ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"),
}
CONFIG_DIRS = {  # tests/data/nvfp4-configs keys of test_capability_matrix.CHECKPOINTS
    ("modelopt", False): "modelopt-dense",
    ("modelopt", True): "modelopt-moe",
    ("ct", False): "ct-dense",
    ("ct", True): "ct-moe",
}


def _mix(index: torch.Tensor, seed: int, modulus: int) -> torch.Tensor:
    """uint8 values that differ between neighbours and between far-apart indices."""
    i = index.to(torch.int64)
    return ((i * 0x9E37 + (i >> 8) * 0x45 + (i >> 16) * 0x3B + seed * 0x61) % modulus).to(
        torch.uint8
    )


def pattern(rows: int, cols: int, seed: int) -> torch.Tensor:
    """uint8 [rows, cols]: byte (r, c) = mix(r) ^ mix(c), distinct per seed."""
    r = _mix(torch.arange(rows), seed, 251)
    c = _mix(torch.arange(cols), seed + 17, 253)
    return r[:, None] ^ c[None, :]


def packed_weight(rows: int, k: int, seed: int) -> torch.Tensor:
    """FP4 codes packed two per byte, [rows, k/2]."""
    return pattern(rows, k // 2, seed)


def block_scales(rows: int, k: int, seed: int) -> torch.Tensor:
    """float8_e4m3fn [rows, k/16], byte codes 0x30..0x5F (2^-3 .. 3.75, all normal)."""
    codes = 0x30 + (pattern(rows, k // GROUP, seed + 5) % 0x30)
    return codes.view(torch.float8_e4m3fn)


def fp4_zero(packed: torch.Tensor) -> torch.Tensor:
    """Whether both FP4 codes of each byte are +-0 (a zero pad)."""
    return (packed & 0x77) == 0


@dataclass
class Projection:
    """One checkpoint projection (q_proj, gate_proj, an expert's w1, ...): rows x k."""

    weight: torch.Tensor  # uint8 [rows, k/2]
    scales: torch.Tensor  # float8_e4m3fn [rows, k/16]
    multiplier: float  # the global scale as a multiplier (w = fp4 * block * multiplier)
    input_scale: float  # ModelOpt input_scale; compressed-tensors stores its inverse
    bias: torch.Tensor | None = None

    @classmethod
    def make(cls, rows: int, k: int, seed: int, multiplier: float, bias_dtype=None):
        bias = None
        if bias_dtype is not None:
            bias = (pattern(rows, 1, seed + 9)[:, 0].to(torch.float32) / 64.0 - 2.0).to(bias_dtype)
        return cls(
            packed_weight(rows, k, seed),
            block_scales(rows, k, seed),
            multiplier,
            0.5 + (seed % 7) / 8.0,
            bias,
        )

    def tensors(self, fmt: str) -> dict[str, torch.Tensor]:
        """The checkpoint tensors of this projection under their names in FMT."""
        weight, scale, global_scale, input_scale = NAMES[fmt]
        if fmt == "modelopt":  # 0-d fp32 scalars, multipliers
            g, i = torch.tensor(self.multiplier), torch.tensor(self.input_scale)
        else:  # shape [1], divisors
            g, i = torch.tensor([1.0 / self.multiplier]), torch.tensor([1.0 / self.input_scale])
        return {weight: self.weight, scale: self.scales, global_scale: g, input_scale: i}

    def stored_global(self, fmt: str) -> float:
        """The value the checkpoint stores for the global scale (float32, before inversion)."""
        return self.tensors(fmt)[NAMES[fmt][2]].reshape(()).item()

    def stored_input(self, fmt: str) -> float:
        """The value the checkpoint stores for the input scale (float32)."""
        return self.tensors(fmt)[NAMES[fmt][3]].reshape(()).item()


def fused(parts: list[Projection], multiplier: float, input_scale: float) -> Projection:
    """The same rows stored pre-fused (qkv_proj / gate_up_proj): one global, one input scale."""
    bias = None
    if parts[0].bias is not None:
        bias = torch.cat([p.bias for p in parts])  # type: ignore[misc]
    return Projection(
        torch.cat([p.weight for p in parts]),
        torch.cat([p.scales for p in parts]),
        multiplier,
        input_scale,
        bias,
    )


def load_linear(layer, fmt: str, proj: Projection, shard_id=None, skip: tuple[str, ...] = ()):
    """Load one projection through the layer's own weight loaders (shard_id None: whole)."""
    extra = () if shard_id is None else (shard_id,)
    for name, tensor in proj.tensors(fmt).items():
        if name in skip:
            continue
        param = getattr(layer, name)
        param.weight_loader(param, tensor, *extra)
    if proj.bias is not None and "bias" not in skip:
        layer.bias.weight_loader(layer.bias, proj.bias, *extra)


def load_expert(
    layer,
    fmt: str,
    prefix: str,
    expert: int,
    shard: str,
    proj: Projection,
    skip: tuple[str, ...] = (),
) -> None:
    """Load one expert's w1 / w3 / w2 through FusedMoE.weight_loader, as a model's loader does."""
    half = "w2" if shard == "w2" else "w13"
    for name, tensor in proj.tensors(fmt).items():
        if name in skip:
            continue
        param_name = f"{half}_{name}"
        param = getattr(layer, param_name)
        param.weight_loader(
            param, tensor, f"{prefix}.{param_name}", shard_id=shard, expert_id=expert
        )
