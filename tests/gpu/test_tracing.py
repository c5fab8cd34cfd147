"""The FP4 Marlin linear op under CUDA-graph capture and torch.compile(fullgraph=True).

SGLang captures decode steps in CUDA graphs and traces models with torch.compile (piecewise
CUDA graphs); ``apply_fp4_marlin_linear`` is registered as a custom op with a fake impl so that
tracing treats it as one opaque node instead of breaking the graph.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_marlin_numerics import DEV, build_modelopt_dense, use_marlin_backends

N, K = 4096, 4096
# 16: Marlin; 1024: on SM90 the dequant + cuBLAS path (nvfp4_marlin_prefill) inside the op
MS = (16, 1024)


def _check_name(base: str, m: int) -> str:
    return base if m == MS[0] else f"{base}_m{m}"


def _layer(dtype: torch.dtype = torch.bfloat16, bias: bool = False) -> Any:
    """The layer (holding a 0.5 * randn bias when BIAS, as a model's layer does) and the
    generator for the inputs."""
    use_marlin_backends()
    gen = torch.Generator(device=DEV).manual_seed(1234)

    def make_bias(weight: Any, multiplier: float) -> torch.Tensor | None:
        return (torch.randn(N, generator=gen, device=DEV) * 0.5).to(dtype) if bias else None

    return build_modelopt_dense(N, K, (N,), dtype, gen, make_bias), gen


def _op_callable() -> Any:
    from sglang.srt.layers.quantization import marlin_utils_fp4

    return marlin_utils_fp4.apply_fp4_marlin_linear


def _layer_op_args(layer: torch.nn.Module) -> tuple[Any, ...]:
    """Arguments of apply_fp4_marlin_linear after prepare_nvfp4_layer_for_marlin (contract)."""
    return (
        layer.weight,
        layer.weight_scale,
        layer.weight_global_scale,
        layer.workspace,
        N,
        K,
    )


def _close(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    diff = (a.float() - b.float()).abs().max().item()
    scale = b.float().abs().max().item()
    return diff <= 1e-3 * max(scale, 1e-6), diff


@pytest.mark.gpu
@pytest.mark.parametrize("m", MS)
def test_cuda_graph_replay_matches_eager(m: int, gpu_report: Any) -> None:
    dense, gen = _layer(bias=True)
    static_x = torch.randn(m, K, generator=gen, device=DEV).to(torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up off the capture stream, as capture requires
            dense.apply(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = dense.apply(static_x)
    results = []
    for _ in range(3):  # new inputs each replay: the graph must read the static buffer
        x = torch.randn(m, K, generator=gen, device=DEV).to(torch.bfloat16)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        eager = dense.apply(x)
        results.append(_close(static_out, eager))
    passed = all(ok for ok, _ in results)
    gpu_report.add_tracing(
        _check_name("cuda_graph", m),
        passed,
        detail=f"layer apply, M={m} N={N} K={K} bf16 + bias; 3 replays vs eager",
        max_abs_diff=max(d for _, d in results),
    )
    assert passed, f"CUDA graph replay differs from eager: {results}"


@pytest.mark.gpu
@pytest.mark.parametrize("m", MS)
def test_torch_compile_fullgraph_keeps_the_op(m: int, gpu_report: Any) -> None:
    dense, gen = _layer()
    op = _op_callable()
    args = _layer_op_args(dense.layer)
    x = torch.randn(m, K, generator=gen, device=DEV).to(torch.bfloat16)
    eager = dense.apply(x)

    seen: list[str] = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    def f(inp: torch.Tensor) -> torch.Tensor:
        return op(inp, *args) * 2.0  # a neighbour op: the graph must not end at the op

    torch._dynamo.reset()
    traced = torch.compile(f, fullgraph=True, backend=recording_backend)(x)
    in_graph = [t for t in seen if "apply_fp4_marlin_linear" in t]
    ok_traced, diff_traced = _close(traced, 2.0 * eager)

    torch._dynamo.reset()
    inductor = torch.compile(f, fullgraph=True)(x)  # default backend: the fake impl is used
    ok_inductor, diff_inductor = _close(inductor, 2.0 * eager)
    passed = bool(in_graph) and ok_traced and ok_inductor
    gpu_report.add_tracing(
        _check_name("torch_compile", m),
        passed,
        detail=f"M={m}: fullgraph=True (no graph break) with a recording backend and inductor",
        op_nodes=in_graph,
        max_abs_diff=max(diff_traced, diff_inductor),
    )
    assert in_graph, f"apply_fp4_marlin_linear is not one node of the traced graph: {seen}"
    assert ok_traced and ok_inductor, (diff_traced, diff_inductor)
