"""NVFP4 through SGLang's real layer code on the Marlin (W4A16) path, against an fp32 reference.

Dense: ModelOpt NVFP4 (``ModelOptFp4LinearMethod`` from ``ModelOptFp4Config.from_config``) and
compressed-tensors W4A4 NVFP4 (the scheme ``_get_scheme_from_parts`` picks with the Marlin
backend), built by their own ``create_weights``, loaded with synthetic checkpoint tensors, then
``process_weights_after_loading`` and ``apply``. MoE: ModelOpt NVFP4 and compressed-tensors
W4A4 NVFP4 MoE methods with the Marlin runner.

The same harness runs on the pin's SGLang and on a series line's (e.g. 0.5.23): what differs
between their SGLang is behind _sglang_api.py. Dense cases with a bias as large as the layer's
output (``bias_scale``) show a bias added in the wrong order, which a small bias would hide.

This module is also the worker that test_kernel_repro.py runs in a subprocess with another JIT
variant (the pin's templates, compute_75 PTX, or a line's bare release): ``python
tests/gpu/test_marlin_numerics.py --worker {repro,turing,upstream} --out FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _jitenv  # noqa: E402
import _sglang_api as api  # noqa: E402
from _reference import (  # noqa: E402
    SMALLEST_BLOCK_SCALE,
    Nvfp4Weight,
    dense_reference,
    dequant_experts,
    dequant_nvfp4,
    moe_reference,
    random_nvfp4_weight,
    rel_l2,
    route,
)

# Global scales as the NVFP4 recipe sets them: global = 448 * 6 / amax, amax of a real
# projection's weights ~0.5 (larger ones overflow fp16 in the MoE's second GEMM).
WEIGHT_AMAX = 0.5
RECIPE_MULTIPLIER = WEIGHT_AMAX / (448.0 * 6.0)

# name -> (N, K, output partitions). Llama-3.1-8B projections (TP=1) + one padded shape.
DENSE_SHAPES: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "qkv_8b": (6144, 4096, (4096, 1024, 1024)),
    "o_8b": (4096, 4096, (4096,)),
    "gate_up_8b": (28672, 4096, (14336, 14336)),
    "down_8b": (4096, 14336, (4096,)),
    # N % 64 != 0 and K % 128 != 0 (K % 16 == 0 as NVFP4 requires): Marlin needs padding.
    "pad_1000x2080": (1000, 2080, (1000,)),
}
# From 512 on SM90 the series runs these through nvfp4_marlin_prefill (dequant + cuBLAS)
DENSE_MS = (1, 7, 16, 33, 128, 511, 512, 1024)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# MoE layer: hidden 2048, intermediate 1408 (Qwen1.5-MoE-A2.7B-like), E x top-k below.
MOE_HIDDEN = 2048
MOE_INTER = 1408
MOE_CONFIGS = ((8, 2), (8, 8), (64, 2), (64, 8))
MOE_MS = (1, 33, 256)
DENSE_PATHS = ("modelopt-dense", "ct-dense")
MOE_PATHS = ("modelopt-moe", "ct-moe")
# A bias of the layer output's own size (rms of x @ W^T for x ~ N(0, 1)): added in the wrong
# order it gives rel L2 ~1; the 0.5 * randn bias of the other cases is ~0.1 of the output.
STRONG_BIAS = 1.0
STRONG_BIAS_SHAPE = "o_8b"
STRONG_BIAS_MS = (1, 33, 128, 1024)
DEV = _jitenv.device()  # "cuda"; "cpu" in a dry run (_dryrun.py)

MODELOPT_HF_QUANT_CONFIG: dict[str, Any] = {
    "producer": {"name": "modelopt", "version": "0.29.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": None,
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    },
}
_NVFP4_ARGS: dict[str, Any] = {
    "num_bits": 4,
    "type": "float",
    "strategy": "tensor_group",
    "group_size": 16,
    "symmetric": True,
    "observer": "minmax",
}
CT_QUANT_CONFIG: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {**_NVFP4_ARGS, "dynamic": False},
            "input_activations": {**_NVFP4_ARGS, "dynamic": "local"},
        }
    },
}


# ----------------------------------------------------------------------------- set-up


def _seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


def _gen(*parts: object) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(_seed(*parts))


def _loader(param: torch.Tensor, loaded: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    param.data.copy_(loaded)


use_marlin_backends = api.use_marlin_backends


def _fill(param: torch.Tensor, value: torch.Tensor | float) -> None:
    if isinstance(value, torch.Tensor):
        param.data.copy_(value.to(param.device).reshape(param.shape).to(param.dtype))
    else:
        param.data.fill_(value)


def _expect_marlin(layer: torch.nn.Module, what: str) -> None:
    """The Marlin preparation ran: it sets ``layer.workspace`` (upstream's helper API)."""
    if getattr(layer, "workspace", None) is None:
        names = {n for n, _ in layer.named_parameters()} | set(vars(layer))
        raise AssertionError(
            f"{what}: process_weights_after_loading did not prepare Marlin tensors "
            f"(attributes: {sorted(names)}); the Marlin backend was not selected"
        )


@dataclass
class DenseLayer:
    path: str
    layer: torch.nn.Module
    apply: Callable[[torch.Tensor], torch.Tensor]  # x -> the layer's output, its bias added
    weight: Nvfp4Weight
    multiplier: float  # fp32 global multiplier of the reference
    n: int
    k: int
    bias: torch.Tensor | None  # the checkpoint's bias, for the reference


# (weight, multiplier) -> the checkpoint's bias, or None: called before the preparation
MakeBias = Callable[[Nvfp4Weight, float], "torch.Tensor | None"]


def _hold_bias(layer: torch.nn.Module, make_bias: MakeBias | None, weight, multiplier):
    """The bias as a model's linear layer holds it: ``layer.bias``, set before the Marlin
    preparation (which may pad or re-order it), and handed to ``apply`` from the layer, as
    ``LinearBase.forward`` does. A bias passed around the preparation would hide its
    handling. Returns the checkpoint's bias."""
    bias = make_bias(weight, multiplier) if make_bias is not None else None
    if bias is not None:
        layer.register_parameter("bias", torch.nn.Parameter(bias.clone(), requires_grad=False))
    return bias


def _apply_with_layer_bias(method: Any, layer: torch.nn.Module):
    return lambda x: method.apply(layer, x, getattr(layer, "bias", None))


def build_modelopt_dense(
    n: int,
    k: int,
    parts: Sequence[int],
    dtype: torch.dtype,
    gen: torch.Generator,
    make_bias: MakeBias | None = None,
) -> DenseLayer:
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptFp4LinearMethod,
    )

    config = ModelOptFp4Config.from_config(MODELOPT_HF_QUANT_CONFIG)
    method = ModelOptFp4LinearMethod(config)
    layer = torch.nn.Module()
    with torch.device(DEV):
        method.create_weights(
            layer, k, list(parts), k, n, dtype, weight_loader=_loader
        )  # fmt: skip
    weight = random_nvfp4_weight(n, k, gen, smallest=SMALLEST_BLOCK_SCALE[dtype])
    # weight_scale_2 is a multiplier; same for every shard of a fused projection.
    ws2 = RECIPE_MULTIPLIER * (1.0 + 0.3 * torch.rand((), generator=gen, device=DEV).item())
    _fill(layer.weight, weight.packed)
    _fill(layer.weight_scale, weight.scales)
    _fill(layer.weight_scale_2, ws2)
    _fill(layer.input_scale, 0.0123)
    bias = _hold_bias(layer, make_bias, weight, ws2)
    method.process_weights_after_loading(layer)
    _expect_marlin(layer, "modelopt-dense")
    apply = _apply_with_layer_bias(method, layer)
    return DenseLayer("modelopt-dense", layer, apply, weight, ws2, n, k, bias)


