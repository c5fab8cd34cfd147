"""Every stored layout of NVFP4 global and input scales reaches every shard (issue 20).

A fused layer (``QKVParallelLinear``, ``MergedColumnParallelLinear``) holds one global scale
and one input scale per shard. Checkpoints store them per shard (``q_proj.weight_scale_2``,
...) or, where the checkpoint already stores the projection fused (``qkv_proj`` /
``gate_up_proj``), once for the fused tensor. MoE experts store them per expert and per half
(w1, w3) and per expert for w2. Built here: the real layers at TP 1 and rank 1 of TP 2, with
the quant config parsed from a checkpoint directory (ModelOpt ``weight_scale_2`` multipliers,
compressed-tensors ``weight_global_scale`` divisors), loaded through their own weight loaders,
then the real ``process_weights_after_loading`` with the CUDA repack recorded.

Wanted: each layout is served exactly (after loading every slot holds its value: the one fused
scale in every shard's slot; after preparation what the kernel applies per output row is the
block scale times that row's own global scale), and a slot no loader wrote is refused after
loading with a message naming the layer and the shard (or expert and half), never used as
whatever ``torch.empty`` left there.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.moe.fused_moe_triton import fused_marlin_moe as _fused_marlin_moe  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent))
from _nvfp4_ckpt import (  # noqa: E402
    CONFIG_DIRS,
    FORMATS,
    NAMES,
    Projection,
    fused,
    load_expert,
    load_linear,
)
from test_capability_matrix import CHECKPOINTS, _quant_config  # noqa: E402
from test_marlin_utils_fp4 import _effective_scales, _marlin_scale_layout  # noqa: E402

HIDDEN, HEAD, HEADS, KV_HEADS, INTER = 256, 64, 4, 2, 192
PREFIX = {
    "qkv": "model.layers.0.self_attn.qkv_proj",
    "gate_up": "model.layers.0.mlp.gate_up_proj",
    "experts": "model.layers.0.mlp.experts",
}
SHARD_NAMES = {"qkv": ("q", "k", "v"), "gate_up": (0, 1)}
MULTIPLIERS = (2.0**-8, 2.0**-7, 2.0**-9)  # per shard: all different (a mixed-up slot shows)
FUSED_MULTIPLIER, FUSED_INPUT = 2.0**-6, 0.75
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _config(fmt: str, moe: bool = False) -> Any:
    return _quant_config(CHECKPOINTS[CONFIG_DIRS[(fmt, moe)]])


def _layer(kind: str, fmt: str, dtype: torch.dtype, tp: int):
    common = dict(
        bias=False,
        params_dtype=dtype,
        quant_config=_config(fmt),
        prefix=PREFIX[kind],
        tp_rank=tp - 1,
        tp_size=tp,
    )
    if kind == "qkv":
        return QKVParallelLinear(HIDDEN, HEAD, HEADS, KV_HEADS, **common)
    return MergedColumnParallelLinear(HIDDEN, [INTER, INTER], **common)


def _shards(kind: str) -> list[Projection]:
    rows = [HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD] if kind == "qkv" else [INTER, INTER]
    return [Projection.make(r, HIDDEN, 3 + i, MULTIPLIERS[i]) for i, r in enumerate(rows)]


def _rank_blocks(parts: list[Projection], tp: int) -> torch.Tensor:
    """Block scales [N_rank, K/16] of rank tp - 1 (KV heads are not replicated here)."""
    rank = tp - 1
    return torch.cat(
        [p.scales[rank * (len(p.scales) // tp) : (rank + 1) * (len(p.scales) // tp)] for p in parts]
    )


def _served_exactly(layer, dtype: torch.dtype, blocks: torch.Tensor, multipliers: list[float]):
    """What the kernel applies per output row == block scale x that row's global multiplier."""
    sizes = list(layer.output_partition_sizes)
    per_row = torch.cat(
        [torch.full((n,), m, dtype=torch.float64) for n, m in zip(sizes, multipliers, strict=True)]
    )
    col = getattr(layer, "weight_output_scale", None)
    col = torch.ones(len(per_row)) if col is None else col
    # compared in Marlin's column order: the output column scale and each row's multiplier are
    # per logical row, moved with the block scales (a 64-column tile may hold two shards)
    got = _effective_scales(layer.weight_scale, layer.weight_global_scale, dtype)
    got = got * _marlin_scale_layout(col.double()[:, None])
    expected = _marlin_scale_layout(blocks.double() * per_row[:, None])
    rtol = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    torch.testing.assert_close(got, expected, rtol=rtol, atol=0)


