"""What the gemv issues per weight tile, read from its machine code (no GPU needed).

Round 1's profile found the gemv latency-bound: its warps issue about every 8 cycles, about
0.47 instructions per scheduler per cycle (NOTES.md). Whether that rate can reach the HBM
roofline at all depends on how many instructions one 16 x 64 weight tile costs: this counts
them in the SASS of every ``fp4_gemv_kernel`` instantiation and turns the count into the
share of the roofline the kernel could reach at a given issue rate:

    ceiling = min(1, (tile bytes / bandwidth) / (instructions per tile / issue capacity))

with the issue capacity SMs x 4 schedulers x clock x rate. The per-tile body is the
unrolled k-tile loop: from the first ``LDSM`` (a tile's activation fragment) to the first
barrier after the last ``HMMA``, divided by the tiles it holds (HMMA count / 4 / MT).

    python bench/kernels/sass_mix.py [--cubin F] [--rate 0.47] [--json OUT]

Needs nvcc (or ``--cubin``) and cuobjdump (``cuobjdump_path``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GEMV_SOURCE = HERE / "fp4_gemv.cu"
# H200: 132 SMs at 1.98 GHz boost; bandwidth: the copy bandwidth round 1 measured (its roofline).
H200 = {"sms": 132, "clock_ghz": 1.98, "bandwidth_tb_s": 4.24}
# Round 1's Nsight Compute profile: 0.43-0.51 instructions issued per scheduler per cycle.
PROFILED_ISSUE_RATE = 0.47
TILE_BYTES = 16 * 64 // 2 + 64  # FP4 weights of one 16 x 64 tile and their 64 scale bytes
BASIS = (
    f"roofline per tile: {TILE_BYTES} B at {H200['bandwidth_tb_s']} TB/s; "
    f"issue: {H200['sms']} SMs x 4 schedulers x {H200['clock_ghz']} GHz x rate"
)
KERNEL = re.compile(r"fp4_gemv_kernelILb([01])ELi(\d+)ELi(\d+)E")
# "/*0a60*/   @!P5 LDG.E.NA.64 R8, ..." -> the opcode with its modifiers
INSTRUCTION = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)"
)
# Opcode (or opcode.modifier) -> what the kernel spends it on.
CLASSES = (
    ("mma", ("HMMA",)),
    ("half multiply", ("HMUL2", "HFMA2", "HADD2")),
    ("bit ops", ("LOP3", "SHF", "PRMT", "IMAD.SHL", "BFE", "BFI")),
    ("memory", ("LDG", "LDSM", "LDS", "LDGSTS", "STS")),
    ("moves", ("MOV", "IMAD.MOV", "UMOV", "SEL")),
    ("address / add", ("IADD3", "LEA", "IADD", "IMAD.IADD", "IMAD.X", "ULEA", "UIADD3")),
    ("integer multiply", ("IMAD",)),
    ("control", ("BRA", "ISETP", "BAR", "WARPSYNC", "S2UR", "S2R", "DEPBAR", "NOP", "PLOP3")),
)


@dataclass
class Mix:
    kernel: str
    dtype: str  # bf16 | fp16
    mt: int  # m-blocks of 8 rows
    u: int  # k-tiles in flight per warp
    instructions: int  # in the whole kernel
    tiles_in_body: int
    per_tile: float
    per_tile_by_class: dict[str, float]

    def ceiling(self, rate: float, device: dict = H200) -> float:
        """Share of the HBM roofline reachable when every scheduler issues RATE per cycle."""
        issue_per_s = device["sms"] * 4 * device["clock_ghz"] * 1e9 * rate
        tile_s_at_roofline = TILE_BYTES / (device["bandwidth_tb_s"] * 1e12)
        return min(1.0, tile_s_at_roofline / (self.per_tile / issue_per_s))


def classify(opcode: str) -> str:
    for name, prefixes in CLASSES:  # the first class naming the opcode or a prefix of it
        if any(opcode == p or opcode.startswith(p + ".") for p in prefixes):
            return name
    return "other"


def functions(sass: str) -> dict[str, list[str]]:
    """cuobjdump -sass text -> {mangled name: opcodes in order}."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in sass.splitlines():
        if "Function : " in line:
            current = out.setdefault(line.split("Function : ", 1)[1].strip(), [])
        elif current is not None and (m := INSTRUCTION.search(line)):
            current.append(m.group(1))
    return out


