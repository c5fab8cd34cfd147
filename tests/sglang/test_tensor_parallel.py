"""Every rank of real models at --tp 1, 2, 4, 8 through SGLang's real parallel layers (issue 20).

For each model of ``_tp_spec.MODELS`` (Llama-3.1 8B / 70B, Qwen2.5 7B / 72B with their QKV bias,
Qwen3-30B-A3B, Qwen3-235B-A22B, Mixtral-8x7B; shapes from their config.json), each TP size and
each layer (qkv, o, gate_up, down, or the MoE experts), in both checkpoint formats (ModelOpt and
compressed-tensors NVFP4), every rank builds the real ``QKVParallelLinear`` /
``RowParallelLinear`` / ``MergedColumnParallelLinear`` / ``FusedMoE`` with the quant config
parsed from a checkpoint directory (tests/data), SGLang sees that rank (``parallel_ranks``:
rank and group size mocked), and loads unsharded checkpoint tensors through the layers' own
weight loaders. What each rank loaded is compared with its tensor-parallel slice. One rank per
TP size (rank 3, or the last: every rank has the same shapes, and the preparation is the costly
part on a CPU) then runs the real ``process_weights_after_loading`` and
``apply``, with the CUDA-only Marlin ops recorded (``marlin_kernels``), and the cell asserts
``_tp_spec``'s outcome: served at its own shape, zero-padded once at load to the tile shape
(the repack sees the padded layout: real rows and columns in place, zeros after them; the
GEMM sees the padded shape; the layer returns the logical shape), or refused with upstream's
message. MoE cells build 2 of the model's experts: every expert has the same shape, and the
count only matters under expert parallelism (tested here at EP 2 and 4 on small shapes,
where the expert map must reach ``fused_marlin_moe``).

``TP_TABLE_OUT=PATH`` writes what the layers did per cell (outcome, shapes handed to the
kernel, what ``apply`` copies per call because of padding, error) as a Markdown table, whether
or not it is what the spec wants; the per-call copies are recorded there, not asserted.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.moe.fused_moe_triton import fused_marlin_moe as _fused_marlin_moe  # noqa: F401
from sglang.srt.layers.moe.topk import StandardTopKOutput

sys.path.insert(0, str(Path(__file__).parent))
import _tp_spec as spec  # noqa: E402
from _nvfp4_ckpt import (  # noqa: E402
    CONFIG_DIRS,
    FORMATS,
    NAMES,
    Projection,
    fp4_zero,
    load_expert,
    load_linear,
)
from test_capability_matrix import CHECKPOINTS, _quant_config  # noqa: E402

DTYPE = torch.bfloat16
M = 3  # tokens per apply
CPU_EXPERTS = 2
# Global multipliers (powers of two). A dense layer's shards share one, as most exporters
# write them, so what apply copies per call is due to padding alone (shards with their own
# scales: test_prefused_scales.py); w1, w3 and w2 of an expert differ.
MULTIPLIERS = (2.0**-8, 2.0**-7, 2.0**-9)
DENSE_MULTIPLIER = 2.0**-8


def processed_rank(tp: int) -> int:
    return min(3, tp - 1)


@functools.lru_cache(maxsize=4)
def quant_config(fmt: str, moe: bool) -> Any:
    return _quant_config(CHECKPOINTS[CONFIG_DIRS[(fmt, moe)]])


# ----------------------------------------------------------------------------- checkpoints


@functools.lru_cache(maxsize=1)
def dense_checkpoint(model_name: str, layer: str) -> dict[Any, Projection]:
    """shard id -> unsharded checkpoint projection of one dense layer (None: a row layer)."""
    m = spec.MODEL_BY_NAME[model_name]
    hd, h = m.head_dim, m.hidden
    bias = DTYPE if (layer == "qkv" and m.qkv_bias) else None
    if layer == "qkv":
        rows = {"q": m.heads * hd, "k": m.kv_heads * hd, "v": m.kv_heads * hd}
        return {
            s: Projection.make(r, h, 11 + i, DENSE_MULTIPLIER, bias)
            for i, (s, r) in enumerate(rows.items())
        }
    if layer == "gate_up":
        assert m.intermediate is not None
        return {s: Projection.make(m.intermediate, h, 21 + s, DENSE_MULTIPLIER) for s in (0, 1)}
    k = m.heads * hd if layer == "o" else m.intermediate
    assert k is not None
    return {None: Projection.make(h, k, 31, DENSE_MULTIPLIER)}


@functools.lru_cache(maxsize=1)
def expert_checkpoint(model_name: str) -> dict[tuple[int, str], Projection]:
    """(expert, w1 / w3 / w2) -> unsharded projection, for CPU_EXPERTS experts."""
    m = spec.MODEL_BY_NAME[model_name]
    assert m.moe_intermediate is not None
    out = {}
    for e in range(CPU_EXPERTS):
        for i, shard in enumerate(("w1", "w3")):
            out[(e, shard)] = Projection.make(
                m.moe_intermediate, m.hidden, 40 + 3 * e + i, MULTIPLIERS[i] * (1 + e)
            )
        out[(e, "w2")] = Projection.make(
            m.hidden, m.moe_intermediate, 41 + 3 * e + 2, MULTIPLIERS[2] * (1 + e)
        )
    return out


# ----------------------------------------------------------------------------- what a rank gets


def rank_rows(cell: spec.LayerCell, rank: int, shard_index: int) -> slice:
    """Rows of shard SHARD_INDEX a column-parallel rank holds (KV heads may be replicated)."""
    size = cell.shards[shard_index]
    if cell.layer == "qkv" and shard_index > 0:
        _, replicas = spec.kv_heads_per_rank(cell.model, cell.tp)
        start = (rank // replicas) * size
    else:
        start = rank * size
    return slice(start, start + size)


def sample_rows(size: int) -> torch.Tensor:
    """Rows compared in full: every 61st, and both ends (a shifted slice shows at both)."""
    return torch.unique(torch.cat([torch.arange(0, size, 61), torch.tensor([0, size - 1])]))


def expected_dense(cell: spec.LayerCell, rank: int, ckpt: dict[Any, Projection]):
    """(partition rows sampled, their packed weight, block scales, the rank's bias).

    Column layers: rows of each shard's slice, in partition order; row layers: every sampled
    output row, the rank's slice of the input features.
    """
    if None in ckpt:  # row parallel: a slice of the input features
        proj = ckpt[None]
        k = cell.k
        rows = sample_rows(cell.n)
        cols = slice(rank * k // 2, (rank + 1) * k // 2)
        groups = slice(rank * k // 16, (rank + 1) * k // 16)
        return rows, proj.weight[rows][:, cols], proj.scales[rows][:, groups], proj.bias
    index, weights, scales, biases = [], [], [], []
    offset = 0
    for i, proj in enumerate(ckpt.values()):
        local = sample_rows(cell.shards[i])
        source = local + rank_rows(cell, rank, i).start
        index.append(local + offset)
        weights.append(proj.weight[source])
        scales.append(proj.scales[source])
        if proj.bias is not None:
            biases.append(proj.bias[rank_rows(cell, rank, i)])
        offset += cell.shards[i]
    bias = torch.cat(biases) if biases else None
    return torch.cat(index), torch.cat(weights), torch.cat(scales), bias


# ----------------------------------------------------------------------------- observations


@dataclass
class Observed:
    """What the layers did with one cell (processed rank)."""

    outcome: str = "?"
    kernel: list[tuple[str, int, int]] = field(default_factory=list)  # (gemm, N, K) repacked
    gemm_shape: tuple[int, int] | None = None  # (size_n, size_k) of the GEMM call
    input_copied: bool | None = None  # apply handed the kernel a new activation tensor
    output_copied: bool | None = None  # apply returned a copy of the kernel's output
    error: str = ""


OBSERVED: dict[tuple[str, str], Observed] = {}  # (cell key, format) -> what happened


def _observe(cell: spec.LayerCell, fmt: str) -> Observed:
    return OBSERVED.setdefault((cell.key, fmt), Observed())


def build_dense(cell: spec.LayerCell, fmt: str, rank: int):
    m = cell.model
    common = dict(
        params_dtype=DTYPE,
        quant_config=quant_config(fmt, False),
        prefix=spec.PREFIX[cell.layer],
        tp_rank=rank,
        tp_size=cell.tp,
    )
    if cell.layer == "qkv":
        return QKVParallelLinear(
            m.hidden, m.head_dim, m.heads, m.kv_heads, bias=m.qkv_bias, **common
        )
    if cell.layer == "gate_up":
        assert m.intermediate is not None
        return MergedColumnParallelLinear(m.hidden, [m.intermediate] * 2, bias=False, **common)
    k = m.heads * m.head_dim if cell.layer == "o" else m.intermediate
    return RowParallelLinear(k, m.hidden, bias=False, **common)


def check_dense_rank(cell: spec.LayerCell, fmt: str, rank: int, kernels, obs: Observed) -> None:
    ckpt = dense_checkpoint(cell.model.name, cell.layer)
    layer = build_dense(cell, fmt, rank)
    assert list(getattr(layer, "output_partition_sizes", [cell.n])) == list(cell.shards)
    assert (layer.output_size_per_partition, layer.input_size_per_partition) == (cell.n, cell.k)
    for shard_id, proj in ckpt.items():
        load_linear(layer, fmt, proj, shard_id)
    weight_name, scale_name, global_name, _ = NAMES[fmt]
    rows, weight, scales, bias = expected_dense(cell, rank, ckpt)
    # (a layer may allocate its padding already: the real rows and columns come first)
    loaded = getattr(layer, weight_name).data[:, : cell.k // 2]
    assert torch.equal(loaded[rows], weight), f"rank {rank}: not its slice of the checkpoint"
    got_scales = getattr(layer, scale_name).data[rows, : cell.k // 16].view(torch.uint8)
    assert torch.equal(got_scales, scales.view(torch.uint8)), f"rank {rank}: block scales"
    stored = [p.stored_global(fmt) for p in ckpt.values()]
    assert getattr(layer, global_name).data.tolist() == stored, "per-shard global scales"
    if bias is not None:
        assert torch.equal(layer.bias.data, bias)
    if rank != processed_rank(cell.tp):
        return

    (gemm,) = cell.gemms
    kernels.clear()
    try:
        layer.quant_method.process_weights_after_loading(layer)
    except ValueError as exc:
        obs.outcome, obs.error = "refused", str(exc)
        raise
    obs.kernel = [("linear", r.size_n, r.size_k) for r in kernels.repacks]
    (repack,) = kernels.repacks
    assert (repack.size_n, repack.size_k) == (gemm.kernel_n, gemm.kernel_k), (
        f"repacked N x K {repack.size_n} x {repack.size_k}, want {gemm.kernel_n} x {gemm.kernel_k}"
    )
    # the repack saw this rank's rows in place and zeros in the padding
    got = repack.rows(rows)
    assert torch.equal(got[:, : cell.k // 2], weight), "repacked rows are not the rank's"
    assert bool(fp4_zero(got[:, cell.k // 2 :]).all()), "K padding is not zero"
    if gemm.kernel_n > cell.n:
        pad_rows = repack.rows(torch.arange(cell.n, gemm.kernel_n))
        assert bool(fp4_zero(pad_rows).all()), "N padding is not zero"

    x = torch.randn(M, cell.k, generator=torch.Generator().manual_seed(rank)).to(DTYPE)
    out = layer.quant_method.apply(layer, x, layer.bias)
    (call,) = kernels.gemms
    obs.gemm_shape = (call["size_n"], call["size_k"])
    a = call["a"]
    obs.input_copied = a.data_ptr() != x.data_ptr()
    obs.output_copied = out.data_ptr() != call["out"].data_ptr()
    obs.outcome = "padded" if gemm.padded else "served"
    assert obs.gemm_shape == (gemm.kernel_n, gemm.kernel_k)
    assert tuple(a.shape) == (M, gemm.kernel_k) and torch.equal(a[:, : cell.k], x)
    assert not a[:, cell.k :].any(), "the activation's K padding is not zero"
    assert tuple(out.shape) == (M, cell.n)
    expected = torch.zeros(M, cell.n, dtype=DTYPE) if bias is None else bias.expand(M, -1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # zero GEMM + bias, in order


def check_experts_rank(
    cell: spec.LayerCell, fmt: str, rank: int, parallel_ranks, kernels, obs: Observed
) -> None:
    m = cell.model
    assert m.moe_intermediate is not None and m.top_k is not None
    parallel_ranks(tp_rank=rank, tp_size=cell.tp)
    top_k = min(m.top_k, CPU_EXPERTS)
    layer = FusedMoE(
        num_experts=CPU_EXPERTS,
        hidden_size=m.hidden,
        intermediate_size=m.moe_intermediate,
        layer_id=0,
        top_k=top_k,
        params_dtype=DTYPE,
        quant_config=quant_config(fmt, True),
        prefix=spec.PREFIX["experts"],
    )
    ckpt = expert_checkpoint(m.name)
    for (e, shard), proj in ckpt.items():
        load_expert(layer, fmt, spec.PREFIX["experts"], e, shard, proj)
    weight_name = NAMES[fmt][0]
    inter, h = cell.n, m.hidden
    w13, w2 = getattr(layer, f"w13_{weight_name}").data, getattr(layer, f"w2_{weight_name}").data
    half = w13.shape[1] // 2  # the loaded half may already be padded
    rows = slice(rank * inter, (rank + 1) * inter)
    cols = slice(rank * inter // 2, (rank + 1) * inter // 2)
    for e in range(CPU_EXPERTS):
        assert torch.equal(w13[e, :inter], ckpt[(e, "w1")].weight[rows]), f"expert {e} w1"
        assert torch.equal(w13[e, half : half + inter], ckpt[(e, "w3")].weight[rows])
        assert torch.equal(w2[e, :, : inter // 2], ckpt[(e, "w2")].weight[:, cols])
    if rank != processed_rank(cell.tp):
        return

    w13_gemm, w2_gemm = cell.gemms
    padded_inter = w2_gemm.kernel_k
    kernels.clear()
    try:
        layer.quant_method.process_weights_after_loading(layer)
    except ValueError as exc:
        obs.outcome, obs.error = "refused", str(exc)
        raise
    obs.kernel = [("w13" if r.size_k == h else "w2", r.size_n, r.size_k) for r in kernels.repacks]
    shapes = {(r.size_n, r.size_k) for r in kernels.repacks}
    want = {(w13_gemm.kernel_n, w13_gemm.kernel_k), (w2_gemm.kernel_n, w2_gemm.kernel_k)}
    assert shapes == want, f"repacked N x K {sorted(shapes)}, want {sorted(want)}"
    first13 = next(r for r in kernels.repacks if (r.size_n, r.size_k) == (2 * padded_inter, h))
    first2 = next(r for r in kernels.repacks if (r.size_n, r.size_k) == (h, padded_inter))
    # expert 0 as the kernel gets it: [gate, 0, up, 0] rows; w2 columns, then zeros
    got13 = first13.rows(torch.arange(2 * padded_inter))
    assert torch.equal(got13[:inter], ckpt[(0, "w1")].weight[rows]), "w13 gate rows"
    assert torch.equal(got13[padded_inter : padded_inter + inter], ckpt[(0, "w3")].weight[rows])
    assert bool(fp4_zero(got13[inter:padded_inter]).all()), "gate padding is not zero"
    assert bool(fp4_zero(got13[padded_inter + inter :]).all()), "up padding is not zero"
    got2 = first2.rows(torch.arange(h))
    assert torch.equal(got2[:, : inter // 2], ckpt[(0, "w2")].weight[:, cols]), "w2 columns"
    assert bool(fp4_zero(got2[:, inter // 2 :]).all()), "w2 K padding is not zero"

    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(M, h, generator=gen).to(DTYPE)
    logits = torch.randn(M, CPU_EXPERTS, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k)
    dispatch = layer.dispatcher.dispatch(
        x, StandardTopKOutput(weights, ids.to(torch.int32), logits)
    )
    out = layer.quant_method.apply(layer, dispatch)
    (call,) = kernels.moe_calls
    w1, w2k = call["w1"], call["w2"]
    obs.gemm_shape = (w2k.shape[1] * 16, w1.shape[1] * 16)  # (intermediate, hidden) as run
    obs.outcome = "padded" if padded_inter != inter else "served"
    assert call["hidden_states"].shape == (M, h)
    assert tuple(w1.shape) == (CPU_EXPERTS, h // 16, 4 * padded_inter)
    assert tuple(w2k.shape) == (CPU_EXPERTS, padded_inter // 16, 2 * h)
    assert getattr(out, "hidden_states", out).shape == (M, h)


# ----------------------------------------------------------------------------- the matrix


def _params() -> list:
    """Model, layer, TP size, format: each layer's checkpoint is made once."""
    params = []
    cells = spec.all_cells()
    for cell in sorted(
        cells, key=lambda c: (spec.MODELS.index(c.model), c.model.layers.index(c.layer), c.tp)
    ):
        for fmt in FORMATS:
            params.append(pytest.param(cell, fmt, id=f"{cell.key}-{fmt}"))
    return params


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize(("cell", "fmt"), _params())
def test_model_layer_at_tp(cuda_device, parallel_ranks, marlin_kernels, cell, fmt):
    """Every rank loads its slice; one rank is served, padded at load, or refused (the spec)."""
    obs = _observe(cell, fmt)
    parallel_ranks(tp_rank=0, tp_size=cell.tp, fp4_gemm_runner_backend="marlin")
    if cell.outcome == "refused":
        with pytest.raises(AssertionError, match=cell.error):
            build_dense(cell, fmt, 0)
        obs.outcome, obs.error = "refused", cell.error or ""
        return
    for rank in range(cell.tp):
        if cell.layer == "experts":
            check_experts_rank(cell, fmt, rank, parallel_ranks, marlin_kernels, obs)
        else:
            check_dense_rank(cell, fmt, rank, marlin_kernels, obs)


# ----------------------------------------------------------------------------- expert parallel

EP = dict(experts=8, hidden=256, inter=128, top_k=2)


def _build_ep_rank(fmt: str, ep: int, rank: int, parallel_ranks) -> tuple[FusedMoE, dict]:
    parallel_ranks(
        tp_rank=rank,
        tp_size=ep,
        ep_size=ep,
        fp4_gemm_runner_backend="marlin",
        moe_runner_backend="marlin",
    )
    layer = FusedMoE(
        num_experts=EP["experts"],
        hidden_size=EP["hidden"],
        intermediate_size=EP["inter"],
        layer_id=0,
        top_k=EP["top_k"],
        params_dtype=DTYPE,
        quant_config=quant_config(fmt, True),
        prefix=spec.PREFIX["experts"],
    )
    ckpt = {}
    for e in range(EP["experts"]):
        for i, shard in enumerate(("w1", "w3", "w2")):
            rows, k = (EP["hidden"], EP["inter"]) if shard == "w2" else (EP["inter"], EP["hidden"])
            ckpt[(e, shard)] = Projection.make(rows, k, 100 + 3 * e + i, MULTIPLIERS[i])
            load_expert(layer, fmt, spec.PREFIX["experts"], e, shard, ckpt[(e, shard)])
    return layer, ckpt


def _ep_forward(layer: FusedMoE, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)  # the same tokens on every rank
    x = torch.randn(5, EP["hidden"], generator=gen).to(DTYPE)
    logits = torch.randn(5, EP["experts"], generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, -1), EP["top_k"])
    ids = ids.to(torch.int32)
    dispatch = layer.dispatcher.dispatch(x, StandardTopKOutput(weights, ids, logits))
    layer.quant_method.apply(layer, dispatch)
    return ids, dispatch.topk_output.topk_ids


