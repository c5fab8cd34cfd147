"""A self-contained bundle for a GPU host without network: make it here, unpack it there.

``scripts/make-bundle.sh [options] OUT`` writes ``OUT/<name>.json`` (the manifest) and
``OUT/<name>.tar.xz`` (or, with ``--part-size``, ``<name>.tar.xz.000``, ``.001``, ...). The
archive holds:
  trees/patched/sglang    the patched python tree (pin + series)
  trees/pin/sglang/...    the pin's jit_kernel CUDA/C++ sources (the repro's unpatched templates)
  trees/upstream/sglang   with --with-upstream: the part of that release the benchmark compares
  sgl/sgl_kernel/         the pin's sglang-kernel: its python files and one common_ops build
  wheels/, wheels-upstream/  wheels the GPU host lacks, for its python (requirements/
                          gpu-host.txt; apache-tvm-ffi as the upstream release pins it)
  lib/                    shared libraries sgl_kernel links and the host may lack (libnuma)
  prebuilt/               with --prebuild ARCH: JIT modules built here + manifest.json
  extra/                  files given with --include; with the conformance stage, also
                          extra/wheels/: the verified upstream wheel its tests come from
The manifest records the sha256 of every part, of the whole archive and of every file in it;
``unpack`` (gpu_proof.py --bundle) checks all three and never runs a bundle that differs.

With ``--line V`` (a maintained series line, e.g. 0.5.23) it is that line's bundle instead:
  trees/patched/sglang    the release with the line applied (.work/lines/V/checkout/python)
  trees/upstream-delta/   the bare release's files where they differ from the line's; the host
                          rebuilds the bare tree from both (``bare_tree``), checked against the
                          digest of the whole tree the bundle was made from
  sgl/sgl_kernel/         LINE_SGL_KERNEL[V] (see there why not the release's own pin)
  wheels/                 requirements/V/gpu-host.txt
  extra/wheels/           the verified upstream wheel its conformance tests come from
No pin tree and no prebuilt modules: the host builds the line's (reduced) modules in parallel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

import stages  # noqa: E402
from jit_hook import tree_hash  # noqa: E402

from fp4series import report  # noqa: E402
from fp4series.digest import sha256_file  # noqa: E402
from fp4series.errors import SeriesError, run_reporting_errors  # noqa: E402

FORMAT = 1
SGL_KERNEL = "sglang-kernel==0.4.2"  # the pin's (Requires-Dist of the 0.5.11 wheel)
# A line's sgl_kernel. 0.5.23 pins sglang-kernel==0.4.10, built for torch 2.14.1: its
# sm90/common_ops.abi3.so needs c10/libtorch symbols that the GPU host's torch 2.11.0 does not
# export (c10::cuda::CUDAErrorLogCapture, a c10::NotImplementedError constructor, torch::Library
# ::_def with torch::headeronly::Tag), so it cannot load there. 0.4.2 (torch 2.11) loads there,
# and what 0.5.23's NVFP4 Marlin layers call of it (moe_sum_reduce, scalar_type) is the same
# code in both; the reports record which sgl_kernel ran.
LINE_SGL_KERNEL = {"0.5.23": "sglang-kernel==0.4.2"}
LIBS = ("libnuma.so.1",)  # sgl_kernel's common_ops links it
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
UPSTREAM_STUB = '''"""fp4series stub: what sglang.kernels.jit imports (no torchvision chain)."""
import torch


def is_cuda() -> bool:
    return torch.cuda.is_available() and torch.version.cuda is not None


def get_cuda_version():
    return tuple(map(int, torch.version.cuda.split("."))) if torch.version.cuda else (0, 0)
'''


# ----------------------------------------------------------------------------- collecting


def _python_tree(path: Path, what: str, hint: str, layout: str = "jit_kernel") -> Path:
    """PATH if it holds an sglang tree of that layout (jit_kernel/, or kernels/jit/ from 0.5.17)."""
    folder = {"jit_kernel": "jit_kernel", "kernels": "kernels/jit"}[layout]
    if not (path / "sglang" / folder).is_dir():
        raise SeriesError(f"{what}: {path}/sglang/{folder} not found", hint=hint)
    return path


def tree_digest(root: Path) -> str:
    """sha256 over every file of ROOT/sglang (relative path + content; __pycache__ left out)."""
    h = hashlib.sha256()
    for p, rel in _files(root, "sglang"):
        h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _files(root: Path, rel: str) -> Iterator[tuple[Path, str]]:
    for p in sorted((root / rel).rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            yield p, str(p.relative_to(root))


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def wheel_fits(wheel: str, python: str | None) -> bool:
    """Whether a wheel file's python/ABI tags run on that Python ("3.12"; None: any)."""
    if python is None:
        return True
    *_, py_tags, abi, _platform = wheel.removesuffix(".whl").split("-")
    want = int(python.replace(".", ""))
    for tag in py_tags.split("."):
        if tag in ("py3", f"py{want}") or tag == f"cp{want}":
            return True
        if abi == "abi3" and tag.startswith("cp3") and int(tag[2:]) <= want:
            return True
    return False


