"""Fused shards with their own NVFP4 global scales, on the GPU, against an fp32 reference.

Dense: a real ``QKVParallelLinear`` (Llama-3.1-8B's 6144x4096 q/k/v) and a real
``MergedColumnParallelLinear`` (gate_up, 2 x 14336 x 4096), tensor parallel size 1, built with
the ModelOpt or the compressed-tensors quant config and loaded shard by shard through their own
``weight_loader``: q = g, k = ratio * g, v = g / 2 (gate = g, up = ratio * g) for ratios 2, 0.5
and 1e-3, as multipliers (ModelOpt ``weight_scale_2``) or divisors (compressed-tensors
``weight_global_scale``). MoE: w3's global scale 2, 0.5, 3 and 1e-3 times w1's, all served: the
kernel applies w1's scale to w13, w3's factor reaches the router weights of the w2 GEMM (fp16
folds the power of two of a ratio below 1 into w3's block scales).

Every case goes to numerics.json's ``fused_shards`` list: served cases with their rel L2, also
per shard (a wrong small shard would hide in the whole layer's error), refused ones with the
error message, and ``templates`` (what ran: ``upstream`` for a line's bare release, recorded
beside the line and not gated). ``fp4series check-reports`` gates them
(fp4series.report.check_fused_shards).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _jitenv  # noqa: E402
import _sglang_api as api  # noqa: E402
from _reference import (  # noqa: E402
    SMALLEST_BLOCK_SCALE,
    dequant_nvfp4,
    moe_reference,
    random_nvfp4_weight,
    rel_l2,
    route,
)
from test_marlin_numerics import (  # noqa: E402
    DEV,
    DTYPES,
    MODELOPT_HF_QUANT_CONFIG,
    MOE_HIDDEN,
    MOE_INTER,
    RECIPE_MULTIPLIER,
    FusedMoE,
    MoeLayer,
    _expect_marlin,
    _fill,
    _finite,
    _gen,
    _loader,
    ct_config,
    moe_forward,
    use_marlin_backends,
)

HIDDEN = 4096
HEAD = 128
LAYERS = {
    # name -> shard ids and sizes (Llama-3.1-8B, TP=1)
    "qkv": {"q": 32 * HEAD, "k": 8 * HEAD, "v": 8 * HEAD},
    "gate_up": {0: 14336, 1: 14336},
}
RATIOS = (2.0, 0.5, 1e-3)
MS = (1, 33, 256, 1024)  # 1024: on SM90 the dequant + cuBLAS path (nvfp4_marlin_prefill)
DENSE_PATHS = ("modelopt-dense", "ct-dense")
MOE_PATHS = ("modelopt-moe", "ct-moe")
MOE_W3_OVER_W1 = {2.0: "served", 0.5: "served", 3.0: "served", 1e-3: "served"}
MOE_E, MOE_TOPK = 8, 2


def _multipliers(layer_name: str, ratio: float) -> list[float]:
    g = RECIPE_MULTIPLIER
    return [g, ratio * g, g / 2][: len(LAYERS[layer_name])]


# What SGLang's model loader adds to a checkpoint's quantization config (get_quant_config, from
# the model class): fused layers' prefixes are matched against exclude_modules through it.
PACKED_MODULES = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}


def _quant_config(path: str) -> Any:
    if path.startswith("modelopt"):
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

        return ModelOptFp4Config.from_config(
            {**MODELOPT_HF_QUANT_CONFIG, "packed_modules_mapping": PACKED_MODULES}
        )
    return ct_config()


def build_fused(path: str, layer_name: str, dtype: torch.dtype, ratio: float, gen):
    """The real fused layer, loaded shard by shard; returns (layer, fp32 weight [N, K])."""
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    use_marlin_backends()
    common = dict(bias=False, params_dtype=dtype, quant_config=_quant_config(path),
                  **api.fused_linear_kwargs())  # fmt: skip
    with torch.device(DEV):
        if layer_name == "qkv":
            layer = QKVParallelLinear(
                HIDDEN, HEAD, 32, 8, prefix="model.layers.0.self_attn.qkv_proj", **common
            )
        else:
            layer = MergedColumnParallelLinear(
                HIDDEN, list(LAYERS["gate_up"].values()), prefix="model.layers.0.mlp.gate_up_proj",
                **common,
            )  # fmt: skip
    modelopt = path.startswith("modelopt")
    parts = []
    mults = _multipliers(layer_name, ratio)
    for (shard, size), mult in zip(LAYERS[layer_name].items(), mults, strict=True):
        w = random_nvfp4_weight(size, HIDDEN, gen, smallest=SMALLEST_BLOCK_SCALE[dtype])
        loads = {
            "weight" if modelopt else "weight_packed": w.packed,
            "weight_scale": w.scales,
            # ModelOpt: multiplier; compressed-tensors: divisor
            "weight_scale_2" if modelopt else "weight_global_scale": torch.tensor(
                mult if modelopt else 1.0 / mult
            ),
            "input_scale" if modelopt else "input_global_scale": torch.tensor(1.0),
        }
        for name, tensor in loads.items():
            param = getattr(layer, name)
            param.weight_loader(param, tensor.to(DEV), shard)
        parts.append(dequant_nvfp4(w.packed, w.scales, mult))
    layer.quant_method.process_weights_after_loading(layer)
    _expect_marlin(layer, f"{path} {layer_name}")
    return layer, torch.cat(parts)


def run_fused_dense(path: str, layer_name: str, dtype: torch.dtype, ratio: float) -> list[dict]:
    gen = _gen("fused", path, layer_name, dtype, ratio)
    sizes = list(LAYERS[layer_name].values())
    base = {
        "path": path,
        "layer": layer_name,
        "dtype": str(dtype).removeprefix("torch."),
        "ratio": ratio,
        "shards": sizes,
        "global_multipliers": _multipliers(layer_name, ratio),
        "n": sum(sizes),
        "k": HIDDEN,
        "templates": _jitenv.templates_label(),
    }
    try:
        layer, w_f32 = build_fused(path, layer_name, dtype, ratio, gen)
    except ValueError as exc:  # refused at load: recorded, check-reports judges it
        return [{**base, "outcome": "refused", "error": str(exc)[:500]}]
    bias = None
    if layer_name == "qkv":  # the column scale is fused with the bias add
        bias = (torch.randn(base["n"], generator=gen, device=DEV) * 0.5).to(dtype)
    cases = []
    for m in MS:
        case = {**base, "outcome": "served", "m": m, "bias": bias is not None}
        x = torch.randn(m, HIDDEN, generator=gen, device=DEV).to(dtype)
        ref = x.float() @ w_f32.t()
        if bias is not None:
            ref = ref + bias.float()
        try:
            out = layer.quant_method.apply(layer, x, bias)
            torch.cuda.synchronize()
            case["rel_l2"] = _finite(rel_l2(out, ref))
            bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
            case["rel_l2_per_shard"] = [
                _finite(rel_l2(out[:, lo:hi], ref[:, lo:hi]))
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        except Exception as exc:  # recorded; the test and check-reports fail on it
            case["rel_l2"] = None
            case["error"] = f"{type(exc).__name__}: {exc}"[:500]
        cases.append(case)
    del layer
    torch.cuda.empty_cache()
    return cases


def build_moe_halves(path: str, dtype: torch.dtype, w3_over_w1: float, gen) -> MoeLayer:
    """MoE whose w3 global scale is ``w3_over_w1`` times w1's, per expert."""
    e = MOE_E
    use_marlin_backends()
    layer = FusedMoE(e, MOE_TOPK, MOE_HIDDEN, MOE_INTER, dtype)
    config = _quant_config(path)
    if path.startswith("modelopt"):
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod

        method = ModelOptNvFp4FusedMoEMethod(config)
    else:
        from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
            CompressedTensorsFusedMoEMethod,
        )

        layer.scheme = config.get_moe_scheme(layer, layer_name="model.layers.0.mlp.experts")
        method = CompressedTensorsFusedMoEMethod(config)
    with torch.device(DEV):
        method.create_weights(layer, e, MOE_HIDDEN, MOE_INTER, dtype, weight_loader=_loader)
    floor = SMALLEST_BLOCK_SCALE[dtype]
    w13 = random_nvfp4_weight(2 * MOE_INTER, MOE_HIDDEN, gen, lead=(e,), smallest=floor)
    w2 = random_nvfp4_weight(MOE_HIDDEN, MOE_INTER, gen, lead=(e,), smallest=floor)
    g1 = RECIPE_MULTIPLIER * (1.0 + 0.5 * torch.rand(e, generator=gen, device=DEV))
    halves = torch.stack([g1, g1 * w3_over_w1], dim=1)  # multipliers [E, 2]
    g2 = 0.6 * RECIPE_MULTIPLIER * (1.0 + 0.5 * torch.rand(e, generator=gen, device=DEV))
    if path.startswith("modelopt"):
        _fill(layer.w13_weight, w13.packed)
        _fill(layer.w2_weight, w2.packed)
        _fill(layer.w13_weight_scale_2, halves)
        _fill(layer.w2_weight_scale_2, g2)
        _fill(layer.w13_input_scale, 0.0123)
        _fill(layer.w2_input_scale, 0.0456)
    else:
        _fill(layer.w13_weight_packed, w13.packed)
        _fill(layer.w2_weight_packed, w2.packed)
        _fill(layer.w13_weight_global_scale, 1.0 / halves)
        _fill(layer.w2_weight_global_scale, 1.0 / g2)
        _fill(layer.w13_input_global_scale, 81.3)
        _fill(layer.w2_input_global_scale, 22.2)
    _fill(layer.w13_weight_scale, w13.scales)
    _fill(layer.w2_weight_scale, w2.scales)
    method.process_weights_after_loading(layer)
    _expect_marlin(layer, f"{path} w1 != w3")
    method.create_moe_runner(layer, layer.moe_runner_config)
    per_row = halves.repeat_interleave(MOE_INTER, dim=1)  # [E, 2I]
    w13_f32 = dequant_nvfp4(w13.packed, w13.scales, 1.0) * per_row.unsqueeze(-1)
    return MoeLayer(path, layer, method, w13_f32, dequant_nvfp4(w2.packed, w2.scales, g2))