def _cases(layouts: tuple[str, ...]):
    return [
        pytest.param(kind, fmt, tp, dt, layout, id=f"{kind}-{fmt}-tp{tp}-{dt}-{layout}")
        for layout in layouts
        for kind in ("qkv", "gate_up")
        for fmt in FORMATS
        for tp in (1, 2)
        for dt in DTYPES
    ]


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize(
    ("kind", "fmt", "tp", "dtype_name", "layout"),
    _cases(("per-shard", "pre-fused")),
)
def test_fused_layer_scales_every_layout(
    cuda_device, parallel_ranks, marlin_kernels, kind, fmt, tp, dtype_name, layout
):
    """Per shard or stored fused: every shard's slot holds its scale, and is served exactly."""
    dtype = DTYPES[dtype_name]
    parallel_ranks(tp_rank=tp - 1, tp_size=tp, fp4_gemm_runner_backend="marlin")
    layer = _layer(kind, fmt, dtype, tp)
    parts = _shards(kind)
    if layout == "per-shard":
        for shard_id, proj in zip(SHARD_NAMES[kind], parts, strict=True):
            load_linear(layer, fmt, proj, shard_id)
        multipliers = [p.multiplier for p in parts]
        stored = [p.stored_global(fmt) for p in parts]
        inputs = [p.stored_input(fmt) for p in parts]
    else:  # the checkpoint stores qkv_proj / gate_up_proj: loaded with no shard id
        whole = fused(parts, FUSED_MULTIPLIER, FUSED_INPUT)
        load_linear(layer, fmt, whole)
        multipliers = [FUSED_MULTIPLIER] * len(parts)
        stored = [whole.stored_global(fmt)] * len(parts)
        inputs = [whole.stored_input(fmt)] * len(parts)
    _, scale_name, global_name, input_name = NAMES[fmt]
    blocks = _rank_blocks(parts, tp)
    assert torch.equal(getattr(layer, scale_name).data.view(torch.uint8), blocks.view(torch.uint8))
    # every shard's slot, after loading (the native path reads input scales from them too)
    assert getattr(layer, global_name).data.tolist() == stored, f"{global_name} slots"
    assert getattr(layer, input_name).data.tolist() == inputs, f"{input_name} slots"

    layer.quant_method.process_weights_after_loading(layer)
    assert marlin_kernels.repacks, "the Marlin preparation did not run"
    _served_exactly(layer, dtype, blocks, multipliers)