def _pip_download(specs: list[str], dest: Path, pip_args: list[str], offline: bool) -> list[Path]:
    """One wheel per ``name==version`` spec, from ``dest`` or PyPI; missing ones are an error.
    With ``--python-version`` in PIP_ARGS a cached wheel counts only if it runs on that Python."""
    dest.mkdir(parents=True, exist_ok=True)
    python = pip_args[pip_args.index("--python-version") + 1] if "--python-version" in pip_args \
        else None  # fmt: skip

    def found(spec: str) -> Path | None:
        name, version = (s.strip() for s in spec.split("=="))
        for p in sorted(dest.glob("*.whl")):
            dist, ver = p.name.split("-")[:2]
            if _norm(dist) == _norm(name) and ver == version and wheel_fits(p.name, python):
                return p
        return None

    todo = [s for s in specs if found(s) is None]
    if todo and not offline:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               *pip_args, "-d", str(dest), *todo]  # fmt: skip
        if subprocess.run(cmd).returncode != 0:
            raise SeriesError(f"pip download failed for {todo}", hint="check the network to PyPI")
    missing = [s for s in specs if found(s) is None]
    if missing:
        raise SeriesError(
            f"no wheel for {', '.join(missing)} in {dest}",
            hint="run without --offline (needs PyPI), or put the wheels there",
        )
    return [found(s) for s in specs]  # type: ignore[misc]


def _requirements(path: Path) -> list[str]:
    specs = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    bad = [s for s in specs if s and "==" not in s]
    if bad:
        raise SeriesError(f"{path}: {bad} not pinned", hint="write name==version, one a line")
    return [s for s in specs if s]


def _upstream(version: str, cache: Path, pip_args: list[str], offline: bool, staging: Path):  # noqa: ANN202
    """(members of the upstream subset, the apache-tvm-ffi wheel that release pins)."""
    wheel = _pip_download([f"sglang=={version}"], cache / "upstream", [], offline)[0]
    tree = cache / "upstream" / f"sglang-{version}"
    with zipfile.ZipFile(wheel) as z:
        if not tree.is_dir():
            keep = ("sglang/kernels/", "sglang/srt/environ.py")
            z.extractall(tree, [n for n in z.namelist() if n.startswith(keep)])
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = z.read(meta).decode()
    pinned = re.search(r"^Requires-Dist: apache-tvm-ffi\s*==\s*([\w.]+)", requires, re.M)
    if pinned is None:
        raise SeriesError(f"sglang {version} does not pin apache-tvm-ffi exactly",
                          hint="bundle an upstream release whose METADATA pins it")  # fmt: skip
    tvm = _pip_download([f"apache-tvm-ffi=={pinned.group(1)}"], cache / "wheels", pip_args, offline)
    k = "sglang/kernels"
    members = [(p, n) for p, n in _files(tree, k) if n.count("/") == 2 and p.suffix == ".py"]
    for rel in ("jit/utils", "jit/include", "jit/csrc/gemm/marlin", "ops/gemm", "ops/quantization"):
        members += list(_files(tree, f"{k}/{rel}"))
    members += [(p, n) for p, n in _files(tree, f"{k}/jit") if n.count("/") == 3]
    members += [(tree / "sglang/srt/environ.py", "sglang/srt/environ.py")]
    for rel, text in (("sglang/__init__.py", ""), (f"{k}/ops/__init__.py", ""),
                      ("sglang/srt/__init__.py", ""), ("sglang/srt/utils/__init__.py", ""),
                      ("sglang/srt/utils/common.py", UPSTREAM_STUB)):  # fmt: skip
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_text(text)
        members = [m for m in members if m[1] != rel] + [(staging / rel, rel)]
    return [(p, f"trees/upstream/{n}") for p, n in members], tvm


