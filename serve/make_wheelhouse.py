"""Build a minimal, pinned wheelhouse that lets an offline CUDA host run the pinned SGLang engine.

The host already has Python 3.12, torch 2.11.0 (CUDA 13.0), triton, numpy, safetensors and other
common packages. This script takes the runtime requirements of the pinned ``sglang`` wheel
(``Requires-Dist`` without extras), leaves out what the chosen engine configuration (a Llama /
Qwen2 / Qwen3-MoE model, triton attention backend, xgrammar or no grammar) never imports and what
the host already has, resolves the rest for CPython 3.12 / manylinux x86_64 with pip, downloads
binary wheels only, checks every file against the index's sha256, repacks ``sglang-kernel``
without the shared objects those backends never load, and writes a hash-pinned lock that
``pip install --no-index --require-hashes`` accepts.

Why each package is left out is recorded in LEFT_OUT below, with the import sites in SGLang's
source that support it (``serve/scan_imports.py`` prints them).
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PY_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "linux_x86_64",
)
MARKER_ENV = {
    "python_version": PY_VERSION,
    "python_full_version": PY_VERSION + ".3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "extra": "",
}

# Packages the GPU host's image already provides, at the versions it was seen with. The resolver
# sees metadata-only stand-ins for them, so nothing of theirs is downloaded. transformers is not
# here: the image has 5.17.0 and the pin needs 5.6.0 (newer ones fail at import with
# "'qwen3_asr' is already used by a Transformers config").
HOST = {
    "torch": "2.11.0",
    "torchvision": "0.26.0",
    "torchaudio": "2.11.0",
    "triton": "3.6.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "huggingface-hub": "1.33.0",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "accelerate": "1.15.0",
    # Also in the image (scipy for the checkpoint producers, pillow for the engine's
    # multimodal imports): the stand-ins carry the versions this project pins, so that the
    # resolution stays the same; the image's own copies (IMAGE_VERSIONS) are what runs there.
    "scipy": "1.17.1",
    "pillow": "13.0.0",
    "nvidia-ml-py": "13.615.71",
    "setuptools": "81.0.0",
}
# The image's versions where they differ from the stand-ins (pip list there, 2026-12-02); the
# end-to-end run used these.
IMAGE_VERSIONS = {"scipy": "1.18.1", "pillow": "12.3.0", "nvidia-ml-py": "13.610.43"}

# Imported unconditionally on the engine's or the server's start path, yet absent from the pin's
# Requires-Dist: upstream gets them only through requirements left out below.
IMPLICIT = {
    "dill": "srt/sampling/custom_logit_processor.py (via srt/configs/deepseek_ocr.py, which "
    "every config load imports); upstream gets it through `datasets`",
    "jsonschema": "srt/entrypoints/openai/serving_chat.py (imported by http_server.py); "
    "upstream gets it through `outlines`",
}

# Requirements of the pin that the engine configuration above never imports: name -> why.
# "guarded" = imported only inside try/if at module level; "lazy" = only inside a function that
# the configuration does not call. Sites are paths under the pin's python/sglang/.
LEFT_OUT = {
    "flashinfer-cubin": "prebuilt cubins only (295 MB); flashinfer_python JIT-compiles its "
    "kernels with the host's nvcc instead; the triton attention backend uses none of them",
    "flash-attn-4": "FA4 attention backend only: guarded in jit_kernel/flash_attention_v4.py",
    "quack-kernels": "no import of `quack` anywhere in sglang/ at the pin",
    "nvidia-cutlass-dsl": "CuTe-DSL kernels (linear attention gdn/kda, diffusion) only: "
    "jit_kernel/cutedsl_*.py; not imported for Llama/Qwen2/Qwen3-MoE",
    "torchao": "lazy in srt/layers/torchao_utils.py, used only with --torchao-config",
    "torch-memory-saver": "guarded in srt/utils/torch_memory_saver_adapter.py, used only with "
    "--enable-memory-saver",
    "torchcodec": "video/audio decoding for multimodal processors: guarded in "
    "srt/utils/video_decoder.py, lazy in srt/utils/common.py",
    "outlines": "grammar backend 'outlines' only (srt/constrained/outlines_backend.py, lazy "
    "from base_grammar_backend.py); the default grammar backend is xgrammar",
    "interegular": "used only by the outlines grammar backend",
    "llguidance": "grammar backend 'llguidance' only (lazy from base_grammar_backend.py)",
    "datasets": "benchmarks and evals only (sglang/benchmark, sglang/eval, sglang/test)",
    "modelscope": "guarded in srt/utils/hf_transformers/common.py behind SGLANG_USE_MODELSCOPE",
    "anthropic": "frontend-language backend sglang/lang/backend/anthropic.py only",
    "blobfile": "no import of `blobfile` anywhere in sglang/ at the pin",
    "build": "packaging tool; no import of `build` in sglang/",
    "easydict": "no import of `easydict` anywhere in sglang/ at the pin",
    "py-spy": "a profiler binary; not imported",
    "timm": "lazy only, vision towers of multimodal models",
    "mistral-common": "lazy only, Mistral tokenizers",
    "smg-grpc-servicer": "gRPC server mode only: guarded in srt/entrypoints/grpc_server.py",
    "kernels": "FA3 from the hub only: guarded in jit_kernel/flash_attention_v3.py",
    "cuda-python": "guarded/lazy only (breakable CUDA graph, host shared memory); the host image "
    "has cuda-bindings, cuda-core and cuda-pathfinder",
    "decord2": "aarch64/arm only (environment marker)",
    "av": "aarch64/arm only (environment marker)",
}
LEFT_OUT.update(
    {
        name: "already in the host image at " + IMAGE_VERSIONS.get(name, ver)
        for name, ver in HOST.items()
    }
)

# Shared objects inside sglang-kernel that the triton/flashinfer attention backends on SM90
# never load. sgl_kernel/__init__.py loads sm90/common_ops on SM90, and sgl_kernel/flash_attn.py
# / flash_mla.py load the others only when imported. NOTE: on SM90 with CUDA >= 12.3 the pin's
# default attention backend for Llama/Qwen MHA models is fa3 (ServerArgs._get_default_attn_backend),
# so serving with the defaults needs --with-fa3; without it pass --attention-backend triton.
KERNEL_NAME, KERNEL_VERSION = "sglang-kernel", "0.4.2"
KERNEL_DROP = {
    "sgl_kernel/flash_ops.abi3.so": "FlashAttention-3 (fa3 attention backend only)",
    "sgl_kernel/flashmla_ops.abi3.so": "FlashMLA (MLA models, flashmla backend only)",
    "sgl_kernel/sm100/common_ops.abi3.so": "SM100 build of common_ops (loaded on Blackwell only)",
}


class WheelhouseError(Exception):
    """An expected failure: the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Pinned:
    name: str
    version: str
    filename: str
    sha256: str
    url: str


def canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pin_wheel(lock_path: Path, cache: Path) -> tuple[Path, str]:
    """The pinned sglang wheel from the cache, checked against upstream.lock's sha256."""
    with lock_path.open("rb") as f:
        pin = tomllib.load(f)["pin"]
    wheel = cache / pin["wheel_filename"]
    if not wheel.is_file():
        raise WheelhouseError(
            f"{wheel} not found: run scripts/fetch-upstream.sh first (it downloads and checks it)"
        )
    got = sha256_of(wheel)
    if got != pin["sha256"]:
        raise WheelhouseError(f"{wheel}: sha256 {got} is not the pin's {pin['sha256']}")
    return wheel, pin["version"]


def runtime_requirements(wheel: Path) -> list[str]:
    """``Requires-Dist`` lines without extras whose markers hold on the target host."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
    out = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(MARKER_ENV):
            out.append(str(req))
        elif "extra" not in str(req.marker):
            out.append(str(req) + "  # marker false on the host")
    return out


def stub_wheel(folder: Path, name: str, version: str) -> None:
    """A metadata-only wheel that stands in for a package the host already has."""
    dist = f"{name.replace('-', '_')}-{version}+host"
    info = f"{dist}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}+host\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: fp4series\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise WheelhouseError(f"pip {args[0]} failed:\n{tail}")
    return proc


def target_flags() -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", PY_VERSION, "--implementation", "cp"]
    for abi in ("cp312", "abi3", "none"):
        flags += ["--abi", abi]
    for plat in (*PLATFORMS, "any"):
        flags += ["--platform", plat]
    return flags


def resolve(
    requirements: list[str], pin_specs: list[str], index_url: str, work: Path
) -> list[Pinned]:
    """Resolve for the target host with pip; host packages are satisfied by stand-ins.

    ``pin_specs`` (every versioned requirement of the pin, also left-out ones) are constraints,
    so a package that comes in as a dependency still gets the version the pin asks for.
    """
    stubs = work / "host-stubs"
    stubs.mkdir()
    for name, version in HOST.items():
        stub_wheel(stubs, name, version)
    reqs = work / "requirements.txt"
    reqs.write_text("\n".join(requirements) + "\n")
    cons = work / "host-constraints.txt"
    host = {canon(n) for n in HOST}
    specs = [s for s in pin_specs if canon(Requirement(s).name) not in host]
    cons.write_text("".join(f"{n}=={v}+host\n" for n, v in HOST.items()) + "\n".join(specs))
    report = work / "report.json"
    print(f"resolving {len(requirements)} requirements for cp312 manylinux x86_64 ...", flush=True)
    pip(
        "install", "--dry-run", "--ignore-installed", "--quiet", "--target", str(work / "t"),
        "--index-url", index_url, "--find-links", str(stubs), "--report", str(report),
        "-r", str(reqs), "-c", str(cons), *target_flags(),
    )  # fmt: skip
    pinned = []
    for item in json.loads(report.read_text())["install"]:
        meta, info = item["metadata"], item["download_info"]
        if info["url"].startswith("file:"):
            continue  # a host stand-in
        hashes = info.get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise WheelhouseError(f"{meta['name']}: the index gave no sha256 for {info['url']}")
        pinned.append(
            Pinned(
                canon(meta["name"]), meta["version"], info["url"].rsplit("/", 1)[-1].split("#")[0],
                hashes["sha256"], info["url"],
            )
        )  # fmt: skip
    return sorted(pinned, key=lambda p: p.name)


def download(pins: list[Pinned], index_url: str, dest: Path) -> None:
    """Download exactly the resolved files (no dependencies) and check each sha256."""
    missing = [p for p in pins if not (dest / p.filename).is_file()]
    if missing:
        print(f"downloading {len(missing)} wheels ...", flush=True)
        pip(
            "download", "--no-deps", "--quiet", "--dest", str(dest), "--index-url", index_url,
            *target_flags(), *(f"{p.name}=={p.version}" for p in missing),
        )  # fmt: skip
    for p in pins:
        path = dest / p.filename
        if not path.is_file():
            raise WheelhouseError(f"pip did not produce {p.filename}; delete {dest} and rerun")
        got = sha256_of(path)
        if got != p.sha256:
            path.unlink()
            raise WheelhouseError(f"{p.filename}: sha256 {got}, index said {p.sha256}; rerun")


def repack_kernel(
    original: Path, dest: Path, drop: dict[str, str] = KERNEL_DROP
) -> tuple[Path, dict[str, int]]:
    """Copy the sglang-kernel wheel without ``drop``, with a RECORD that matches.

    Entries keep their order and timestamps, so the same input gives the same bytes.
    """
    dropped: dict[str, int] = {}
    out = dest / original.name
    tmp = out.with_suffix(".partial")
    try:
        with zipfile.ZipFile(original) as src, zipfile.ZipFile(tmp, "w") as dst:
            record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
            for info in src.infolist():
                if info.filename in drop:
                    dropped[info.filename] = info.file_size
                elif info.filename != record_name:
                    dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
            missing = set(drop) - set(dropped)
            if missing:
                raise WheelhouseError(
                    f"{original.name} lacks {sorted(missing)}: not the 0.4.2 layout"
                )
            lines = src.read(record_name).decode().splitlines(keepends=True)
            kept = [ln for ln in lines if ln.split(",", 1)[0] not in drop]
            rec = src.getinfo(record_name)
            dst.writestr(rec, "".join(kept), compress_type=zipfile.ZIP_DEFLATED)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return out, dropped


def split_parts(folder: Path, files: list[Path], part_mb: int) -> list[list[Path]]:
    """Pack ``files`` into folder/part-N/ of at most part_mb MiB each (greedy, largest first).

    A file larger than a part is cut into NAME.chunk-000, -001, ... that fill parts of their
    own; ``--join`` puts them back together.
    """
    limit = part_mb << 20
    pieces: list[Path] = []
    for f in sorted(files, key=lambda p: -p.stat().st_size):
        if f.stat().st_size <= limit:
            pieces.append(f)
            continue
        with f.open("rb") as src:
            for i, chunk in enumerate(iter(lambda: src.read(limit), b"")):
                piece = f.with_name(f"{f.name}.chunk-{i:03d}")
                piece.write_bytes(chunk)
                pieces.append(piece)
        f.unlink()
    parts: list[list[Path]] = []
    size = 0
    for f in pieces:
        n = f.stat().st_size
        if not parts or size + n > limit:
            parts.append([])
            size = 0
        parts[-1].append(f)
        size += n
    for i, part in enumerate(parts, 1):
        sub = folder / f"part-{i}"
        sub.mkdir(exist_ok=True)
        for f in part:
            os.replace(f, sub / f.name)
    return parts


def join_parts(folder: Path) -> int:
    """Move every part-N/ file into ``folder`` and concatenate chunked wheels; returns wheels."""
    chunks: dict[str, list[Path]] = {}
    for f in sorted(folder.glob("part-*/*")):
        if ".chunk-" in f.name:
            chunks.setdefault(f.name.rsplit(".chunk-", 1)[0], []).append(f)
        else:
            os.replace(f, folder / f.name)
    for name, pieces in chunks.items():
        tmp = folder / (name + ".partial")
        with tmp.open("wb") as out:
            for piece in sorted(pieces, key=lambda p: p.name):
                out.write(piece.read_bytes())
        os.replace(tmp, folder / name)
        for piece in pieces:
            piece.unlink()
    for sub in folder.glob("part-*"):
        sub.rmdir()
    return len(list(folder.glob("*.whl")))


def mib(n: int) -> str:
    return f"{n / (1 << 20):8.1f} MiB"


def write_lock(
    path: Path,
    pins: list[Pinned],
    kernel: Pinned,
    original: Pinned,
    omitted,
    extras: list[str],
    drop: dict[str, str],
) -> None:
    lines = [
        "# serve/wheelhouse.lock -- written by serve/make_wheelhouse.py; do not edit by hand.",
        f"# Extra requirement files: {', '.join(extras) or 'none'}",
        f"# The pinned sglang's runtime requirements for CPython {PY_VERSION} manylinux x86_64,",
        "# minus what the engine configuration never imports and what the host already has.",
        "# Install: pip install --no-index --find-links WHEELHOUSE --require-hashes -r THIS",
        f"# {KERNEL_NAME} is repacked: PyPI's {original.filename} sha256 {original.sha256}",
        f"#   without {', '.join(sorted(drop))}.",
        "# Added (imported at start, missing from the pin's Requires-Dist):",
        *(f"#   + {name}: {why}" for name, why in sorted(IMPLICIT.items())),
        "# Left out (requirement: why):",
        *(f"#   {name}: {why}" for name, why in sorted(omitted.items())),
        "",
    ]
    for p in sorted([*pins, kernel], key=lambda p: p.name):
        lines.append(f"{p.name}=={p.version} --hash=sha256:{p.sha256}")
    tmp = path.with_suffix(".partial")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".work" / "wheelhouse")
    ap.add_argument("--lock", type=Path, default=ROOT / "serve" / "wheelhouse.lock")
    ap.add_argument("--upstream-lock", type=Path, default=ROOT / "upstream.lock")
    ap.add_argument("--cache", type=Path, default=ROOT / ".work" / "cache" / "wheels")
    ap.add_argument("--index-url", default="https://pypi.org/simple")
    ap.add_argument("--split-mb", type=int, default=0, help="split into part-N/ of this size")
    ap.add_argument(
        "--join",
        type=Path,
        metavar="DIR",
        help="on the target host: merge DIR/part-N/ (and chunked wheels) back into DIR, then exit",
    )
    ap.add_argument(
        "--with-fa3",
        action="store_true",
        help="keep sgl_kernel/flash_ops.abi3.so (FA3: the pin's default attention on SM90)",
    )
    ap.add_argument(
        "--extra",
        type=Path,
        action="append",
        default=[],
        help="a requirements file to add (e.g. requirements/checkpoints.txt for the producers)",
    )
    ap.add_argument(
        "--keep", action="append", default=[], help="keep a left-out requirement (repeatable)"
    )
    args = ap.parse_args(argv)
    try:
        if args.join:
            if not list(args.join.glob("part-*")):
                raise WheelhouseError(f"no part-N/ folder in {args.join}: nothing to join")
            print(f"{join_parts(args.join)} wheels in {args.join}")
            return 0
        return build(args)
    except WheelhouseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def build(args: argparse.Namespace) -> int:
    wheel, version = pin_wheel(args.upstream_lock, args.cache)
    print(f"pin: {wheel.name} (sha256 checked against {args.upstream_lock.name})")
    omitted = {k: v for k, v in LEFT_OUT.items() if k not in {canon(n) for n in args.keep}}
    wanted, skipped, specs = [], {}, []
    for line in runtime_requirements(wheel):
        req = Requirement(line.split("  #")[0])
        name = canon(req.name)
        if req.specifier and "# marker false" not in line:
            specs.append(f"{req.name}{req.specifier}")
        if "# marker false" in line:
            skipped[name] = omitted.get(name, "environment marker false on linux x86_64")
        elif name in omitted:
            skipped[name] = omitted[name]
        else:
            wanted.append(str(req))
    wanted += sorted(IMPLICIT)
    for extra in args.extra:
        if not extra.is_file():
            raise WheelhouseError(f"{extra} not found (--extra takes a requirements file)")
        for line in extra.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                wanted.append(line)
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / ".downloads"
    raw.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        pins = resolve(wanted, specs, args.index_url, Path(tmp))
    pulled = {p.name for p in pins} & set(skipped)
    for name in pulled:
        skipped[name] += " -- YET IN THE WHEELHOUSE: another requirement depends on it"
    download(pins, args.index_url, raw)
    for stale in set(raw.glob("*.whl")) - {raw / p.filename for p in pins}:
        stale.unlink()  # from an earlier resolution
    original = next((p for p in pins if p.name == KERNEL_NAME), None)
    if original is None or original.version != KERNEL_VERSION:
        raise WheelhouseError(f"resolution did not pick {KERNEL_NAME}=={KERNEL_VERSION}")
    # the final folder: every wheel but the kernel is a hard link (or copy) of the download
    for old in args.out.glob("**/*.whl"):
        if raw not in old.parents:
            old.unlink()
    for part in args.out.glob("part-*"):
        shutil.rmtree(part)
    files = []
    for p in pins:
        if p.name == KERNEL_NAME:
            continue
        dst = args.out / p.filename
        try:
            os.link(raw / p.filename, dst)
        except OSError:
            shutil.copy2(raw / p.filename, dst)
        files.append(dst)
    drop = dict(KERNEL_DROP)
    if args.with_fa3:
        del drop["sgl_kernel/flash_ops.abi3.so"]
    repacked, dropped = repack_kernel(raw / original.filename, args.out, drop)
    files.append(repacked)
    kernel = Pinned(KERNEL_NAME, KERNEL_VERSION, repacked.name, sha256_of(repacked), "")
    extras = [str(e) for e in args.extra]
    rest = [p for p in pins if p.name != KERNEL_NAME]
    write_lock(args.lock, rest, kernel, original, skipped, extras, drop)

    print(f"\nleft out ({len(skipped)} of the pin's requirements):")
    for name, why in sorted(skipped.items()):
        print(f"  {name:<22} {why}")
    print("\nadded (imported at start, missing from the pin's Requires-Dist):")
    for name, why in sorted(IMPLICIT.items()):
        print(f"  {name:<22} {why}")
    print(f"\n{KERNEL_NAME} {KERNEL_VERSION} repacked:")
    print(f"  PyPI wheel  {mib((raw / original.filename).stat().st_size)}  {original.filename}")
    print(f"  repacked    {mib(repacked.stat().st_size)}  sha256 {kernel.sha256}")
    for name, size in sorted(dropped.items()):
        print(f"  dropped     {mib(size)} unpacked  {name}: {drop[name]}")
    sizes = sorted(((f.stat().st_size, f.name) for f in files), reverse=True)
    total = sum(s for s, _ in sizes)
    print(f"\nwheelhouse: {len(files)} wheels, {mib(total).strip()} in {args.out}")
    print("largest:")
    for size, name in sizes[:10]:
        print(f"  {mib(size)}  {name}")
    if args.split_mb:
        parts = split_parts(args.out, files, args.split_mb)
        for i, part in enumerate(parts, 1):
            held = list((args.out / f"part-{i}").iterdir())
            size = mib(sum(f.stat().st_size for f in held))
            print(f"part-{i}: {len(part)} files, {size}")
        print(f"on the host: python serve/make_wheelhouse.py --join {args.out}")
    print(f"lock: {args.lock} ({len(pins)} pins); sglang itself is installed with --no-deps")
    print(f"pin version {version}; import facts: python serve/scan_imports.py TREE flashinfer ...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
