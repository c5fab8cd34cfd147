"""FP4 (NVFP4) Marlin of the patched pin against bf16 cuBLAS, INT4 GPTQ Marlin, the HBM roofline
and upstream SGLang 0.5.23's FP4 Marlin, all measured in one run on one GPU.

Method (what bench.md states):
* Before each group of timings (one method on one shape, every M) copies stream for 0.3 s,
  so that no group starts from an idle GPU's clocks.
* Weights rotate over enough copies that each rotation covers >= 3x the L2 size, so every
  timed call streams its weight from HBM (activations are one tensor per M: small).
* One CUDA graph per (method, shape, M) holds ``calls`` back-to-back calls cycling through the
  copies; each replay is timed with CUDA events; per-call time = replay time / calls.
  We report the MEDIAN over ``--replays`` replays (the best is kept as ``*_best_us``).
* Roofline: (N*K/2 + N*K/16 + 2*M*K + 2*M*N) bytes / device-to-device copy bandwidth measured
  at the start of the same run (bytes read + written).
* FP4 (``fp4_us``): the series' ``apply_fp4_marlin_linear`` with its Marlin GEMM, also where
  the series takes another path; ``dispatch_us`` / ``dispatch_path``: the same op as a model
  runs it (from M = 1024 on SM90 the weights dequantized for cuBLAS, nvfp4_marlin_prefill;
  where the path is Marlin, dispatch_us is fp4_us: the same call).
* FP8 (``fp8_us``, SM89 and newer): e4m3 weights and activations through cuBLASLt
  (``torch._scaled_mm``, per-tensor scales, bf16 out), what an H100/H200 user serves instead:
  the GEMM alone, activations already in FP8 (a W8A8 layer also quantizes its input, one more
  kernel), weights rotated as the other columns. Dense rows only.
* Epilogue (``epilogue_us``): the linear as served on a fused layer whose shards keep their own
  global scales (a float32 per-column output scale, ratios 1 / 0.5 / 2^-9) and with a bias;
  ``epilogue_unfused_us``: the same with the PyTorch ops patch 14 replaced by one kernel.
* INT4: the pin's ``gptq_marlin_gemm`` with ``uint4b8``, group size 128 (GPTQ as run today).
* Upstream 0.5.23: its own ``gptq_marlin_gemm`` wrapper and JIT module (``sglang.kernels``),
  run in a subprocess with the 0.5.23 tree on PYTHONPATH, on the same Marlin-layout tensors
  (the layouts agree since 0.5.13) and with 0.5.23's call flags (fp32 reduce, atomic-add rule).
* MoE: one layer, E=64, top-8, hidden 2048, intermediate 1408, through the real ModelOpt NVFP4
  MoE method (Marlin runner), INT4 via ``fused_marlin_moe`` (uint4b8, group 128), bf16 via
  ``torch._grouped_mm``; routing differs per call so the set of touched experts rotates.

Usage: python bench/bench_fp4_marlin.py --out reports/h200 [--upstream-tree DIR] [--no-moe]
(FP4SERIES_BENCH_ARGS adds options after these, e.g. "--no-moe --upstream-tree=" where the GPU
proof's bench stage runs it.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "src"))

MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
DEQUANT_FROM = 128  # the dequant + cuBLAS path is also timed forced from this M on (dequant_us)
# name -> (N, K): Llama-3.1-8B and -70B projections at TP=1.
SHAPES: dict[str, tuple[int, int]] = {
    "qkv_8b": (6144, 4096),
    "o_8b": (4096, 4096),
    "gate_up_8b": (28672, 4096),
    "down_8b": (4096, 14336),
    "qkv_70b": (10240, 8192),
    "o_70b": (8192, 8192),
    "gate_up_70b": (57344, 8192),
    "down_70b": (8192, 28672),
}
MOE = {"e": 64, "topk": 8, "hidden": 2048, "inter": 1408}
INT4_GROUP = 128
DTYPE = torch.bfloat16
FP8_FROM = (8, 9)  # compute capability from which FP8 e4m3 GEMMs run (cuBLASLt)
WARMUP_S = 0.3  # steady_clocks before each group of timings (one method, one shape, every M)
EPILOGUE_SLACK = 1.02  # the epilogue goal: within 2 % of the plain layer's time


# ----------------------------------------------------------------------------- timing


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(0)
    return int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)


def copies_for(bytes_per_copy: int) -> int:
    """Weight copies so that one rotation covers >= 3x L2 (at least 2)."""
    return max(2, math.ceil(3 * l2_bytes() / max(bytes_per_copy, 1)))


def time_graph(calls: Sequence[Callable[[], Any]], replays: int) -> tuple[float, float]:
    """(median, best) microseconds per call of a CUDA graph replaying ``calls`` in order."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls[: max(1, len(calls))]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1000.0 / len(calls))
    del graph
    return statistics.median(per_call), min(per_call)