def _sgl_kernel(cache: Path, ops: str, offline: bool, spec: str = SGL_KERNEL
                ) -> list[tuple[Path, str]]:  # fmt: skip
    """sgl_kernel's python files and ``<ops>/common_ops.abi3.so`` (the wheel is ~330 MB)."""
    subset = cache / f"sgl_kernel-{spec.split('==')[1]}-{ops}"
    if not (subset / "sgl_kernel" / ops).is_dir():
        wheel = _pip_download([spec], cache / "sgl_kernel", [], offline)[0]
        with zipfile.ZipFile(wheel) as z:
            z.extractall(subset, [n for n in z.namelist() if n.startswith("sgl_kernel/") and (
                n.endswith(".py") or n == f"sgl_kernel/{ops}/common_ops.abi3.so")])  # fmt: skip
    return [(p, f"sgl/{n}") for p, n in _files(subset, "sgl_kernel")]


def unpatched_tree(patched: Path, pin: Path, work: Path) -> Path:
    """The patched tree with the pin's jit_kernel CUDA/C++ sources (hard links, made once)."""
    kp, kpin = patched / "sglang" / "jit_kernel", pin / "sglang" / "jit_kernel"
    dest = work / f"unpatched-{tree_hash(kp)[:12]}-{tree_hash(kpin)[:12]}"
    if (dest / ".done").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)

    shutil.copytree(patched / "sglang", dest / "sglang", copy_function=_link)
    for p in kpin.rglob("*"):
        if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts:
            target = dest / p.relative_to(pin)
            target.unlink(missing_ok=True)  # never write through a link into the patched tree
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)
    (dest / ".done").write_text("")
    return dest


def reduced_tree(tree: Path, kernel_set: str, work: Path) -> Path:
    """TREE with its Marlin GEMM modules' dispatch reduced to KERNEL_SET (hard links, made
    once): the modules build the kernels the FP4 layers run (all of their tile configurations)
    and every line of host code, in a fraction of the time (fp4series.marlin_dispatch)."""
    from fp4series import compile_check, marlin_dispatch

    keep = marlin_dispatch.KERNEL_SETS[kernel_set]
    layout = compile_check.discover_layout(tree / "sglang")
    sources = sorted({layout.csrc / rel for name in compile_check.GEMM_MODULES
                      for rel in layout.module(name).cuda_files})  # fmt: skip
    dest = work / f"{kernel_set}-{tree.name}-{tree_digest(tree)[:12]}"
    if (dest / ".done").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(tree / "sglang", dest / "sglang", copy_function=_link)
    notes = []
    for src in sources:
        text = src.read_text()
        if not marlin_dispatch.has_dispatch(text):
            continue
        reduction = marlin_dispatch.reduce_source(text, keep)
        target = dest / src.relative_to(tree)
        target.unlink()  # a hard link into TREE: never write through it
        target.write_text(reduction.text)
        notes.append(f"{src.name}: {reduction.summary(keep)}")
    if not notes:
        raise SeriesError(f"{tree}: no Marlin dispatch to reduce to {kernel_set}",
                          hint="run with --kernel-set full")  # fmt: skip
    (dest / "kernel-set.txt").write_text("\n".join(notes) + "\n")
    (dest / ".done").write_text("")
    return dest


