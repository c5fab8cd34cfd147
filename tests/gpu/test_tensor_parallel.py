"""Tensor- and expert-parallel NVFP4 layers on one GPU, rank by rank, against the fp32 reference.

Each case takes one layer of a real model (shapes from tests/sglang/_tp_spec.py) and one
parallel size R. For every rank r of R, one after the other on this GPU, SGLang's real layer
(``QKVParallelLinear``, ``MergedColumnParallelLinear``, ``RowParallelLinear``, ``FusedMoE``)
is built as rank r (the rank and group size mocked: tests/sglang/_parallel.py), loads the
unsharded checkpoint tensors through its own weight loaders, runs the real
``process_weights_after_loading`` and serves the same tokens through the Marlin kernels. The
ranks' outputs are combined as the parallel group would (column-parallel: each shard's slices
concatenated, KV heads replicated across ranks taken once; row-parallel: partial outputs
summed, the bias added by rank 0 only; MoE: partial outputs summed, over the intermediate
slices with TP and over the experts with EP) and compared with the unsharded layer in fp32
(tests/gpu/_reference.py). Padded shapes (Qwen2.5-72B at TP 4 and 8, Qwen3-30B-A3B's experts at
TP 8) and unpadded ones, ModelOpt and compressed-tensors, fp16 and bf16.

Every case goes to numerics.json's ``tensor_parallel`` list (path, layer, model, tp_size or
ep_size, dtype, m, n, k (per rank), padded, outcome, rel_l2); ``fp4series check-reports``
gates them (fp4series.report.check_tensor_parallel).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent
SGLANG_TESTS = HERE.parent / "sglang"
for _p in (str(HERE), str(SGLANG_TESTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _parallel  # noqa: E402
import _tp_spec as spec  # noqa: E402
from _nvfp4_ckpt import Projection, load_expert, load_linear  # noqa: E402
from _reference import (  # noqa: E402
    SMALLEST_BLOCK_SCALE,
    dequant_nvfp4,
    moe_reference,
    random_nvfp4_weight,
    rel_l2,
    route,
)
from test_fused_shards import _quant_config as fused_quant_config  # noqa: E402
from test_marlin_numerics import (  # noqa: E402
    DTYPES,
    RECIPE_MULTIPLIER,
    _expect_marlin,
    _finite,
    _gen,
)

MS = (1, 33)
GPU_EXPERTS = 32  # of Qwen3-30B-A3B's 128 (every expert has the same shape)
FORMATS = {"modelopt": ("modelopt-dense", "modelopt-moe"), "ct": ("ct-dense", "ct-moe")}


@dataclass(frozen=True)
class Case:
    model: str
    layer: str
    size: int  # R: the TP size, or the EP size when ep
    ep: bool = False
    bias: bool = False  # a row layer with a bias (added once, by rank 0)

    @property
    def name(self) -> str:
        what = f"ep{self.size}" if self.ep else f"tp{self.size}"
        return f"{self.model}-{self.layer}-{what}" + ("-bias" if self.bias else "")

    def cell(self) -> spec.LayerCell:
        return spec.layer_cell(
            spec.MODEL_BY_NAME[self.model], self.layer, 1 if self.ep else self.size
        )


CASES = (
    Case("Qwen2.5-7B", "qkv", 4),  # QKV bias, 1 KV head per rank
    Case("Qwen3-30B-A3B", "qkv", 8),  # 4 KV heads on 8 ranks: each held by 2 ranks
    Case("Qwen2.5-72B", "gate_up", 8),  # N 7392 -> 7424
    Case("Qwen2.5-72B", "gate_up", 2),
    Case("Qwen2.5-72B", "down", 8, bias=True),  # K 3696 -> 3712
    Case("Qwen2.5-72B", "down", 4),  # K 7392 -> 7424
    Case("Llama-3.1-8B", "o", 2),
    Case("Qwen3-30B-A3B", "experts", 8),  # expert intermediate 96 -> 128
    Case("Qwen3-30B-A3B", "experts", 4),
    Case("Qwen3-30B-A3B", "experts", 2, ep=True),
    Case("Qwen3-30B-A3B", "experts", 4, ep=True),
)


def _quant_config(fmt: str) -> Any:
    """The checkpoint's quant config, with the fused-module mapping the model loader adds."""
    return fused_quant_config(FORMATS[fmt][0])


# ----------------------------------------------------------------------------- dense


def _dense_checkpoint(case: Case, dtype: torch.dtype, gen) -> dict[Any, tuple[Projection, Any]]:
    """shard id -> (projection, Nvfp4Weight) of the unsharded layer."""
    m = spec.MODEL_BY_NAME[case.model]
    hd, h = m.head_dim, m.hidden
    floor = SMALLEST_BLOCK_SCALE[dtype]
    if case.layer == "qkv":
        rows = {"q": m.heads * hd, "k": m.kv_heads * hd, "v": m.kv_heads * hd}
    elif case.layer == "gate_up":
        rows = {0: m.intermediate, 1: m.intermediate}
    else:
        rows = {None: h}
    k = {"o": m.heads * hd, "down": m.intermediate}.get(case.layer, h)
    out = {}
    for shard, n in rows.items():
        w = random_nvfp4_weight(n, k, gen, smallest=floor)
        bias = None
        if (case.layer == "qkv" and m.qkv_bias) or case.bias:
            bias = (torch.randn(n, generator=gen, device="cuda") * 0.5).to(dtype)
        out[shard] = (Projection(w.packed, w.scales, RECIPE_MULTIPLIER, 0.0123, bias), w)
    return out