def ct_config() -> Any:
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    return CompressedTensorsConfig.from_config(json.loads(json.dumps(CT_QUANT_CONFIG)))


def ct_linear_scheme(config: Any) -> Any:
    """The scheme ``_get_scheme_from_parts`` picks for the NVFP4 Linear target."""
    parts = config.target_scheme_map["Linear"]
    fn = config._get_scheme_from_parts
    kwargs = {}
    if "layer_name" in inspect.signature(fn).parameters:
        kwargs["layer_name"] = "model.layers.0.self_attn.o_proj"
    return fn(parts["weights"], parts["input_activations"], **kwargs)


def build_ct_dense(
    n: int,
    k: int,
    parts: Sequence[int],
    dtype: torch.dtype,
    gen: torch.Generator,
    make_bias: MakeBias | None = None,
) -> DenseLayer:
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsLinearMethod,
    )

    config = ct_config()
    layer = torch.nn.Module()
    layer.scheme = ct_linear_scheme(config)
    method = CompressedTensorsLinearMethod(config)
    with torch.device(DEV):
        method.create_weights(layer, k, list(parts), k, n, dtype, weight_loader=_loader)
    weight = random_nvfp4_weight(n, k, gen, smallest=SMALLEST_BLOCK_SCALE[dtype])
    # compressed-tensors stores the global scale as a divisor: w = fp4 * block / gs.
    gs = (1 + 0.3 * torch.rand((), generator=gen, device=DEV).item()) / RECIPE_MULTIPLIER
    _fill(layer.weight_packed, weight.packed)
    _fill(layer.weight_scale, weight.scales)
    _fill(layer.weight_global_scale, gs)
    _fill(layer.input_global_scale, 81.3)
    bias = _hold_bias(layer, make_bias, weight, 1 / gs)
    method.process_weights_after_loading(layer)
    _expect_marlin(layer, f"ct-dense ({type(layer.scheme).__name__})")
    apply = _apply_with_layer_bias(method, layer)
    return DenseLayer("ct-dense", layer, apply, weight, 1 / gs, n, k, bias)


