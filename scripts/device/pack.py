"""Build ``.carry/``: everything the GPU proof needs on a GPU machine that has no network.

Contents (all < 64 MiB together with the repository's own files):
  sglang-patched.tar.xz   python/sglang of the patched checkout (pin + series)
  pin-jit.tar.xz          the pin's version of every non-.py file under sglang/jit_kernel that the
                          series changes (the unpatched-template repro swaps them in)
  sglang-0523.tar.xz      the subset of upstream 0.5.23 its FP4 Marlin needs (sglang.kernels jit +
                          gemm/quantization wrappers, srt/environ.py, a 2-function srt/utils stub)
  sgl_kernel.tar.xz       sgl_kernel 0.4.2's python files + sm90/common_ops (moe_align_block_size,
                          moe_sum_reduce, ...); shim/ is the fallback if it cannot load there
  wheels/                 cp312 wheels the image lacks (apache-tvm-ffi, the sglang.srt import chain,
                          transformers 5.6.0 + tokenizers 0.22.2: the image's newer ones break it)
  lib/                    libnuma.so.1 (common_ops links it)
  prebuilt/               JIT modules built on the CPU machine (scripts/device/prebuild.py; kept
                          across re-packs: this script never builds or deletes them)
  meta.json               series revision, pin, file lists, sizes

Usage: python scripts/device/pack.py [--carry .carry] [--no-0523] [--split]
  --no-0523               leave out the upstream 0.5.23 subset and its tvm-ffi wheel (size)
  --split                 also write .carry-numerics and .carry-bench (hard links into .carry,
                          see CALLS): with every module prebuilt, one carry exceeds 64 MiB, so
                          the proof runs as two calls; then only the split carries must fit
  FP4SERIES_PATCHED_TREE  python dir holding the patched sglang/ (default .work/checkout/python)
  FP4SERIES_PIN_TREE      python dir holding the pin's sglang/ (default .work/upstream/...)
  FP4SERIES_UPSTREAM_0523 dir holding 0.5.23's sglang/ (default: unpacked from the PyPI wheel)
"""

from __future__ import annotations

import argparse
import filecmp
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from fp4series import report  # noqa: E402
from fp4series.errors import SeriesError  # noqa: E402

LIMIT = 64 * 2**20
CACHE = REPO / ".work" / "cache" / "device"
SGL_KERNEL_WHEEL = "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl"
PIP_PLATFORM = [
    "--only-binary=:all:", "--no-deps", "--python-version", "3.12", "--implementation", "cp",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
    "--platform", "manylinux1_x86_64", "--platform", "any",
]  # fmt: skip
# Missing from the H200 image (KINDS.md list) for the pin's sglang.srt quantization import chain,
# found by importing modelopt_quant / compressed_tensors / fused_marlin_moe with the pin on
# PYTHONPATH and listing the third-party distributions loaded.
WHEELS = [
    "apache-tvm-ffi==0.1.15.post2", "compressed-tensors==0.20.1", "dill==0.4.1",
    "distro==1.9.0", "gguf==0.19.0", "loguru==0.7.3", "msgspec==0.23.0", "openai==2.6.1",
    "jiter==0.19.0", "orjson==3.13.0", "partial-json-parser==0.2.1.1.post7",
    "pybase64==1.5.1", "pydantic==2.14.4", "pydantic-core==2.50.5", "typing-inspection==0.4.5",
    "annotated-types==0.8.0", "pyzmq==27.3.0", "sniffio==1.3.1", "starlette==1.10.0",
    "transformers==5.6.0", "tokenizers==0.22.2", "ipython==9.18.1", "traitlets==5.16.1",
    "ipython-pygments-lexers==1.1.1",
]  # fmt: skip
UPSTREAM_WHEELS = ["apache-tvm-ffi==0.1.11"]  # 0.5.23 pins it exactly; installed separately


def _first_tree(candidates: list[Path | None], what: str, hint: str) -> Path:
    for c in candidates:
        if c is not None and (c / "sglang" / "jit_kernel").is_dir():
            return c
    raise SeriesError(f"cannot find {what} (tried {[str(c) for c in candidates if c]})", hint)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).resolve() if value else None