def run_moe_halves(path: str, dtype: torch.dtype, w3_over_w1: float) -> list[dict]:
    gen = _gen("fused-moe", path, dtype, w3_over_w1)
    base = {
        "path": path,
        "layer": "moe_w13",
        "dtype": str(dtype).removeprefix("torch."),
        "ratio": w3_over_w1,
        "e": MOE_E,
        "topk": MOE_TOPK,
        "n": MOE_INTER,
        "k": MOE_HIDDEN,
        "templates": _jitenv.templates_label(),
    }
    try:
        moe = build_moe_halves(path, dtype, w3_over_w1, gen)
    except ValueError as exc:
        return [{**base, "outcome": "refused", "error": str(exc)[:500]}]
    cases = []
    for m in MS:
        case = {**base, "outcome": "served", "m": m, "bias": False}
        x = torch.randn(m, MOE_HIDDEN, generator=gen, device=DEV).to(dtype)
        logits = torch.randn(m, MOE_E, generator=gen, device=DEV)
        weights, ids = route(logits, MOE_TOPK)
        ref = moe_reference(x, moe.w13_f32, moe.w2_f32, weights, ids)
        try:
            out = moe_forward(moe, x, logits, MOE_TOPK)
            torch.cuda.synchronize()
            case["rel_l2"] = _finite(rel_l2(out, ref))
        except Exception as exc:
            case["rel_l2"] = None
            case["error"] = f"{type(exc).__name__}: {exc}"[:500]
        cases.append(case)
    return cases


