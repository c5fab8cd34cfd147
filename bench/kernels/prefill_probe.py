"""The prefill path's dequant kernel alone: the series' Triton kernel beside this folder's CUDA one.

Patch 13 (``nvfp4_marlin_prefill``) dequantizes the Marlin NVFP4 layout with a Triton kernel;
``fp4_dequant.cu`` here did the same job in the kernel rounds, where the dequant + cuBLAS path
was measured. This times both on random layouts of the eight shapes (rows of a whole layer, or
the 160 MiB chunk the series uses), checks that they write the same bits, and reports each as
a share of the copy bandwidth (bytes read + written), for the Triton kernel at several program
shapes (k-tiles per program, warps), so the series' choice is a measured one.

    python bench/kernels/prefill_probe.py [--module PATH] [--extra-module PATH ...] [--out FILE]

``--module``: the patched tree's ``nvfp4_marlin_prefill.py`` (default: .work/checkout's);
``--extra-module``: a candidate copy of it, edited, timed and bit-checked beside.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _p in (HERE, REPO / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import bench_fp4_marlin as bfm  # noqa: E402  (the eight shapes, the copy bandwidth)
import fp4_kernels as fk  # noqa: E402

MODULE = REPO / ".work/checkout/python/sglang/srt/layers/quantization/nvfp4_marlin_prefill.py"
# Program shapes timed: (k-tiles per program, warps, register cap or 0 for Triton's own).
# Registers a thread at sm_90a (``--registers``, no GPU needed; run 6's shapes in
# reports/h200/kernels/prefill-probe/registers-run-6.jsonl): 8x4 48, 16x4 74 (64 with 12 bytes
# spilled), 16x8 48, 32x8 91, 8x2 80, 32x16 54; a cap below that spills (16x4 at 40: 304 bytes).
CONFIGS = ((4, 4, 0), (8, 4, 0), (8, 8, 0), (16, 4, 0), (16, 8, 0))


def parse_config(text: str) -> tuple[int, int, int]:
    """``KTxW`` or ``KTxWrR`` (R registers a thread at most) -> (KT, W, R or 0)."""
    head, _, cap = text.partition("r")
    kt, _, warps = head.partition("x")
    return int(kt), int(warps), int(cap or 0)


def config_name(kt: int, warps: int, cap: int) -> str:
    return f"{kt}x{warps}" + (f"r{cap}" if cap else "")


def config_key(kt: int, warps: int, cap: int) -> str:
    return f"triton_k_{config_name(kt, warps, cap)}_us"


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location("nvfp4_marlin_prefill", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn, reps: int = 20) -> float:
    """Median microseconds of REPS calls, each timed with CUDA events (warmed up)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def probe_shape(pf, kernels: fk.Kernels, name: str, n: int, k: int, gen: torch.Generator,
                bw: float, extras: tuple[Path, ...] = (), profile: bool = False,
                configs: tuple[tuple[int, int, int], ...] = CONFIGS) -> dict:  # fmt: skip
    """One shape's chunk (the series' rows for its K) through both kernels, bf16. ``profile``:
    each kernel launched once, not timed (for ncu)."""
    dtype = torch.bfloat16
    bias = fk.GLOBAL_SCALE_BIAS[dtype]
    g = torch.tensor([2.0 ** (bias - 7) * 1e-2], device="cuda").to(dtype)
    g_eff = g.float().item() * 2.0 ** -(bias - 7)  # the multiplier the 16-bit value holds
    rows = pf.dequant_chunk_rows(n, k)
    weight = torch.randint(-(2**31), 2**31 - 1, (k // 16, 2 * n), generator=gen, device="cuda",
                           dtype=torch.int64).to(torch.int32)  # fmt: skip
    scales = torch.randint(0x50, 0x80, (k // 16, n), generator=gen, device="cuda",
                           dtype=torch.int32).to(torch.uint8)  # fmt: skip
    out_t = torch.empty(rows, k, dtype=dtype, device="cuda")
    out_c = torch.empty(rows, k, dtype=dtype, device="cuda")
    byte_count = rows * k * 2 + rows * k // 2 + rows * k // 16
    row = {"shape": name, "n": n, "k": k, "rows": rows, "bytes": byte_count}
    stream = torch.cuda.current_stream().cuda_stream

    def cuda_dequant() -> None:
        rc = kernels.lib.fp4_dequant(
            weight.data_ptr(), scales.data_ptr(), None, g_eff, n, k, 0, rows, k,
            out_c.data_ptr(), k, 1, stream,
        )  # fmt: skip
        kernels.check(rc, "fp4_dequant")

    def triton_dequant(kt: int, warps: int, cap: int) -> None:
        grid = ((k + 16 * kt - 1) // (16 * kt), (rows + 63) // 64)
        pf._dequant_nvfp4_marlin_kernel[grid](
            weight, scales, g, g, out_t, n, 0, rows, k, k, pf._UNBIAS[dtype],
            HAS_COL=False, K_TILES=kt, num_warps=warps, **({"maxnreg": cap} if cap else {}),
        )  # fmt: skip

    def same_bits(launch) -> bool:  # noqa: ANN001
        """LAUNCH's output against the CUDA kernel's, both written afresh (NaN before)."""
        out_t.fill_(float("nan"))
        out_c.fill_(float("nan"))
        launch()
        cuda_dequant()
        torch.cuda.synchronize()
        return bool(torch.equal(out_t, out_c))

    if profile:  # in this order: the CUDA kernel, the series' kernel, each candidate
        launches = [cuda_dequant, lambda: pf.dequant_nvfp4_marlin(weight, scales, g, 0, rows, k,
                                                                  out_t)]  # fmt: skip
        for path in extras:
            mod = load_module(path)
            launches.append(lambda mod=mod: mod.dequant_nvfp4_marlin(weight, scales, g, 0, rows,
                                                                     k, out_t))  # fmt: skip
        for launch in launches:
            launch()
            torch.cuda.synchronize()
        return {**row, "profiled": ["cuda", "series", *(p.stem for p in extras)]}
    row["cuda_us"] = timed(cuda_dequant)
    for kt, warps, cap in configs:
        fn = lambda kt=kt, warps=warps, cap=cap: triton_dequant(kt, warps, cap)  # noqa: E731
        row[config_key(kt, warps, cap)] = timed(fn)
        row["same_bits_all"] = row.get("same_bits_all", True) and same_bits(fn)
    for path in extras:  # other modules' own wrappers (candidate kernels), same bits required
        mod = load_module(path)
        fn = lambda mod=mod: mod.dequant_nvfp4_marlin(weight, scales, g, 0, rows, k, out_t)  # noqa: E731
        row[f"extra_{path.stem}_us"] = timed(fn)
        row[f"extra_{path.stem}_same_bits"] = same_bits(fn)
    row["same_bits"] = same_bits(  # the series' own call
        lambda: pf.dequant_nvfp4_marlin(weight, scales, g, 0, rows, k, out_t)
    )
    row["triton_best"] = min((k2 for k2 in row if k2.startswith("triton_")), key=row.__getitem__)
    row["fastest"] = min((k2 for k2 in row if k2.endswith("_us") and k2 != "cuda_us"),
                         key=row.__getitem__)  # fmt: skip
    row["series_us"] = row.get(config_key(pf._K_TILES, 4, 0)) or timed(
        lambda: pf.dequant_nvfp4_marlin(weight, scales, g, 0, rows, k, out_t)
    )
    for key in [key for key in row if key.endswith("_us")]:
        row[key.removesuffix("_us") + "_share"] = round(byte_count / row[key] / 1e6 / bw, 3)
    return row


def registers(pf, configs: tuple[tuple[int, int, int], ...]) -> list[dict]:
    """Registers and spill bytes a thread of each program shape takes on sm_90a, from Triton's
    compiler and its ptxas, without a GPU. The bf16 kernel without a column scale, compiled
    for 16-byte aligned pointers and sizes, as Triton compiles it for such a launch."""
    import re
    import subprocess

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = pf._dequant_nvfp4_marlin_kernel
    types = ["*i32", "*u8", "*bf16", "*bf16", "*bf16"] + ["i32"] * 5 + ["fp32"]
    sig = dict(zip(kernel.arg_names, [*types, "constexpr", "constexpr"], strict=True))
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 7, 8, 9)}
    ptxas = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
    out = []
    for kt, warps, cap in configs:
        src = ASTSource(kernel, sig, {"HAS_COL": False, "K_TILES": kt}, aligned)
        opts = {"num_warps": warps, **({"maxnreg": cap} if cap else {})}
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ptx)
            f.flush()
            cmd = [str(ptxas), "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"]
            log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        regs = int(re.search(r"Used (\d+) registers", log).group(1))
        spill = int(re.search(r"(\d+) bytes spill stores", log).group(1))
        out.append({"config": config_name(kt, warps, cap), "registers": regs,
                    "spill_store_bytes": spill})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", type=Path, default=MODULE)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--extra-module", type=Path, action="append", default=[],
                        help="a candidate copy of the module, timed beside")  # fmt: skip
    parser.add_argument("--configs", type=lambda t: tuple(map(parse_config, t.split(","))),
                        default=CONFIGS, metavar="KTxW[rR],...",
                        help="program shapes to time (default: %(default)s)")  # fmt: skip
    parser.add_argument("--profile", metavar="SHAPE", choices=list(bfm.SHAPES),
                        help="that shape only, each kernel launched once (under ncu)")  # fmt: skip
    parser.add_argument("--registers", action="store_true",
                        help="registers per program shape at sm_90a (no GPU)")  # fmt: skip
    args = parser.parse_args(argv)
    pf = load_module(args.module)
    if args.registers:
        for row in registers(pf, args.configs):
            print(json.dumps(row))
        return 0
    kernels = fk.Kernels(fk.build(Path(tempfile.mkdtemp()), torch.cuda.get_device_capability()))
    bw = bfm.copy_bandwidth_tb_s()
    gen = torch.Generator(device="cuda").manual_seed(13)
    rows_out = []
    print(f"[prefill-probe] copy bandwidth {bw:.2f} TB/s", flush=True)
    shapes = {args.profile: bfm.SHAPES[args.profile]} if args.profile else bfm.SHAPES
    for name, (n, k) in shapes.items():
        row = probe_shape(pf, kernels, name, n, k, gen, bw, tuple(args.extra_module),
                          profile=bool(args.profile), configs=args.configs)  # fmt: skip
        rows_out.append(row)
        if args.profile:
            print(f"[prefill-probe] {name}: launched {', '.join(row['profiled'])}", flush=True)
            return 0
        print(f"[prefill-probe] {name}: rows {row['rows']}, CUDA {row['cuda_us']:.1f} us "
              f"({row['cuda_share']:.0%}), series' Triton {row['series_us']:.1f} us "
              f"({row['series_share']:.0%}), fastest {row['fastest']}, "
              f"same bits {row['same_bits']}", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    data = {"device": torch.cuda.get_device_name(), "copy_bandwidth_tb_s": bw, "rows": rows_out}
    if args.out:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0 if all(r["same_bits"] for r in rows_out) else 1


if __name__ == "__main__":
    sys.exit(main())
