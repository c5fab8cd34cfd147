"""Run the SM75 (Turing) FP4 Marlin path on a newer GPU through compute_75 PTX.

Why: no Turing GPU is available. A module built as compute_75 PTX only (no SASS)
is JIT-compiled by the driver with __CUDA_ARCH__ == 750, so the Turing code path
of the patched Marlin templates (synchronous global->shared copies, two m16n8k8
mma per m16n8k16) is what runs. This script builds the dense `gptq_marlin` and
`gptq_marlin_repack` JIT modules that way (`compute75_ptx_builds`: tvm-ffi's
gencode target replaced by `-gencode=arch=compute_75,code=compute_75`, plus
`override_jit_cuda_arch(7, 5)` for -DSGL_CUDA_ARCH=750, in a separate cache dir),
proves the library holds only compute_75 PTX of the Turing path, and checks FP4
GEMMs in fp16 against an fp32 reference from the same FP4 codes and non-uniform
FP8 block scales. It also checks that bf16 on SM75 fails with a clear message.
`--moe` adds the MoE module (`moe_wna16_marlin`) and MoE cases.

Usage (patched SGLang python tree on PYTHONPATH, CUDA GPU, nvcc, ninja, apache-tvm-ffi):
    PYTHONPATH=/path/to/patched/python python tests/gpu/turing_ptx_check.py [--moe] \
        [--json reports/h200/turing_ptx_check.json]
Exit status 0 only if every check passes. Speed is not measured: PTX JIT on a
newer GPU says nothing about Turing performance.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch

TOL = 1e-2
PTX_TARGET = "-gencode=arch=compute_75,code=compute_75"
# float4_e2m1f id of sgl_kernel.scalar_type (used if sgl_kernel cannot be imported).
FLOAT4_E2M1F_ID = 562949953487106
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
CASES = [  # (m, n, k, use_fp32_reduce); n=256 with long k splits slices across blocks
    (1, 4096, 4096, True),
    (7, 4096, 4096, True),
    (16, 4096, 4096, False),
    (33, 256, 8192, False),
    (64, 4096, 4096, True),
    (200, 2048, 1024, True),
]


@contextmanager
def compute75_ptx_builds(cache_dir: str) -> Iterator[None]:
    """JIT modules built inside get compute_75 PTX only and -DSGL_CUDA_ARCH=750.

    Modules are cached per process (cache_once), so building the Marlin ones in
    here and calling them later keeps every other JIT module on the real arch.
    """
    import tvm_ffi.cpp.extension as ext
    from sglang.jit_kernel.utils import override_jit_cuda_arch

    if not hasattr(ext, "_get_cuda_target"):
        raise SystemExit("tvm_ffi.cpp.extension._get_cuda_target not found: cannot force PTX")
    saved_target = ext._get_cuda_target
    saved_cache = os.environ.get("TVM_FFI_CACHE_DIR")
    ext._get_cuda_target = lambda: PTX_TARGET
    # The tvm-ffi cache key ignores the gencode target: keep these builds apart.
    os.environ["TVM_FFI_CACHE_DIR"] = cache_dir
    try:
        with override_jit_cuda_arch(7, 5):
            yield
    finally:
        ext._get_cuda_target = saved_target
        if saved_cache is None:
            os.environ.pop("TVM_FFI_CACHE_DIR", None)
        else:
            os.environ["TVM_FFI_CACHE_DIR"] = saved_cache


def float4_type() -> object:
    try:
        from sgl_kernel.scalar_type import scalar_types

        return scalar_types.float4_e2m1f
    except Exception:
        return SimpleNamespace(id=FLOAT4_E2M1F_ID)


def marlin_scale_perm() -> list[int]:
    """Column order of grouped scales in Marlin (8x8 transpose)."""
    return [i + 8 * j for i in range(8) for j in range(8)]


def make_fp4_layer(n: int, k: int, gen: torch.Generator) -> dict:
    """Random FP4 codes, non-uniform FP8 block scales (group 16), a global multiplier."""
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    lut = torch.tensor(E2M1_VALUES + [-v for v in E2M1_VALUES], dtype=torch.float32)
    # scales spread over 2^-3..2^3 so that a wrong scale layout shows up
    exp = torch.randint(-3, 4, (n, k // 16), generator=gen).float()
    mant = 1.0 + torch.rand((n, k // 16), generator=gen) * 0.875
    scale_fp8 = (mant * torch.pow(2.0, exp)).to(torch.float8_e4m3fn)
    global_mult = torch.tensor(0.3719, dtype=torch.float16)
    w_ref = lut[codes.long()] * scale_fp8.float().repeat_interleave(16, dim=1) * global_mult.float()
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()  # [n, k/2], low nibble = even k
    return {"packed": packed, "scale_fp8": scale_fp8, "global": global_mult, "w_ref": w_ref}


def to_marlin(layer: dict, n: int, k: int, device: str) -> tuple:
    """Host preprocessing of the series' layout contract (8-bit scales, stride n/16)."""
    from sglang.jit_kernel.gptq_marlin_repack import gptq_marlin_repack

    qweight = layer["packed"].to(device).view(torch.int32).T.contiguous()  # [k/8, n]
    empty = torch.empty(0, dtype=torch.int32, device=device)
    marlin_w = gptq_marlin_repack(qweight, empty, k, n, 4)

    s = layer["scale_fp8"].to(device).T.contiguous().to(torch.float16)  # [k/16, n]
    s = s.reshape(-1, 64)[:, marlin_scale_perm()].reshape(-1, n)
    s = s.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(s.size(0), -1)  # order the fp8 trick reads
    s = (s * 2**7).view(torch.int16) << 1  # FP8 bits into the high byte (scales >= 0)
    marlin_s = s.view(torch.int8)[:, 1::2].contiguous()

    g = (layer["global"].float() * 2**7).to(torch.float16).reshape(1).to(device)  # 2^(14-7)
    return marlin_w, marlin_s, g