def _expected_map(ep: int, rank: int) -> torch.Tensor:
    local = EP["experts"] // ep
    expert_map = torch.full((EP["experts"],), -1, dtype=torch.int32)
    expert_map[rank * local : (rank + 1) * local] = torch.arange(local, dtype=torch.int32)
    return expert_map


EP_CELLS = [pytest.param(fmt, ep, id=f"{fmt}-ep{ep}") for fmt in FORMATS for ep in (2, 4)]


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize(("fmt", "ep"), EP_CELLS)
def test_ep_rank_loads_and_runs_its_local_experts(
    cuda_device, parallel_ranks, marlin_kernels, fmt, ep
):
    """Each EP rank holds its block of experts, and the kernel sees local expert ids only."""
    local = EP["experts"] // ep
    for rank in range(ep):
        marlin_kernels.clear()
        layer, ckpt = _build_ep_rank(fmt, ep, rank, parallel_ranks)
        assert layer.num_local_experts == local
        w13 = getattr(layer, f"w13_{NAMES[fmt][0]}").data
        for j in range(local):
            e = rank * local + j
            assert torch.equal(w13[j, : EP["inter"]], ckpt[(e, "w1")].weight), f"expert {e}"
        layer.quant_method.process_weights_after_loading(layer)
        ids, local_ids = _ep_forward(layer, rank)
        (call,) = marlin_kernels.moe_calls
        assert call["w1"].shape[0] == local
        torch.testing.assert_close(call["topk_ids"], _expected_map(ep, rank)[ids.long()])


