"""One GPU round of the new NVFP4 kernels: build, prove, time, beside FP4 Marlin in one process.

On a CUDA host with the patched SGLang tree importable (``scripts/gpu-proof.sh --stages kernels``
sets that up, from a bundle on an offline host):

1. builds ``fp4_gemv.cu`` + ``fp4_dequant.cu`` with nvcc (seconds; ptxas report and SASS
   instruction counts into ``build.txt``);
2. proves the layout model: SGLang's real ``gptq_marlin_repack`` output equals
   ``_marlin_layout.repack_codes``, and a prepared layer's bytes decode (model and the dequant
   kernel) to the checkpoint's fp32 weights;
3. for the eight Llama-3.1 shapes of bench_fp4_marlin.py: a layer with random FP4 codes and
   non-uniform block scales through ``prepare_nvfp4_layer_for_marlin``, the new paths checked
   against an fp32 reference of the same FP4 weights (rel. L2 <= 1e-2, outputs poisoned with
   NaN first, with and without a column scale + bias; bf16, and fp16 on two shapes; gemv split
   configurations at M = 1 and 16; bitwise repeatability), then timed beside FP4 Marlin, bf16
   cuBLAS and the HBM roofline with bench_fp4_marlin.py's own helpers (CUDA graphs, weights
   rotated past L2, median of replays);
4. writes ``kernels.json`` (every row, check and goal), ``kernels.md`` (the table),
   ``dispatch.json`` (per shape, the fastest measured path per M and the crossovers) and
   prints a short table last.

Usage: python bench/kernels/run_round.py --out DIR [--shapes a,b] [--ms 1,2,...] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _p in (HERE, REPO / "bench", REPO / "tests" / "gpu", REPO / "tests" / "sglang", REPO / "src"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _marlin_layout as ml  # noqa: E402
import bench_fp4_marlin as bfm  # noqa: E402
import fp4_kernels as fk  # noqa: E402
import sass_mix  # noqa: E402

MS = (1, 2, 4, 8, 16, 32, 64, 256, 1024)
GATE = 1e-2
FP16_SHAPES = ("qkv_8b", "down_8b")
FP16_MS = (1, 8, 16, 64, 1024)
SWEEP_MS = (1, 16)
# the gemv's loader per checked path (Kernels.loader): the ring, round 3's workspace end
LOADER_OF = {"gemv_ring": fk.Kernels.RING, "gemv_ws": fk.Kernels.COPY_WS}
# the gemv paths the dispatch may take on this GPU: the default end and round 3's (SM90); the
# ring is what SM80-89 run, timed beside on SM90 but not a path there
GEMV_PATHS = ("gemv", "gemv_ws")
PREFILL_FROM = 64  # prefill is timed from this M on, gemv up to MAX_GEMV_M
OVERLAP_FROM = 256
FP8_FROM = bfm.FP8_FROM
# Prefill scratch budgets timed (MiB): one chunk well inside L2, the default, a wide one.
PREFILL_SCRATCH_MIB = (24, 64, 160)
OVERLAP_SCRATCH = 64 << 20  # per buffer (two buffers)
START = time.time()


def log(msg: str) -> None:
    print(f"[kernels {time.time() - START:5.0f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- build


def sass_summary(so: Path) -> str:
    """Per kernel: counts of the instructions that matter (wide loads, mma, local memory); per
    gemv instantiation its instructions per weight tile and the roofline share issue allows
    at one and at round 1's profiled instructions per scheduler per cycle (sass_mix.py)."""
    tool = sass_mix.cuobjdump_path()
    if tool is None:
        return "cuobjdump not found: no SASS summary\n"
    proc = subprocess.run([tool, "--dump-sass", str(so)], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"cuobjdump failed: {proc.stderr[-500:]}\n"
    keys = ("LDG.E.NA.LTC256B.128", "LDG.E.NA.64", "LDG.E.128", "HMMA.16816", "HMUL2", "LDS.64",
            "STG.E.128", "LDL", "STL", "BAR.SYNC")  # fmt: skip
    lines = []
    for fn, ops in sass_mix.functions(proc.stdout).items():
        counts = {k: sum(op.startswith(k) for op in ops) for k in keys}
        lines.append(fn + ": " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    try:
        rates = [1.0, sass_mix.PROFILED_ISSUE_RATE]
        per_tile = sass_mix.table(sass_mix.gemv_mixes(proc.stdout), rates)
    except ValueError as exc:  # the loop's shape changed: the counts above still stand
        per_tile = f"no per-tile counts: {exc}"
    return "\n".join(lines) + f"\n\n## per weight tile\n{per_tile}\n{sass_mix.BASIS}\n"


# ----------------------------------------------------------------------------- layers


def make_layer(n: int, k: int, dtype: torch.dtype, seed: int, smallest: float) -> tuple:
    """(checkpoint weight, global multiplier, prepared tensors) of one random NVFP4 layer."""
    from _reference import random_nvfp4_weight
    from sglang.srt.layers.quantization.marlin_utils_fp4 import prepare_nvfp4_layer_for_marlin
    from test_marlin_numerics import RECIPE_MULTIPLIER

    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = random_nvfp4_weight(n, k, gen, smallest=smallest)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w.packed.clone(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(w.scales.clone(), requires_grad=False)
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.params_dtype = layer.orig_dtype = dtype
    layer.weight_global_scale = torch.nn.Parameter(
        torch.tensor(RECIPE_MULTIPLIER, device="cuda"), requires_grad=False
    )
    prepare_nvfp4_layer_for_marlin(layer)
    return w, RECIPE_MULTIPLIER, fk.PreparedTensors.from_layer(layer)


def reference_weight(w: Any, g: float) -> torch.Tensor:
    from _reference import dequant_nvfp4

    return dequant_nvfp4(w.packed, w.scales, g)  # fp32 [N, K] on the GPU


def with_epilogue(t: fk.PreparedTensors, seed: int, out_rms: float) -> fk.PreparedTensors:
    """The same weights with a column scale in [0.5, 2) and a bias of the output's size."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cs = torch.rand(t.size_n, generator=gen, device="cuda") * 1.5 + 0.5
    bias = (torch.randn(t.size_n, generator=gen, device="cuda") * out_rms).to(t.act_dtype)
    return fk.PreparedTensors(t.weight, t.weight_scale, t.weight_global_scale, t.size_n,
                              t.size_k, cs, bias)  # fmt: skip


def marlin_apply(t: fk.PreparedTensors) -> Callable[[torch.Tensor], torch.Tensor]:
    from sglang.srt.layers.quantization.marlin_utils import marlin_make_workspace
    from sglang.srt.layers.quantization.marlin_utils_fp4 import apply_fp4_marlin_linear

    ws = marlin_make_workspace(torch.device("cuda"))

    def run(x: torch.Tensor) -> torch.Tensor:
        return apply_fp4_marlin_linear(x, t.weight, t.weight_scale, t.weight_global_scale, ws,
                                       t.size_n, t.size_k, bias=t.bias,
                                       output_scale=t.weight_output_scale)  # fmt: skip

    return run


# ----------------------------------------------------------------------------- checks


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    from _reference import rel_l2 as r

    return r(out, ref)


def check_layout(kernels: fk.Kernels, checks: list[dict[str, Any]]) -> None:
    """The CPU model against SGLang's real repack, and a prepared layer's decode."""
    from sglang.jit_kernel.gptq_marlin_repack import gptq_marlin_repack

    gen = torch.Generator().manual_seed(11)
    n, k = 256, 512
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    gptq = packed.view(torch.int32).T.contiguous()  # what _fp4_to_marlin hands the repack
    real = gptq_marlin_repack(gptq.cuda(), torch.empty(0, dtype=torch.int32, device="cuda"),
                              k, n, 4).cpu()  # fmt: skip
    model = ml.repack_codes(codes)
    checks.append({"check": "repack model == gptq_marlin_repack", "n": n, "k": k,
                   "passed": bool(torch.equal(real, model)),
                   "mismatching_ints": int((real != model).sum())})  # fmt: skip
    for dtype, smallest in ((torch.bfloat16, 2.0**-6), (torch.float16, 2.0**-9)):
        w, g, t = make_layer(1024, 2048, dtype, seed=5, smallest=smallest)
        codes_ok = torch.equal(ml.unrepack_codes(t.weight.cpu()),
                               ml.codes_from_checkpoint(w.packed.cpu()))  # fmt: skip
        scales_ok = torch.equal(ml.unprocess_scales(t.weight_scale.cpu()), w.scales.float().cpu())
        g_eff = ml.decode_global_scale(t.weight_global_scale.cpu(), dtype)
        g_ok = abs(g_eff / g - 1) <= 2.0**-8
        checks.append({"check": "prepared layer decodes to the checkpoint (model)",
                       "dtype": str(dtype), "codes": codes_ok, "scales": scales_ok,
                       "g": g, "g_effective": g_eff,
                       "passed": codes_ok and scales_ok and g_ok})  # fmt: skip
        model_w = ml.dequant(t.weight, t.weight_scale, t.weight_global_scale, dtype, False)
        dq = fk.Fp4Linear(kernels, t).dequant_all().float().cpu()
        checks.append({"check": "dequant kernel == layout model (exact)", "dtype": str(dtype),
                       "passed": bool(torch.equal(dq, model_w)),
                       "max_abs_err": (dq - model_w).abs().max().item()})  # fmt: skip


def run_gemv_checked(lin: fk.Fp4Linear, x: torch.Tensor, cfg: tuple[int, int] | None) -> tuple:
    out = torch.full((x.shape[0], lin.t.size_n), float("nan"), dtype=x.dtype, device=x.device)
    wn, sp = cfg if cfg else (None, None)
    lin.gemv(x, out=out, wn=wn, splits=sp)
    out2 = torch.full_like(out, float("nan"))
    lin.gemv(x, out=out2, wn=wn, splits=sp)
    torch.cuda.synchronize()
    return out, bool(torch.equal(out, out2)), int(lin.buf.counters.abs().sum().item())


def check_shape(name: str, kernels: fk.Kernels, w: Any, g: float, t: fk.PreparedTensors,
                ms: Sequence[int], dtype: torch.dtype, sweep: bool,
                cases: list[dict[str, Any]]) -> None:  # fmt: skip
    """Every path and M against the fp32 reference, plain and with column scale + bias."""
    wref = reference_weight(w, g)
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(name.encode()))
    lin = fk.Fp4Linear(kernels, t)
    # Marlin's output beside (informative): bf16 only, the stage builds no fp16 Marlin module
    marlin = marlin_apply(t) if dtype == torch.bfloat16 else None
    for m in ms:
        x = torch.randn(m, t.size_k, generator=gen, device="cuda").to(dtype)
        ref = x.float() @ wref.t()
        rms = ref.pow(2).mean().sqrt().item()
        lin_e = fk.Fp4Linear(kernels, with_epilogue(t, m, rms))
        ref_e = ref * lin_e.t.weight_output_scale + lin_e.t.bias.float()
        paths: list[tuple[str, fk.Fp4Linear, torch.Tensor, Any]] = []  # (name, runner, ref, cfg)
        if m <= fk.MAX_GEMV_M:
            paths += [("gemv", lin, ref, None), ("gemv+epilogue", lin_e, ref_e, None)]
            if sweep and m in SWEEP_MS:
                paths += [(f"gemv wn={c[0]} splits={c[1]}", lin, ref, c)
                          for c in sweep_configs(lin, m)]  # fmt: skip
        small = lin.rows_for(min(PREFILL_SCRATCH_MIB) << 20)  # several chunks on every shape
        if m >= PREFILL_FROM or m == 1:
            paths += [("prefill", lin, ref, {}), ("prefill+epilogue", lin_e, ref_e, {}),
                      (f"prefill chunk_n={small}", lin, ref, {"chunk_n": small})]  # fmt: skip
        if m >= OVERLAP_FROM:
            paths += [(f"prefill_overlap chunk_n={small}", lin, ref,
                       {"overlap": True, "chunk_n": small}),
                      ("prefill_overlap+epilogue", lin_e, ref_e, {"overlap": True})]  # fmt: skip
        if m <= fk.MAX_GEMV_M and kernels.copy_engine:
            paths += [("gemv_ring", lin, ref, None), ("gemv_ring+epilogue", lin_e, ref_e, None),
                      ("gemv_ws", lin, ref, None)]  # fmt: skip
        for path, runner, r, cfg in paths:
            case: dict[str, Any] = {"shape": name, "dtype": str(dtype), "m": m, "path": path}
            try:
                if path.startswith("gemv"):
                    with kernels.using(LOADER_OF.get(path.split("+")[0], -1)):
                        out, repeat, counters = run_gemv_checked(runner, x, cfg)
                    case.update(repeatable=repeat, counters_reset=counters == 0)
                else:
                    out = torch.full((m, t.size_n), float("nan"), dtype=dtype, device="cuda")
                    runner.prefill(x, out=out, **cfg)
                    torch.cuda.synchronize()
                case["all_written"] = bool(torch.isfinite(out).all())
                case["rel_l2"] = rel_l2(out, r)
                case["passed"] = (case["rel_l2"] <= GATE and case["all_written"]
                                  and case.get("repeatable", True)
                                  and case.get("counters_reset", True))  # fmt: skip
            except Exception as exc:  # record and go on: one failure must not hide the rest
                case.update(passed=False, error=f"{type(exc).__name__}: {exc}")
            cases.append(case)
        if m <= fk.MAX_GEMV_M and kernels.copy_engine:
            cases.append(same_bits_both_ends(name, dtype, lin, x))
        if marlin is not None:
            cases.append(
                {
                    "shape": name,
                    "dtype": str(dtype),
                    "m": m,
                    "path": "marlin (beside, not gated)",
                    "rel_l2": rel_l2(marlin(x), ref),
                }
            )
    del wref
    torch.cuda.empty_cache()


def same_bits_both_ends(name: str, dtype: torch.dtype, lin: fk.Fp4Linear,
                        x: torch.Tensor) -> dict[str, Any]:  # fmt: skip
    """The cluster end and round 3's workspace end sum the same partials in the same order:
    at one (wn, splits) with several splits their outputs must be equal bit for bit. The
    configuration is the plan's (at least 2 splits), else fewer splits, where the default
    loader really takes the cluster end (a size that does not fit would compare the workspace
    end with itself)."""
    m = x.shape[0]
    n, k = lin.t.padded_n, lin.t.padded_k
    wn, planned = lin.plan(m)
    tries = [s for s in dict.fromkeys([max(planned, 2), 8, 4, 2]) if s <= k // 16]
    splits = next((s for s in tries if lin.k.end(m, n, k, wn, s) == "cluster"), tries[-1])
    case: dict[str, Any] = {
        "shape": name,
        "dtype": str(dtype),
        "m": m,
        "path": f"gemv cluster end == workspace end (wn={wn}, splits={splits})",
    }
    try:
        lin.reserve([m], [(wn, splits)])
        out, _, _ = run_gemv_checked(lin, x, (wn, splits))
        with lin.k.using(fk.Kernels.COPY_WS):
            out_ws, _, counters = run_gemv_checked(lin, x, (wn, splits))
        case.update(bitwise_equal=bool(torch.equal(out, out_ws)), counters_reset=counters == 0,
                    all_written=bool(torch.isfinite(out).all()),
                    end=lin.k.end(m, n, k, wn, splits))  # fmt: skip
        case["passed"] = (case["bitwise_equal"] and case["counters_reset"]
                          and case["all_written"] and case["end"] == "cluster")  # fmt: skip
    except Exception as exc:
        case.update(passed=False, error=f"{type(exc).__name__}: {exc}")
    return case


def sweep_configs(lin: fk.Fp4Linear, m: int) -> list[tuple[int, int]]:
    """A few (wn, splits) around the plan: the run measures what the heuristic guessed."""
    n_tiles, k_tiles = lin.t.padded_n // 64, lin.t.padded_k // 16
    auto = lin.plan(m)
    out = []
    # the copy engine runs wn 4 and 8 (fp4_gemv gives narrower blocks to the register ring)
    for wn in (4, 8) if lin.k.copy_engine else (1, 2, 4, 8):
        for s in (1, 2, 3, 4, 6, 8, 12, 16):
            if k_tiles / s / (8 // wn) >= 4 and (wn, s) != auto and n_tiles >= wn:
                out.append((wn, s))
    return out


# ----------------------------------------------------------------------------- timing


def prefill_variants(lin: fk.Fp4Linear) -> dict[str, int]:
    """Budget name -> chunk rows, budgets giving the same chunk dropped."""
    out: dict[str, int] = {}
    for mib in PREFILL_SCRATCH_MIB:
        rows = lin.rows_for(mib << 20)
        if rows not in out.values():
            out[f"{mib}M"] = rows
    return out


steady_clocks = bfm.steady_clocks  # one warm-up for the kernel rounds and bench.json


def timed(fns: Sequence[Callable[[], Any]], replays: int) -> tuple[float, float]:
    return bfm.time_graph(bfm.rotation(fns), replays)


bench_fp8 = bfm.bench_fp8  # one FP8 column for the kernel rounds and bench.json
geomean = bfm.geomean  # one geometric mean for the kernel rounds' goals and bench.md's


def bench_new(kernels: fk.Kernels, base: fk.PreparedTensors, ms: Sequence[int], replays: int,
              sweep: bool) -> dict[int, dict[str, Any]]:  # fmt: skip
    """Per M: {path: (median, best)} for the new paths, weights rotated past L2."""
    per_copy = base.weight.numel() * 4 + base.weight_scale.numel()
    tensors = [base] + [
        fk.PreparedTensors(base.weight.clone(), base.weight_scale.clone(),
                           base.weight_global_scale.clone(), base.size_n, base.size_k)
        for _ in range(bfm.copies_for(per_copy) - 1)
    ]  # fmt: skip
    first = fk.Fp4Linear(kernels, tensors[0])
    # one workspace, counter set, scratch and side stream: the calls are sequential
    lins = [first] + [fk.Fp4Linear(kernels, t, buffers=first.buf) for t in tensors[1:]]
    first.reserve(ms)
    if sweep:
        for m in SWEEP_MS:
            first.reserve([m], sweep_configs(first, m))
    variants = prefill_variants(first)
    out: dict[int, dict[str, Any]] = {}
    steady_clocks()
    for m in ms:
        x = torch.randn(m, base.size_k, device="cuda", dtype=base.act_dtype)
        res: dict[str, Any] = {}
        if m <= fk.MAX_GEMV_M:
            res["gemv"] = timed([lambda lin=lin, x=x: lin.gemv(x) for lin in lins], replays)
            res["gemv_config"] = first.plan(m)
            if kernels.copy_engine:  # the register ring (what SM80-89 run), round 3's end
                for path, which in LOADER_OF.items():
                    with kernels.using(which):
                        first.reserve([m])  # its own plan may split more
                        res[path] = timed([lambda lin=lin, x=x: lin.gemv(x) for lin in lins],
                                          replays)  # fmt: skip
                        res[f"{path}_config"] = first.plan(m)
            if m in SWEEP_MS:  # the fused epilogue (column scale + bias) at the same M
                epi = [fk.Fp4Linear(kernels, with_epilogue(lin.t, m, 1.0), buffers=first.buf)
                       for lin in lins]  # fmt: skip
                res["gemv+epilogue"] = timed([lambda lin=lin, x=x: lin.gemv(x) for lin in epi],
                                             replays)  # fmt: skip
            if sweep and m in SWEEP_MS:
                res["sweep"] = {}
                for c in sweep_configs(first, m):
                    fns = [
                        lambda lin=lin, x=x, c=c: lin.gemv(x, wn=c[0], splits=c[1]) for lin in lins
                    ]
                    res["sweep"][f"{c[0]},{c[1]}"] = timed(fns, replays)[0]
        if m >= PREFILL_FROM:
            for name, rows in variants.items():
                fns = [lambda lin=lin, x=x, r=rows: lin.prefill(x, chunk_n=r) for lin in lins]
                res[f"prefill@{name}"] = timed(fns, replays)
        if m >= OVERLAP_FROM:
            ov = first.rows_for(OVERLAP_SCRATCH)
            fns = [
                lambda lin=lin, x=x, r=ov: lin.prefill(x, overlap=True, chunk_n=r) for lin in lins
            ]
            res[f"prefill_overlap@{OVERLAP_SCRATCH >> 20}M"] = timed(fns, replays)
        out[m] = res
    if ms[0] <= fk.MAX_GEMV_M:  # the first group once more, last: does the order show?
        x = torch.randn(ms[0], base.size_k, device="cuda", dtype=base.act_dtype)
        out[ms[0]]["gemv_repeat"] = timed([lambda lin=lin: lin.gemv(x) for lin in lins], replays)
    del lins, tensors
    torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------- goals


def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, from the measured rows (new = the fastest new path at that M)."""

    def sel(lo: int, hi: int) -> list[dict[str, Any]]:
        return [r for r in rows if lo <= r["m"] <= hi and r.get("new_us")]

    g: dict[str, Any] = {}
    g["m1_4_geomean_vs_marlin"] = geomean([r["marlin_us"] / r["new_us"] for r in sel(1, 4)])
    g["m8_16_geomean_vs_marlin"] = geomean([r["marlin_us"] / r["new_us"] for r in sel(8, 16)])
    g["m1_roofline_fraction"] = {r["shape"]: r["roofline_us"] / r["new_us"] for r in sel(1, 1)}
    g["m1_roofline_goal_shapes"] = [r["shape"] for r in sel(1, 1) if r["roofline_m1_us"] >= 8.0]
    g["m1_roofline_goal_met"] = all(g["m1_roofline_fraction"][s] >= 0.7
                                    for s in g["m1_roofline_goal_shapes"])  # fmt: skip
    g["m32_64_bf16_over_new"] = {f"{r['shape']}@{r['m']}": r["bf16_us"] / r["new_us"]
                                 for r in sel(32, 64)}  # fmt: skip
    g["m1024_bf16_over_new"] = {r["shape"]: r["bf16_us"] / r["new_us"] for r in sel(1024, 1 << 30)}
    g["new_slower_than_marlin"] = [f"{r['shape']}@{r['m']}" for r in rows
                                   if r.get("new_us") and r["new_us"] > r["marlin_us"]]  # fmt: skip
    g["goal_m1_4"] = (g["m1_4_geomean_vs_marlin"] or 0) >= 1.5
    g["goal_m8_16"] = (g["m8_16_geomean_vs_marlin"] or 0) >= 1.25
    g["goal_m32_64"] = all(v >= 1.0 for v in g["m32_64_bf16_over_new"].values())
    g["goal_m1024"] = all(v >= 0.8 for v in g["m1024_bf16_over_new"].values())
    return g


def dispatch_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape: the fastest measured path per M (Marlin included) and where it changes."""
    table: dict[str, Any] = {}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        best = []
        for r in sorted((r for r in rows if r["shape"] == shape), key=lambda r: r["m"]):
            cands = {"marlin": r["marlin_us"], **{p: v for p, v in r["paths_us"].items() if v}}
            path = min(cands, key=cands.__getitem__)
            best.append({"m": r["m"], "path": path, "us": cands[path]})
        crossovers = [(b["m"], b["path"]) for i, b in enumerate(best)
                      if i == 0 or b["path"] != best[i - 1]["path"]]  # fmt: skip
        table[shape] = {"best": best, "crossovers": crossovers, "dispatch": dispatch_entries(best)}
    return table


def dispatch_entries(best: list[dict[str, Any]]) -> list[list[Any]]:
    """fp4_kernels.DISPATCH's form of one shape's winners: [upper M, path], each path up to the
    last measured M it won (the next path from there on), the last one open-ended."""
    entries: list[list[Any]] = []
    for b in best:
        if entries and entries[-1][1] == b["path"]:
            entries[-1][0] = b["m"]
        else:
            entries.append([b["m"], b["path"]])
    if entries:
        entries[-1][0] = fk.OPEN_END
    return entries


# ----------------------------------------------------------------------------- main


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def write_md(data: dict[str, Any], path: Path) -> None:
    lines = ["# NVFP4 kernels round: new paths beside FP4 Marlin", "",
             f"Device: {data['device']}, torch {data['torch']}, copy bandwidth "
             f"{data['copy_bandwidth_tb_s']:.2f} TB/s (roofline), {data['seconds']} s.",
             f"Command: `{data['command']}`", "", f"Method: {data['method']}", "",
             "Times in microseconds (median). new = the fastest new path at that M "
             "(gemv: M <= 64, its splits summed through the cluster; gemv_ws: the same with "
             "round 3's workspace end; prefill: dequant into scratch + cuBLAS). Ratios > 1: new "
             "is faster.",
             "gemv ring: the gemv with its register-ring loader (SM80-89's; on SM90 the copy "
             "engine loads its weights), timed beside; gemv ws: the copy-engine gemv with round "
             "3's end (splits summed through a global workspace, its own plan) where the gemv's "
             "splits sum through the cluster; gemv+epi: the gemv with a column scale and a bias "
             "in its epilogue (M 1 and 16).",
             "fp8: FP8 e4m3 weights and activations through cuBLASLt (torch._scaled_mm, "
             "per-tensor scales), the GEMM alone (a W8A8 layer also quantizes its input).",
             "", "| shape | N | K | M | Marlin | new | path | gemv | gemv ring | gemv ws | "
             "gemv+epi | prefill | bf16 | fp8 | roofline | Marlin/new | bf16/new | fp8/new "
             "| roof/new |",
             "|---" * 19 + "|"]  # fmt: skip
    for r in data["rows"]:
        p = r["paths_us"]
        new = r.get("new_us")
        lines.append(
            f"| {r['shape']} | {r['n']} | {r['k']} | {r['m']} | {fmt(r['marlin_us'])} | "
            f"{fmt(new)} | {r.get('new_path', '-')} | {fmt(p.get('gemv'))} | "
            f"{fmt(r.get('gemv_ring_us'))} | {fmt(r.get('gemv_ws_us'))} | "
            f"{fmt(r.get('gemv_epilogue_us'))} | "
            f"{fmt(min([v for k, v in p.items() if k.startswith('prefill') and v] or [None]))} | "
            f"{fmt(r['bf16_us'])} | {fmt(r.get('fp8_us'))} | {fmt(r['roofline_us'])} | "
            f"{fmt(r['marlin_us'] / new if new else None, '.2f')} | "
            f"{fmt(r['bf16_us'] / new if new else None, '.2f')} | "
            f"{fmt(r['fp8_us'] / new if new and r.get('fp8_us') else None, '.2f')} | "
            f"{fmt(r['roofline_us'] / new if new else None, '.2f')} |"
        )  # fmt: skip
    failed = [c for c in data["cases"] if c.get("passed") is False]
    lines += [
        "",
        f"Checks: {len(data['cases'])} cases, {len(failed)} failed; layout checks: "
        + ", ".join(
            f"{c['check']} {'pass' if c['passed'] else 'FAIL'}" for c in data["layout_checks"]
        ),  # fmt: skip
        "",
        "Goals: " + json.dumps(data["goals"], indent=1),
    ]
    path.write_text("\n".join(lines) + "\n")


def shape_rows(shape: str, n: int, k: int, ms: Sequence[int], bw: float, marlin: dict,
               bf16: dict, fp8: dict, new: dict,
               sweeps: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for m in ms:
        res = new[m]
        paths = {p: v[0] for p, v in res.items() if p in GEMV_PATHS or p.startswith("prefill")}
        best_path = min(paths, key=paths.__getitem__) if paths else None
        if "sweep" in res:
            sweeps[f"{shape}@{m}"] = {"auto": list(res["gemv_config"]),
                                      "auto_us": res["gemv"][0], **res["sweep"]}  # fmt: skip
        rows.append({
            "shape": shape, "n": n, "k": k, "m": m,
            "marlin_us": marlin[m][0], "marlin_best_us": marlin[m][1],
            "bf16_us": bf16[m][0], "bf16_best_us": bf16[m][1],
            "fp8_us": fp8[m][0] if m in fp8 else None,
            "roofline_us": bfm.roofline_us(m, n, k, bw),
            "roofline_m1_us": bfm.roofline_us(1, n, k, bw),
            "paths_us": paths, "gemv_config": res.get("gemv_config"),
            "gemv_ring_us": res["gemv_ring"][0] if "gemv_ring" in res else None,
            "gemv_ws_us": res["gemv_ws"][0] if "gemv_ws" in res else None,
            "gemv_ws_config": res.get("gemv_ws_config"),
            "gemv_epilogue_us": res["gemv+epilogue"][0] if "gemv+epilogue" in res else None,
            "gemv_repeat_us": res["gemv_repeat"][0] if "gemv_repeat" in res else None,
            "new_us": paths[best_path] if best_path else None, "new_path": best_path,
        })  # fmt: skip
    return rows


def scratch_info(lin: fk.Fp4Linear) -> dict[str, Any]:
    info = {name: {"chunk_n": r, "bytes": lin.scratch_size(r), "chunks": len(lin.chunks(r))}
            for name, r in prefill_variants(lin).items()}  # fmt: skip
    ov = lin.rows_for(OVERLAP_SCRATCH)
    info["overlap"] = {"chunk_n": ov, "bytes": lin.scratch_size(ov, True),
                       "chunks": len(lin.chunks(ov))}  # fmt: skip
    return info


def print_summary(data: dict[str, Any]) -> None:
    print("\nshape        M  Marlin    new  path                 bf16   roof  Marlin/new roof/new")
    for r in data["rows"]:
        if r["m"] in (1, 4, 16, 64, 1024) and r["new_us"]:
            new = r["new_us"]
            print(f"{r['shape']:<11} {r['m']:>4} {r['marlin_us']:7.1f} {new:6.1f}  "
                  f"{str(r['new_path']):<19} {r['bf16_us']:7.1f} {r['roofline_us']:6.1f}  "
                  f"{r['marlin_us'] / new:6.2f}    {r['roofline_us'] / new:5.2f}")  # fmt: skip
    gl = data["goals"]
    print(f"M1-4 geomean vs Marlin {fmt(gl['m1_4_geomean_vs_marlin'], '.2f')}, M8-16 "
          f"{fmt(gl['m8_16_geomean_vs_marlin'], '.2f')}, roofline goal met: "
          f"{gl['m1_roofline_goal_met']}, M1024 goal: {gl['goal_m1024']}, M32-64 goal: "
          f"{gl['goal_m32_64']}")  # fmt: skip
    failed = [c for c in data["cases"] + data["layout_checks"] if c.get("passed") is False]
    print(
        f"checks: {len(data['cases'])} cases + {len(data['layout_checks'])} layout, "
        f"{len(failed)} failed" + "".join(f"\n  FAILED {c}" for c in failed[:10])
    )
    if data["errors"]:
        print("errors:" + "".join(f"\n  {e}" for e in data["errors"]))


def main(argv: Sequence[str] | None = None) -> int:
    argv = [*(sys.argv[1:] if argv is None else argv),
            *shlex.split(os.environ.get("FP4SERIES_KERNELS_ARGS", ""))]  # fmt: skip
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shapes", default=",".join(bfm.SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="start no new shape after this many seconds")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="two shapes, M 1, 16, 64, 1024")
    ap.add_argument("--no-sweep", action="store_true", help="skip the gemv (wn, splits) sweep")
    args = ap.parse_args(argv)
    deadline = os.environ.get("FP4SERIES_DEADLINE_EPOCH")  # scripts/gpu-proof.sh --deadline
    if deadline:
        args.budget_s = min(args.budget_s, float(deadline) - START - 90.0)
    if not torch.cuda.is_available():
        print("run_round: no CUDA device; nothing to run", file=sys.stderr)
        return 2
    cap = torch.cuda.get_device_capability()
    shapes = [s for s in args.shapes.split(",") if s]
    ms = [int(m) for m in args.ms.split(",")]
    if args.quick:
        shapes, ms = ["qkv_8b", "down_70b"], [1, 16, 64, 1024]
    args.out.mkdir(parents=True, exist_ok=True)

    so = fk.build(args.out / "build", cap)
    kernels = fk.Kernels(so)
    ptxas = so.with_name(so.name.replace("libfp4k-", "ptxas-").replace(".so", ".txt"))
    build = ptxas.read_text() + "\n# SASS\n" + sass_summary(so)
    (args.out / "build.txt").write_text(build.replace(f"{REPO}/", ""))  # paths in the repository
    log(f"built {so.name}")

    import _jitenv

    from fp4series import report

    _jitenv.apply_variant()
    torch.backends.cuda.matmul.allow_tf32 = False
    command = os.environ.get("FP4SERIES_REPORT_COMMAND") or (
        "python bench/kernels/run_round.py " + " ".join(argv)
    )
    data = report.run_metadata(command)
    data.update(
        method=(f"median of {args.replays} CUDA-graph replays, >= 24 calls per graph, weights "
                f"rotated over >= 3x L2 ({bfm.l2_bytes() / 2**20:.0f} MiB) with "
                "bench_fp4_marlin.py's helpers; bf16 activations; roofline = (N*K/2 + N*K/16 + "
                "2*M*K + 2*M*N) bytes / copy bandwidth; checks: rel. L2 vs an fp32 reference of "
                f"the same FP4 weights, gate {GATE}, outputs poisoned with NaN"),
        library=so.name, capability=list(cap), complete=False, errors=[], scratch={},
        shapes_skipped_for_budget=[], layout_checks=[], cases=[], rows=[], sweeps={},
        # which kernels ran: series_revision names the series (on a GPU host, the bundle's)
        kernel_sources=fk.source_hashes(),
    )  # fmt: skip

    def save() -> None:
        """Reports as they stand (after every shape: a stopped run keeps what it measured)."""
        data["seconds"] = round(time.time() - START, 1)
        data["goals"] = goals(data["rows"])
        data["dispatch"] = dispatch_table(data["rows"])
        report.write_json(args.out / "kernels.json", data)
        (args.out / "dispatch.json").write_text(json.dumps(
            {"source": command, "date": data["date"], "device": data["device"],
             "shapes": data["dispatch"]}, indent=1) + "\n")  # fmt: skip
        write_md(data, args.out / "kernels.md")

    def guarded(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # record, go on with the next part
            data["errors"].append(f"{what}: {type(exc).__name__}: {exc}")
            log(f"{what} FAILED: {type(exc).__name__}: {exc}")
            torch.cuda.empty_cache()
            return None

    guarded("layout", lambda: check_layout(kernels, data["layout_checks"]))
    log("layout: " + ", ".join(f"{c['check']}={c['passed']}" for c in data["layout_checks"]))
    data["copy_bandwidth_tb_s"] = bw = bfm.copy_bandwidth_tb_s()
    log(f"copy bandwidth {bw:.2f} TB/s, L2 {bfm.l2_bytes() / 2**20:.0f} MiB")
    save()

    def one_shape(i: int, shape: str) -> None:
        n, k = bfm.SHAPES[shape]
        w, g, t = make_layer(n, k, torch.bfloat16, seed=100 + i, smallest=2.0**-6)
        check_shape(shape, kernels, w, g, t, ms, torch.bfloat16, not args.no_sweep,
                    data["cases"])  # fmt: skip
        del w
        bad = [c for c in data["cases"] if c["shape"] == shape and c.get("passed") is False]
        log(f"{shape}: checked ({len(bad)} failed)")
        base = {"weight": t.weight, "scale": t.weight_scale, "global_scale": t.weight_global_scale}
        steady_clocks()
        marlin = bfm.bench_fp4(n, k, base, ms, args.replays)[0]  # Marlin at every M
        steady_clocks()
        bf16 = bfm.bench_bf16(n, k, ms, args.replays)
        fp8: dict[int, tuple[float, float]] = {}
        if cap >= FP8_FROM:  # FP8 e4m3 GEMMs need SM89 or newer
            steady_clocks()
            try:
                fp8 = bench_fp8(n, k, ms, args.replays)
            except Exception as exc:  # the FP8 column is beside the round: keep the shape
                data["errors"].append(f"{shape} fp8: {type(exc).__name__}: {exc}")
        new = bench_new(kernels, t, ms, args.replays, not args.no_sweep)
        data["scratch"][shape] = scratch_info(fk.Fp4Linear(kernels, t))
        rows = shape_rows(shape, n, k, ms, bw, marlin, bf16, fp8, new, data["sweeps"])
        data["rows"] += rows
        log(f"{shape}: timed; M={ms[0]} Marlin {rows[0]['marlin_us']:.1f} us, new "
            f"{fmt(rows[0]['new_us'])} us, roofline {rows[0]['roofline_us']:.1f} us")  # fmt: skip

    for i, shape in enumerate(shapes):
        if time.time() - START > args.budget_s:
            data["shapes_skipped_for_budget"] = shapes[i:]
            log(f"budget spent: skipping {shapes[i:]}")
            break
        guarded(shape, lambda i=i, shape=shape: one_shape(i, shape))
        torch.cuda.empty_cache()
        save()

    def fp16_checks(shape: str) -> None:
        n, k = bfm.SHAPES[shape]
        w, g, t = make_layer(n, k, torch.float16, seed=200, smallest=2.0**-9)
        check_shape(shape, kernels, w, g, t, [m for m in FP16_MS if m in ms or args.quick],
                    torch.float16, False, data["cases"])  # fmt: skip

    def subnormal_checks(shape: str) -> None:
        """bf16 with E4M3-subnormal block scales: Marlin flushes them (with a warning), the
        new kernels decode every scale byte; both against the checkpoint's own weights."""
        n, k = bfm.SHAPES[shape]
        w, g, t = make_layer(n, k, torch.bfloat16, seed=300, smallest=2.0**-9)
        sub: list[dict[str, Any]] = []
        check_shape(shape, kernels, w, g, t, [1, 16], torch.bfloat16, False, sub)
        for c in sub:
            c["variant"] = "bf16 with E4M3 subnormal block scales (Marlin flushes them)"
        data["cases"] += sub

    done = [s for s in shapes if s not in data["shapes_skipped_for_budget"]]
    for shape in [s for s in FP16_SHAPES if s in done]:
        guarded(f"{shape} fp16", lambda shape=shape: fp16_checks(shape))
        log(f"{shape}: fp16 checked")
    if done:
        guarded("subnormal scales", lambda: subnormal_checks(done[0]))
    data["complete"] = not data["errors"] and not data["shapes_skipped_for_budget"]
    save()
    print_summary(data)
    print(f"wrote {args.out}/kernels.json, kernels.md, dispatch.json, build.txt "
          f"in {time.time() - START:.0f} s")  # fmt: skip
    failed = [c for c in data["cases"] + data["layout_checks"] if c.get("passed") is False]
    return 1 if failed or data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
