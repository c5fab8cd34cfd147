"""Prebuild SGLang JIT modules on a machine without a GPU, for the device call to load.

The device call has minutes, not the ~4 min per Marlin module a build there takes. This builds
(compile + link, no dlopen) with tvm-ffi's ``build_inline`` in place of ``load_inline``, for a
forced arch, and records what the loader hook (``prebuilt_hook.py``) needs to pick the ``.so``:
the JIT module name, the arch list tvm-ffi sees, PTX-only or not, and a hash of the tree's
``jit_kernel`` CUDA/C++ sources (so a module is never loaded for a tree it was not built from).

usage:
  python scripts/device/prebuild.py build --arch sm_90|compute_75 --out DIR SPEC...
      (the tree is whatever ``sglang`` imports: set PYTHONPATH) SPEC = gptq_marlin:bf16,
      moe_wna16_marlin:fp16, repack, act:bf16
  python scripts/device/prebuild.py record --so SO --module NAME --spec S --arch A --tree T \
      --out DIR
      describe a module built elsewhere with the same recipe (build_jit.py), for pack
  python scripts/device/prebuild.py pack --builds DIR... --dest .carry/prebuilt [--also-tree T]
      strip, xz -9 and write manifest.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))

from prebuilt_hook import tree_hash  # noqa: E402

from fp4series.digest import sha256_file  # noqa: E402


def _force_arch(arch: str) -> None:
    """Make every JIT build of this process target ``arch`` without a device probe."""
    import tvm_ffi.cpp.extension as tvm_ext
    from sglang.jit_kernel import utils as jit_utils

    kind, num = arch.split("_")
    major, minor = int(num[:-1]), int(num[-1])
    jit_utils._init_jit_cuda_arch_once()  # the probe warns without a GPU; then overridden
    jit_utils._CUDA_ARCH = jit_utils.ArchInfo(major, minor, "")
    code = f"compute_{num}" if kind == "compute" else f"sm_{num}"
    target = f"-gencode=arch=compute_{num},code={code}"
    if kind == "compute":
        # PTX text: xz (pack) shrinks it far more than the fatbin's own compression does,
        # and the carry is size-limited
        target += " --no-compress"
    tvm_ext._get_cuda_target = lambda: target


def build(arch: str, out: Path, specs: list[str]) -> int:
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")  # nvcc here is a /usr/local/bin wrapper
    import tvm_ffi.cpp

    sys.path.insert(0, str(HERE.parents[1] / "tests" / "gpu"))
    import _jitenv

    built: dict[str, str] = {}

    def build_only(name: str, *, keep_module_alive: bool = True, build_directory=None, **kw):  # noqa: ANN001, ANN003, ANN202
        bdir = out / name
        bdir.mkdir(parents=True, exist_ok=True)
        so = tvm_ffi.cpp.build_inline(name, build_directory=str(bdir), **kw)
        built[name] = str(so)
        return so

    tvm_ffi.cpp.load_inline = build_only  # load_jit imports it at call time
    _force_arch(arch)
    import sglang

    tree = Path(sglang.__file__).resolve().parent / "jit_kernel"
    rc = 0
    for spec in specs:
        t0 = time.time()
        before = set(built)
        try:
            _jitenv.warm_one(spec)
        except Exception as exc:  # noqa: BLE001 - report each spec
            print(f"[prebuild] {spec}: FAILED {type(exc).__name__}: {exc}", flush=True)
            rc = 1
            continue
        for name in set(built) - before:
            rec = {
                "module": name,
                "spec": spec,
                "arch": arch,
                "arch_list": f"{arch.split('_')[1][:-1]}.{arch[-1]}",
                "ptx_only": arch.startswith("compute_"),
                "tree": str(tree.parent.parent),
                "tree_hash": tree_hash(tree),
                "tree_git": _git_head(tree),
                "so": built[name],
                "build_s": round(time.time() - t0, 1),
            }
            (out / f"{name}.{arch}.json").write_text(json.dumps(rec, indent=1))
            print(f"[prebuild] {spec}: {name} in {rec['build_s']} s", flush=True)
    return rc


def record(so: Path, module: str, spec: str, arch: str, tree: Path, out: Path, note: str) -> int:
    """Write the build record of a .so built elsewhere (same tvm-ffi, nvcc, flags)."""
    kdir = tree / "sglang" / "jit_kernel"
    if not so.is_file() or not kdir.is_dir():
        print(f"error: {so} or {kdir} missing", file=sys.stderr)
        return 1
    rec = {
        "module": module, "spec": spec, "arch": arch,
        "arch_list": f"{arch.split('_')[1][:-1]}.{arch[-1]}",
        "ptx_only": arch.startswith("compute_"), "tree": str(tree),
        "tree_hash": tree_hash(kdir), "tree_git": _git_head(kdir), "so": str(so),
        "build_s": None, "note": note,
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{module}.{arch}.json").write_text(json.dumps(rec, indent=1))
    return 0


def _git_head(path: Path) -> str:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                          text=True)  # fmt: skip
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "."],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return (proc.stdout.strip() or "not-git") + ("-dirty" if dirty else "")


def pack(builds: list[Path], dest: Path, also_trees: list[Path]) -> int:
    """Strip + xz each built .so into dest, manifest.json lists them (sha256 of the raw .so)."""
    dest.mkdir(parents=True, exist_ok=True)
    mpath = dest / "manifest.json"
    old = json.loads(mpath.read_text()) if mpath.is_file() else {}
    entries = {(e["module"], e["arch"], e["tree_hash"]): e for e in old.get("modules", [])}
    extra_hashes = [tree_hash(t / "sglang" / "jit_kernel") for t in also_trees]
    for bdir in builds:
        for rec_path in sorted(bdir.glob("*.json")):
            rec = json.loads(rec_path.read_text())
            so = Path(rec["so"])
            if not so.is_file():
                print(f"[pack] missing {so}: skipped", file=sys.stderr)
                continue
            stripped = dest / f".{so.name}.tmp"
            shutil.copy2(so, stripped)
            subprocess.run(["strip", "--strip-debug", str(stripped)], check=True)
            fname = f"{rec['module']}.{rec['arch']}.{rec['tree_hash'][:12]}.so"
            raw = dest / fname
            stripped.rename(raw)
            rec["file"] = fname + ".xz"
            rec["sha256"] = sha256_file(raw)
            rec["size"] = raw.stat().st_size
            subprocess.run(["xz", "-9", "-T2", "-f", str(raw)], check=True)
            rec["xz_size"] = (dest / rec["file"]).stat().st_size
            # modules whose sources are identical in other trees (activation) serve them too
            if rec["spec"].startswith(("act", "activation")):
                rec["also_tree_hashes"] = [h for h in extra_hashes if h != rec["tree_hash"]]
            entries[(rec["module"], rec["arch"], rec["tree_hash"])] = rec
            print(f"[pack] {rec['file']}: {rec['size']} -> {rec['xz_size']} bytes")
    manifest = {
        "tvm_ffi": _tvm_ffi_version(),
        "modules": sorted(entries.values(), key=lambda e: (e["tree"], e["module"], e["arch"])),
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


def _tvm_ffi_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-tvm-ffi")
    except PackageNotFoundError:
        return "unknown (not installed in the packing interpreter)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--arch", required=True, choices=["sm_90", "compute_75", "sm_80"])
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("specs", nargs="+")
    r = sub.add_parser("record")
    for opt in ("--so", "--tree", "--out"):
        r.add_argument(opt, type=Path, required=True)
    for opt in ("--module", "--spec", "--arch"):
        r.add_argument(opt, required=True)
    r.add_argument("--note", default="built with out/kernels/build_jit.py (same recipe)")
    p = sub.add_parser("pack")
    p.add_argument("--builds", nargs="+", type=Path, required=True)
    p.add_argument("--dest", type=Path, required=True)
    p.add_argument("--also-tree", nargs="*", type=Path, default=[])
    args = parser.parse_args(argv)
    if args.cmd == "build":
        return build(args.arch, args.out, args.specs)
    if args.cmd == "record":
        return record(args.so, args.module, args.spec, args.arch, args.tree, args.out, args.note)
    return pack(args.builds, args.dest, args.also_tree)


if __name__ == "__main__":
    sys.exit(main())