def mix(name: str, ops: list[str]) -> Mix:
    m = KERNEL.search(name)
    if m is None:
        raise ValueError(f"{name}: not an fp4_gemv_kernel instantiation")
    bf16, mt, u = m.group(1) == "1", int(m.group(2)), int(m.group(3))
    hmma = [i for i, op in enumerate(ops) if op.startswith("HMMA")]
    if not hmma:
        raise ValueError(f"{name}: no HMMA in its SASS; is this the gemv kernel?")
    start = next((i for i, op in enumerate(ops) if op.startswith("LDSM")), None)
    if start is None or start > hmma[0]:
        raise ValueError(f"{name}: no LDSM before the first HMMA; the loop's shape changed")
    end = next((i for i in range(hmma[-1], len(ops)) if ops[i].startswith("BAR")), len(ops))
    tiles = len(hmma) // (4 * mt)
    body = Counter(classify(op) for op in ops[start:end])
    return Mix(
        kernel=name,
        dtype="bf16" if bf16 else "fp16",
        mt=mt,
        u=u,
        instructions=len(ops),
        tiles_in_body=tiles,
        per_tile=(end - start) / tiles,
        per_tile_by_class={k: round(v / tiles, 1) for k, v in sorted(body.items())},
    )


def gemv_mixes(sass: str) -> list[Mix]:
    """Every fp4_gemv_kernel instantiation in cuobjdump -sass text, bf16 first, by MT."""
    found = functions(sass)
    mixes = [mix(n, ops) for n, ops in found.items() if KERNEL.search(n)]
    return sorted(mixes, key=lambda x: (x.dtype, x.mt))


def cuobjdump_path() -> str | None:
    """cuobjdump: ``$CUOBJDUMP``, PATH, or CUDA's bin/ (beside nvcc, or /usr/local/cuda/bin)."""
    nvcc = shutil.which("nvcc")
    beside = str(Path(nvcc).resolve().parent / "cuobjdump") if nvcc else None
    for cand in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), beside,
                 "/usr/local/cuda/bin/cuobjdump"):  # fmt: skip
        if cand and Path(cand).is_file():
            return cand
    return None


def build_cubin(out_dir: Path) -> Path:
    """The gemv as fp4_kernels.build compiles it for Hopper (its nvcc and sm_90a flag, -O3),
    as a cubin."""
    import fp4_kernels as fk  # torch comes with it: only when building

    cubin = out_dir / "fp4_gemv.cubin"
    cmd = [fk.nvcc_path(), "-cubin", "-O3", fk.arch_flag((9, 0)), "-std=c++17", "-lineinfo",
           "-o", str(cubin), str(GEMV_SOURCE)]  # fmt: skip
    subprocess.run(cmd, check=True)
    return cubin


def table(mixes: list[Mix], rates: list[float]) -> str:
    classes = [c for c, _ in CLASSES] + ["other"]
    head = ["dtype", "MT", "U", "per tile", *classes, *(f"ceiling at {r:g}" for r in rates)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for x in mixes:
        cells = [x.dtype, str(x.mt), str(x.u), f"{x.per_tile:.1f}"]
        cells += [f"{x.per_tile_by_class.get(c, 0):g}" for c in classes]
        cells += [f"{x.ceiling(r):.0%}" for r in rates]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cubin", type=Path, help="an sm_90a cubin of fp4_gemv.cu (default: build)")
    ap.add_argument(
        "--rate",
        type=float,
        action="append",
        help=f"issue rates (default 1 and {PROFILED_ISSUE_RATE}, the profiled one)",
    )
    ap.add_argument("--json", type=Path, help="also write the counts here")
    args = ap.parse_args(argv)
    rates = args.rate or [1.0, PROFILED_ISSUE_RATE]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = args.cubin or build_cubin(Path(tmp))
        dump = cuobjdump_path()
        if dump is None:
            raise SystemExit("cuobjdump not found: put CUDA's bin/ on PATH or set CUOBJDUMP")
        sass = subprocess.run(
            [dump, "-sass", str(cubin)], check=True, capture_output=True, text=True
        )
    mixes = gemv_mixes(sass.stdout)
    if not mixes:
        raise SystemExit("no fp4_gemv_kernel in the cubin")
    print(table(mixes, rates))
    print("\n" + BASIS)
    if args.json:
        args.json.write_text(json.dumps([asdict(x) for x in mixes], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