def _build_dense(case: Case, fmt: str, rank: int, dtype: torch.dtype):
    from sglang.srt.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    m = spec.MODEL_BY_NAME[case.model]
    common = dict(
        params_dtype=dtype,
        quant_config=_quant_config(fmt),
        prefix=spec.PREFIX[case.layer],
        tp_rank=rank,
        tp_size=case.size,
    )
    with torch.device("cuda"):
        if case.layer == "qkv":
            return QKVParallelLinear(
                m.hidden, m.head_dim, m.heads, m.kv_heads, bias=m.qkv_bias, **common
            )
        if case.layer == "gate_up":
            return MergedColumnParallelLinear(m.hidden, [m.intermediate] * 2, bias=False, **common)
        k = m.heads * m.head_dim if case.layer == "o" else m.intermediate
        return RowParallelLinear(k, m.hidden, bias=case.bias, **common)


def _combine_columns(case: Case, cell: spec.LayerCell, outs: list[torch.Tensor]) -> torch.Tensor:
    """Rank outputs [M, sum(shards)] -> the unsharded layer's [M, N], shard by shard."""
    bounds = torch.tensor([0, *cell.shards]).cumsum(0).tolist()
    parts = []
    for i in range(len(cell.shards)):
        ranks = range(case.size)
        if case.layer == "qkv" and i > 0:  # a replicated KV head: once, from its first rank
            _, replicas = spec.kv_heads_per_rank(spec.MODEL_BY_NAME[case.model], case.size)
            ranks = range(0, case.size, replicas)
        parts.append(torch.cat([outs[r][:, bounds[i] : bounds[i + 1]] for r in ranks], dim=1))
    return torch.cat(parts, dim=1)


def run_dense(case: Case, fmt: str, dtype: torch.dtype, monkeypatch) -> tuple[list[dict], str]:
    cell = case.cell()
    gen = _gen("tp", case.name, fmt, dtype)
    ckpt = _dense_checkpoint(case, dtype, gen)
    w_f32 = torch.cat([dequant_nvfp4(w.packed, w.scales, p.multiplier) for p, w in ckpt.values()])
    biases = [p.bias for p, _ in ckpt.values() if p.bias is not None]
    bias_full = torch.cat(biases).float() if biases else None
    xs = {m: torch.randn(m, w_f32.shape[1], generator=gen, device="cuda").to(dtype) for m in MS}
    outs: dict[int, list[torch.Tensor]] = {m: [] for m in MS}
    for rank in range(case.size):
        _parallel.use_ranks(
            monkeypatch,
            _parallel.Ranks(rank, case.size),
            device="cuda",
            fp4_gemm_runner_backend="marlin",
        )
        layer = _build_dense(case, fmt, rank, dtype)
        for shard, (proj, _) in ckpt.items():
            load_linear(layer, fmt, proj, shard)
        layer.quant_method.process_weights_after_loading(layer)
        _expect_marlin(layer, f"{case.name} {fmt} rank {rank}")
        row = cell.layer in ("o", "down")
        # a row layer's bias is added once, by rank 0 (RowParallelLinear.forward)
        bias = layer.bias if (not row or rank == 0) else None
        for m, x in xs.items():
            x_rank = x[:, rank * cell.k : (rank + 1) * cell.k].contiguous() if row else x
            outs[m].append(layer.quant_method.apply(layer, x_rank, bias).float())
        del layer
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    cases = []
    for m, x in xs.items():
        ref = x.float() @ w_f32.t()
        if bias_full is not None:
            ref = ref + bias_full
        if cell.layer in ("o", "down"):
            out = torch.stack(outs[m]).sum(0)
        else:
            out = _combine_columns(case, cell, outs[m])
        cases.append({"m": m, "rel_l2": _finite(rel_l2(out, ref))})
    return cases, ""


# ----------------------------------------------------------------------------- MoE


