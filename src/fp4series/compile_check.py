"""Compile-only check of the patched Marlin JIT CUDA modules with the local nvcc.

SGLang builds its Marlin kernels at run time (``sglang.jit_kernel.utils.load_jit`` ->
apache-tvm-ffi ``load_inline`` -> ninja + nvcc). A CPU machine has nvcc but no GPU, so the
worker below drives SGLang's own loader with the arch forced through
``override_jit_cuda_arch`` and tvm-ffi's ``load_inline`` swapped for ``build_inline``: the
exact sources and flags SGLang would compile on that GPU, built into a ``.so``, never loaded.

The parent side (``run_compile_checks``) is stdlib-only: it hashes the inputs of each target
(kernel sources, SGLang's loader, flags, nvcc and tvm-ffi versions) and skips a target whose
stamp in ``.work/cache/compile/`` already records that hash.
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
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fp4series.errors import SeriesError

#: Wrapper module (in ``sglang.jit_kernel``) and its cached JIT loader, per kernel family.
MODULES: dict[str, tuple[str, str, str]] = {
    # name: (python module, loader function, csrc sub-directory with the templates)
    "gptq_marlin": ("sglang.jit_kernel.gptq_marlin", "_jit_gptq_marlin_module", "gemm/marlin"),
    "moe_wna16_marlin": (
        "sglang.jit_kernel.moe_wna16_marlin",
        "_jit_moe_wna16_marlin_module",
        "gemm/marlin_moe",
    ),
}
DTYPES = ("fp16", "bf16")

#: The cold check stays near 15 minutes on 2 cores (~3.5 min per module, dtype and arch).
DEFAULT_TARGETS = ("gptq_marlin:bf16:sm_90", "moe_wna16_marlin:fp16:sm_80")
#: Added when the patched templates carry a Turing (SM75) code path.
TURING_TARGETS = ("gptq_marlin:fp16:sm_75", "moe_wna16_marlin:fp16:sm_75")
#: How a Turing path shows in the templates: an explicit 750 arch guard or a named marker.
TURING_MARKER = re.compile(r"__CUDA_ARCH__\s*(?:>=|==|<|>)\s*750|MARLIN_SM75|MARLIN_TURING")

ENV_TARGETS = "FP4SERIES_COMPILE_TARGETS"  # comma list overriding the default targets
ENV_JOBS = "FP4SERIES_COMPILE_JOBS"  # concurrent nvcc builds (capped at 2)
MAX_JOBS = 2


@dataclass(frozen=True)
class Target:
    """One JIT module build: kernel family, activation dtype, GPU arch (``sm_90``, ``sm_90a``)."""

    module: str
    dtype: str
    arch: str

    @classmethod
    def parse(cls, text: str) -> Target:
        parts = text.strip().split(":")
        if len(parts) != 3:
            raise SeriesError(
                f"bad compile target {text!r}",
                hint="write MODULE:DTYPE:ARCH, e.g. gptq_marlin:bf16:sm_90",
            )
        module, dtype, arch = parts
        if module not in MODULES:
            raise SeriesError(
                f"unknown JIT module {module!r} in compile target {text!r}",
                hint=f"use one of {', '.join(MODULES)}",
            )
        if dtype not in DTYPES:
            raise SeriesError(
                f"unknown activation dtype {dtype!r} in {text!r}", hint="use fp16 or bf16"
            )
        if not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
            raise SeriesError(f"bad arch {arch!r} in {text!r}", hint="write e.g. sm_80 or sm_90a")
        return cls(module, dtype, arch)

    @property
    def name(self) -> str:
        return f"{self.module}-{self.dtype}-{self.arch}"

    @property
    def major_minor_suffix(self) -> tuple[int, int, str]:
        m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", self.arch)
        assert m is not None
        return int(m.group(1)), int(m.group(2)), m.group(3)

    def __str__(self) -> str:
        return f"{self.module}:{self.dtype}:{self.arch}"


@dataclass
class CompileResult:
    target: Target
    status: str  # "cached" | "built" | "failed"
    seconds: float
    detail: str = ""


def has_turing_path(sglang_dir: Path) -> bool:
    """True when the patched Marlin templates carry an SM75 code path (patch 9)."""
    for sub in ("gemm/marlin", "gemm/marlin_moe"):
        folder = sglang_dir / "jit_kernel" / "csrc" / sub
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            if path.suffix in {".h", ".cuh", ".cu"} and TURING_MARKER.search(
                path.read_text(errors="replace")
            ):
                return True
    return False


def select_targets(sglang_dir: Path, spec: str | None = None) -> list[Target]:
    """Targets from ``spec`` / $FP4SERIES_COMPILE_TARGETS, else the defaults (+ SM75 if present)."""
    spec = spec if spec is not None else os.environ.get(ENV_TARGETS)
    if spec is not None:
        if spec.strip().lower() in {"", "none", "off"}:
            return []
        return [Target.parse(t) for t in spec.split(",") if t.strip()]
    names = list(DEFAULT_TARGETS)
    if has_turing_path(sglang_dir):
        names += TURING_TARGETS
    return [Target.parse(t) for t in names]


def _hash_tree(h: hashlib._Hash, root: Path, base: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(base)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())


def _tool_version(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    except OSError as exc:
        return f"unavailable: {exc}"


def target_key(target: Target, sglang_dir: Path, python: Path, nvcc: str) -> str:
    """Hash of everything that decides the build: sources, loader, flags, arch, tool versions."""
    h = hashlib.sha256()
    h.update(f"target={target}\n".encode())
    jit = sglang_dir / "jit_kernel"
    _hash_tree(h, jit / "include", sglang_dir)
    _hash_tree(h, jit / "csrc" / MODULES[target.module][2], sglang_dir)
    for rel in ("utils.py", f"{target.module}.py"):
        path = jit / rel
        if path.is_file():
            h.update(rel.encode() + b"\0" + path.read_bytes())
    h.update(_tool_version([nvcc, "--version"]).encode())
    h.update(
        _tool_version(
            [
                str(python),
                "-c",
                "import importlib.metadata as m; print(m.version('apache-tvm-ffi'))",
            ]
        ).encode()
    )
    h.update(Path(__file__).read_bytes())  # the worker decides flags too
    return h.hexdigest()


def find_cuda_home(nvcc: str) -> str:
    """CUDA_HOME for tvm-ffi: the toolkit behind ``nvcc`` (``/usr/local/bin/nvcc`` is a shim)."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    for candidate in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
        if (Path(candidate) / "bin" / "nvcc").exists():
            return candidate
    return str(Path(nvcc).resolve().parent.parent)