def _never_loaded(message: str, prefix: str, *names: str) -> bool:
    """A refusal that says a scale was never loaded, naming the layer and one of NAMES."""
    said = "never loaded" in message.lower() or "not loaded" in message.lower()
    named = any(re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", message) for n in names)
    return said and prefix in message and named


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize(
    ("kind", "fmt", "missing"),
    [
        pytest.param(
            kind,
            fmt,
            missing,
            id=f"{kind}-{fmt}-no-{missing}-scale",
        )
        for kind, missing in (("qkv", 1), ("gate_up", 1), ("qkv", 2))
        for fmt in FORMATS
    ],
)
def test_fused_layer_scale_never_loaded_is_refused(
    cuda_device, parallel_ranks, marlin_kernels, kind, fmt, missing
):
    """A shard whose global scale no loader wrote: refused after loading, layer and shard named."""
    parallel_ranks(fp4_gemm_runner_backend="marlin")
    layer = _layer(kind, fmt, torch.bfloat16, 1)
    global_name = NAMES[fmt][2]
    for i, (shard_id, proj) in enumerate(zip(SHARD_NAMES[kind], _shards(kind), strict=True)):
        load_linear(layer, fmt, proj, shard_id, skip=(global_name,) if i == missing else ())
    with pytest.raises(ValueError) as err:
        layer.quant_method.process_weights_after_loading(layer)
    shard = SHARD_NAMES[kind][missing]
    names = (f"shard {missing}", f"shard {shard}", f"'{shard}'")
    assert _never_loaded(str(err.value), PREFIX[kind], *names), str(err.value)
    assert not marlin_kernels.repacks


# ----------------------------------------------------------------------------- MoE

E, MOE_HIDDEN, MOE_INTER = 4, 256, 128


def _experts(fmt: str, parallel_ranks, w3_ratio: float, skip: dict | None = None):
    """A real FusedMoE; per expert w1, w3 (w3's multiplier = w3_ratio x w1's) and w2."""
    parallel_ranks(fp4_gemm_runner_backend="marlin", moe_runner_backend="marlin")
    layer = FusedMoE(
        num_experts=E,
        hidden_size=MOE_HIDDEN,
        intermediate_size=MOE_INTER,
        layer_id=0,
        top_k=2,
        params_dtype=torch.bfloat16,
        quant_config=_config(fmt, moe=True),
        prefix=PREFIX["experts"],
    )
    stored: dict[tuple[int, str], float] = {}
    for e in range(E):
        g = MULTIPLIERS[0] * (1 + e)
        for shard, rows, k, mult in (
            ("w1", MOE_INTER, MOE_HIDDEN, g),
            ("w3", MOE_INTER, MOE_HIDDEN, g * w3_ratio),
            ("w2", MOE_HIDDEN, MOE_INTER, 2 * g),
        ):
            proj = Projection.make(rows, k, 50 + 3 * e + len(stored) % 3, mult)
            stored[(e, shard)] = proj.stored_global(fmt)
            names = (skip or {}).get((e, shard), ())
            load_expert(layer, fmt, PREFIX["experts"], e, shard, proj, skip=names)
    return layer, stored


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("w3_ratio", [1.0, 2.0, 0.25], ids=["halves-equal", "w3-2x", "w3-0.25x"])
def test_expert_scales_per_expert_per_half(
    cuda_device, parallel_ranks, marlin_kernels, fmt, w3_ratio
):
    """Per expert and half: every slot holds its own scale, and the layer is prepared."""
    layer, stored = _experts(fmt, parallel_ranks, w3_ratio)
    global_name = NAMES[fmt][2]
    w13 = getattr(layer, f"w13_{global_name}").data
    w2 = getattr(layer, f"w2_{global_name}").data
    assert w13.tolist() == [[stored[(e, "w1")], stored[(e, "w3")]] for e in range(E)]
    assert w2.tolist() == [stored[(e, "w2")] for e in range(E)]
    layer.quant_method.process_weights_after_loading(layer)
    assert len(marlin_kernels.repacks) == 2 * E


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize(
    ("fmt", "expert", "shard"),
    [
        pytest.param(
            fmt,
            expert,
            shard,
            id=f"{fmt}-expert{expert}-{shard}",
        )
        for fmt in FORMATS
        for expert, shard in ((2, "w3"), (1, "w1"), (3, "w2"))
    ],
)
def test_expert_scale_never_loaded_is_refused(
    cuda_device, parallel_ranks, marlin_kernels, fmt, expert, shard
):
    """An expert's half whose global scale no loader wrote: refused, expert and half named."""
    global_name = NAMES[fmt][2]
    layer, _ = _experts(fmt, parallel_ranks, 2.0, skip={(expert, shard): (global_name,)})
    with pytest.raises(ValueError) as err:
        layer.quant_method.process_weights_after_loading(layer)
    message = str(err.value)
    assert _never_loaded(message, PREFIX["experts"], shard), message
    assert re.search(rf"expert {expert}\b", message), message
    assert not marlin_kernels.repacks
