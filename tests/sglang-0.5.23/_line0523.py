"""Helpers shared by the 0.5.23 line's CPU tests (checkpoint configs, kernel stubs)."""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path

import torch

DATA_DIR = Path(__file__).parents[1] / "data" / "nvfp4-configs"


@dataclass(frozen=True)
class Checkpoint:
    key: str
    quantization: str  # what SGLang's model config detects for this checkpoint
    directory: str  # under tests/data/nvfp4-configs
    moe: bool
    prefix: str  # a realistic layer prefix of that model


CHECKPOINTS = {
    c.key: c
    for c in (
        # nvidia/Llama-3.1-8B-Instruct-FP4 (hf_quant_config.json)
        Checkpoint(
            "modelopt-dense",
            "modelopt_fp4",
            "modelopt-nvfp4-dense",
            False,
            "model.layers.0.mlp.down_proj",
        ),
        # nvidia/Qwen3-30B-A3B-FP4 style (hf_quant_config.json)
        Checkpoint(
            "modelopt-moe", "modelopt_fp4", "modelopt-nvfp4-moe", True, "model.layers.0.mlp.experts"
        ),
        # a ModelOpt W4A16_NVFP4 (weight-only) export of the same model
        Checkpoint(
            "modelopt-a16-dense",
            "modelopt_fp4",
            "modelopt-nvfp4a16-dense",
            False,
            "model.layers.0.mlp.down_proj",
        ),
        # RedHatAI/Meta-Llama-3.1-8B-Instruct-NVFP4 style (config.json)
        Checkpoint(
            "ct-dense",
            "compressed-tensors",
            "ct-nvfp4-dense",
            False,
            "model.layers.0.mlp.down_proj",
        ),
        # RedHatAI/Qwen3-30B-A3B-NVFP4 style (config.json)
        Checkpoint(
            "ct-moe", "compressed-tensors", "ct-nvfp4-moe", True, "model.layers.0.mlp.experts"
        ),
    )
}


def quant_config(ckpt: Checkpoint, packed_modules_mapping: dict | None = None):
    """Parse the checkpoint directory the way the model loader does (get_quant_config)."""
    from sglang.srt.model_loader.weight_utils import get_quant_config
    from transformers import PretrainedConfig

    directory = DATA_DIR / ckpt.directory
    hf = json.loads((directory / "config.json").read_text())
    hf_config = PretrainedConfig(
        architectures=hf["architectures"], quantization_config=hf.get("quantization_config")
    )
    model_config = types.SimpleNamespace(
        quantization=ckpt.quantization,
        hf_config=hf_config,
        model_path=str(directory),
        revision=None,
        is_draft_model=False,
        is_draft_quantization_explicit=False,
    )
    load_config = types.SimpleNamespace(download_dir=None, model_loader_extra_config={})
    return get_quant_config(
        model_config, load_config, packed_modules_mapping=packed_modules_mapping or {}
    )


def loader_capability_check(quant_config, quantization: str) -> None:
    """The model loader's check (model_loader/loader.py, _get_quantization_config)."""
    major, minor = torch.cuda.get_device_capability()
    capability = major * 10 + minor
    if capability < quant_config.get_min_capability():
        raise ValueError(
            f"The quantization method {quantization} is not supported for the "
            f"current GPU. Minimum capability: {quant_config.get_min_capability()}. "
            f"Current capability: {capability}."
        )


def fp8_scales(shape, lo: int, hi: int, seed: int) -> torch.Tensor:
    """Random non-negative FP8-E4M3 values with byte codes in [lo, hi]."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32)
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


class MarlinStubs:
    """Stand-ins for the CUDA ops marlin_utils_fp4 calls (as tests/sglang does).

    ``gptq_marlin_repack`` records its input and returns a tensor of the Marlin shape;
    ``gptq_marlin_gemm`` returns a known [M, N] tensor and records its arguments;
    ``marlin_make_workspace`` returns a small tensor.
    """

    def __init__(self, module, monkeypatch):
        self.repacks: list[tuple] = []
        self.gemm_calls: list[dict] = []
        self.gemm_out: torch.Tensor | None = None

        def repack(b_q_weight, perm, size_k, size_n, num_bits):
            self.repacks.append((b_q_weight.clone(), size_k, size_n, num_bits))
            return torch.zeros((size_k // 16, size_n * 2), dtype=torch.int32)

        def gemm(**kwargs):
            self.gemm_calls.append(kwargs)
            m, n = kwargs["size_m"], kwargs["size_n"]
            if self.gemm_out is None:
                out = (torch.arange(m * n, dtype=torch.float32) % 61 - 30).view(m, n) / 8
            else:
                out = self.gemm_out[:m, :n].float()
            return out.to(kwargs["a"].dtype)

        monkeypatch.setattr(module, "gptq_marlin_repack", repack, raising=False)
        monkeypatch.setattr(module, "gptq_marlin_gemm", gemm, raising=False)
        monkeypatch.setattr(
            module, "marlin_make_workspace", lambda device, max_blocks_per_sm=1: torch.zeros(4)
        )


# --------------------------------------------------------------------------
# Independent decoders of what the Marlin FP4 kernels read (from their bit operations)
# --------------------------------------------------------------------------

FP16, BF16 = torch.float16, torch.bfloat16
# exponent bias moved into the activation dtype: the kernel reads global * 2^(bias - 7)
GLOBAL_BIAS = {FP16: 14, BF16: 126}


def decode_16bit(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """IEEE decode of fp16 (e5m10) / bf16 (e8m7) bit patterns, by hand."""
    bits = bits.to(torch.int64) & 0xFFFF
    ebits, mbits = (5, 10) if dtype == FP16 else (8, 7)
    bias = 2 ** (ebits - 1) - 1
    sign = torch.where(bits >> 15 == 1, -1.0, 1.0).double()
    e = (bits >> mbits) & (2**ebits - 1)
    mant = (bits & (2**mbits - 1)).double() / 2**mbits
    normal = (1 + mant) * torch.pow(2.0, (e - bias).double())
    sub = mant * 2.0 ** (1 - bias)
    return sign * torch.where(e == 0, sub, normal)


def kernel_scale_decode(byte: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What the kernel's dequant_fp8_scales makes of one Marlin NVFP4 scale byte."""
    b = byte.view(torch.uint8).to(torch.int64)
    fp16_bits = b << 7
    bf16_bits = ((b & 0x80) << 7) | ((b & 0x7F) << 4)
    return decode_16bit(fp16_bits if dtype == FP16 else bf16_bits, dtype)


def effective_scales(scale_bytes, global_scale, dtype) -> torch.Tensor:
    """block scale x global scale as the kernel applies them (the 2^-bias undone)."""
    block = kernel_scale_decode(scale_bytes, dtype)
    glob = decode_16bit(global_scale.reshape(-1)[:1].view(torch.int16), dtype)
    return block * glob.item() * 2.0 ** -GLOBAL_BIAS[dtype]


def marlin_scale_layout(s_nk: torch.Tensor) -> torch.Tensor:
    """Closed form of the kernel's NVFP4 scale order, from S [N, K/16] -> [K/16, N].

    out[g, 64c + p] = S[64c + i + 8j, g], q = p with 1<->2 swapped in fours,
    i = q // 8, j = q % 8.
    """
    n, groups = s_nk.shape
    out = torch.empty(groups, n, dtype=s_nk.dtype)
    for p in range(64):
        q = 4 * (p // 4) + [0, 2, 1, 3][p % 4]
        src = q // 8 + 8 * (q % 8)
        out[:, p::64] = s_nk[src::64, :].T
    return out
