"""Seconds-long check of the new kernels on a CUDA host, before a round: no SGLang needed.

Random bytes are a valid Marlin NVFP4 layout (every nibble is an FP4 code; the scale bytes are
drawn from a finite range), so this builds layers of a few shapes directly, runs the gemv with
each weight loader this GPU has (the register ring; on SM90 also the copy engine, with the
splits summed through the cluster and through the global workspace) at several M and splits,
and compares against the dequant kernel's weights times the activations in fp32; the two ends
of the copy engine must agree bit for bit at the same splits.
A loader that hangs is caught by the caller's timeout (``timeout 60 python preflight.py``);
one that computes wrong values fails here, with the case named, before a round spends minutes.

    python bench/kernels/preflight.py [--build DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fp4_kernels as fk  # noqa: E402

# N, K, input k (< K: the layer's K padded, activations past it read as zero)
SHAPES = ((256, 512, 512), (4096, 4096, 4096), (1024, 14336, 14288), (960, 2064, 2064))
MS = (1, 3, 8, 16, 33, 64)
GATE = 1e-2


def random_layer(n: int, k: int, k_in: int, dtype: torch.dtype,
                 gen: torch.Generator) -> fk.PreparedTensors:  # fmt: skip
    weight = torch.randint(-(2**31), 2**31 - 1, (k // 16, 2 * n), generator=gen, device="cuda",
                           dtype=torch.int64).to(torch.int32)  # fmt: skip
    scales = torch.randint(0x50, 0x80, (k // 16, n), generator=gen, device="cuda",
                           dtype=torch.int32).to(torch.uint8)  # fmt: skip
    g = torch.tensor([2.0 ** (fk.GLOBAL_SCALE_BIAS[dtype] - 7) * 1e-2], device="cuda").to(dtype)
    return fk.PreparedTensors(weight, scales, g, n, k_in)


def check_configs(lin: fk.Fp4Linear, x: torch.Tensor, ref: torch.Tensor, label: str,
                  outs: dict[tuple[int, int], torch.Tensor]) -> int:  # fmt: skip
    """The gemv at its plan and a few explicit (wn, splits) against ``ref``; failures. The
    explicit configurations' outputs go into ``outs``."""
    m, n, k = x.shape[0], lin.t.size_n, lin.t.padded_k
    failed = 0
    for cfg in (None, (4, 3), (1, 1), (8, 2)):
        if cfg and (m > 32 and cfg[0] > 4 or k // 16 < 8 * cfg[1]):
            continue
        wn, splits = cfg or (None, None)
        lin.reserve([m], [cfg] if cfg else [])
        out = torch.full((m, n), float("nan"), dtype=x.dtype, device="cuda")
        lin.gemv(x, out=out, wn=wn, splits=splits)
        torch.cuda.synchronize()
        rel = ((out.float() - ref).norm() / ref.norm()).item()
        ok = bool(torch.isfinite(out).all()) and rel <= GATE
        failed += not ok
        if cfg:
            outs[cfg] = out
        if not ok or cfg is None:
            print(f"[preflight] {'ok  ' if ok else 'FAIL'} {label} {cfg or 'plan'} "
                  f"rel_l2={rel:.2e}", flush=True)  # fmt: skip
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "fp4k-preflight")
    args = ap.parse_args(argv)
    kernels = fk.Kernels(fk.build(args.build, torch.cuda.get_device_capability()))
    loaders = ["ring"] + (["copy", "copy-ws"] if kernels.copy_engine else [])
    gen = torch.Generator(device="cuda").manual_seed(0)
    failed = compared = 0
    for dtype in (torch.bfloat16, torch.float16):
        for n, k, k_in in SHAPES:
            t = random_layer(n, k, k_in, dtype, gen)
            lin = fk.Fp4Linear(kernels, t)
            w = lin.dequant_all().float() * lin.g
            for m in MS:
                x = torch.randn(m, k_in, generator=gen, device="cuda").to(dtype)
                ref = x.float() @ w.t()
                label = f"{str(dtype)[6:]} N={n} K={k} k_in={k_in} M={m}"
                outs: dict[str, dict[tuple[int, int], torch.Tensor]] = {}
                for loader in loaders:
                    with kernels.using(fk.Kernels.LOADERS.index(loader)):
                        outs[loader] = {}
                        failed += check_configs(lin, x, ref, f"{label} {loader}", outs[loader])
                for cfg, out in outs.get("copy", {}).items():  # the two ends: the same bits
                    if kernels.end(m, n, k, *cfg) != "cluster":
                        continue  # (1, 1): the ring; one split: no sum
                    compared += 1
                    if not torch.equal(out, outs["copy-ws"][cfg]):
                        failed += 1
                        print(f"[preflight] FAIL {label} {cfg}: cluster end != workspace end",
                              flush=True)  # fmt: skip
    if kernels.copy_engine and not compared:
        failed += 1
        print("[preflight] FAIL: no configuration ran the cluster end", flush=True)
    verdict = "passed" if not failed else f"{failed} case(s) FAILED"
    print(f"[preflight] {verdict}; loaders: {', '.join(loaders)}; cluster end == workspace end "
          f"compared {compared} times")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
