"""The new kernels under torch.compile(fullgraph=True) and CUDA graphs, on a CUDA host.

Issue 23 asks that the new paths survive both: a model compiled whole must not break its graph
at them, and a captured graph must replay them. ``fp4_kernels.Fp4Module`` wraps a layer's
dispatch as one ``fp4k::linear`` op; this builds two random layers (no SGLang needed, as
``preflight.py``), the second with a column scale and a bias, chains them with a ReLU, and
compares, per M, the eager result with ``torch.compile(fullgraph=True)`` (Inductor) and with
``mode="reduce-overhead"`` (Inductor's CUDA graphs), bit for bit. The layers take a dispatch
of this check's own (``PATHS``) so that every kind of path runs: M = 1 the gemv's workspace
end, 4 its cluster end, 16 the dispatch's Marlin (dequant + cuBLAS here: no Marlin module is
loaded), 256 the overlapped prefill (a side stream and events inside the graph).

    python bench/kernels/compile_check.py [--out FILE.json] [--build DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fp4_kernels as fk  # noqa: E402
import preflight  # noqa: E402

MS = (1, 4, 16, 256)
N = K = 4096
PATHS = [(1, "gemv_ws"), (8, "gemv"), (64, "marlin"), (fk.OPEN_END, "prefill_overlap@64M")]


def layers(kernels: fk.Kernels) -> torch.nn.Module:
    gen = torch.Generator(device="cuda").manual_seed(23)
    t1 = preflight.random_layer(N, K, K, torch.bfloat16, gen)
    t2 = preflight.random_layer(N, K, K, torch.bfloat16, gen)
    t2.weight_output_scale = torch.rand(N, generator=gen, device="cuda") + 0.5
    t2.bias = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
    first = fk.Fp4Module(fk.Fp4Linear(kernels, t1, dispatch=PATHS))
    second = fk.Fp4Module(fk.Fp4Linear(kernels, t2, dispatch=PATHS, buffers=first.lin.buf))
    for mod in (first, second):
        mod.lin.reserve(MS)
    return torch.nn.Sequential(first, torch.nn.ReLU(), second)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "fp4k-compile")
    args = ap.parse_args(argv)
    kernels = fk.Kernels(fk.build(args.build, torch.cuda.get_device_capability()))
    model = layers(kernels)
    results = []
    for mode in ("default", "reduce-overhead"):
        compiled = torch.compile(model, fullgraph=True, mode=mode, dynamic=False)
        for m in MS:
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            start = time.time()
            with torch.no_grad():
                want = model(x)
                got = [compiled(x).clone() for _ in range(3)]  # CUDA graphs record, then replay
            torch.cuda.synchronize()
            same = all(torch.equal(g, want) for g in got)
            path = model[0].lin.path_for(m)
            if path == "marlin":  # no Marlin module here: Fp4Linear runs dequant + cuBLAS
                path = "prefill (the dispatch's marlin; no Marlin module loaded here)"
            results.append({"mode": mode, "m": m, "path": path, "bitwise_equal": same,
                            "finite": bool(torch.isfinite(want).all()),
                            "seconds": round(time.time() - start, 1)})  # fmt: skip
            verdict = "equal" if same else "DIFFERENT"
            print(f"[compile] fullgraph mode={mode} M={m} ({path}): {verdict} "
                  f"({results[-1]['seconds']} s)", flush=True)  # fmt: skip
    # Inductor counts the graphs it could not put in CUDA graphs (reduce-overhead): none here
    skips = counters["inductor"]["cudagraph_skips"]
    ok = all(r["bitwise_equal"] and r["finite"] for r in results) and skips == 0
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python bench/kernels/compile_check.py", "passed": ok,
              "cudagraph_skips": skips, "cases": results,
              # which kernels: check-reports holds them equal to the round's beside this report
              "kernel_sources": fk.source_hashes()}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"[compile] {'passed' if ok else 'FAILED'}: {len(results)} cases, "
          f"CUDA-graph skips {skips}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