DENSE_BUILDERS = {"modelopt-dense": build_modelopt_dense, "ct-dense": build_ct_dense}


def _case(path: str, dtype: torch.dtype, m: int, n: int, k: int, bias: bool) -> dict[str, Any]:
    case: dict[str, Any] = {
        "path": path,
        "dtype": str(dtype).removeprefix("torch."),
        "m": m,
        "n": n,
        "k": k,
        "bias": bias,
        "templates": _jitenv.templates_label(),
    }
    if _jitenv.forced_arch():
        case["arch"] = _jitenv.forced_arch()
    return case


def dense_gemm(m: int, dtype: torch.dtype) -> str:
    """The GEMM the tree's dense NVFP4 linear picks for M rows of DTYPE on this GPU (its own
    choice, asked before the call): "dequant+cublas" where nvfp4_marlin_prefill takes it (the
    pin's patch 13), else "marlin"."""
    try:
        from sglang.srt.layers.quantization.nvfp4_marlin_prefill import use_dequant_gemm
    except ImportError:  # a tree without it (a line, a bare release)
        return "marlin"
    return "dequant+cublas" if use_dequant_gemm(m, torch.device(DEV), dtype) else "marlin"


def _finite(value: float) -> float | None:
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _output_rms(weight: Nvfp4Weight, multiplier: float) -> float:
    """rms of ``x @ W^T`` over x ~ N(0, 1): ||W||_F / sqrt(N)."""
    w = dequant_nvfp4(weight.packed, weight.scales, multiplier)
    return torch.linalg.vector_norm(w).item() / w.shape[0] ** 0.5


def run_dense(
    path: str,
    dtype: torch.dtype,
    shape: str,
    bias: bool,
    ms: Sequence[int],
    bias_scale: float | None = None,
) -> list[dict[str, Any]]:
    """Build one layer, run every M; one case dict per M (errors recorded, not raised).
    ``bias_scale``: the bias's rms in units of the output's (default: 0.5 * randn)."""
    n, k, parts = DENSE_SHAPES[shape]
    gen = _gen(path, dtype, shape, bias if bias_scale is None else bias_scale)
    use_marlin_backends()

    def make_bias(weight: Nvfp4Weight, multiplier: float) -> torch.Tensor | None:
        if not bias:
            return None
        rms = 0.5 if bias_scale is None else bias_scale * _output_rms(weight, multiplier)
        return (torch.randn(n, generator=gen, device=DEV) * rms).to(dtype)

    dense = DENSE_BUILDERS[path](n, k, parts, dtype, gen, make_bias)
    b = dense.bias
    small = dense.weight.small_rows
    cases = []
    for m in ms:
        case = _case(path, dtype, m, n, k, bias)
        case["shape"] = shape
        case["gemm"] = dense_gemm(m, dtype)
        if bias_scale is not None:
            case["bias_scale"] = bias_scale
        x = torch.randn(m, k, generator=gen, device=DEV).to(dtype)
        ref = dense_reference(x, dense.weight, dense.multiplier, b)
        try:
            out = dense.apply(x)
            torch.cuda.synchronize()
            if tuple(out.shape) != (m, n):
                raise AssertionError(f"output shape {tuple(out.shape)} != {(m, n)}")
            case["rel_l2"] = _finite(rel_l2(out, ref))
            case["nonfinite_outputs"] = int((~torch.isfinite(out)).sum().item())
            if small.any():
                case["rel_l2_small_scales"] = _finite(rel_l2(out[:, small], ref[:, small]))
        except Exception as exc:  # record the failure; the test asserts afterwards
            case["rel_l2"] = None
            case["error"] = f"{type(exc).__name__}: {exc}"[:500]
        cases.append(case)
    del dense
    torch.cuda.empty_cache()
    return cases