def steady_clocks(seconds: float = WARMUP_S) -> None:
    """Stream copies for a while before a group of timings, so that each group starts from the
    clocks of a memory-bound load, whatever ran before it (an idle GPU during a shape's setup,
    or the large GEMMs of the group before). In the kernel rounds' round 3 the group timed
    first after the bf16 GEMMs at M = 1024 read 19-29 % slow; in this benchmark's first run of
    2026-12-04 each shape's first group, FP4 Marlin from M = 1, read up to 40 % slower than the
    same call timed later in that shape (reports/h200/runs/2026-12-04-all-stages/bench.json:
    o_70b at M = 1 28.5 us as fp4_us, 23.8 us with an epilogue added)."""
    src = torch.empty(2**27, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            dst.copy_(src)
        torch.cuda.synchronize()
    del src, dst


def rotation(fns: Sequence[Callable[[], Any]], min_calls: int = 24) -> list[Callable[[], Any]]:
    n = max(min_calls, 2 * len(fns))
    return [fns[i % len(fns)] for i in range(n)]


def copy_bandwidth_tb_s(replays: int = 10) -> float:
    """Device-to-device copy, bytes read + written, best of ``replays`` (1 GiB buffers)."""
    n = 2**30 // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        dst.copy_(src)
    best = float("inf")
    for _ in range(replays):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000.0)
    return 2 * src.numel() * src.element_size() / best / 1e12


def roofline_us(m: int, n: int, k: int, bw_tb_s: float) -> float:
    return (n * k / 2 + n * k / 16 + 2 * m * k + 2 * m * n) / (bw_tb_s * 1e12) * 1e6


# ----------------------------------------------------------------------------- methods


def fp4_weight_tensors(n: int, k: int, seed: int) -> dict[str, torch.Tensor]:
    """Marlin-layout FP4 tensors from the series' own preparation (marlin_utils_fp4)."""
    from _reference import random_nvfp4_weight
    from sglang.srt.layers.quantization.marlin_utils_fp4 import prepare_nvfp4_layer_for_marlin

    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = random_nvfp4_weight(n, k, gen)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w.packed, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(w.scales, requires_grad=False)
    layer.output_size_per_partition = n
    layer.input_size_per_partition = k
    layer.params_dtype = DTYPE
    layer.orig_dtype = DTYPE
    layer.weight_global_scale = torch.tensor(8.3e-4, device="cuda")
    prepare_nvfp4_layer_for_marlin(layer)
    return {
        "weight": layer.weight.data,
        "scale": layer.weight_scale.data,
        "global_scale": layer.weight_global_scale.data,
    }


def has_dequant_path() -> bool:
    """Whether the series under test has the dequant + cuBLAS path (on any GPU)."""
    from sglang.srt.layers.quantization import marlin_utils_fp4

    return hasattr(marlin_utils_fp4, "use_dequant_gemm")


@contextlib.contextmanager
def path_forced(dequant: bool) -> Iterator[None]:
    """apply_fp4_marlin_linear with one path at every M: Marlin (the fp4_us column) or the
    dequant + cuBLAS path (dequant_us); a series without the latter only has Marlin."""
    from sglang.srt.layers.quantization import marlin_utils_fp4

    chooser = getattr(marlin_utils_fp4, "use_dequant_gemm", None)
    if chooser is None:
        yield
        return
    marlin_utils_fp4.use_dequant_gemm = lambda m, device, dtype: dequant
    try:
        yield
    finally:
        marlin_utils_fp4.use_dequant_gemm = chooser


def rotated_copies(base: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """BASE and enough clones of it that one rotation streams its weights from HBM."""
    per_copy = base["weight"].numel() * base["weight"].element_size() + base["scale"].numel()
    return [base] + [
        {k2: v.clone() for k2, v in base.items()} for _ in range(copies_for(per_copy) - 1)
    ]


def has_fused_epilogue() -> bool:
    """Whether the series under test runs Marlin's epilogue as one kernel (patch 14)."""
    from sglang.srt.layers.quantization import marlin_utils_fp4

    return hasattr(marlin_utils_fp4, "marlin_fp4_epilogue")


@contextlib.contextmanager
def epilogue_unfused() -> Iterator[None]:
    """The series' linear with the PyTorch ops patch 14 replaced after Marlin (padding copy,
    float32 upcast, column-scale multiply, bias add, downcast): epilogue_unfused_us. They are
    the module's own marlin_fp4_epilogue_ops, what SM75 runs."""
    from sglang.srt.layers.quantization import marlin_utils_fp4, nvfp4_marlin_epilogue

    fused = marlin_utils_fp4.marlin_fp4_epilogue
    marlin_utils_fp4.marlin_fp4_epilogue = nvfp4_marlin_epilogue.marlin_fp4_epilogue_ops
    try:
        yield
    finally:
        marlin_utils_fp4.marlin_fp4_epilogue = fused


def bench_epilogue(n: int, k: int, base: dict[str, torch.Tensor], ms: Sequence[int],
                   replays: int) -> tuple[dict, dict]:  # fmt: skip
    """The linear as served with a fused layer's per-column output scale (three shards with
    their own global scales: ratios 1, 0.5, 2^-9) and a bias: epilogue_us; where the series
    fuses them (patch 14), the same with the PyTorch ops instead, on the rows Marlin serves
    (the dequant path folds both into its chunks): epilogue_unfused_us."""
    from sglang.srt.layers.quantization.marlin_utils import marlin_make_workspace
    from sglang.srt.layers.quantization.marlin_utils_fp4 import apply_fp4_marlin_linear
    from test_marlin_numerics import dense_gemm

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    shard = torch.tensor([1.0, 0.5, 2.0**-9], device="cuda")
    spread = 1 + torch.rand(n, device="cuda", generator=gen)
    col = shard[torch.arange(n, device="cuda") * 3 // n] * spread
    bias = (torch.randn(n, device="cuda", generator=gen) * 0.1).to(DTYPE)
    copies = rotated_copies(base)
    ws = marlin_make_workspace(torch.device("cuda"))
    fused, unfused = {}, {}
    patch_14 = has_fused_epilogue()
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=DTYPE)
        fns = [
            (
                lambda c=c, x=x: apply_fp4_marlin_linear(
                    x, c["weight"], c["scale"], c["global_scale"], ws, n, k, bias,
                    output_scale=col,
                )
            )
            for c in copies
        ]  # fmt: skip
        fused[m] = time_graph(rotation(fns), replays)
        if patch_14 and dense_gemm(m, DTYPE) == "marlin":  # where patch 14 acts
            with epilogue_unfused():
                unfused[m] = time_graph(rotation(fns), replays)
    return fused, unfused


def bench_fp4(n: int, k: int, base: dict[str, torch.Tensor], ms: Sequence[int], replays: int):
    """apply_fp4_marlin_linear per M, in microseconds (median, best): Marlin's time, the
    dispatch's (timed only where it takes another path), and from DEQUANT_FROM on the dequant +
    cuBLAS path forced (where the series has it), which places the crossover."""
    from sglang.srt.layers.quantization.marlin_utils import marlin_make_workspace
    from sglang.srt.layers.quantization.marlin_utils_fp4 import apply_fp4_marlin_linear
    from test_marlin_numerics import dense_gemm

    copies = rotated_copies(base)
    ws = marlin_make_workspace(torch.device("cuda"))
    marlin, dispatch, dequant = {}, {}, {}
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=DTYPE)
        fns = [
            (
                lambda c=c, x=x: apply_fp4_marlin_linear(
                    x, c["weight"], c["scale"], c["global_scale"], ws, n, k
                )
            )
            for c in copies
        ]
        with path_forced(dequant=False):
            marlin[m] = time_graph(rotation(fns), replays)
        if m >= DEQUANT_FROM and has_dequant_path():
            with path_forced(dequant=True):
                dequant[m] = time_graph(rotation(fns), replays)
        served = dense_gemm(m, DTYPE) != "marlin"
        dispatch[m] = time_graph(rotation(fns), replays) if served else marlin[m]
    return marlin, dispatch, dequant