def moe_routing(m: int, e: int, top_k: int, block: int, gen: torch.Generator) -> tuple:
    """Random top-k routing and the block-sorted token list the MoE kernel reads."""
    topk_ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(m)])
    topk_w = torch.rand((m, top_k), generator=gen)
    flat = topk_ids.flatten()
    sorted_ids, expert_ids = [], []
    for ex in range(e):
        idx = (flat == ex).nonzero().flatten().tolist()
        pad = -len(idx) % block
        idx += [m * top_k] * pad  # sentinel: past the last (token, k) slot
        sorted_ids += idx
        expert_ids += [ex] * (len(idx) // block)
    return (
        topk_ids,
        topk_w,
        torch.tensor(sorted_ids, dtype=torch.int32),
        torch.tensor(expert_ids, dtype=torch.int32),
        torch.tensor([len(sorted_ids)], dtype=torch.int32),
    )


def run_moe_cases(gen: torch.Generator, device: str, sms: int) -> list[dict]:
    """FP4 MoE GEMM (moe_wna16_marlin) against per-expert fp32 references."""
    from sglang.jit_kernel.moe_wna16_marlin import moe_wna16_marlin_gemm

    e, n, k, top_k = 8, 1024, 2048, 2
    layers = [make_fp4_layer(n, k, gen) for _ in range(e)]
    packed = [to_marlin(layer, n, k, device) for layer in layers]
    w = torch.stack([p[0] for p in packed])
    s = torch.stack([p[1] for p in packed])
    g = torch.cat([p[2] for p in packed])
    cases = []
    for m, block, mul in [(3, 8, False), (40, 16, True), (256, 64, False)]:
        topk_ids, topk_w, sorted_ids, expert_ids, n_post = moe_routing(m, e, top_k, block, gen)
        x = torch.randn((m, k), generator=gen).to(torch.float16)
        ref = torch.stack(
            [
                x.float()[t] @ layers[topk_ids[t, j]]["w_ref"].T
                for t in range(m)
                for j in range(top_k)
            ]
        )
        if mul:
            ref = ref * topk_w.flatten()[:, None]
        out = moe_wna16_marlin_gemm(
            x.to(device),
            None,
            w,
            None,
            s,
            g,
            None,
            None,
            None,
            torch.zeros(sms * 4, dtype=torch.int32, device=device),
            sorted_ids.to(device),
            expert_ids.to(device),
            n_post.to(device),
            topk_w.to(device),
            moe_block_size=block,
            top_k=top_k,
            mul_topk_weights=mul,
            is_ep=False,
            b_q_type=float4_type(),
            size_m=m,
            size_n=n,
            size_k=k,
            use_fp32_reduce=True,
        )
        torch.cuda.synchronize()
        err = ((out.float().cpu() - ref).norm() / ref.norm()).item()
        cases.append(
            {
                "kind": "moe",
                "m": m,
                "n": n,
                "k": k,
                "experts": e,
                "top_k": top_k,
                "moe_block_size": block,
                "mul_topk_weights": mul,
                "rel_l2": err,
                "pass": err <= TOL,
            }
        )
        print(json.dumps(cases[-1]))
    return cases


def inspect_library(cache_dir: str) -> dict:
    """What the gptq_marlin fp16 build targeted and embeds: compute_75 PTX only."""
    dirs = sorted(glob.glob(os.path.join(cache_dir, "*gptq_marlin_fp16*")), key=os.path.getmtime)
    if not dirs:
        return {"ok": False, "error": f"no gptq_marlin fp16 build under {cache_dir}"}
    dirs = dirs[-1:]  # the build this run used (newest)
    info: dict = {"build_dir": dirs[0]}
    with open(os.path.join(dirs[0], "build.ninja")) as f:
        ninja = f.read()
    flags = next(ln for ln in ninja.splitlines() if ln.startswith("cuda_cflags ="))
    info["gencode"] = [
        f for f in flags.split() if f.startswith(("-gencode", "-arch", "--gpu-arch"))
    ]
    info["sgl_cuda_arch"] = [f for f in flags.split() if f.startswith("-DSGL_CUDA_ARCH")]
    ok = info["gencode"] == [PTX_TARGET] and info["sgl_cuda_arch"] == ["-DSGL_CUDA_ARCH=750"]
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    libs = glob.glob(os.path.join(dirs[0], "*.so"))
    if libs and os.path.exists(tool):
        listing = subprocess.run(
            [tool, "--list-elf", "--list-ptx", libs[0]], capture_output=True, text=True
        )
        lines = (listing.stdout + listing.stderr).splitlines()
        info["elf_entries"] = [ln for ln in lines if ln.startswith("ELF file")]
        info["ptx_entries"] = [ln for ln in lines if ln.startswith("PTX file")]
        ptx = subprocess.run([tool, "-ptx", libs[0]], capture_output=True, text=True).stdout
        info["ptx_mma_m16n8k8"] = ptx.count("mma.sync.aligned.m16n8k8")
        info["ptx_mma_m16n8k16"] = ptx.count("m16n8k16")
        info["ptx_cp_async"] = ptx.count("cp.async")
        ok = ok and (
            not info["elf_entries"]
            and bool(info["ptx_entries"])
            and all("sm_75" in ln for ln in info["ptx_entries"])
            and info["ptx_mma_m16n8k8"] > 0
            and info["ptx_mma_m16n8k16"] == 0
            and info["ptx_cp_async"] == 0
        )
    else:
        info["cuobjdump"] = "not found: judged from the build flags only"
    info["ok"] = ok
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "tvm-ffi-c75"))
    parser.add_argument("--skip-bf16", action="store_true", help="skip the bf16 refusal check")
    parser.add_argument("--moe", action="store_true", help="also build and check the MoE kernel")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0

    from sglang.jit_kernel.gptq_marlin import _jit_gptq_marlin_module, gptq_marlin_gemm
    from sglang.jit_kernel.gptq_marlin_repack import _jit_gptq_marlin_repack_module

    t0 = time.time()
    with compute75_ptx_builds(args.cache_dir):
        _jit_gptq_marlin_repack_module()
        _jit_gptq_marlin_module(torch.float16)
        if not args.skip_bf16:
            _jit_gptq_marlin_module(torch.bfloat16)
        if args.moe:
            from sglang.jit_kernel.moe_wna16_marlin import _jit_moe_wna16_marlin_module

            _jit_moe_wna16_marlin_module(torch.float16)
    build_s = time.time() - t0

    device = "cuda"
    props = torch.cuda.get_device_properties(0)
    result: dict = {
        "arch": "compute_75",
        "device": props.name,
        "capability": list(torch.cuda.get_device_capability(0)),
        "dtype": "float16",
        "tolerance": TOL,
        "build_s": round(build_s, 1),
        "cases": [],
    }
    print(f"compute_75 PTX builds: {build_s:.0f} s")
    gen = torch.Generator().manual_seed(75)
    failed = False
    workspace = torch.zeros(props.multi_processor_count, dtype=torch.int32, device=device)
    layers: dict = {}
    for m, n, k, fp32_reduce in CASES:
        if (n, k) not in layers:
            layer = make_fp4_layer(n, k, gen)
            layers[(n, k)] = (layer, to_marlin(layer, n, k, device))
        layer, (marlin_w, marlin_s, g) = layers[(n, k)]
        x = torch.randn((m, k), generator=gen).to(torch.float16)
        ref = x.float() @ layer["w_ref"].T
        out = gptq_marlin_gemm(
            x.to(device),
            None,
            marlin_w,
            marlin_s,
            g,
            None,
            None,
            None,
            workspace,
            float4_type(),
            m,
            n,
            k,
            use_fp32_reduce=fp32_reduce,
        )
        torch.cuda.synchronize()
        err = ((out.float().cpu() - ref).norm() / ref.norm()).item()
        ok = err <= TOL
        failed |= not ok
        case = {
            "kind": "dense",
            "m": m,
            "n": n,
            "k": k,
            "fp32_reduce": fp32_reduce,
            "rel_l2": err,
            "pass": ok,
        }
        result["cases"].append(case)
        print(json.dumps(case))

    if args.moe:
        moe_cases = run_moe_cases(gen, device, props.multi_processor_count)
        result["cases"] += moe_cases
        failed |= not all(c["pass"] for c in moe_cases)

    if not args.skip_bf16:
        x = torch.randn((16, 1024), dtype=torch.bfloat16, device=device)
        _, (marlin_w, marlin_s, g) = layers[(2048, 1024)]
        try:
            gptq_marlin_gemm(
                x,
                None,
                marlin_w,
                marlin_s,
                g.to(torch.bfloat16),
                None,
                None,
                None,
                workspace,
                float4_type(),
                16,
                2048,
                1024,
            )
            result["bf16"] = {"pass": False, "error": "bf16 ran on the SM75 build"}
        except Exception as e:  # the wrapper raises a tvm-ffi / runtime error
            msg = str(e)
            result["bf16"] = {"pass": "--dtype float16" in msg, "error": msg[-300:]}
        failed |= not result["bf16"]["pass"]
        print("bf16:", json.dumps(result["bf16"]))

    result["library"] = inspect_library(args.cache_dir)
    failed |= not result["library"].get("ok", False)
    print("library:", json.dumps(result["library"]))
    result["pass"] = not failed
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print("PASS" if not failed else "FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