def _run_one(
    target: Target,
    *,
    python: Path,
    sglang_dir: Path,
    cache_dir: Path,
    build_root: Path,
    nvcc: str,
    force: bool,
) -> CompileResult:
    start = time.monotonic()
    key = target_key(target, sglang_dir, python, nvcc)
    stamp = cache_dir / f"{target.name}.stamp"
    if not force and stamp.is_file() and stamp.read_text().split("\n", 1)[0] == key:
        return CompileResult(target, "cached", time.monotonic() - start, str(stamp))
    out_dir = build_root / target.name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    env = dict(os.environ)
    env["CUDA_HOME"] = find_cuda_home(nvcc)
    env["MAX_JOBS"] = "1"  # one translation unit per module; parallelism is across targets
    env["PYTHONPATH"] = os.pathsep.join(
        [str(sglang_dir.parent), str(Path(__file__).resolve().parents[1])]
    )
    cmd = [
        "nice", "-n", "10", str(python), "-m", "fp4series.compile_check", "worker",
        "--module", target.module, "--dtype", target.dtype, "--arch", target.arch,
        "--build-dir", str(out_dir),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    (out_dir / "worker.log").write_text(proc.stdout + proc.stderr)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        return CompileResult(target, "failed", seconds, tail)
    cache_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{key}\n{json.dumps({'target': str(target), 'seconds': seconds})}\n")
    return CompileResult(target, "built", seconds, proc.stdout.strip().splitlines()[-1:][0])


def run_compile_checks(
    targets: Sequence[Target],
    *,
    python: Path,
    sglang_dir: Path,
    cache_dir: Path,
    build_root: Path,
    jobs: int | None = None,
    force: bool = False,
) -> list[CompileResult]:
    """Build each target unless its stamp matches; print one line per target; never > 2 jobs."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        raise SeriesError(
            "nvcc not found: the Marlin compile check needs the CUDA toolkit",
            hint="install CUDA 13 (nvcc on PATH) or skip with FP4SERIES_COMPILE_TARGETS=none",
        )
    if not (sglang_dir / "jit_kernel" / "utils.py").is_file():
        raise SeriesError(
            f"{sglang_dir} is not an SGLang package with jit_kernel/",
            hint="point the build at a checkout's python/sglang",
        )
    jobs = jobs or int(os.environ.get(ENV_JOBS, str(MAX_JOBS)))
    jobs = max(1, min(jobs, MAX_JOBS))
    print(f"[compile] {len(targets)} target(s), {jobs} at a time, nice 10: "
          + ", ".join(str(t) for t in targets), flush=True)  # fmt: skip

    def one(t: Target) -> CompileResult:
        print(f"[compile] {t} ...", flush=True)
        r = _run_one(
            t, python=python, sglang_dir=sglang_dir, cache_dir=cache_dir,
            build_root=build_root, nvcc=nvcc, force=force,
        )  # fmt: skip
        print(f"[compile] {t}: {r.status} in {r.seconds:.1f}s", flush=True)
        if r.status == "failed":
            print(r.detail, file=sys.stderr, flush=True)
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, targets))


# --------------------------------------------------------------------------------------------
# Worker: runs inside the test venv (torch + apache-tvm-ffi), imports SGLang, builds one module.


def _worker(module: str, dtype: str, arch: str, build_dir: str) -> int:
    import importlib

    import torch
    import tvm_ffi.cpp
    from sglang.jit_kernel import utils

    built: list[str] = []

    def build_only(name: str, **kwargs: object) -> str:
        kwargs["build_directory"] = build_dir
        kwargs.pop("keep_module_alive", None)
        path = tvm_ffi.cpp.build_inline(name, **kwargs)  # type: ignore[arg-type]
        built.append(path)
        return path  # load_jit returns it; nothing is loaded on this GPU-less machine

    tvm_ffi.cpp.load_inline = build_only  # type: ignore[assignment]
    os.environ.setdefault("TVM_FFI_GPU_BACKEND", "cuda")
    m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    assert m is not None
    py_module, loader, _ = MODULES[module]
    wrapper = importlib.import_module(py_module)
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with utils.override_jit_cuda_arch(int(m.group(1)), int(m.group(2)), m.group(3)):
        getattr(wrapper, loader)(torch_dtype)
    if not built or not Path(built[0]).is_file():
        print(f"no shared object was built for {module}:{dtype}:{arch}", file=sys.stderr)
        return 1
    ninja = Path(build_dir) / "build.ninja"
    flags = [ln for ln in ninja.read_text().splitlines() if ln.startswith("cuda_cflags")]
    print(flags[0] if flags else "")
    print(f"built {built[0]} ({Path(built[0]).stat().st_size} bytes)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4series.compile_check")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="(internal) build one JIT module in this interpreter")
    w.add_argument("--module", required=True, choices=sorted(MODULES))
    w.add_argument("--dtype", required=True, choices=DTYPES)
    w.add_argument("--arch", required=True)
    w.add_argument("--build-dir", required=True)
    args = parser.parse_args(argv)
    return _worker(args.module, args.dtype, args.arch, args.build_dir)


if __name__ == "__main__":
    sys.exit(main())