def bench_bf16(n: int, k: int, ms: Sequence[int], replays: int):
    w0 = torch.randn(n, k, device="cuda", dtype=DTYPE) * 0.02
    ws = [w0] + [w0.clone() for _ in range(copies_for(2 * n * k) - 1)]
    out = {}
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=DTYPE)
        fns = [(lambda w=w, x=x: torch.matmul(x, w.t())) for w in ws]
        out[m] = time_graph(rotation(fns), replays)
    del ws, w0
    return out


def bench_fp8(n: int, k: int, ms: Sequence[int], replays: int) -> dict[int, tuple[float, float]]:
    """FP8 e4m3 weights and activations through cuBLASLt (``torch._scaled_mm``, per-tensor
    scales, bf16 out): the GEMM an FP8 checkpoint runs on Hopper, without the activations'
    quantization. Microseconds (median, best) per M."""
    w0 = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
    ws = [w0] + [w0.clone() for _ in range(copies_for(n * k) - 1)]
    one = torch.ones((), device="cuda")
    out = {}
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        fns = [
            lambda w=w, x=x: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one,
                                              out_dtype=torch.bfloat16)
            for w in ws
        ]  # fmt: skip
        out[m] = time_graph(rotation(fns), replays)
    del ws, w0
    torch.cuda.empty_cache()
    return out