def _tar_xz(dest: Path, members: list[tuple[Path, str]], preset: int = 6) -> int:
    """Write (source file, archive name) pairs; mtimes are kept (ninja reuses builds)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for src, name in sorted(members, key=lambda m: m[1]):
            tar.add(str(src), arcname=name, recursive=False)
    dest.write_bytes(lzma.compress(buf.getvalue(), preset=preset))
    return dest.stat().st_size


def _tree_files(root: Path, rel: str, skip_pycache: bool = True) -> list[tuple[Path, str]]:
    out = []
    for p in (root / rel).rglob("*"):
        if p.is_file() and not (skip_pycache and "__pycache__" in p.parts):
            out.append((p, str(p.relative_to(root))))
    return out


def _pip_download(specs: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("-")[0].lower().replace("_", "-") + "==" + p.name.split("-")[1]
            for p in dest.glob("*.whl")}  # fmt: skip
    todo = [s for s in specs if s.lower().replace("_", "-") not in have]
    if todo:
        cmd = [sys.executable, "-m", "pip", "download", "-q", *PIP_PLATFORM, "-d", str(dest), *todo]
        subprocess.run(cmd, check=True)


def _sgl_kernel_wheel() -> Path:
    for d in (CACHE, REPO / ".work" / "cache" / "wheels", Path("/work/wt/wheels")):
        if (d / SGL_KERNEL_WHEEL).is_file():
            return d / SGL_KERNEL_WHEEL
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "-d", str(CACHE), "sglang-kernel==0.4.2"]  # fmt: skip
    subprocess.run(cmd, check=True)
    return CACHE / SGL_KERNEL_WHEEL


def _upstream_0523() -> Path:
    env = _env_path("FP4SERIES_UPSTREAM_0523")
    if env:
        return env
    for c in (REPO / ".work" / "upstream" / "0.5.23", Path("/work/wt/ref-0.5.23")):
        if (c / "sglang" / "kernels" / "jit").is_dir():
            return c
    target = CACHE / "sglang-0.5.23"
    if not (target / "sglang").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "-d", str(CACHE), "sglang==0.5.23"]  # fmt: skip
        subprocess.run(cmd, check=True)
        wheel = next(CACHE.glob("sglang-0.5.23-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target, [n for n in z.namelist() if n.startswith("sglang/kernels/")
                                  or n == "sglang/srt/environ.py"])  # fmt: skip
    return target


UTILS_STUB = '''"""fp4series stub: what sglang.kernels.jit.utils imports (no torchvision chain)."""
import torch


def is_cuda() -> bool:
    return torch.cuda.is_available() and torch.version.cuda is not None


def get_cuda_version():
    if torch.version.cuda:
        return tuple(map(int, torch.version.cuda.split(".")))
    return (0, 0)
'''


def _pack_0523(carry: Path, up: Path) -> int:
    """The subset of upstream 0.5.23 its FP4 Marlin needs (benchmark comparison)."""
    k = "sglang/kernels"
    members = [(p, n) for p, n in _tree_files(up, k) if n.count("/") == 2 and p.suffix == ".py"]
    members += _tree_files(up, f"{k}/jit/utils") + _tree_files(up, f"{k}/jit/include")
    members += [(p, n) for p, n in _tree_files(up, f"{k}/jit") if n.count("/") == 3]
    members += _tree_files(up, f"{k}/jit/csrc/gemm/marlin")
    members += _tree_files(up, f"{k}/ops/gemm") + _tree_files(up, f"{k}/ops/quantization")
    members += [(up / "sglang/srt/environ.py", "sglang/srt/environ.py")]
    stub_dir = CACHE / "stub0523"
    for rel, text in (("sglang/__init__.py", ""), (f"{k}/ops/__init__.py", ""),
                      ("sglang/srt/__init__.py", ""), ("sglang/srt/utils/__init__.py", ""),
                      ("sglang/srt/utils/common.py", UTILS_STUB)):  # fmt: skip
        (stub_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (stub_dir / rel).write_text(text)
        members = [m for m in members if m[1] != rel] + [(stub_dir / rel, rel)]
    return _tar_xz(carry / "sglang-0523.tar.xz", members)


def pack(carry: Path, with_0523: bool = True) -> dict[str, object]:
    patched = _first_tree(
        [_env_path("FP4SERIES_PATCHED_TREE"), REPO / ".work" / "checkout" / "python"],
        "the patched python tree",
        "run `python -m fp4series prepare-checkout` or set FP4SERIES_PATCHED_TREE",
    )
    pin = _first_tree(
        [_env_path("FP4SERIES_PIN_TREE"), REPO / ".work" / "upstream" / "v0.5.11" / "python",
         REPO / ".work" / "upstream" / "0.5.11" / "python", Path("/work/wt/pin/python")],
        "the pin's python tree",
        "run `python -m fp4series fetch-upstream` or set FP4SERIES_PIN_TREE",
    )  # fmt: skip
    keep = REPO / ".work" / "carry-prebuilt-keep"  # ignored; survives the rmtree below
    if (carry / "prebuilt").is_dir():
        if keep.exists():
            shutil.rmtree(keep)
        keep.parent.mkdir(parents=True, exist_ok=True)
        (carry / "prebuilt").rename(keep)
    if carry.exists():
        shutil.rmtree(carry)
    (carry / "wheels").mkdir(parents=True)
    (carry / "wheels-0523").mkdir()
    (carry / "lib").mkdir()
    sizes: dict[str, int] = {}

    sizes["sglang-patched.tar.xz"] = _tar_xz(
        carry / "sglang-patched.tar.xz", _tree_files(patched, "sglang")
    )
    changed = []
    pin_jit = pin / "sglang" / "jit_kernel"
    for src, name in _tree_files(pin, "sglang/jit_kernel"):
        if src.suffix == ".py":
            continue  # the series' python stays; only the CUDA/C++ sources go back to the pin
        new = patched / name
        if not new.is_file() or not filecmp.cmp(src, new, shallow=False):
            changed.append((src, name))
    del pin_jit
    sizes["pin-jit.tar.xz"] = _tar_xz(carry / "pin-jit.tar.xz", changed)

    up = _upstream_0523() if with_0523 else None
    if up is not None:
        sizes["sglang-0523.tar.xz"] = _pack_0523(carry, up)
    carry.mkdir(parents=True, exist_ok=True)
    if keep.is_dir():
        keep.rename(carry / "prebuilt")

    wheel = _sgl_kernel_wheel()
    sk_dir = CACHE / "sgl_kernel_subset"
    if not (sk_dir / "sgl_kernel" / "sm90").is_dir():
        with zipfile.ZipFile(wheel) as z:
            names = [
                n
                for n in z.namelist()
                if n.startswith("sgl_kernel/")
                and (n.endswith(".py") or n == "sgl_kernel/sm90/common_ops.abi3.so")
            ]
            z.extractall(sk_dir, names)
    sizes["sgl_kernel.tar.xz"] = _tar_xz(
        carry / "sgl_kernel.tar.xz", _tree_files(sk_dir, "sgl_kernel"), preset=9
    )
    shim = carry / "shim" / "sgl_kernel"
    shutil.copytree(REPO / "scripts" / "device" / "sgl_kernel_shim" / "sgl_kernel", shim)
    shutil.copy2(sk_dir / "sgl_kernel" / "scalar_type.py", shim / "scalar_type.py")

    wcache = CACHE / "wheels-cp312"
    _pip_download(WHEELS, wcache)
    if with_0523:
        _pip_download(UPSTREAM_WHEELS, CACHE / "wheels-0523")
    for spec in WHEELS:
        name, version = spec.split("==")
        for p in wcache.glob("*.whl"):
            dist, ver = p.name.split("-")[:2]
            if dist.lower().replace("_", "-") == name and ver == version:
                shutil.copy2(p, carry / "wheels" / p.name)
    for p in (CACHE / "wheels-0523").glob("apache_tvm_ffi-0.1.11-*.whl"):
        if with_0523:
            shutil.copy2(p, carry / "wheels-0523" / p.name)
    if len(list((carry / "wheels").glob("*.whl"))) != len(WHEELS):
        raise SeriesError("some wheels were not downloaded", hint=f"check {wcache}")

    numa = _libnuma()
    if numa:
        shutil.copy2(numa, carry / "lib" / "libnuma.so.1")

    meta = {
        "series_revision": report.series_revision(REPO),
        "pin": report.pin_info(REPO),
        "patched_tree": str(patched),
        "patched_tree_head": _git_head(patched),
        "pin_tree": str(pin),
        "upstream_0523_tree": str(up) if up else "not carried (--no-0523)",
        "pin_jit_files": sorted(n for _, n in changed),
        "sgl_kernel_wheel": wheel.name,
        "sizes": sizes,
    }
    (carry / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _git_head(tree: Path) -> str:
    """The checkout commit the patched tree was taken from (pin + series), if it is a git tree."""
    proc = subprocess.run(
        ["git", "-C", str(tree), "describe", "--always", "--dirty", "--tags"],
        capture_output=True, text=True,
    )  # fmt: skip
    return proc.stdout.strip() or "not a git checkout"


def _libnuma() -> Path | None:
    """libnuma.so.1 from this machine or the Debian package (common_ops.abi3.so needs it)."""
    for p in (Path("/usr/lib/x86_64-linux-gnu/libnuma.so.1"), CACHE / "libnuma.so.1"):
        if p.is_file():
            return p.resolve()
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", "libnuma1"], cwd=CACHE, check=True,
                       capture_output=True)  # fmt: skip
        deb = next(CACHE.glob("libnuma1_*.deb"))
        subprocess.run(["dpkg", "-x", str(deb), str(CACHE / "numa")], check=True)
        lib = next((CACHE / "numa").rglob("libnuma.so.1*"))
        shutil.copy2(lib.resolve(), CACHE / "libnuma.so.1")
        return CACHE / "libnuma.so.1"
    except (OSError, subprocess.CalledProcessError, StopIteration):
        print("warning: libnuma.so.1 not packed (sgl_kernel may fall back to the shim)")
        return None


# The proof in two device calls, each carry under 64 MiB: the sm_90 numerics (patched and pin
# modules, no 0.5.23), then compute_75 + benchmark (0.5.23, the modules those two load).
CALLS: dict[str, dict[str, Any]] = {
    "numerics": {
        "with_0523": False,
        "keep": lambda e, patched: e["arch"] == "sm_90",
    },
    "bench": {
        "with_0523": True,
        "keep": lambda e, patched: (
            e["tree_hash"] == patched
            and (
                e["arch"] == "compute_75"
                or e["module"]
                in (
                    "sgl_kernel_jit_gptq_marlin_bf16_t",
                    "sgl_kernel_jit_gptq_marlin_repack",
                    "sgl_kernel_jit_moe_wna16_marlin_bf16_t",
                )
            )
        ),
    },
}


def call_carry(carry: Path, dest: Path, call: str) -> None:
    """``dest``: the files of ``carry`` (hard links) that device call ``call`` needs."""
    spec = CALLS[call]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for item in carry.iterdir():
        if item.name == "prebuilt":
            continue
        if item.name in ("sglang-0523.tar.xz", "wheels-0523") and not spec["with_0523"]:
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name, copy_function=os.link)
        else:
            os.link(item, dest / item.name)
    if spec["with_0523"] and not (dest / "sglang-0523.tar.xz").is_file():
        raise SeriesError(f"{carry} has no 0.5.23 subset", hint="pack without --no-0523")
    manifest = json.loads((carry / "prebuilt" / "manifest.json").read_text())
    patched = manifest_tree_hash(carry)
    keep = [e for e in manifest["modules"] if spec["keep"](e, patched)]
    (dest / "prebuilt").mkdir()
    for e in keep:
        os.link(carry / "prebuilt" / e["file"], dest / "prebuilt" / e["file"])
    (dest / "prebuilt" / "manifest.json").write_text(
        json.dumps({**manifest, "modules": keep}, indent=1)
    )
    print(f"{dest.name}: {len(keep)} prebuilt modules: "
          f"{sorted((e['module'], e['arch'], e['tree_hash'][:8]) for e in keep)}")  # fmt: skip


def manifest_tree_hash(carry: Path) -> str:
    """tree_hash of the patched jit_kernel sources packed in ``carry``."""
    sys.path.insert(0, str(REPO / "scripts" / "device"))
    from prebuilt_hook import tree_hash

    meta = json.loads((carry / "meta.json").read_text())
    return tree_hash(Path(meta["patched_tree"]) / "sglang" / "jit_kernel")


def travel_size(carry: Path) -> tuple[int, int]:
    """(bytes of files git would send: tracked + untracked-not-ignored, bytes of carry)."""
    files = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        check=True, capture_output=True,
    ).stdout.split(b"\0")  # fmt: skip
    repo_bytes = sum(
        (REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file()
    )
    carry_bytes = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file())
    return repo_bytes, carry_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--carry", default=str(REPO / ".carry"))
    parser.add_argument("--no-0523", action="store_true", help="leave out upstream 0.5.23")
    parser.add_argument(
        "--split", action="store_true",
        help="also write .carry-numerics and .carry-bench (the two device calls' carries)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    carry = Path(args.carry)
    splits = [carry.with_name(f"{carry.name}-{call}") for call in CALLS] if args.split else []
    try:
        meta = pack(carry, with_0523=not args.no_0523)
        for dest, call in zip(splits, CALLS, strict=True):
            call_carry(carry, dest, call)
    except SeriesError as exc:
        print(f"error: {exc}\n  what to do: {exc.hint}", file=sys.stderr)
        return 1
    print(json.dumps(meta["sizes"], indent=1))
    rc = 0
    for c in splits or [carry]:
        repo_bytes, carry_bytes = travel_size(c)
        total = repo_bytes + carry_bytes
        print(f"{c.name}: carry {carry_bytes / 2**20:.1f} MiB + repo "
              f"{repo_bytes / 2**20:.1f} MiB = {total / 2**20:.1f} MiB (limit 64 MiB)")  # fmt: skip
        if total > LIMIT:
            print(f"error: {c} is over the 64 MiB a device call carries", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