def _prebuild(arch: str, variants: dict[str, Path], wanted: list[tuple[str, str]], cache: Path,
              jobs: int, staging: Path) -> list[tuple[Path, str]]:  # fmt: skip
    """Build the stages' JIT modules here (no GPU needed), cached by tree hash and arch."""
    todo: dict[tuple[Path, str], list[str]] = {}
    for variant, spec in wanted:
        if variant in variants:
            a = "compute_75" if variant == "compute75" else arch
            todo.setdefault((variants[variant], a), []).append(spec)
    procs, records = [], []
    # one process per module (nvcc compiles each on one core), at most ``jobs`` at a time
    for (tree, a), specs in todo.items():
        out = cache / "prebuilt" / tree_hash(tree / "sglang" / "jit_kernel")[:16] / a
        out.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(REPO / "src")]))
        cmd = [sys.executable, str(HERE / "jit_hook.py"), "build", "--arch", a, "--out", str(out)]
        for spec in specs:
            while len([p for p in procs if p.poll() is None]) >= jobs:
                time.sleep(2)
            print(f"[make-bundle] prebuilding {a} {spec} for {tree}", flush=True)
            procs.append(subprocess.Popen([*cmd, spec], env=env))
        records.append(out)
    if any([p.wait() for p in procs]):  # every one waited for, not up to the first failure
        print("[make-bundle] warning: some modules did not build; the GPU host builds them")
    entries = []
    for out in records:
        for rec_path in sorted(out.glob("*.json")):
            rec = json.loads(rec_path.read_text())
            name = f"{rec['module']}.{rec['arch']}.{rec['tree_hash'][:12]}.so"
            shutil.copy2(rec["so"], staging / name)
            subprocess.run(["strip", "--strip-debug", str(staging / name)], check=False)
            entries.append({**{k: v for k, v in rec.items() if k != "so"}, "file": name})
    (staging / "manifest.json").write_text(json.dumps({"modules": entries}, indent=1))
    return [(p, f"prebuilt/{p.name}") for p in sorted(staging.iterdir())]


# ----------------------------------------------------------------------------- writing


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.strip(), re.I)
    if not m:
        raise SeriesError(f"--part-size {text!r} is not a size", hint="e.g. 60M, 500K, 2G")
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