def run_moe(case: Case, fmt: str, dtype: torch.dtype, monkeypatch) -> tuple[list[dict], str]:
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    m = spec.MODEL_BY_NAME[case.model]
    assert m.moe_intermediate is not None and m.top_k is not None
    e, h, inter = GPU_EXPERTS, m.hidden, m.moe_intermediate
    gen = _gen("tp-moe", case.name, fmt, dtype)
    floor = SMALLEST_BLOCK_SCALE[dtype]
    w13 = random_nvfp4_weight(2 * inter, h, gen, lead=(e,), smallest=floor)
    w2 = random_nvfp4_weight(h, inter, gen, lead=(e,), smallest=floor)
    g1 = RECIPE_MULTIPLIER * (1.0 + 0.5 * torch.rand(e, generator=gen, device="cuda"))
    g2 = 0.6 * RECIPE_MULTIPLIER * (1.0 + 0.5 * torch.rand(e, generator=gen, device="cuda"))
    w13_f32 = dequant_nvfp4(w13.packed, w13.scales, g1)
    w2_f32 = dequant_nvfp4(w2.packed, w2.scales, g2)
    tokens = {
        mm: (
            torch.randn(mm, h, generator=gen, device="cuda").to(dtype),
            torch.randn(mm, e, generator=gen, device="cuda"),
        )
        for mm in MS
    }
    outs: dict[int, list[torch.Tensor]] = {mm: [] for mm in MS}
    ep = case.size if case.ep else 1
    for rank in range(case.size):
        _parallel.use_ranks(
            monkeypatch,
            _parallel.Ranks(rank, case.size, ep),
            device="cuda",
            fp4_gemm_runner_backend="marlin",
            moe_runner_backend="marlin",
        )
        with torch.device("cuda"):
            layer = FusedMoE(
                num_experts=e,
                hidden_size=h,
                intermediate_size=inter,
                layer_id=0,
                top_k=m.top_k,
                params_dtype=dtype,
                quant_config=_quant_config(fmt),
                prefix=spec.PREFIX["experts"],
            )
        for x in range(e):
            g = (g1[x].item(), g1[x].item(), g2[x].item())
            for i, (shard, packed, scales) in enumerate(
                (
                    ("w1", w13.packed[x, :inter], w13.scales[x, :inter]),
                    ("w3", w13.packed[x, inter:], w13.scales[x, inter:]),
                    ("w2", w2.packed[x], w2.scales[x]),
                )
            ):
                proj = Projection(packed, scales, g[i], 0.0123)
                load_expert(layer, fmt, spec.PREFIX["experts"], x, shard, proj)
        layer.quant_method.process_weights_after_loading(layer)
        _expect_marlin(layer, f"{case.name} {fmt} rank {rank}")
        for mm, (x_tok, logits) in tokens.items():
            weights, ids = route(logits, m.top_k)
            topk = StandardTopKOutput(weights, ids, logits)
            # the layer computes in place (inplace MoE): every rank gets its own copy
            dispatch = layer.dispatcher.dispatch(x_tok.clone(), topk)
            combined = layer.quant_method.apply(layer, dispatch)
            outs[mm].append(getattr(combined, "hidden_states", combined).float())
        del layer
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    cases = []
    for mm, (x_tok, logits) in tokens.items():
        weights, ids = route(logits, m.top_k)
        ref = moe_reference(x_tok, w13_f32, w2_f32, weights, ids)
        cases.append({"m": mm, "rel_l2": _finite(rel_l2(torch.stack(outs[mm]).sum(0), ref))})
    return cases, ""


# ----------------------------------------------------------------------------- tests


def _record(case: Case, fmt: str, dtype: torch.dtype) -> dict[str, Any]:
    cell = case.cell()
    moe = case.layer == "experts"
    return {
        "path": FORMATS[fmt][1 if moe else 0],
        "layer": "moe" if moe else case.layer,
        "model": case.model,
        ("ep_size" if case.ep else "tp_size"): case.size,
        "dtype": str(dtype).removeprefix("torch."),
        "n": cell.n,
        "k": cell.k,
        "padded": cell.outcome == "padded",
        **({"bias": True} if case.bias else {}),
    }


def run_case(case: Case, fmt: str, dtype: torch.dtype, monkeypatch) -> list[dict]:
    base = _record(case, fmt, dtype)
    runner = run_moe if case.layer == "experts" else run_dense
    try:
        results, _ = runner(case, fmt, dtype, monkeypatch)
    except (ValueError, AssertionError) as exc:  # refused at load: recorded, check-reports judges
        torch.cuda.empty_cache()
        return [{**base, "outcome": "refused", "error": f"{type(exc).__name__}: {exc}"[:500]}]
    return [{**base, "outcome": "served", **r} for r in results]


PARAMS = [
    pytest.param(case, fmt, dt, id=f"{case.name}-{fmt}-{dt}")
    for case in CASES
    for fmt in FORMATS
    for dt in DTYPES
]


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "fmt", "dtype"), PARAMS)
def test_parallel_layer(case: Case, fmt: str, dtype: str, gpu_report: Any, monkeypatch) -> None:
    from fp4series.report import check_tensor_parallel_case

    cases = run_case(case, fmt, DTYPES[dtype], monkeypatch)
    gpu_report.extra.setdefault("tensor_parallel", []).extend(cases)
    assert all(c["outcome"] == "served" for c in cases), cases[0].get("error")
    problems: list[str] = []
    for c in cases:
        check_tensor_parallel_case("tensor_parallel", c, problems)
    assert not problems, "; ".join(problems)