@pytest.mark.parametrize("cuda_device", [pytest.param((9, 0), id="sm90")], indirect=True)
@pytest.mark.parametrize(
    ("fmt", "ep"),
    [pytest.param(*p.values, id=p.id) for p in EP_CELLS],
)
def test_ep_expert_map_reaches_fused_marlin_moe(
    cuda_device, parallel_ranks, marlin_kernels, fmt, ep
):
    """With --ep > 1 fused_marlin_moe must get the expert map (else ids of other ranks' experts,
    -1 after the dispatcher's mapping, are run as local experts and their rows are summed)."""
    for rank in range(ep):
        marlin_kernels.clear()
        layer, _ = _build_ep_rank(fmt, ep, rank, parallel_ranks)
        layer.quant_method.process_weights_after_loading(layer)
        _ep_forward(layer, rank)
        (call,) = marlin_kernels.moe_calls
        expert_map = call.get("expert_map")
        assert expert_map is not None, f"{fmt} EP {ep} rank {rank}: expert_map not passed"
        torch.testing.assert_close(expert_map.cpu().to(torch.int32), _expected_map(ep, rank))


# ----------------------------------------------------------------------------- the table


def _kernel_text(obs: Observed) -> str:
    return ", ".join(f"{name} {n}x{k}" for name, n, k in dict.fromkeys(obs.kernel)) or "-"