# ----------------------------------------------------------------------------- MoE


class FusedMoE(torch.nn.Module):
    """Stand-in for SGLang's FusedMoE: the attributes its quant methods read.

    The real FusedMoE needs an initialized tensor-parallel group; the quant method
    (create_weights / process_weights_after_loading / create_moe_runner / apply) is the real
    code. The class name matters: compressed-tensors matches the "Linear" target to
    "FusedMoE" modules by class name. What 0.5.23's methods read besides (the expert-parallel
    view of its dispatcher, the MegaMoE flag) is set as FusedMoE sets it at EP size 1.
    """

    def __init__(self, e: int, topk: int, hidden: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

        self.num_experts = e
        self.num_local_experts = e
        self.top_k = topk
        self.hidden_size = hidden
        self.intermediate_size_per_partition = inter
        self.moe_ep_size, self.moe_ep_rank, self.moe_tp_size, self.moe_tp_rank = 1, 0, 1, 0
        self.layer_id = 0
        self.params_dtype = dtype
        self._mega_moe_nvfp4 = False
        self.dispatcher = SimpleNamespace(moe_ep_size=1, moe_ep_rank=0, num_experts=e,
                                          num_local_experts=e, local_expert_mapping=None,
                                          expert_mask_gpu=None)  # fmt: skip
        # as FusedMoE.__init__ derives it from the runner backend (Marlin here: False)
        from sglang.srt.layers.moe.utils import get_moe_runner_backend

        backend = get_moe_runner_backend()
        self.use_flashinfer_trtllm_moe = (
            backend.is_flashinfer_trtllm() or backend.is_flashinfer_trtllm_routed()
        )
        self.moe_runner_config = MoeRunnerConfig(
            num_experts=e,
            num_local_experts=e,
            hidden_size=hidden,
            intermediate_size_per_partition=inter,
            layer_id=0,
            top_k=topk,
            num_fused_shared_experts=0,
            params_dtype=dtype,
            activation="silu",
            is_gated=True,
            inplace=False,
        )


@dataclass
class MoeLayer:
    path: str
    layer: FusedMoE
    method: Any
    w13_f32: torch.Tensor
    w2_f32: torch.Tensor


@contextlib.contextmanager
def marlin_moe_without_atomic_add() -> Iterator[None]:
    """The MoE GEMMs reduce split-K slices in fp32 instead of by atomicAdd.

    fused_marlin_moe (upstream, untouched by the series) reduces with atomicAdd into the output
    dtype on SM90 (and always in fp16); in bf16 that costs accuracy at small M, where more K
    slices are added. Measuring both tells that cost apart from the series' own error.
    """
    from sglang.srt.layers.moe.fused_moe_triton import fused_marlin_moe as fmm

    gemm = fmm.moe_wna16_marlin_gemm

    def without_atomic_add(*args: Any, **kwargs: Any) -> torch.Tensor:
        return gemm(*args, **{**kwargs, "use_atomic_add": False})

    fmm.moe_wna16_marlin_gemm = without_atomic_add
    try:
        yield
    finally:
        fmm.moe_wna16_marlin_gemm = gemm


def _moe_weights(
    e: int, hidden: int, inter: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[Nvfp4Weight, Nvfp4Weight]:
    floor = SMALLEST_BLOCK_SCALE[dtype]
    w13 = random_nvfp4_weight(2 * inter, hidden, gen, lead=(e,), smallest=floor)
    w2 = random_nvfp4_weight(hidden, inter, gen, lead=(e,), smallest=floor)
    return w13, w2


def _per_expert(gen: torch.Generator, e: int, base: float) -> torch.Tensor:
    return base * (1.0 + 0.5 * torch.rand(e, generator=gen, device=DEV))


def build_modelopt_moe(e: int, topk: int, dtype: torch.dtype, gen: torch.Generator) -> MoeLayer:
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptNvFp4FusedMoEMethod,
    )

    config = ModelOptFp4Config.from_config(MODELOPT_HF_QUANT_CONFIG)
    method = ModelOptNvFp4FusedMoEMethod(config)
    layer = FusedMoE(e, topk, MOE_HIDDEN, MOE_INTER, dtype)
    with torch.device(DEV):
        method.create_weights(layer, e, MOE_HIDDEN, MOE_INTER, dtype, weight_loader=_loader)
    w13, w2 = _moe_weights(e, MOE_HIDDEN, MOE_INTER, dtype, gen)
    g13 = _per_expert(gen, e, RECIPE_MULTIPLIER)  # multipliers, w1 and w3 share one per expert
    g2 = _per_expert(gen, e, 0.6 * RECIPE_MULTIPLIER)
    _fill(layer.w13_weight, w13.packed)
    _fill(layer.w13_weight_scale, w13.scales)
    _fill(layer.w2_weight, w2.packed)
    _fill(layer.w2_weight_scale, w2.scales)
    _fill(layer.w13_weight_scale_2, g13.unsqueeze(-1).expand(e, 2).contiguous())
    _fill(layer.w2_weight_scale_2, g2)
    _fill(layer.w13_input_scale, 0.0123)
    _fill(layer.w2_input_scale, 0.0456)
    method.process_weights_after_loading(layer)
    _expect_marlin(layer, "modelopt-moe")
    method.create_moe_runner(layer, layer.moe_runner_config)
    return MoeLayer(
        "modelopt-moe", layer, method, dequant_experts(w13, g13), dequant_experts(w2, g2)
    )


def build_ct_moe(e: int, topk: int, dtype: torch.dtype, gen: torch.Generator) -> MoeLayer:
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsFusedMoEMethod,
    )

    config = ct_config()
    layer = FusedMoE(e, topk, MOE_HIDDEN, MOE_INTER, dtype)
    layer.scheme = config.get_moe_scheme(layer, layer_name="model.layers.0.mlp.experts")
    method = CompressedTensorsFusedMoEMethod(config)
    with torch.device(DEV):
        method.create_weights(layer, e, MOE_HIDDEN, MOE_INTER, dtype, weight_loader=_loader)
    w13, w2 = _moe_weights(e, MOE_HIDDEN, MOE_INTER, dtype, gen)
    gs13 = _per_expert(gen, e, 1 / RECIPE_MULTIPLIER)  # divisors
    gs2 = _per_expert(gen, e, 1.4 / RECIPE_MULTIPLIER)
    _fill(layer.w13_weight_packed, w13.packed)
    _fill(layer.w13_weight_scale, w13.scales)
    _fill(layer.w2_weight_packed, w2.packed)
    _fill(layer.w2_weight_scale, w2.scales)
    _fill(layer.w13_weight_global_scale, gs13.unsqueeze(-1).expand(e, 2).contiguous())
    _fill(layer.w2_weight_global_scale, gs2)
    _fill(layer.w13_input_global_scale, 81.3)
    _fill(layer.w2_input_global_scale, 22.2)
    method.process_weights_after_loading(layer)
    _expect_marlin(layer, f"ct-moe ({type(layer.scheme).__name__})")
    method.create_moe_runner(layer, layer.moe_runner_config)
    return MoeLayer(
        "ct-moe", layer, method, dequant_experts(w13, 1 / gs13), dequant_experts(w2, 1 / gs2)
    )