def write(members: list[tuple[Path, str]], out: Path, name: str, part_size: int | None,
          meta: dict) -> dict:  # fmt: skip
    """tar.xz of ``members`` split into parts, and the manifest that checks them byte-exact."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{name}.tar.xz*"):
        old.unlink()
    archive = out / f"{name}.tar.xz"
    files = {}
    with tarfile.open(archive, "w:xz") as tar:  # mtimes kept: ninja reuses builds on re-unpack
        for src, arc in sorted(members, key=lambda m: m[1]):
            files[arc] = sha256_file(src)
            tar.add(str(src), arcname=arc, recursive=False)
    payload = sha256_file(archive)
    parts = [archive]
    if part_size and archive.stat().st_size > part_size:
        parts = []
        with archive.open("rb") as fh:
            while chunk := fh.read(part_size):
                parts.append(out / f"{name}.tar.xz.{len(parts):03d}")
                parts[-1].write_bytes(chunk)
        archive.unlink()
    manifest = {**meta, "format": FORMAT, "payload_sha256": payload, "files": files,
                "parts": [{"file": p.name, "sha256": sha256_file(p), "size": p.stat().st_size}
                          for p in parts]}  # fmt: skip
    (out / f"{name}.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _join(out, manifest, out / f".{name}.joined")  # read back what was written
    (out / f".{name}.joined").unlink()
    return manifest


def _libs(members: list[tuple[Path, str]]) -> None:
    for lib in LIBS:
        found = [Path(d) / lib for d in LIB_DIRS if (Path(d) / lib).is_file()]
        if found:
            members.append((found[0].resolve(), f"lib/{lib}"))
        else:
            print(f"[make-bundle] warning: {lib} not found here; not bundled", file=sys.stderr)


def _includes(specs: list[str]) -> list[tuple[Path, str]]:
    members = []
    for spec in specs:
        src, _, dest = spec.partition(":")
        src_path = Path(src)
        dest = dest or src_path.name
        if src_path.is_dir():
            members += [(p, f"extra/{dest}/{p.relative_to(src_path)}")
                        for p in sorted(src_path.rglob("*")) if p.is_file()]  # fmt: skip
        elif src_path.is_file():
            members.append((src_path, f"extra/{dest}"))
        else:
            raise SeriesError(f"--include {src}: no such file or directory", hint="fix the path")
    return members


def upstream_delta(patched: Path, bare: Path) -> tuple[list[tuple[Path, str]], list[str]]:
    """The bare tree's files that the patched tree lacks or has otherwise, as members under
    trees/upstream-delta/, and the patched tree's files the bare one does not have."""
    have = dict(_files(patched, "sglang"))
    want = dict(_files(bare, "sglang"))
    by_rel = {rel: p for p, rel in have.items()}
    members = []
    for p, rel in want.items():
        mine = by_rel.get(rel)
        if mine is None or mine.read_bytes() != p.read_bytes():
            members.append((p, f"trees/upstream-delta/{rel}"))
    bare_rels = set(want.values())
    removed = sorted(rel for rel in have.values() if rel not in bare_rels)
    return members, removed


def bare_tree(root: Path, manifest: dict, work: Path) -> Path:
    """A line bundle's bare release tree: the line's tree with the delta applied (hard links,
    made once), checked against the digest of the tree the bundle was made from."""
    info = manifest["upstream_delta"]
    dest = work / f"bare-{info['digest'][:16]}"
    if (dest / ".done").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(root / "trees" / "patched" / "sglang", dest / "sglang", copy_function=_link)
    for rel in info["removed"]:
        (dest / rel).unlink()
    delta = root / "trees" / "upstream-delta"
    for p in sorted(delta.rglob("*")) if delta.is_dir() else []:
        if p.is_file():
            target = dest / p.relative_to(delta)
            target.unlink(missing_ok=True)  # never write through a link into the line's tree
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)
    got = tree_digest(dest)
    if got != info["digest"]:
        raise SeriesError(f"{dest}: the rebuilt bare release differs from the one the bundle "
                          "was made from", hint="make the bundle again")  # fmt: skip
    (dest / ".done").write_text("")
    return dest


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def _conformance_wheel(line: str | None, cache: Path, offline: bool) -> Path:
    """The verified upstream wheel a line's (None: the pin's) conformance tests come from."""
    from fp4series import conformance

    release = conformance.upstream_release(REPO / "upstream.lock",
                                           conformance.profile(line).source_version)  # fmt: skip
    local = REPO / ".work" / "cache" / "wheels" / release.wheel_filename
    if local.is_file() or offline:
        if not local.is_file() or sha256_file(local) != release.sha256:
            raise SeriesError(f"{local}: missing or not the wheel upstream.lock names",
                              hint="run without --offline (fetches and verifies it)")  # fmt: skip
        return local
    from fp4series.upstream import fetch_wheel

    return fetch_wheel(release, REPO / ".work" / "cache")