def write_table(path: Path) -> None:
    """What the layers did per cell, beside what the spec wants (TP_TABLE_OUT)."""
    lines = [
        "| model | tp | layer | format | wanted | observed | kernel N x K (repack) | "
        "per-call copies | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in spec.all_cells():
        for fmt in FORMATS:
            obs = OBSERVED.get((cell.key, fmt))
            if obs is None:
                continue
            want = cell.outcome
            if cell.gemms and cell.outcome == "padded":
                want += (
                    " ("
                    + ", ".join(
                        f"{g.name} {g.kernel_n}x{g.kernel_k}" for g in cell.gemms if g.padded
                    )
                    + ")"
                )
            copies = []
            if obs.input_copied:
                copies.append("input padded")
            if obs.output_copied:
                copies.append("output sliced")
            mark = "" if obs.outcome == cell.outcome else " **(wrong)**"
            error = obs.error.replace("|", "/").replace("\n", " ")[:160]
            lines.append(
                f"| {cell.model.name} | {cell.tp} | {cell.layer} | {fmt} | {want} | "
                f"{obs.outcome}{mark} | {_kernel_text(obs)} | "
                f"{', '.join(copies) or '-'} | {error} |"
            )
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module", autouse=True)
def _write_table_at_end():
    """TP_TABLE_OUT=PATH: the table of what this run observed, once the module is done."""
    yield
    target = os.environ.get("TP_TABLE_OUT")
    if target and OBSERVED:
        write_table(Path(target))
