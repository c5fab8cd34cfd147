"""NVFP4 through SGLang's real layer code on the Marlin (W4A16) path, against an fp32 reference.

Dense: ModelOpt NVFP4 (``ModelOptFp4LinearMethod`` from ``ModelOptFp4Config.from_config``) and
compressed-tensors W4A4 NVFP4 (the scheme ``_get_scheme_from_parts`` picks with the Marlin
backend), built by their own ``create_weights``, loaded with synthetic checkpoint tensors, then
``process_weights_after_loading`` and ``apply``. MoE: ModelOpt NVFP4 and compressed-tensors
W4A4 NVFP4 MoE methods with the Marlin runner.

This module is also the worker that test_kernel_repro.py runs in a subprocess with another JIT
variant (the pin's templates, or compute_75 PTX): ``python tests/gpu/test_marlin_numerics.py
--worker {repro,turing} --out FILE``.
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
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _jitenv  # noqa: E402
from _reference import (  # noqa: E402
    SMALLEST_BLOCK_SCALE,
    Nvfp4Weight,
    dense_reference,
    dequant_experts,
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
DENSE_MS = (1, 7, 16, 33, 128, 1024)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# MoE layer: hidden 2048, intermediate 1408 (Qwen1.5-MoE-A2.7B-like), E x top-k below.
MOE_HIDDEN = 2048
MOE_INTER = 1408
MOE_CONFIGS = ((8, 2), (8, 8), (64, 2), (64, 8))
MOE_MS = (1, 33, 256)
DENSE_PATHS = ("modelopt-dense", "ct-dense")
MOE_PATHS = ("modelopt-moe", "ct-moe")

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
    return torch.Generator(device="cuda").manual_seed(_seed(*parts))


def _loader(param: torch.Tensor, loaded: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    param.data.copy_(loaded)


def use_marlin_backends() -> None:
    """Select the Marlin FP4 GEMM and MoE runner backends, as the server args would."""
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.quantization import fp4_utils

    fp4_utils.FP4_GEMM_RUNNER_BACKEND = fp4_utils.Fp4GemmRunnerBackend("marlin")
    moe_utils.MOE_RUNNER_BACKEND = moe_utils.MoeRunnerBackend("marlin")


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
    apply: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    weight: Nvfp4Weight
    multiplier: float  # fp32 global multiplier of the reference
    n: int
    k: int


def build_modelopt_dense(
    n: int, k: int, parts: Sequence[int], dtype: torch.dtype, gen: torch.Generator
) -> DenseLayer:
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptFp4LinearMethod,
    )

    config = ModelOptFp4Config.from_config(MODELOPT_HF_QUANT_CONFIG)
    method = ModelOptFp4LinearMethod(config)
    layer = torch.nn.Module()
    with torch.device("cuda"):
        method.create_weights(
            layer, k, list(parts), k, n, dtype, weight_loader=_loader
        )  # fmt: skip
    weight = random_nvfp4_weight(n, k, gen, smallest=SMALLEST_BLOCK_SCALE[dtype])
    # weight_scale_2 is a multiplier; same for every shard of a fused projection.
    ws2 = RECIPE_MULTIPLIER * (1.0 + 0.3 * torch.rand((), generator=gen, device="cuda").item())
    _fill(layer.weight, weight.packed)
    _fill(layer.weight_scale, weight.scales)
    _fill(layer.weight_scale_2, ws2)
    _fill(layer.input_scale, 0.0123)
    method.process_weights_after_loading(layer)
    _expect_marlin(layer, "modelopt-dense")
    return DenseLayer(
        "modelopt-dense", layer, lambda x, b: method.apply(layer, x, b), weight, ws2, n, k
    )


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
    n: int, k: int, parts: Sequence[int], dtype: torch.dtype, gen: torch.Generator
) -> DenseLayer:
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsLinearMethod,
    )

    config = ct_config()
    layer = torch.nn.Module()
    layer.scheme = ct_linear_scheme(config)
    method = CompressedTensorsLinearMethod(config)
    with torch.device("cuda"):
        method.create_weights(layer, k, list(parts), k, n, dtype, weight_loader=_loader)
    weight = random_nvfp4_weight(n, k, gen, smallest=SMALLEST_BLOCK_SCALE[dtype])
    # compressed-tensors stores the global scale as a divisor: w = fp4 * block / gs.
    gs = (1 + 0.3 * torch.rand((), generator=gen, device="cuda").item()) / RECIPE_MULTIPLIER
    _fill(layer.weight_packed, weight.packed)
    _fill(layer.weight_scale, weight.scales)
    _fill(layer.weight_global_scale, gs)
    _fill(layer.input_global_scale, 81.3)
    method.process_weights_after_loading(layer)
    _expect_marlin(layer, f"ct-dense ({type(layer.scheme).__name__})")
    return DenseLayer(
        "ct-dense", layer, lambda x, b: method.apply(layer, x, b), weight, 1 / gs, n, k
    )


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


def _finite(value: float) -> float | None:
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def run_dense(
    path: str, dtype: torch.dtype, shape: str, bias: bool, ms: Sequence[int]
) -> list[dict[str, Any]]:
    """Build one layer, run every M; one case dict per M (errors recorded, not raised)."""
    n, k, parts = DENSE_SHAPES[shape]
    gen = _gen(path, dtype, shape, bias)
    use_marlin_backends()
    dense = DENSE_BUILDERS[path](n, k, parts, dtype, gen)
    b = (torch.randn(n, generator=gen, device="cuda") * 0.5).to(dtype) if bias else None
    small = dense.weight.small_rows
    cases = []
    for m in ms:
        case = _case(path, dtype, m, n, k, bias)
        case["shape"] = shape
        x = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
        ref = dense_reference(x, dense.weight, dense.multiplier, b)
        try:
            out = dense.apply(x, b)
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
    "FusedMoE" modules by class name.
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
    return base * (1.0 + 0.5 * torch.rand(e, generator=gen, device="cuda"))


def build_modelopt_moe(e: int, topk: int, dtype: torch.dtype, gen: torch.Generator) -> MoeLayer:
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptNvFp4FusedMoEMethod,
    )

    config = ModelOptFp4Config.from_config(MODELOPT_HF_QUANT_CONFIG)
    method = ModelOptNvFp4FusedMoEMethod(config)
    layer = FusedMoE(e, topk, MOE_HIDDEN, MOE_INTER, dtype)
    with torch.device("cuda"):
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
    with torch.device("cuda"):
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
        x = torch.randn(m, MOE_HIDDEN, generator=gen, device="cuda").to(dtype)
        logits = torch.randn(m, e, generator=gen, device="cuda")
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
@pytest.mark.parametrize(("path", "dtype", "e", "topk"), MOE_PARAMS)
def test_moe(path: str, dtype: str, e: int, topk: int, gpu_report: Any) -> None:
    cases = run_moe(path, DTYPES[dtype], e, topk, MOE_MS)
    gpu_report.add_cases(cases)
    bad = _fails(cases)
    assert not bad, f"{path} {dtype} E={e} top-{topk}: " + "; ".join(bad)


# ----------------------------------------------------------------------------- worker

# Subsets run under another JIT variant (each variant is a separate multi-minute build).
WORKER_SUITES: dict[str, dict[str, Any]] = {
    # The pin's templates with the series' host preprocessing: expected to FAIL.
    "repro": {
        "dense": [
            ("modelopt-dense", torch.bfloat16, "qkv_8b", False, (1, 33, 128)),
            ("ct-dense", torch.bfloat16, "o_8b", False, (16, 128)),
        ],
        "moe": [
            ("modelopt-moe", torch.bfloat16, 8, 2, (1, 33)),
            ("ct-moe", torch.bfloat16, 8, 2, (33,)),
        ],
    },
    # compute_75 PTX on an SM90 GPU: the SM75 code path, fp16 only, expected to PASS.
    "turing": {
        "dense": [
            ("modelopt-dense", torch.float16, "qkv_8b", True, (1, 33, 128)),
            ("ct-dense", torch.float16, "down_8b", False, (7, 128)),
        ],
        "moe": [
            ("modelopt-moe", torch.float16, 8, 2, (1, 33)),
            ("ct-moe", torch.float16, 64, 8, (33,)),
        ],
    },
}


def run_suite(name: str) -> Iterator[dict[str, Any]]:
    suite = WORKER_SUITES[name]
    for path, dtype, shape, bias, ms in suite["dense"]:
        yield from run_dense(path, dtype, shape, bias, ms)
    for path, dtype, e, topk, ms in suite["moe"]:
        yield from run_moe(path, dtype, e, topk, ms)


def worker_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", choices=sorted(WORKER_SUITES), required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    _jitenv.apply_variant()
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.time()
    cases = []
    for case in run_suite(args.worker):
        print(f"[{args.worker}] {json.dumps(case)}", flush=True)
        cases.append(case)
    result = {"suite": args.worker, "variant": _jitenv.describe(), "cases": cases,
              "seconds": round(time.time() - start, 1)}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
