"""Fallback ``sgl_kernel`` for the GPU proof when the carried sm90 ``common_ops`` cannot load.

Used only if ``import sgl_kernel`` of the real (carried) subset fails on the GPU machine; the
reports then record ``sgl_kernel: shim``. It provides the real ``scalar_type`` module (copied
from the sglang-kernel 0.4.2 wheel by pack.py) and plain-torch versions of the two ops the
Marlin MoE path calls around the kernels under test (``moe_align_block_size``,
``moe_sum_reduce``). Every other name raises when called. The plain versions synchronize,
so they cannot be captured in a CUDA graph: the MoE benchmark then reports a failure note.
"""

from __future__ import annotations

from typing import Any

import torch

from sgl_kernel import scalar_type  # noqa: F401  (the real module, copied next to this file)

__version__ = "0.4.2+fp4series-shim"
IS_SHIM = True

_lib = torch.library.Library("sgl_kernel", "DEF")
# topk.py registers a fake for this op at import time; the op must exist.
_lib.define(
    "moe_fused_gate(Tensor input_tensor, Tensor bias, int num_expert_group, int topk_group, "
    "int topk, int num_fused_shared_experts=0, float routed_scaling_factor=0, "
    "bool apply_routed_scaling_factor_on_output=False) -> Tensor[]"
)


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    experts_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    cumsum_buffer: torch.Tensor,
    pad_sorted_token_ids: bool = False,
) -> None:
    """Group the flattened (token, slot) indices by expert, each group padded to block_size."""
    flat = topk_ids.reshape(-1).long()
    total = flat.numel()
    sorted_token_ids.fill_(total)
    experts_ids.fill_(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts).tolist()
    start_in_order = int((flat < 0).sum())
    pos = block = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        sorted_token_ids[pos : pos + count] = order[start_in_order : start_in_order + count].to(
            sorted_token_ids.dtype
        )
        padded = (count + block_size - 1) // block_size * block_size
        experts_ids[block : block + padded // block_size] = e
        start_in_order += count
        pos += padded
        block += padded // block_size
    num_tokens_post_pad.fill_(pos)


def moe_sum_reduce(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float) -> None:
    output.copy_((input.float().sum(dim=1) * routed_scaling_factor).to(output.dtype))


def __getattr__(name: str) -> Any:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name} is not available in the GPU-proof shim")

    missing.__name__ = name
    return missing