MOE_BUILDERS = {"modelopt-moe": build_modelopt_moe, "ct-moe": build_ct_moe}


def moe_forward(moe: MoeLayer, x: torch.Tensor, logits: torch.Tensor, topk: int) -> torch.Tensor:
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    weights, ids = route(logits, topk)
    dispatch = StandardDispatchOutput(
        hidden_states=x,
        hidden_states_scale=None,
        topk_output=StandardTopKOutput(weights, ids, logits),
    )
    combined = moe.method.apply(moe.layer, dispatch)
    return getattr(combined, "hidden_states", combined)


def run_moe(path: str, dtype: torch.dtype, e: int, topk: int, ms: Sequence[int]) -> list[dict]:
    gen = _gen(path, dtype, e, topk)
    use_marlin_backends()
    moe = MOE_BUILDERS[path](e, topk, dtype, gen)
    cases = []
    for m in ms:
        case = _case(path, dtype, m, MOE_INTER, MOE_HIDDEN, False)
        case.update(e=e, topk=topk, shape=f"moe_h{MOE_HIDDEN}_i{MOE_INTER}")
        x = torch.randn(m, MOE_HIDDEN, generator=gen, device=DEV).to(dtype)
        logits = torch.randn(m, e, generator=gen, device=DEV)
        weights, ids = route(logits, topk)
        ref = moe_reference(x, moe.w13_f32, moe.w2_f32, weights, ids)
        try:
            out = moe_forward(moe, x, logits, topk)
            torch.cuda.synchronize()
            if tuple(out.shape) != (m, MOE_HIDDEN):
                raise AssertionError(f"output shape {tuple(out.shape)} != {(m, MOE_HIDDEN)}")
            case["rel_l2"] = _finite(rel_l2(out, ref))
            case["nonfinite_outputs"] = int((~torch.isfinite(out)).sum().item())
            # the same layer with fp32 split-K reduce instead of atomicAdd (gated as well)
            with marlin_moe_without_atomic_add():
                out_fp32_reduce = moe_forward(moe, x, logits, topk)
            torch.cuda.synchronize()
            case["rel_l2_no_atomic_add"] = _finite(rel_l2(out_fp32_reduce, ref))
            # informational: against a reference that rounds what the layer stores (the first
            # GEMM's output, the activation) to its dtype; not closer, the roundings differ
            ref_stored = moe_reference(x, moe.w13_f32, moe.w2_f32, weights, ids, dtype)
            case["rel_l2_vs_stored_intermediates"] = _finite(rel_l2(out, ref_stored))
        except Exception as exc:
            case.setdefault("rel_l2", None)
            case["error"] = f"{type(exc).__name__}: {exc}"[:500]
        cases.append(case)
    del moe
    torch.cuda.empty_cache()
    return cases