def _problems(cases: list[dict]) -> list[str]:
    from fp4series.report import check_fused_shard_case

    problems: list[str] = []
    for case in cases:
        check_fused_shard_case("fused_shards", case, problems)
    return problems


DENSE_PARAMS = [
    pytest.param(p, name, dt, r, id=f"{p}-{name}-{dt}-ratio{r:g}")
    for p in DENSE_PATHS
    for name in LAYERS
    for dt in DTYPES
    for r in RATIOS
]
MOE_PARAMS = [
    pytest.param(p, dt, r, id=f"{p}-{dt}-w3_over_w1_{r:g}")
    for p in MOE_PATHS
    for dt in DTYPES
    for r in MOE_W3_OVER_W1
]


@pytest.mark.gpu
@pytest.mark.parametrize(("path", "layer_name", "dtype", "ratio"), DENSE_PARAMS)
def test_fused_dense(path: str, layer_name: str, dtype: str, ratio: float, gpu_report: Any):
    cases = run_fused_dense(path, layer_name, DTYPES[dtype], ratio)
    gpu_report.extra.setdefault("fused_shards", []).extend(cases)
    assert all(c["outcome"] == "served" for c in cases), cases[0].get("error")
    problems = _problems(cases)
    assert not problems, "; ".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize(("path", "dtype", "w3_over_w1"), MOE_PARAMS)
def test_fused_moe_halves(path: str, dtype: str, w3_over_w1: float, gpu_report: Any):
    cases = run_moe_halves(path, DTYPES[dtype], w3_over_w1)
    gpu_report.extra.setdefault("fused_shards", []).extend(cases)
    expected = MOE_W3_OVER_W1[w3_over_w1]
    assert all(c["outcome"] == expected for c in cases), cases[0].get("error")
    problems = _problems(cases)
    assert not problems, "; ".join(problems)