def make_line(args: argparse.Namespace) -> int:
    """A line's bundle (module docstring): its tree, the bare release's delta, its wheels."""
    from fp4series.line import resolve_line

    line = resolve_line(args.line, root=REPO)
    if line.is_pin:
        raise SeriesError(f"{args.line} is the pin's version", hint="leave out --line")
    if args.prebuild or args.with_upstream or args.pin_tree:
        raise SeriesError("--prebuild, --with-upstream and --pin-tree are for the pin's bundle",
                          hint=f"a {line.label} bundle carries its trees; the GPU host builds "
                          "the modules")  # fmt: skip
    hint = (
        f"run `python -m fp4series prepare-checkout --line {line.version}` (scripts/main.sh "
        f"--line {line.version} does)"
    )
    patched = _python_tree(args.patched_tree or line.checkout / "python", f"{line.label}'s tree",
                           hint, "kernels")  # fmt: skip
    bare = _python_tree(args.upstream_tree or line.upstream_dir / "python",
                        f"the bare {line.version} tree", hint, "kernels")  # fmt: skip
    pip_args = ["--python-version", args.python_version, "--implementation", "cp",
                *[a for p in args.platform for a in ("--platform", p)]]  # fmt: skip
    cache, out = args.cache, args.out.resolve()
    members = [(p, f"trees/patched/{n}") for p, n in _files(patched, "sglang")]
    delta, removed = upstream_delta(patched, bare)
    members += delta
    members += _sgl_kernel(cache, args.sgl_kernel_ops, args.offline,
                           LINE_SGL_KERNEL.get(line.version, SGL_KERNEL))  # fmt: skip
    wheels_txt = args.wheels or REPO / "requirements" / line.version / "gpu-host.txt"
    wheels = _pip_download(_requirements(wheels_txt), cache / "wheels", pip_args, args.offline)
    members += [(w, f"wheels/{w.name}") for w in wheels]
    conf = _conformance_wheel(line.version, cache, args.offline)
    members.append((conf, f"extra/wheels/{conf.name}"))
    _libs(members)
    members += _includes(args.include)
    meta = {"series_revision": report.series_revision(REPO, line.version),
            "pin": report.pin_info(REPO, line.version), "line": line.version,
            "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": args.python_version, "upstream": None, "prebuilt": None,
            "sgl_kernel": LINE_SGL_KERNEL.get(line.version, SGL_KERNEL),
            "upstream_delta": {"digest": tree_digest(bare), "removed": removed,
                               "files": len(delta)}}  # fmt: skip
    print(f"[make-bundle] {line.label}: its tree, {len(delta)} file(s) of the bare release, "
          f"{len(wheels)} wheels", flush=True)  # fmt: skip
    manifest = write(members, out, args.name, _parse_size(args.part_size) if args.part_size
                     else None, meta)  # fmt: skip
    total = sum(p["size"] for p in manifest["parts"])
    sizes = ", ".join(f"{p['size'] / 2**20:.1f}" for p in manifest["parts"])
    print(f"[make-bundle] {out}/{args.name}.json: {len(manifest['files'])} files, "
          f"{len(manifest['parts'])} part(s) ({sizes} MiB), {total / 2**20:.1f} MiB")  # fmt: skip
    return 0