def _fails(cases: list[dict[str, Any]]) -> list[str]:
    """Cases over the gates check-reports applies (fp4series.report: 1e-2; bf16 MoE as
    shipped, with upstream's atomicAdd split-K reduce, 1.5e-2)."""
    from fp4series.report import GATED_FIELDS, max_rel_l2

    bad = []
    for c in cases:
        for field in GATED_FIELDS:
            if field in c and (c[field] is None or c[field] > max_rel_l2(c, field)):
                bad.append(f"m={c['m']} {field}={c[field]} {c.get('error', '')}")
    return bad


# ----------------------------------------------------------------------------- tests

DENSE_PARAMS = [
    pytest.param(path, dt, shape, bias, id=f"{path}-{dt}-{shape}-{'bias' if bias else 'nobias'}")
    for path in DENSE_PATHS
    for dt in DTYPES
    for shape in DENSE_SHAPES
    for bias in (False, True)
]
MOE_PARAMS = [
    pytest.param(path, dt, e, topk, id=f"{path}-{dt}-e{e}-top{topk}")
    for path in MOE_PATHS
    for dt in DTYPES
    for e, topk in MOE_CONFIGS
]


@pytest.mark.gpu
@pytest.mark.parametrize(("path", "dtype", "shape", "bias"), DENSE_PARAMS)
def test_dense(path: str, dtype: str, shape: str, bias: bool, gpu_report: Any) -> None:
    cases = run_dense(path, DTYPES[dtype], shape, bias, DENSE_MS)
    gpu_report.add_cases(cases)
    bad = _fails(cases)
    assert not bad, f"{path} {dtype} {shape} bias={bias}: " + "; ".join(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("path", DENSE_PATHS)
def test_dense_strong_bias(path: str, dtype: str, gpu_report: Any) -> None:
    """A bias as large as the output: one added in the wrong order shows at rel L2 ~1."""
    cases = run_dense(path, DTYPES[dtype], STRONG_BIAS_SHAPE, True, STRONG_BIAS_MS, STRONG_BIAS)
    gpu_report.add_cases(cases)
    bad = _fails(cases)
    assert not bad, f"{path} {dtype} {STRONG_BIAS_SHAPE} bias x{STRONG_BIAS}: " + "; ".join(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_prefill_dequant_is_the_checkpoint_rounded_once(dtype: str, gpu_report: Any) -> None:
    """nvfp4_marlin_prefill's kernel on a layer the real preparation made (padded: N 1000,
    K 2080): fp4 * block scale * global scale rounded once to the dtype, bit for bit, against
    the checkpoint's codes and scales (block scales >= 2^-6: no power of two folded in)."""
    prefill = pytest.importorskip("sglang.srt.layers.quantization.nvfp4_marlin_prefill")
    from sglang.srt.layers.quantization.marlin_utils_fp4 import prepare_nvfp4_layer_for_marlin

    act = DTYPES[dtype]
    n, k = 1000, 2080
    gen = torch.Generator(device=DEV).manual_seed(2080)
    w = random_nvfp4_weight(n, k, gen, smallest=2.0**-6)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w.packed.clone(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(w.scales.clone(), requires_grad=False)
    layer.weight_global_scale = torch.nn.Parameter(
        torch.tensor(RECIPE_MULTIPLIER, device=DEV), requires_grad=False
    )
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.params_dtype = act
    prepare_nvfp4_layer_for_marlin(layer)
    bias = {torch.float16: 14, torch.bfloat16: 126}[act]
    g_eff = layer.weight_global_scale.data.reshape(-1)[0].float().item() * 2.0 ** -(bias - 7)
    out = torch.full((n, k), float("nan"), dtype=act, device=DEV)
    prefill.dequant_nvfp4_marlin(
        layer.weight, layer.weight_scale, layer.weight_global_scale, 0, n, k, out
    )
    ref = dequant_nvfp4(w.packed, w.scales, g_eff)
    equal = bool(torch.equal(out, ref.to(act)))
    record = {"dtype": dtype, "n": n, "k": k, "bit_equal": equal,
              "max_abs_diff_vs_fp32": float((out.float() - ref).abs().max().item())}  # fmt: skip
    gpu_report.extra.setdefault("prefill_dequant", []).append(record)
    assert equal, record


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_marlin_epilogue_is_the_float32_ops(dtype: str, gpu_report: Any) -> None:
    """nvfp4_marlin_epilogue's one kernel against the PyTorch ops it replaced (float32 multiply
    by the fused shards' column scale, then the bias, rounded once), bit for bit: padded and
    not, with and without each vector, M 1 to 4096, non-uniform scales, NaN in the padding."""
    from sglang.srt.layers.quantization import nvfp4_marlin_epilogue as epilogue

    act = DTYPES[dtype]
    gen = torch.Generator(device=DEV).manual_seed(14)
    n = 1000
    scale = torch.rand(n, generator=gen, device=DEV) * torch.tensor(
        [1.0, 0.5, 2.0**-9], device=DEV
    ).repeat_interleave(torch.tensor([512, 256, 232], device=DEV))
    bias = (torch.randn(n, generator=gen, device=DEV) * 30).to(act)
    for m in (1, 33, 4096):
        for padded_n in (1000, 1024):
            for s, b in ((scale, bias), (scale, None), (None, bias)):
                out = torch.full((m, padded_n), float("nan"), device=DEV, dtype=act)
                out[:, :n] = (torch.randn(m, n, generator=gen, device=DEV) * 30).to(act)
                ref = out[:, :n].float()
                ref = ref * s if s is not None else ref
                ref = (ref + b.float() if b is not None else ref).to(act)
                got = epilogue.marlin_fp4_epilogue(out.clone(), n, s, b)
                record = {"dtype": dtype, "m": m, "n": n, "padded_n": padded_n,
                          "scale": s is not None, "bias": b is not None,
                          "bit_equal": bool(torch.equal(got, ref))}  # fmt: skip
                gpu_report.extra.setdefault("marlin_epilogue", []).append(record)
                assert record["bit_equal"], record


@pytest.mark.gpu
@pytest.mark.parametrize(("path", "dtype", "e", "topk"), MOE_PARAMS)
def test_moe(path: str, dtype: str, e: int, topk: int, gpu_report: Any) -> None:
    cases = run_moe(path, DTYPES[dtype], e, topk, MOE_MS)
    gpu_report.add_cases(cases)
    bad = _fails(cases)
    assert not bad, f"{path} {dtype} E={e} top-{topk}: " + "; ".join(bad)


# ----------------------------------------------------------------------------- worker

# Subsets run under another JIT variant (each variant is a separate multi-minute build).
# dense: (path, dtype, shape, bias, Ms[, bias_scale]); moe: (path, dtype, E, top-k, Ms);
# fused: (path, layer, dtype, ratio) and fused_moe: (path, dtype, w3 / w1), at the Ms of
# test_fused_shards.py.
FP16, BF16 = torch.float16, torch.bfloat16
WORKER_SUITES: dict[str, dict[str, list[tuple[Any, ...]]]] = {
    # The pin's templates with the series' host preprocessing: expected to FAIL.
    "repro": {
        "dense": [
            ("modelopt-dense", BF16, "qkv_8b", False, (1, 33, 128)),
            ("ct-dense", BF16, "o_8b", False, (16, 128)),
        ],
        "moe": [
            ("modelopt-moe", BF16, 8, 2, (1, 33)),
            ("ct-moe", BF16, 8, 2, (33,)),
        ],
    },
    # compute_75 PTX on an SM90 GPU: the SM75 code path, fp16 only, expected to PASS.
    "turing": {
        "dense": [
            ("modelopt-dense", FP16, "qkv_8b", True, (1, 33, 128)),
            ("ct-dense", FP16, "down_8b", False, (7, 128)),
        ],
        "moe": [
            ("modelopt-moe", FP16, 8, 2, (1, 33)),
            ("ct-moe", FP16, 64, 8, (33,)),
        ],
    },
    # A line's bare release beside the line: the bias added in Marlin's permuted order (the
    # strong-bias cases: expected rel L2 ~1), fused shards' own global scales (served with one
    # scale, or refused), and the cases both should pass (no bias, MoE), fp16 and bf16.
    "upstream": {
        "dense": [
            *(
                (p, dt, STRONG_BIAS_SHAPE, True, (1, 33), STRONG_BIAS)
                for p in DENSE_PATHS
                for dt in (FP16, BF16)
            ),
            *((p, dt, STRONG_BIAS_SHAPE, False, (33,)) for p in DENSE_PATHS for dt in (FP16, BF16)),
        ],  # fmt: skip
        "moe": [(p, dt, 8, 2, (1, 33)) for p in MOE_PATHS for dt in (FP16, BF16)],
        "fused": [(p, "qkv", dt, 2.0) for p in DENSE_PATHS for dt in (FP16, BF16)],
        "fused_moe": [(p, dt, 2.0) for p in MOE_PATHS for dt in (FP16, BF16)],
    },
}


def run_suite(name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """("cases" | "fused_shards", case) for every case of a worker suite."""
    suite = WORKER_SUITES[name]
    for path, dtype, shape, bias, ms, *scale in suite["dense"]:
        for case in run_dense(path, dtype, shape, bias, ms, *scale):
            yield "cases", case
    for path, dtype, e, topk, ms in suite["moe"]:
        for case in run_moe(path, dtype, e, topk, ms):
            yield "cases", case
    if suite.get("fused") or suite.get("fused_moe"):
        from test_fused_shards import run_fused_dense, run_moe_halves

        for path, layer, dtype, ratio in suite.get("fused", []):
            for case in run_fused_dense(path, layer, dtype, ratio):
                yield "fused_shards", case
        for path, dtype, ratio in suite.get("fused_moe", []):
            for case in run_moe_halves(path, dtype, ratio):
                yield "fused_shards", case


def worker_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", choices=sorted(WORKER_SUITES), required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    _jitenv.apply_variant()
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.time()
    found: dict[str, list[dict[str, Any]]] = {"cases": [], "fused_shards": []}
    for kind, case in run_suite(args.worker):
        print(f"[{args.worker}] {json.dumps(case)}", flush=True)
        found[kind].append(case)
    result = {"suite": args.worker, "variant": _jitenv.describe(), **found,
              "seconds": round(time.time() - start, 1)}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