def bench_int4(n: int, k: int, ms: Sequence[int], replays: int):
    from sgl_kernel.scalar_type import scalar_types
    from sglang.jit_kernel.gptq_marlin import gptq_marlin_gemm
    from sglang.jit_kernel.gptq_marlin_repack import gptq_marlin_repack
    from sglang.srt.layers.quantization.marlin_utils import (
        marlin_make_workspace,
        marlin_permute_scales,
        should_use_atomic_add_reduce,
    )

    q = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), device="cuda", dtype=torch.int32)
    perm = torch.empty(0, dtype=torch.int32, device="cuda")
    qw = gptq_marlin_repack(q, perm, k, n, 4)
    s = (torch.rand(k // INT4_GROUP, n, device="cuda") * 0.01 + 0.001).to(DTYPE)
    s = marlin_permute_scales(s, k, n, INT4_GROUP)
    per_copy = qw.numel() * 4 + s.numel() * 2
    copies = [(qw, s)] + [(qw.clone(), s.clone()) for _ in range(copies_for(per_copy) - 1)]
    ws = marlin_make_workspace(torch.device("cuda"))
    out = {}
    qtype = scalar_types.uint4b8
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=DTYPE)
        atomic = should_use_atomic_add_reduce(m, n, k, x.device, DTYPE)
        fns = [
            (
                lambda c=c, x=x, m=m, a=atomic: gptq_marlin_gemm(
                    x, None, c[0], c[1], None, None, None, None, ws, qtype, m, n, k, True, a, True
                )
            )
            for c in copies
        ]
        out[m] = time_graph(rotation(fns), replays)
    return out


# ----------------------------------------------------------------------------- upstream worker


def upstream_worker(job_dir: Path, replays: int) -> int:
    """Runs under the 0.5.23 tree: time its FP4 Marlin on the tensors the parent saved."""
    from sgl_kernel.scalar_type import scalar_types
    from sglang.kernels.ops.gemm.gptq_marlin import gptq_marlin_gemm

    job = json.loads((job_dir / "job.json").read_text())
    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ws = torch.zeros(sms, dtype=torch.int, device="cuda")
    results = []
    qtype = scalar_types.float4_e2m1f
    for item in job["shapes"]:
        n, k = item["n"], item["k"]
        base = torch.load(job_dir / item["file"], map_location="cuda")
        copies = rotated_copies(base)
        steady_clocks()
        for m in item["ms"]:
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            atomic = item["atomic"][str(m)]
            fns = [
                (
                    lambda c=c, x=x, m=m, a=atomic, n=n, k=k, qtype=qtype: gptq_marlin_gemm(
                        x,
                        None,
                        c["weight"],
                        c["scale"],
                        c["global_scale"],
                        None,
                        None,
                        None,
                        ws,
                        qtype,
                        m,
                        n,
                        k,
                        True,
                        a,
                        True,
                    )
                )
                for c in copies
            ]
            med, best = time_graph(rotation(fns), replays)
            results.append({"shape": item["shape"], "m": m, "median_us": med, "best_us": best})
        del copies, base
        torch.cuda.empty_cache()
        print(f"[bench] upstream 0.5.23 {item['shape']}: done at {time.time() - t0:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    (job_dir / "result.json").write_text(json.dumps(results))
    return 0


def wait_upstream_build(t0: float, budget_s: float | None) -> str:
    """Wait for a background build of 0.5.23's modules (FP4SERIES_UPSTREAM_BUILD_RC names the
    file its exit status lands in); "" when ready, else why 0.5.23 is not measured."""
    rc_file = os.environ.get("FP4SERIES_UPSTREAM_BUILD_RC")
    if not rc_file:
        return ""  # the worker compiles what it needs itself
    print("[bench] waiting for the upstream 0.5.23 build ...", flush=True)
    while not Path(rc_file).is_file():
        if budget_s is not None and time.time() - t0 > budget_s:
            return "upstream 0.5.23 not run: its JIT build did not finish within --budget-s"
        time.sleep(2)
    rc = Path(rc_file).read_text().strip()
    return "" if rc == "0" else f"upstream 0.5.23 not run: its JIT build exited {rc}"


def upstream_worker_env(tree: str, patched_root: Path, environ: Mapping[str, str]) -> dict:
    """The upstream worker's environment: 0.5.23's tree first (its `sglang` package wins), then
    its own extras (apache-tvm-ffi 0.1.11, which it pins), then the rest without the patched
    tree; both JIT caches (tvm-ffi's and, from 0.5.17 on, SGLang's own) at the one its modules
    were built into (FP4SERIES_UPSTREAM_CACHE), not the patched tree's."""
    env = dict(environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in rest if os.path.realpath(p) != os.path.realpath(patched_root)]
    extra = json.loads(env.get("FP4SERIES_UPSTREAM_EXTRA_PATH", "[]"))
    env["PYTHONPATH"] = os.pathsep.join([tree, *extra, *rest])
    default_cache = env.get("TVM_FFI_CACHE_DIR", os.path.expanduser("~/.cache/tvm-ffi")) + "-0523"
    cache = env.get("FP4SERIES_UPSTREAM_CACHE", default_cache)
    env["TVM_FFI_CACHE_DIR"] = cache
    env["SGLANG_JIT_CACHE_DIR"] = cache
    return env


def run_upstream(
    tree: str, tensors: dict[str, dict[str, torch.Tensor]], ms: Sequence[int], replays: int
) -> tuple[dict[tuple[str, int], tuple[float, float]], str]:
    from sglang.srt.layers.quantization.marlin_utils import should_use_atomic_add_reduce

    with tempfile.TemporaryDirectory(dir=os.environ.get("FP4SERIES_BENCH_TMP")) as tmp:
        job_dir = Path(tmp)
        shapes = []
        for shape, base in tensors.items():
            n, k = SHAPES[shape]
            torch.save({a: b.cpu() for a, b in base.items()}, job_dir / f"{shape}.pt")
            atomic = {str(m): should_use_atomic_add_reduce(m, n, k, torch.device("cuda"), DTYPE)
                      for m in ms}  # fmt: skip
            shapes.append({"shape": shape, "n": n, "k": k, "file": f"{shape}.pt", "ms": list(ms),
                           "atomic": atomic})  # fmt: skip
        (job_dir / "job.json").write_text(json.dumps({"shapes": shapes}))
        import sglang

        patched_root = Path(sglang.__file__).resolve().parents[1]
        env = upstream_worker_env(tree, patched_root, os.environ)
        cmd = [
            sys.executable,
            __file__,
            "--upstream-worker",
            str(job_dir),
            "--replays",
            str(replays),
        ]
        # its output (JIT builds, progress) goes to this process's log as it happens
        try:
            proc = subprocess.run(cmd, env=env, timeout=480)
        except subprocess.TimeoutExpired:
            return {}, "upstream 0.5.23 worker stopped after 480 s (its output: the log)"
        if proc.returncode != 0:
            return {}, f"upstream 0.5.23 worker exited {proc.returncode} (its output: the log)"
        rows = json.loads((job_dir / "result.json").read_text())
    return {(r["shape"], r["m"]): (r["median_us"], r["best_us"]) for r in rows}, ""


# ----------------------------------------------------------------------------- MoE


def bench_moe(ms: Sequence[int], replays: int, bw: float) -> tuple[list[dict[str, Any]], str]:
    from _reference import route
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from test_marlin_numerics import build_modelopt_moe, use_marlin_backends

    e, topk, h, inter = MOE["e"], MOE["topk"], MOE["hidden"], MOE["inter"]
    use_marlin_backends()
    gen = torch.Generator(device="cuda").manual_seed(7)
    moe = build_modelopt_moe(e, topk, DTYPE, gen)
    notes = []
    int4 = _int4_moe(e, h, inter)
    bf16 = _bf16_moe(e, h, inter)
    per_expert = (2 * inter * h + h * inter) * (0.5 + 1 / 16)
    rows = []
    steady_clocks()
    for m in ms:
        x = torch.randn(m, h, device="cuda", dtype=DTYPE)
        routes = []
        for _ in range(8):  # different routing per call: the touched experts rotate
            logits = torch.randn(m, e, device="cuda")
            w, ids = route(logits, topk)
            routes.append((logits, w, ids))
        fp4_fns = [
            (
                lambda r=r, x=x: moe.method.apply(
                    moe.layer, StandardDispatchOutput(x, None, StandardTopKOutput(r[1], r[2], r[0]))
                )
            )
            for r in routes
        ]  # fmt: skip
        row: dict[str, Any] = {"shape": f"moe_e{e}_top{topk}_h{h}_i{inter}", "kind": "moe",
                               "m": m, "n": inter, "k": h, "e": e, "topk": topk}  # fmt: skip
        row["fp4_us"], row["fp4_best_us"] = time_graph(rotation(fp4_fns, 16), replays)
        # the MoE stays on Marlin at every M: the dispatch is the same call
        row["dispatch_us"], row["dispatch_best_us"] = row["fp4_us"], row["fp4_best_us"]
        row["dispatch_path"] = "marlin"
        for name, impl in (("int4", int4), ("bf16", bf16)):
            if isinstance(impl, str):
                row[f"{name}_us"] = None
                continue
            try:
                fns = [(lambda r=r, x=x, f=impl: f(x, r)) for r in routes]
                row[f"{name}_us"], row[f"{name}_best_us"] = time_graph(rotation(fns, 16), replays)
            except Exception as exc:  # keep the FP4 number; say why the baseline is missing
                row[f"{name}_us"] = None
                notes.append(f"{name} MoE baseline failed at M={m}: {type(exc).__name__}: {exc}")
        touched = e * (1 - (1 - topk / e) ** m)
        row["roofline_us"] = (touched * per_expert + 4 * m * h) / (bw * 1e12) * 1e6
        row["upstream_fp4_us"] = None
        rows.append(row)
    notes += [impl for impl in (int4, bf16) if isinstance(impl, str)]
    notes.append("upstream 0.5.23 MoE Marlin not measured (its MoE JIT module is not built)")
    return rows, "; ".join(notes)


def _int4_moe(e: int, h: int, inter: int) -> Any:
    try:
        from sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe import fused_marlin_moe
        from sglang.srt.layers.quantization.gptq import gptq_marlin_moe_repack
        from sglang.srt.layers.quantization.marlin_utils import (
            marlin_make_workspace,
            marlin_moe_permute_scales,
        )

        perm = torch.empty((e, 0), dtype=torch.int32, device="cuda")
        q13 = torch.randint(
            -(2**31), 2**31 - 1, (e, h // 8, 2 * inter), device="cuda", dtype=torch.int32
        )
        q2 = torch.randint(
            -(2**31), 2**31 - 1, (e, inter // 8, h), device="cuda", dtype=torch.int32
        )
        w1 = gptq_marlin_moe_repack(q13, perm, h, 2 * inter, 4)
        w2 = gptq_marlin_moe_repack(q2, perm, inter, h, 4)
        s1 = (torch.rand(e, h // INT4_GROUP, 2 * inter, device="cuda") * 0.01).to(DTYPE)
        s1 = marlin_moe_permute_scales(s1, h, 2 * inter, INT4_GROUP)
        s2 = (torch.rand(e, inter // INT4_GROUP, h, device="cuda") * 0.01).to(DTYPE)
        s2 = marlin_moe_permute_scales(s2, inter, h, INT4_GROUP)
        ws = marlin_make_workspace(torch.device("cuda"), max_blocks_per_sm=4)
    except Exception as exc:
        return f"INT4 MoE baseline not built: {type(exc).__name__}: {exc}"

    def run(x: torch.Tensor, r: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return fused_marlin_moe(x, w1, w2, s1, s2, r[0], r[1], r[2], workspace=ws, num_bits=4)

    return run


def _bf16_moe(e: int, h: int, inter: int) -> Any:
    if not hasattr(torch, "_grouped_mm"):
        return "bf16 MoE baseline: torch._grouped_mm not available"
    w13 = torch.randn(e, h, 2 * inter, device="cuda", dtype=DTYPE) * 0.02  # [E, K, N]
    w2 = torch.randn(e, inter, h, device="cuda", dtype=DTYPE) * 0.02
    experts = torch.arange(e, device="cuda", dtype=torch.int32)

    def run(x: torch.Tensor, r: tuple[torch.Tensor, ...]) -> torch.Tensor:
        weights, ids = r[1], r[2]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // ids.shape[1]
        counts = (flat.unsqueeze(1) == experts.unsqueeze(0)).sum(0, dtype=torch.int32)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        a = x[tokens]
        hmid = torch._grouped_mm(a, w13, offs=offs)
        act = torch.nn.functional.silu(hmid[:, :inter]) * hmid[:, inter:]
        y = torch._grouped_mm(act.contiguous(), w2, offs=offs)
        y = y * weights.reshape(-1)[order].unsqueeze(1).to(y.dtype)
        return torch.zeros_like(x).index_add_(0, tokens, y)

    return run


# ----------------------------------------------------------------------------- main


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def geomean(values: Sequence[float | None]) -> float | None:
    """Geometric mean of the positive values (None when there are none)."""
    vals = [v for v in values if v and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None


def goal_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Issue 23's kernel-level goals as this run measured them on the dense rows: the series'
    linear as served (dispatch_us) against FP4 Marlin, bf16 cuBLAS and the HBM roofline. Each
    goal: its words, what was measured, met (True/False); FP8 beside, for information (its
    goals are end to end). Goals whose rows are missing are left out."""
    from fp4series.readme import span
    from fp4series.report import DISPATCH_PATHS, DISPATCH_SLACK

    dense = [r for r in rows if r.get("kind", "dense") == "dense" and r.get("dispatch_us")]

    def at(ms: set[int]) -> list[Mapping[str, Any]]:
        return [r for r in dense if r["m"] in ms]

    goals: list[dict[str, Any]] = []
    for ms, target in (({1, 2, 4}, 1.5), ({8, 16}, 1.25)):
        if speedups := [r["fp4_us"] / r["dispatch_us"] for r in at(ms)]:
            value = geomean(speedups)
            goals.append({"goal": f"M {min(ms)}-{max(ms)}: geometric-mean speed-up over FP4 "
                                  f"Marlin >= {target}x", "measured": f"{value:.2f}x",
                          "met": value >= target})  # fmt: skip
    if big := [r for r in at({1}) if r["roofline_us"] >= 8.0]:
        shares = {r["shape"]: r["roofline_us"] / r["dispatch_us"] for r in big}
        goals.append({"goal": "M = 1: >= 70 % of the HBM roofline on every shape whose "
                              "roofline is >= 8 us",
                      "measured": ", ".join(f"{s} {v:.0%}" for s, v in shares.items()),
                      "met": min(shares.values()) >= 0.7})  # fmt: skip
    if mid := [r for r in at({32, 64}) if r.get("bf16_us")]:
        ratios = [r["bf16_us"] / r["dispatch_us"] for r in mid]
        goals.append({"goal": "M 32-64: never slower than bf16 cuBLAS",
                      "measured": f"bf16 time / dispatch time {span(ratios)}",
                      "met": min(ratios) >= 1.0})  # fmt: skip
    if big_m := [r for r in dense if r["m"] >= 1024 and r.get("bf16_us")]:
        speed = {(r["shape"], r["m"]): r["bf16_us"] / r["dispatch_us"] for r in big_m}
        below = sorted({f"{s} (M {m}: {v:.2f}x)" for (s, m), v in speed.items() if v < 0.8})
        goals.append({"goal": "M >= 1024: >= 0.8x bf16 cuBLAS's speed on every shape",
                      "measured": f"{span(list(speed.values()))}x"
                                  + (f"; below: {', '.join(below)}" if below else ""),
                      "met": not below})  # fmt: skip
    if served := [r for r in dense if r.get("dispatch_path", "marlin") != "marlin"]:
        worst = max(r["dispatch_us"] / r["fp4_us"] for r in served)
        goals.append({"goal": "never slower than Marlin (where the dispatch leaves it)",
                      "measured": f"dispatch time / Marlin time at most {worst:.2f}",
                      "met": worst <= DISPATCH_SLACK})  # fmt: skip
    if epi := [r for r in dense if r.get("epilogue_us")]:
        parts, worst_all = [], 0.0
        for path in DISPATCH_PATHS:  # where patch 14 acts (Marlin), and the dequant path's own
            worst: dict[str, float] = {}
            unfused: dict[str, float] = {}
            for r in (r for r in epi if r.get("dispatch_path", "marlin") == path):
                ratio = r["epilogue_us"] / r["dispatch_us"]
                worst[r["shape"]] = max(worst.get(r["shape"], 0.0), ratio)
                if path == "marlin" and r.get("epilogue_unfused_us"):
                    ratio = r["epilogue_unfused_us"] / r["dispatch_us"]
                    unfused[r["shape"]] = max(unfused.get(r["shape"], 0.0), ratio)
            if worst:
                worst_all = max(worst_all, *worst.values())
                parts.append(f"{path} rows {span(list(worst.values()))}" + (
                    f" (the ops patch 14 replaced: {span(list(unfused.values()))})"
                    if unfused else ""))  # fmt: skip
        goals.append({"goal": "epilogue: a layer with the fused shards' column scale and a "
                              "bias at the speed of one without (within 2 %)",
                      "measured": "time over the plain layer's, worst M per shape: "
                                  + "; ".join(parts),
                      "met": worst_all <= EPILOGUE_SLACK})  # fmt: skip
    for ms in ({1}, {8}, {1024}):
        if fp8 := [r["fp8_us"] / r["dispatch_us"] for r in at(ms) if r.get("fp8_us")]:
            goals.append({"goal": f"FP8 beside (kernel level, M = {min(ms)}; information: the "
                                  "FP8 goals are end to end)",
                          "measured": f"FP8 time / dispatch time {span(fp8)}",
                          "met": None})  # fmt: skip
    return goals


def write_markdown(data: dict[str, Any], path: Path) -> None:
    lines = [
        "# FP4 Marlin benchmark",
        "",
        f"Device: {data['device']}, torch {data['torch']}, copy bandwidth "
        f"{data['copy_bandwidth_tb_s']:.2f} TB/s (roofline). Series {data['series_revision']}, "
        f"pin {data['pin'].get('tag')}.",
        f"Command: `{data['command']}`",
        "",
        f"Method: {data['method']}",
        "",
        "Columns: microseconds per call (median of replays); ratios > 1 mean FP4 is faster "
        "(bf16/FP4, INT4/FP4, upstream/FP4); roofline/FP4 is the fraction of the HBM roofline "
        "reached. FP4 = FP4 Marlin; dispatch = the series' linear as served (its path); "
        "dequant = its dequant + cuBLAS path forced (from M = 128, where the series has it); "
        "FP8 = e4m3 through cuBLASLt, the GEMM alone; epilogue = the served linear with a fused "
        "layer's column scale and a bias (unfused: with the PyTorch ops patch 14 replaced); "
        "FP4/disp, bf16/disp and FP8/disp: > 1 where the dispatch is faster.",
        "",
    ]
    if data.get("goals"):
        lines += ["## Issue 23's goals in this run (what limits each: bench/kernels/NOTES.md)",
                  "", "| goal | measured | met |", "|---|---|---|"]  # fmt: skip
        for g in data["goals"]:
            met = {True: "yes", False: "no", None: "-"}[g["met"]]
            lines.append(f"| {g['goal']} | {g['measured']} | {met} |")
        lines += ["", "## Every row", ""]
    lines += [
        "| shape | N | K | M | FP4 us | dispatch us | path | dequant us | epilogue us "
        "| unfused us | bf16 us | FP8 us | INT4 us | upstream 0.5.23 us | roofline us | bf16/FP4 "
        "| INT4/FP4 | up/FP4 | roof/FP4 | FP4/disp | bf16/disp | FP8/disp |",
        "|" + "---|" * 22,
    ]
    for r in data["rows"]:

        def f(v: float | None) -> str:
            return f"{v:.1f}" if v else "-"

        lines.append(
            f"| {r['shape']} | {r['n']} | {r['k']} | {r['m']} | {f(r['fp4_us'])} | "
            f"{f(r.get('dispatch_us'))} | {r.get('dispatch_path', '-')} | "
            f"{f(r.get('dequant_us'))} | {f(r.get('epilogue_us'))} | "
            f"{f(r.get('epilogue_unfused_us'))} | {f(r.get('bf16_us'))} | {f(r.get('fp8_us'))} | "
            f"{f(r.get('int4_us'))} | {f(r.get('upstream_fp4_us'))} | "
            f"{f(r['roofline_us'])} | {_ratio(r.get('bf16_us'), r['fp4_us'])} | "
            f"{_ratio(r.get('int4_us'), r['fp4_us'])} | "
            f"{_ratio(r.get('upstream_fp4_us'), r['fp4_us'])} | "
            f"{_ratio(r['roofline_us'], r['fp4_us'])} | "
            f"{_ratio(r['fp4_us'], r.get('dispatch_us'))} | "
            f"{_ratio(r.get('bf16_us'), r.get('dispatch_us'))} | "
            f"{_ratio(r.get('fp8_us'), r.get('dispatch_us'))} |"
        )
    for key in ("upstream_note", "moe_note", "fp8_note"):
        if data.get(key):
            lines += ["", f"Note ({key}): {data[key]}"]
    path.write_text("\n".join(lines) + "\n")


def write_outputs(data: dict[str, Any], out: Path) -> None:
    """bench.json, bench.md and bench.png (the plot: best effort) into OUT."""
    from fp4series import report

    report.write_json(out / "bench.json", data)
    write_markdown(data, out / "bench.md")
    try:
        sys.path.insert(0, str(REPO / "bench"))
        from plot import plot_bench

        plot_bench(data, out / "bench.png")
    except Exception as exc:  # the numbers matter more than the picture
        print(f"[bench] plot failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def render(path: Path) -> int:
    """A run's outputs again from its bench.json: its goals recomputed from its rows (the
    measurements and the run's metadata unchanged), bench.md and bench.png redrawn."""
    data = json.loads(path.read_text())
    data["goals"] = goal_rows(data["rows"])
    write_outputs(data, path.parent)
    print(f"[bench] rendered {path} (goals), bench.md, bench.png")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "reports" / "h200"))
    parser.add_argument("--upstream-tree", default=os.environ.get("FP4SERIES_UPSTREAM_TREE"))
    parser.add_argument("--replays", type=int, default=7)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    parser.add_argument("--no-moe", action="store_true")
    parser.add_argument(
        "--budget-s", type=float, default=None,
        help="stop starting new shapes (and skip upstream/MoE) once this many seconds are spent",
    )  # fmt: skip
    parser.add_argument("--render", metavar="BENCH_JSON",
                        help="no GPU: recompute a run's goals from its rows, rewrite its "
                             "bench.json and bench.md / bench.png beside it")  # fmt: skip
    parser.add_argument("--upstream-worker", help=argparse.SUPPRESS)
    extra = shlex.split(os.environ.get("FP4SERIES_BENCH_ARGS", ""))  # options a stage adds
    args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), *extra])
    if args.render:
        return render(Path(args.render))
    if not torch.cuda.is_available():
        print("bench_fp4_marlin: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    if args.upstream_worker:
        return upstream_worker(Path(args.upstream_worker), args.replays)

    import _jitenv

    from fp4series import report

    _jitenv.apply_variant()
    from test_marlin_numerics import dense_gemm  # after the variant: it reads _jitenv on import

    t0 = time.time()
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [s for s in args.shapes.split(",") if s]
    bw = copy_bandwidth_tb_s()
    print(f"[bench] copy bandwidth {bw:.2f} TB/s, L2 {l2_bytes() / 2**20:.0f} MiB", flush=True)
    rows: list[dict[str, Any]] = []
    fp4_tensors: dict[str, dict[str, torch.Tensor]] = {}
    skipped: list[str] = []
    last_shape_s = 0.0
    fp8_note = ""
    if torch.cuda.get_device_capability() < FP8_FROM:
        fp8_note = f"FP8 not timed: e4m3 GEMMs need SM{''.join(map(str, FP8_FROM))} or newer"
    for i, shape in enumerate(shapes):
        if args.budget_s is not None and time.time() - t0 + last_shape_s > args.budget_s:
            skipped = shapes[i:]
            print(f"[bench] time budget {args.budget_s:.0f} s: skipping {skipped}", flush=True)
            break
        t_shape = time.time()
        n, k = SHAPES[shape]
        base = fp4_weight_tensors(n, k, seed=100 + i)
        steady_clocks()
        fp4, dispatch, dequant = bench_fp4(n, k, base, ms, args.replays)
        steady_clocks()
        bf16 = bench_bf16(n, k, ms, args.replays)
        steady_clocks()
        int4 = bench_int4(n, k, ms, args.replays)
        steady_clocks()
        epilogue, unfused = bench_epilogue(n, k, base, ms, args.replays)
        fp8: dict[int, tuple[float, float]] = {}
        if not fp8_note:
            try:
                steady_clocks()
                fp8 = bench_fp8(n, k, ms, args.replays)
            except Exception as exc:  # a column beside the others: keep the shape
                fp8_note = f"FP8 failed on {shape}: {type(exc).__name__}: {exc}"
        fp4_tensors[shape] = base
        for m in ms:
            rows.append({
                "shape": shape, "kind": "dense", "m": m, "n": n, "k": k,
                "fp4_us": fp4[m][0], "bf16_us": bf16[m][0], "int4_us": int4[m][0],
                "roofline_us": roofline_us(m, n, k, bw), "upstream_fp4_us": None,
                "fp4_best_us": fp4[m][1], "bf16_best_us": bf16[m][1], "int4_best_us": int4[m][1],
                "dispatch_us": dispatch[m][0], "dispatch_best_us": dispatch[m][1],
                "dispatch_path": dense_gemm(m, DTYPE),
                "dequant_us": dequant[m][0] if m in dequant else None,
                "fp8_us": fp8[m][0] if m in fp8 else None,
                "fp8_best_us": fp8[m][1] if m in fp8 else None,
                "epilogue_us": epilogue[m][0],
                "epilogue_unfused_us": unfused[m][0] if m in unfused else None,
            })  # fmt: skip
        print(f"[bench] {shape}: done at {time.time() - t0:.0f} s", flush=True)
        torch.cuda.empty_cache()
        last_shape_s = time.time() - t_shape
    over = args.budget_s is not None and time.time() - t0 > args.budget_s
    upstream_note = ""
    if args.upstream_tree and over:
        upstream_note = "upstream 0.5.23 not run: --budget-s spent"
    elif args.upstream_tree and (why_not := wait_upstream_build(t0, args.budget_s)):
        upstream_note = why_not
    elif args.upstream_tree:
        up, upstream_note = run_upstream(args.upstream_tree, fp4_tensors, ms, args.replays)
        for row in rows:
            got = up.get((row["shape"], row["m"]))
            if got:
                row["upstream_fp4_us"], row["upstream_fp4_best_us"] = got
        print(f"[bench] upstream 0.5.23 done at {time.time() - t0:.0f} s", flush=True)
    else:
        upstream_note = "no --upstream-tree (FP4SERIES_UPSTREAM_TREE): upstream 0.5.23 not run"
    del fp4_tensors
    moe_note = ""
    if not args.no_moe and over:
        moe_note = "MoE not run: --budget-s spent"
    elif not args.no_moe:
        try:
            moe_rows, moe_note = bench_moe(ms, args.replays, bw)
            for r in moe_rows:
                r["note"] = moe_note or "MoE row"
                r["fp8_us"] = None  # the FP8 column is dense only
            rows += moe_rows
        except Exception as exc:
            moe_note = f"MoE benchmark failed: {type(exc).__name__}: {exc}"
        print(f"[bench] MoE done at {time.time() - t0:.0f} s", flush=True)
    command = os.environ.get("FP4SERIES_REPORT_COMMAND") or (
        "python bench/bench_fp4_marlin.py " + " ".join(argv or sys.argv[1:])
    )
    data = report.run_metadata(command)
    data.update(
        method=(
            f"median of {args.replays} CUDA-graph replays, >= 24 calls per graph, weights rotated "
            f"over >= 3x L2 ({l2_bytes() / 2**20:.0f} MiB); bf16 activations; FP4 = the series' "
            "apply_fp4_marlin_linear with its Marlin GEMM at every M, dispatch = the same op as "
            "served (dispatch_path; = FP4 where that is Marlin); INT4 = GPTQ uint4b8 "
            f"g{INT4_GROUP}; MoE E={MOE['e']} top-{MOE['topk']} hidden {MOE['hidden']} "
            f"inter {MOE['inter']}, MoE roofline counts the expected touched experts"
        ),
        copy_bandwidth_tb_s=bw,
        l2_bytes=l2_bytes(),
        seconds=round(time.time() - t0, 1),
        upstream_note=upstream_note,
        moe_note=moe_note,
        fp8_note=fp8_note,
        shapes_skipped_for_budget=skipped,
        rows=rows,
        goals=goal_rows(rows),
    )
    out = Path(args.out)
    write_outputs(data, out)
    print(f"[bench] wrote {out / 'bench.json'}, bench.md, bench.png in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