def make(args: argparse.Namespace) -> int:
    if args.line:
        return make_line(args)
    pin_tag = report.pin_info(REPO)["tag"]
    hint = "run `python -m fp4series prepare-checkout` (scripts/main.sh does)"
    args.patched_tree = args.patched_tree or REPO / ".work" / "checkout" / "python"
    args.wheels = args.wheels or REPO / "requirements" / "gpu-host.txt"
    patched = _python_tree(args.patched_tree, "the patched tree", hint)
    pin_default = REPO / ".work" / "upstream" / pin_tag / "python"
    pin = _python_tree(args.pin_tree or pin_default, "the pin's tree", hint)
    pip_args = ["--python-version", args.python_version, "--implementation", "cp",
                *[a for p in args.platform for a in ("--platform", p)]]  # fmt: skip
    cache, out = args.cache, args.out.resolve()
    staging = cache / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    members = [(p, f"trees/patched/{n}") for p, n in _files(patched, "sglang")]
    members += [(p, f"trees/pin/{n}") for p, n in _files(pin, "sglang/jit_kernel")
                if p.suffix != ".py"]  # fmt: skip
    members += _sgl_kernel(cache, args.sgl_kernel_ops, args.offline)
    wheels = _pip_download(_requirements(args.wheels), cache / "wheels", pip_args, args.offline)
    members += [(w, f"wheels/{w.name}") for w in wheels]
    if args.with_upstream:
        up, tvm = _upstream(args.with_upstream, cache, pip_args, args.offline, staging / "up")
        members += up + [(w, f"wheels-upstream/{w.name}") for w in tvm]
    _libs(members)
    if args.prebuild:
        unpatched = unpatched_tree(patched, pin, staging)
        variants = {"patched": patched, "unpatched": unpatched, "compute75": patched}
        wanted = [m for s in stages.select(args.stages) for m in s.modules]
        (staging / "prebuilt").mkdir()
        members += _prebuild(args.prebuild, variants, list(dict.fromkeys(wanted)), cache,
                             args.jobs, staging / "prebuilt")  # fmt: skip
    members += _includes(args.include)
    if "conformance" in {s.name for s in stages.select(args.stages)}:
        conf = _conformance_wheel(None, cache, args.offline)  # the stage's tests come from it
        if f"extra/wheels/{conf.name}" not in {a for _, a in members}:  # not also --include'd
            members.append((conf, f"extra/wheels/{conf.name}"))
    meta = {"series_revision": report.series_revision(REPO), "pin": report.pin_info(REPO),
            "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": args.python_version, "upstream": args.with_upstream or None,
            "prebuilt": args.prebuild or None}  # fmt: skip
    manifest = write(members, out, args.name, _parse_size(args.part_size) if args.part_size
                     else None, meta)  # fmt: skip
    total = sum(p["size"] for p in manifest["parts"])
    print(f"[make-bundle] {out}/{args.name}.json: {len(manifest['files'])} files, "
          f"{len(manifest['parts'])} part(s), {total / 2**20:.1f} MiB")  # fmt: skip
    return 0


# ----------------------------------------------------------------------------- reading


def _manifest_path(bundle: Path) -> Path:
    if bundle.is_file():
        return bundle
    found = sorted(bundle.glob("*.json"))
    if len(found) != 1:
        raise SeriesError(f"{bundle}: expected one bundle manifest (*.json), found {len(found)}",
                          hint="pass the manifest file itself: --bundle DIR/NAME.json")  # fmt: skip
    return found[0]


def _join(folder: Path, manifest: dict, dest: Path) -> None:
    """Check every part, join them into DEST and check the whole archive's sha256."""
    with dest.open("wb") as out:
        for part in manifest["parts"]:
            path = folder / part["file"]
            if not path.is_file():
                raise SeriesError(f"bundle part {path} is missing", hint="copy every part over")
            if sha256_file(path) != part["sha256"]:
                raise SeriesError(f"bundle part {path}: sha256 differs from the manifest",
                                  hint="copy it again; it was damaged on the way")  # fmt: skip
            with path.open("rb") as fh:
                shutil.copyfileobj(fh, out)
    if sha256_file(dest) != manifest["payload_sha256"]:
        raise SeriesError(f"{folder}: the parts do not join to the archive the manifest names",
                          hint="copy every part of one make-bundle run")  # fmt: skip


