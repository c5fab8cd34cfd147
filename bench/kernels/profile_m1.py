"""The new gemv and FP4 Marlin, once each per shape, for a profiler (Nsight Compute).

Round 1 measured the gemv at 22-38 % of the HBM roofline at M = 1, against a predicted 74-82 %
(NOTES.md). Before changing it, the question is where the time goes: DRAM throughput, stall
reasons, occupancy. This builds the same layers as run_round.py and launches each path once
inside a profiler range (cudaProfilerStart/Stop), after a warm-up outside it, so a profiler run
with ``--profile-from-start off`` sees exactly one gemv and one Marlin launch per shape (on
SM90 the gemv twice: its splits summed through the cluster, then through round 3's global
workspace, each at its own plan):

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --section LaunchStats \\
        --section SchedulerStats --section SourceCounters --section InstructionStats \\
        python bench/kernels/profile_m1.py --out DIR [--shapes qkv_70b,o_8b] [--m 1]

Run where run_round.py runs (``scripts/gpu-proof.sh --stages kernels-profile`` sets that up and
wraps it in ``ncu``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_round as rr  # noqa: E402  (puts bench/, tests/gpu and src on sys.path)

bfm, fk = rr.bfm, rr.fk


def main(argv: Sequence[str] | None = None) -> int:
    argv = [*(sys.argv[1:] if argv is None else argv),
            *shlex.split(os.environ.get("FP4SERIES_KERNELS_ARGS", ""))]  # fmt: skip
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shapes", default="o_8b,qkv_70b,down_70b")
    ap.add_argument("--m", type=int, default=1)
    args, _ = ap.parse_known_args(argv)  # run_round's options (FP4SERIES_KERNELS_ARGS) ignored
    if not torch.cuda.is_available():
        print("profile_m1: no CUDA device; nothing to run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    kernels = fk.Kernels(fk.build(args.out / "build", torch.cuda.get_device_capability()))
    import _jitenv

    _jitenv.apply_variant()
    for i, shape in enumerate(s for s in args.shapes.split(",") if s):
        n, k = bfm.SHAPES[shape]
        _, _, t = rr.make_layer(n, k, torch.bfloat16, seed=100 + i, smallest=2.0**-6)
        lin = fk.Fp4Linear(kernels, t)
        lin.reserve([args.m])
        marlin = rr.marlin_apply(t)
        x = torch.randn(args.m, k, device="cuda").to(torch.bfloat16)
        for _ in range(3):  # warm-up: module loads, workspace, clocks
            lin.gemv(x)
            marlin(x)
        torch.cuda.synchronize()
        ends = [fk.Kernels.DEFAULT] + ([fk.Kernels.COPY_WS] if kernels.copy_engine else [])
        plans = []
        for which in ends:
            with kernels.using(which) as name:
                lin.reserve([args.m])
                lin.gemv(x)
                plans.append(f"{name} {lin.plan(args.m)}")
        torch.cuda.synchronize()
        print(f"[profile] {shape} N={n} K={k} M={args.m}: gemv ({', '.join(plans)}: "
              "(wn, splits)), then Marlin", flush=True)  # fmt: skip
        torch.cuda.profiler.start()
        for which in ends:
            with kernels.using(which):
                lin.gemv(x)
        marlin(x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