def _unzip_wheel(wheel: Path, site: Path) -> None:
    """What pip does for these wheels, without pip: unzip, lift .data/{purelib,platlib}."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for data in site.glob("*.data"):
        for sub in ("purelib", "platlib"):
            for item in (data / sub).iterdir() if (data / sub).is_dir() else []:
                shutil.move(str(item), site / item.name)
        shutil.rmtree(data)


def unpack(bundle: Path, work: Path) -> tuple[Path, dict]:
    """The bundle checked and unpacked under ``work`` (once per archive), and its manifest."""
    mpath = _manifest_path(bundle)
    manifest = json.loads(mpath.read_text())
    if manifest.get("format") != FORMAT:
        raise SeriesError(f"{mpath}: bundle format {manifest.get('format')} is not {FORMAT}",
                          hint="make it with this checkout's scripts/make-bundle.sh")  # fmt: skip
    root = work / f"bundle-{manifest['payload_sha256'][:16]}"
    if (root / ".unpacked").is_file():
        return root, manifest
    tmp = work / f".{root.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _join(mpath.parent, manifest, tmp / "bundle.tar.xz")
    with tarfile.open(tmp / "bundle.tar.xz") as tar:
        tar.extractall(tmp, filter="fully_trusted")
    (tmp / "bundle.tar.xz").unlink()
    bad = [n for n, h in manifest["files"].items() if sha256_file(tmp / n) != h]
    if bad:
        raise SeriesError(f"{len(bad)} unpacked file(s) differ from the manifest: {bad[:3]}",
                          hint="make the bundle again")  # fmt: skip
    for wheels, site in (("wheels", "site"), ("wheels-upstream", "site-upstream")):
        for w in sorted((tmp / wheels).glob("*.whl")):
            _unzip_wheel(w, tmp / site)
    (tmp / ".unpacked").write_text(mpath.name)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root, manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/make-bundle.sh", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="directory the manifest and the parts go to")
    p.add_argument("--name", default="bundle", help="file name stem (default: bundle)")
    p.add_argument("--part-size", help="split the archive into parts of at most this (60M)")
    p.add_argument("--line", metavar="VERSION", help="a maintained series line's bundle "
                   "(e.g. 0.5.23; its tree, the bare release, its wheels)")  # fmt: skip
    p.add_argument("--patched-tree", type=Path, help="default .work/checkout/python (a line's: "
                   ".work/lines/V/checkout/python)")  # fmt: skip
    p.add_argument("--pin-tree", type=Path, help="default .work/upstream/<pin tag>/python")
    p.add_argument("--upstream-tree", type=Path, help="a line's bare release (default "
                   ".work/upstream/V/python)")  # fmt: skip
    p.add_argument("--with-upstream", metavar="VERSION", help="e.g. 0.5.23: benchmark column")
    p.add_argument("--prebuild", metavar="ARCH", help="prebuild JIT modules here (e.g. sm_90)")
    p.add_argument("--stages", default=",".join(stages.DEFAULT_STAGES),
                   help="stages whose modules --prebuild builds; with conformance, the "
                   "verified 0.5.13 wheel its tests come from is bundled too")  # fmt: skip
    p.add_argument("--jobs", type=int, default=2, help="parallel prebuilds (default 2)")
    p.add_argument("--wheels", type=Path, help="default requirements/gpu-host.txt (a line's: "
                   "requirements/V/gpu-host.txt)")  # fmt: skip
    p.add_argument("--python-version", default="3.12", help="the GPU host's python")
    p.add_argument("--platform", action="append", help="wheel platform tags for the GPU host "
                   "(repeatable; default manylinux_2_28/2014 x86_64 and any)")  # fmt: skip
    p.add_argument("--sgl-kernel-ops", default="sm90", help="which common_ops build to bundle")
    p.add_argument("--include", action="append", default=[], metavar="SRC[:DEST]",
                   help="also bundle a file or directory under extra/DEST")  # fmt: skip
    p.add_argument("--offline", action="store_true", help="use only wheels already in --cache")
    p.add_argument("--cache", type=Path, default=REPO / ".work" / "cache" / "bundle")
    args = p.parse_args(argv)
    args.platform = args.platform or ["manylinux_2_28_x86_64", "manylinux2014_x86_64", "any"]
    return run_reporting_errors(make, args)


if __name__ == "__main__":
    sys.exit(main())
