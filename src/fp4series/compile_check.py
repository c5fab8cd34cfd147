"""Compile-only check of the patched Marlin JIT CUDA modules with the local nvcc.

SGLang builds its Marlin kernels at run time: a cached Python loader (``_jit_gptq_marlin_module``
and the like) calls ``load_jit`` with the module's CUDA sources, which generates and runs a ninja
build with nvcc. A CPU machine has nvcc but no GPU, so the worker below drives SGLang's own loader
with the arch forced through ``override_jit_cuda_arch`` and the final load replaced by "keep the
``.so``": the exact sources and flags SGLang would compile on that GPU, built, never loaded.

Both source layouts are supported, and everything is discovered from the tree, not assumed:

- the JIT root is the directory under ``sglang/`` holding ``csrc/``, ``include/`` and a ``utils``
  module or package that defines ``load_jit`` (``jit_kernel/`` at the pin, ``kernels/jit/`` from
  0.5.17 on);
- a module's wrapper is the Python file with a function whose body calls
  ``load_jit("<module>", ..., cuda_files=[...])`` (``jit_kernel/gptq_marlin.py`` at the pin,
  ``kernels/ops/gemm/gptq_marlin.py`` on 0.5.23), and that function is the loader the worker calls;
- the loader package is where that file imports ``load_jit`` from; the worker takes
  ``override_jit_cuda_arch`` from it. Build-only mode follows what ``load_jit`` runs on:
  tvm-ffi's ``load_inline`` (the pin: swapped for ``build_inline``), or SGLang's own ninja loader
  (0.5.17+: its ``_load`` returns the path instead of loading, and the ``.so`` is copied out of the
  staging directory).

A ``MODULE@fp4`` target builds the module the same way from a copy of its dispatch source
reduced to the FP4 kernels (``fp4series.marlin_dispatch``): the parent writes the copy, the
worker hands it to the wrapper's ``load_jit`` in place of the tree's file.

The parent side (``run_compile_checks``) is stdlib-only: it hashes the inputs of each target
(the module's sources and what they include, the JIT headers, the loader package, the wrapper,
nvcc and tvm-ffi versions) and skips a target whose stamp in ``.work/cache/compile/`` already
records that hash. ``python -m fp4series.compile_check check`` runs it on any tree (e.g. a line's
checkout) with any venv.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
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

from fp4series import marlin_dispatch
from fp4series.errors import SeriesError, run_main

#: The Marlin JIT modules this check knows, by the name their wrapper passes to ``load_jit``.
#: Where their wrappers and sources live is discovered from the tree (``discover_layout``).
MODULES: tuple[str, ...] = (
    "gptq_marlin",
    "moe_wna16_marlin",
    "gptq_marlin_repack",
    "awq_marlin_repack",
)
#: The GEMM modules: their kernel dispatch can be reduced to a kernel set (``MODULE@SET``).
GEMM_MODULES = ("gptq_marlin", "moe_wna16_marlin")
DTYPES = ("fp16", "bf16")
#: Dtype field of a module whose loader takes no activation dtype (the repack modules).
NO_DTYPE = "-"

#: What the series changes in the GEMM templates is FP4 (float4_e2m1f) code: the FP4 scale
#: stride (SM80+) and the Turing path (SM75 fp16). The default targets build those modules
#: with the dispatch reduced to its FP4 kernels (``@fp4``: 15 of 270 dense, 20 of 180 MoE),
#: all host code included (dense SM75: 40 s of CPU where the full module took 470 s), so each
#: template is built for SM80 and SM90, one in fp16 and one in bf16. ``full``
#: (FP4SERIES_COMPILE_TARGETS=full) builds the same targets as whole modules.
DEFAULT_TARGETS = (
    "gptq_marlin@fp4:bf16:sm_90",
    "moe_wna16_marlin@fp4:fp16:sm_80",
    "gptq_marlin@fp4:fp16:sm_80",
    "moe_wna16_marlin@fp4:bf16:sm_90",
)
#: Added when the patched templates carry a Turing (SM75) code path (the repacks take ~6 s each).
TURING_TARGETS = (
    # the Turing patch moves every kernel body to SM75: its FP4 kernels and one of each variant
    "gptq_marlin@fp4v:fp16:sm_75",
    "moe_wna16_marlin@fp4v:fp16:sm_75",
    "gptq_marlin_repack:-:sm_75",
    "awq_marlin_repack:-:sm_75",
)
FULL = "full"  # the spec that builds the default targets as whole modules
#: How a Turing path shows in the templates: an arch guard at 750 that moves a threshold
#: (``< 750`` stubs, ``>= 750`` helpers) or a named marker. ``== 750`` alone is not one:
#: upstream 0.5.23's MoE template has an ``__CUDA_ARCH__ == 750`` shuffle fallback for
#: ``__reduce_add_sync`` while every kernel body is still stubbed below SM80.
TURING_MARKER = re.compile(
    r"__CUDA_ARCH__\s*(?:>=|<|>)\s*750\b|mma_m16n8k16_sm75|MARLIN_SM75|MARLIN_TURING"
)

ENV_TARGETS = "FP4SERIES_COMPILE_TARGETS"  # comma list overriding the default targets
ENV_JOBS = "FP4SERIES_COMPILE_JOBS"  # concurrent nvcc builds (capped at 2)
MAX_JOBS = 2


@dataclass(frozen=True)
class Target:
    """One JIT module build: module, activation dtype, GPU arch (``sm_90``, ``sm_90a``), and
    the loader's boolean parameters to set (``MODULE[@SET]:DTYPE:ARCH[:FLAG+FLAG]``, e.g.
    ``moe_wna16_marlin:fp16:sm_75:expert_ids_are_sorted+has_inactive_prefix_count``); every
    other boolean parameter without a default is False, the rest keep their defaults.
    ``@SET`` (a GEMM module only, e.g. ``gptq_marlin@fp4``) builds the module with its kernel
    dispatch reduced to that kernel set (``marlin_dispatch.KERNEL_SETS``)."""

    module: str
    dtype: str
    arch: str
    flags: tuple[str, ...] = ()
    kernels: str | None = None  # a marlin_dispatch.KERNEL_SETS name; None: every kernel

    @classmethod
    def parse(cls, text: str) -> Target:
        parts = text.strip().split(":")
        if len(parts) not in (3, 4):
            raise SeriesError(
                f"bad compile target {text!r}",
                hint="write MODULE[@SET]:DTYPE:ARCH[:FLAG+FLAG], e.g. gptq_marlin:bf16:sm_90 "
                "or gptq_marlin@fp4:fp16:sm_75",
            )
        module, dtype, arch = parts[:3]
        module, _, kernels = module.partition("@")
        flags = tuple(f for f in parts[3].split("+") if f) if len(parts) == 4 else ()
        if module not in MODULES:
            raise SeriesError(
                f"unknown JIT module {module!r} in compile target {text!r}",
                hint=f"use one of {', '.join(MODULES)}",
            )
        if kernels and kernels not in marlin_dispatch.KERNEL_SETS:
            raise SeriesError(
                f"unknown kernel set {kernels!r} in compile target {text!r}",
                hint=f"use one of {', '.join('@' + k for k in marlin_dispatch.KERNEL_SETS)}, "
                "or no @SET for the full module",
            )
        if kernels and module not in GEMM_MODULES:
            raise SeriesError(
                f"{module} has no kernel dispatch to reduce ({text!r})",
                hint=f"@SET applies to {' and '.join(GEMM_MODULES)}; write {module}:{dtype}:"
                f"{arch} (the full module)",
            )
        if dtype not in (*DTYPES, NO_DTYPE):
            raise SeriesError(
                f"unknown activation dtype {dtype!r} in {text!r}",
                hint=f"use fp16 or bf16 ({NO_DTYPE} for a module without one, e.g. a repack)",
            )
        if not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
            raise SeriesError(f"bad arch {arch!r} in {text!r}", hint="write e.g. sm_80 or sm_90a")
        for flag in flags:
            if not re.fullmatch(r"[A-Za-z_]\w*", flag):
                raise SeriesError(
                    f"bad loader flag {flag!r} in {text!r}",
                    hint="flags are the loader's parameter names, joined by +",
                )
        return cls(module, dtype, arch, flags, kernels or None)

    @property
    def module_spec(self) -> str:
        """``gptq_marlin`` or, reduced to a kernel set, ``gptq_marlin@fp4``."""
        return f"{self.module}@{self.kernels}" if self.kernels else self.module

    @property
    def name(self) -> str:
        dtype = "nodtype" if self.dtype == NO_DTYPE else self.dtype
        extra = "-" + "+".join(self.flags) if self.flags else ""
        return f"{self.module_spec}-{dtype}-{self.arch}{extra}"

    @property
    def major_minor_suffix(self) -> tuple[int, int, str]:
        m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", self.arch)
        assert m is not None
        return int(m.group(1)), int(m.group(2)), m.group(3)

    def __str__(self) -> str:
        extra = ":" + "+".join(self.flags) if self.flags else ""
        return f"{self.module_spec}:{self.dtype}:{self.arch}{extra}"


@dataclass
class CompileResult:
    target: Target
    status: str  # "cached" | "built" | "failed"
    seconds: float
    detail: str = ""
    kernels: str = ""  # for a MODULE@SET target: what its reduced dispatch builds


# --------------------------------------------------------------------------------------------
# Layout discovery (stdlib only: ast over the tree's files, nothing imported)


@dataclass(frozen=True)
class JitModule:
    """Where one JIT module's loader and sources are, as the tree itself says."""

    name: str  # load_jit's first argument, e.g. "gptq_marlin"
    py_module: str  # dotted wrapper module, e.g. sglang.kernels.ops.gemm.gptq_marlin
    loader: str  # the function in it that calls load_jit, e.g. _jit_gptq_marlin_module
    utils_module: str  # where the wrapper imports load_jit from, e.g. sglang.kernels.jit.utils
    cuda_files: tuple[str, ...]  # relative to the JIT root's csrc/
    wrapper: Path


@dataclass(frozen=True)
class JitLayout:
    sglang_dir: Path
    root: Path  # holds csrc/ and include/: sglang/jit_kernel or sglang/kernels/jit
    modules: dict[str, JitModule]

    @property
    def csrc(self) -> Path:
        return self.root / "csrc"

    @property
    def include(self) -> Path:
        return self.root / "include"

    def module(self, name: str) -> JitModule:
        if name not in self.modules:
            raise SeriesError(
                f"no JIT loader for module {name!r} under {self.sglang_dir}: no function there "
                f"calls load_jit({name!r}, ...)",
                hint="this SGLang tree does not build that module; pick other compile targets",
            )
        return self.modules[name]

    def module_path(self, dotted: str) -> Path:
        """The file (``x.py``) or package directory (``x/``) of a dotted module of the tree."""
        base = self.sglang_dir.parent / Path(*dotted.split("."))
        return base if base.is_dir() else base.with_suffix(".py")

    def sources(self, name: str) -> list[Path]:
        """Every file the module's CUDA sources are built from inside the JIT root: the
        directories of its cuda_files, plus the quoted includes they reach (transitively)."""
        mod = self.module(name)
        seen: set[Path] = set()
        todo: list[Path] = []
        for rel in mod.cuda_files:
            folder = (self.csrc / rel).parent
            todo += [p for p in sorted(folder.glob("*")) if p.is_file()]
        root = self.root.resolve()
        while todo:
            path = todo.pop()
            path = path.resolve()
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            for inc in _INCLUDE.findall(path.read_text(errors="replace")):
                for base in (path.parent, self.csrc, self.include):
                    cand = (base / inc).resolve()
                    if cand.is_file() and cand.is_relative_to(root):
                        todo.append(cand)
                        break
        return sorted(seen)


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_SKIP_DIRS = {"csrc", "include", "tests", "test", "benchmark", "benchmarks", "__pycache__"}


def _defines_load_jit(utils: Path) -> bool:
    files = sorted(utils.rglob("*.py")) if utils.is_dir() else [utils]
    return any("def load_jit(" in f.read_text(errors="replace") for f in files if f.is_file())


def _find_jit_root(sglang_dir: Path) -> Path:
    candidates = []
    for folder in sorted([*sglang_dir.glob("*/"), *sglang_dir.glob("*/*/")]):
        if not ((folder / "csrc").is_dir() and (folder / "include").is_dir()):
            continue
        utils = folder / "utils.py" if (folder / "utils.py").is_file() else folder / "utils"
        if utils.exists() and _defines_load_jit(utils):
            candidates.append(folder)
    if len(candidates) != 1:
        found = ", ".join(str(c.relative_to(sglang_dir)) for c in candidates) or "none"
        raise SeriesError(
            f"{sglang_dir} has no single SGLang JIT kernel root (csrc/, include/ and a utils "
            f"module defining load_jit): found {found}",
            hint="point the compile check at a checkout's python/sglang (or an installed sglang)",
        )
    return candidates[0]


def _dotted(path: Path, top: Path) -> str:
    rel = path.relative_to(top).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_source(tree: ast.Module, name: str, package: str) -> str | None:
    """The absolute module a file's top-level ``from X import name`` names (relative resolved)."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            if node.level == 0:
                return node.module
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            return ".".join([*base, *([node.module] if node.module else [])])
    return None


def _scan_wrapper(path: Path, sglang_dir: Path) -> list[JitModule]:
    text = path.read_text(errors="replace")
    if "load_jit" not in text:
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    dotted = _dotted(path, sglang_dir.parent)
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    utils = _import_source(tree, "load_jit", package)
    found = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func
            called = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
            if called != "load_jit" or not node.args:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            cuda: list[str] = []
            for kw in node.keywords:
                if kw.arg == "cuda_files" and isinstance(kw.value, ast.List | ast.Tuple):
                    elts = kw.value.elts
                    cuda = [e.value for e in elts if isinstance(e, ast.Constant)]
            if utils is not None:
                found.append(JitModule(first.value, dotted, fn.name, utils, tuple(cuda), path))
    return found


@functools.lru_cache(maxsize=16)
def _discover(sglang_dir: Path, stamp: tuple[int, ...]) -> JitLayout:
    root = _find_jit_root(sglang_dir)
    modules: dict[str, JitModule] = {}
    top = root.parent  # pin: sglang/ (wrappers beside jit_kernel/); 0.5.23: sglang/kernels/
    for path in sorted(top.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(top).parts[:-1]):
            continue
        for mod in _scan_wrapper(path, sglang_dir):
            if mod.name in MODULES and mod.name not in modules:
                modules[mod.name] = mod
    return JitLayout(sglang_dir, root, modules)


def discover_layout(sglang_dir: Path) -> JitLayout:
    """The JIT root and the Marlin modules' wrappers of an SGLang tree (cached per tree state)."""
    sglang_dir = Path(sglang_dir).resolve()
    try:
        stamp = (sglang_dir.stat().st_mtime_ns,
                 *(p.stat().st_mtime_ns for p in sglang_dir.glob("*/") if p.is_dir()))  # fmt: skip
    except OSError:
        stamp = ()
    return _discover(sglang_dir, stamp)


def has_turing_path(sglang_dir: Path) -> bool:
    """True when the Marlin GEMM templates carry an SM75 code path (the series' Turing patch)."""
    layout = discover_layout(sglang_dir)
    for name in ("gptq_marlin", "moe_wna16_marlin"):
        if name not in layout.modules:
            continue
        for path in layout.sources(name):
            if path.suffix in {".h", ".cuh", ".cu"} and TURING_MARKER.search(
                path.read_text(errors="replace")
            ):
                return True
    return False


def select_targets(sglang_dir: Path, spec: str | None = None) -> list[Target]:
    """Targets from ``spec`` / $FP4SERIES_COMPILE_TARGETS, else the defaults (+ SM75 if
    present); ``full``: the defaults as whole modules (no kernel set)."""
    spec = spec if spec is not None else os.environ.get(ENV_TARGETS)
    full = spec is not None and spec.strip().lower() == FULL
    if spec is not None and not full:
        if spec.strip().lower() in {"", "none", "off"}:
            return []
        return [Target.parse(t) for t in spec.split(",") if t.strip()]
    names = list(DEFAULT_TARGETS)
    if has_turing_path(sglang_dir):
        names += TURING_TARGETS
    targets = [Target.parse(t) for t in names]
    return [dataclasses.replace(t, kernels=None) for t in targets] if full else targets


def _hash_tree(h: hashlib._Hash, root: Path, base: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        _hash_file(h, path, base)


def _hash_file(h: hashlib._Hash, path: Path, base: Path) -> None:
    try:
        rel = str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        rel = str(path)
    h.update(rel.encode() + b"\0")
    h.update(hashlib.sha256(path.read_bytes()).digest())


def _tool_version(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    except OSError as exc:
        return f"unavailable: {exc}"


def target_key(target: Target, sglang_dir: Path, python: Path, nvcc: str) -> str:
    """Hash of everything that decides the build: sources, loader, flags, arch, tool versions."""
    layout = discover_layout(sglang_dir)
    mod = layout.module(target.module)
    h = hashlib.sha256()
    h.update(f"target={target}\n".encode())
    _hash_tree(h, layout.include, sglang_dir)
    for path in layout.sources(target.module):
        _hash_file(h, path, sglang_dir)
    utils = layout.module_path(mod.utils_module)
    if utils.is_dir():
        _hash_tree(h, utils, sglang_dir)
    elif utils.is_file():
        _hash_file(h, utils, sglang_dir)
    _hash_file(h, mod.wrapper, sglang_dir)
    h.update(f"{mod.py_module}:{mod.loader}:{mod.utils_module}\n".encode())
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
    h.update(Path(marlin_dispatch.__file__).read_bytes())  # ... and what a kernel set keeps
    return h.hexdigest()


def stage_kernel_set(target: Target, layout: JitLayout, out_dir: Path) -> tuple[list[str], str]:
    """For a ``MODULE@SET`` target: write the module's dispatch source reduced to the set's
    weight types under OUT_DIR/reduced/ and return the worker's ``--cuda-file REL=PATH``
    arguments and a summary (``15 of 270 dispatch kernels (kFE2M1f)``)."""
    if not target.kernels:
        return [], ""
    keep = marlin_dispatch.KERNEL_SETS[target.kernels]
    mod = layout.module(target.module)
    args, notes = [], []
    for rel in mod.cuda_files:
        source = layout.csrc / rel
        if not marlin_dispatch.has_dispatch(source.read_text(errors="replace")):
            continue
        dest = out_dir / "reduced" / rel
        variants = target.kernels in marlin_dispatch.VARIANT_SETS
        reduction = marlin_dispatch.write_reduced(source, dest, keep, variants=variants)
        args += ["--cuda-file", f"{rel}={dest.resolve()}"]
        notes.append(reduction.summary(keep))
    if not args:
        raise SeriesError(
            f"{target}: no CUDA source of {target.module} ({', '.join(mod.cuda_files)}) defines "
            f"{marlin_dispatch.DISPATCH_FUNCTION}, so there is no dispatch to reduce",
            hint=f"compile the full module instead: {target.module}:{target.dtype}:{target.arch}",
        )
    return args, "; ".join(notes)


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
    # ninja (a pip package in the venv) must be found next to the venv's python
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    layout = discover_layout(sglang_dir)
    mod = layout.module(target.module)
    try:
        cuda_args, kernel_note = stage_kernel_set(target, layout, out_dir)
    except SeriesError as exc:
        detail = f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else "")
        return CompileResult(target, "failed", time.monotonic() - start, detail)
    cmd = [
        "nice", "-n", "10", str(python), "-m", "fp4series.compile_check", "worker",
        "--module", target.module, "--dtype", target.dtype, "--arch", target.arch,
        "--build-dir", str(out_dir), "--py-module", mod.py_module, "--loader", mod.loader,
        "--utils-module", mod.utils_module, *(a for f in target.flags for a in ("--flag", f)),
        *cuda_args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    (out_dir / "worker.log").write_text(proc.stdout + proc.stderr)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        return CompileResult(target, "failed", seconds, tail)
    cache_dir.mkdir(parents=True, exist_ok=True)
    record = {"target": str(target), "seconds": seconds}
    if kernel_note:
        record["kernels"] = kernel_note
    stamp.write_text(f"{key}\n{json.dumps(record)}\n")
    detail = proc.stdout.strip().splitlines()[-1:][0]
    return CompileResult(target, "built", seconds, detail, kernel_note)


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
    layout = discover_layout(sglang_dir)  # raises when the tree has no JIT root
    for t in targets:
        layout.module(t.module)  # ... or lacks a target's loader
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
        kernels = f" ({r.kernels})" if r.kernels else ""
        print(f"[compile] {t}: {r.status} in {r.seconds:.1f}s{kernels}", flush=True)
        if r.status == "failed":
            print(r.detail, file=sys.stderr, flush=True)
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, targets))


# --------------------------------------------------------------------------------------------
# Worker: runs inside the test venv (torch + apache-tvm-ffi), imports SGLang, builds one module.


def _loader_args(fn: object, torch_dtype: object, flags: Sequence[str]) -> tuple[list, dict]:
    """Arguments for a module loader: the dtype, True for FLAGS, False for other required
    booleans; parameters with a default keep it."""
    import inspect

    try:
        import torch

        torch_dtype_type: object = torch.dtype
    except ImportError:  # the parent's tests run without torch; string annotations still work
        torch_dtype_type = None

    params = inspect.signature(inspect.unwrap(fn)).parameters  # type: ignore[arg-type]
    unknown = [f for f in flags if f not in params]
    if unknown:
        raise SystemExit(f"loader has no parameter(s) {', '.join(unknown)}: {list(params)}")
    args: list = []
    kwargs: dict = {}
    for p in params.values():
        ann = (
            p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        )
        if p.name == "dtype" or p.annotation is torch_dtype_type or ann in ("torch.dtype", "dtype"):
            if torch_dtype is None:
                raise SystemExit(f"the loader needs an activation dtype ({p.name}): use fp16/bf16")
            args.append(torch_dtype)
        elif p.name in flags:
            kwargs[p.name] = True
        elif p.default is not inspect.Parameter.empty:
            continue
        elif p.annotation is bool or ann == "bool":
            kwargs[p.name] = False
        else:
            raise SystemExit(f"cannot fill the loader's parameter {p.name} ({ann or 'untyped'})")
    return args, kwargs


class _Swaps(dict[str, str]):
    """cuda_files entries (as the wrapper names them) -> the staged file built instead."""

    used: set[str]

    def __init__(self, pairs: Sequence[str]) -> None:
        super().__init__(p.split("=", 1) for p in pairs)
        self.used = set()


def _swap_cuda_files(wrapper: object, pairs: Sequence[str]) -> _Swaps:
    """Make the wrapper module's ``load_jit`` build the staged (reduced) sources: absolute
    paths, which both loaders take as they are, in place of the csrc-relative names."""
    swaps = _Swaps(pairs)
    if not swaps:
        return swaps
    real = getattr(wrapper, "load_jit", None)
    if real is None:
        raise SystemExit(f"{getattr(wrapper, '__name__', wrapper)} has no module-level load_jit "
                         "to hand the reduced source to; build the full module (the target "
                         "without @SET)")  # fmt: skip

    def load_jit_staged(*args: object, cuda_files: Sequence[str] | None = None,
                        **kwargs: object) -> object:  # fmt: skip
        files = []
        for rel in cuda_files or []:
            if rel in swaps:
                swaps.used.add(rel)
            files.append(swaps.get(rel, rel))
        return real(*args, cuda_files=files, **kwargs)

    wrapper.load_jit = load_jit_staged  # type: ignore[attr-defined]
    return swaps


def _worker(
    module: str,
    dtype: str,
    arch: str,
    build_dir: str,
    py_module: str | None = None,
    loader: str | None = None,
    utils_module: str | None = None,
    flags: Sequence[str] = (),
    cuda_files: Sequence[str] = (),
) -> int:
    import importlib
    import inspect

    out = Path(build_dir)
    if py_module is None or loader is None or utils_module is None:
        import sglang  # type: ignore[import-not-found]

        mod = discover_layout(Path(sglang.__file__).parent).module(module)
        py_module, loader, utils_module = mod.py_module, mod.loader, mod.utils_module
    # SGLang's own loader (0.5.17+) reads these when it runs: a fresh build into our folder
    os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(out / "sglang-jit-cache"))
    os.environ["SGLANG_JIT_FORCE_RECOMPILE"] = "1"
    os.environ.setdefault("TVM_FFI_GPU_BACKEND", "cuda")

    import torch

    utils = importlib.import_module(utils_module)
    impl = sys.modules[inspect.unwrap(utils.load_jit).__module__]
    built: list[str] = []
    if hasattr(impl, "_load") and hasattr(getattr(impl, "ninja", None), "build"):
        # load_jit generates build.ninja and runs it in a staging folder, loads the .so with
        # tvm_ffi.load_module (_load) and publishes it to its cache. Keep a copy, load nothing.
        ninja_mod = impl.ninja
        build_in_staging = ninja_mod.build

        def build_and_keep(*, spec: object, build_dir: Path, build_file: str) -> Path:
            lib = Path(build_in_staging(spec=spec, build_dir=build_dir, build_file=build_file))
            shutil.copy2(lib, out / lib.name)
            shutil.copy2(Path(build_dir) / "build.ninja", out / "build.ninja")
            built.append(str(out / lib.name))
            return lib

        ninja_mod.build = build_and_keep
        # SGLang gives one module build 30 minutes (sized for a GPU host); two 3-minute
        # builds on a shared 2-core CPU machine take longer than that
        if hasattr(ninja_mod, "_NINJA_TIMEOUT_S"):
            ninja_mod._NINJA_TIMEOUT_S = max(ninja_mod._NINJA_TIMEOUT_S, 4 * 3600)
        impl._load = lambda library: str(library)  # nothing is loaded on this GPU-less machine
    else:
        import tvm_ffi.cpp

        def build_only(name: str, **kwargs: object) -> str:
            kwargs["build_directory"] = build_dir
            kwargs.pop("keep_module_alive", None)
            path = tvm_ffi.cpp.build_inline(name, **kwargs)  # type: ignore[arg-type]
            built.append(path)
            return path  # load_jit returns it; nothing is loaded on this GPU-less machine

        tvm_ffi.cpp.load_inline = build_only  # type: ignore[assignment]
    m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    assert m is not None
    wrapper = importlib.import_module(py_module)
    fn = getattr(wrapper, loader)
    swapped = _swap_cuda_files(wrapper, cuda_files)
    torch_dtype = (
        None if dtype == NO_DTYPE else {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    )
    args, kwargs = _loader_args(fn, torch_dtype, flags)
    if torch_dtype is not None and not args:
        print(f"note: {py_module}.{loader} takes no activation dtype; {dtype} ignored")
    with utils.override_jit_cuda_arch(int(m.group(1)), int(m.group(2)), m.group(3)):
        fn(*args, **kwargs)
    if not built or not Path(built[0]).is_file():
        print(f"no shared object was built for {module}:{dtype}:{arch}", file=sys.stderr)
        return 1
    unused = sorted(set(swapped) - set(swapped.used))
    if unused:
        print(f"{py_module}.{loader} never asked load_jit for {', '.join(unused)}, so the reduced "
              "source was not what got built; build the full module (the target without @SET) "
              "and see which cuda_files the loader passes now", file=sys.stderr)  # fmt: skip
        return 1
    ninja = out / "build.ninja"
    flag_lines = [ln for ln in ninja.read_text().splitlines()
                  if ln.startswith(("cuda_cflags", "cudaflags"))]  # fmt: skip
    shown = [*map(str, args), *(f"{k}={v}" for k, v in kwargs.items())]
    print(f"loader: {py_module}.{loader}({', '.join(shown)})")
    print(flag_lines[0] if flag_lines else "")
    print(f"built {built[0]} ({Path(built[0]).stat().st_size} bytes)")
    return 0


def _find_cuobjdump(python: Path | None = None) -> str | None:
    """cuobjdump from PATH, the toolkit, or the one triton ships (the CPU image's CUDA 13
    toolkit has nvcc but no cuobjdump)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    cands = [Path(find_cuda_home(shutil.which("nvcc") or "nvcc")) / "bin" / "cuobjdump"]
    for base in {Path(sys.prefix), *([Path(python).parent.parent] if python else [])}:
        cands += sorted(
            base.glob("lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump")
        )
    return next((str(c) for c in cands if c.is_file()), None)


def sass_summary(library: Path, cuobjdump: str | None = None) -> dict[str, int]:
    """Counts of the instructions that tell the SM75 path from the SM80 one in a built module:
    HMMA.1688 (mma m16n8k8), HMMA.16816 (m16n8k16, SM80+), LDGSTS (cp.async, SM80+), and
    the number of kernels with code."""
    tool = cuobjdump or _find_cuobjdump()
    if tool is None:
        return {"error": "no cuobjdump (CUDA toolkit bin/, PATH, or triton's copy)"}  # type: ignore[dict-item]
    text = subprocess.run([tool, "-sass", str(library)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    sizes = [len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", body, re.M))
             for body in re.split(r"^\s*Function : ", text, flags=re.M)[1:]]  # fmt: skip
    return {
        "kernels": len(sizes),
        # an empty stub (the template below its arch) is EXIT plus padding: a handful of words
        "empty_kernels": sum(1 for n in sizes if n <= 16),
        "HMMA.1688": len(re.findall(r"HMMA\.1688", text)),
        "HMMA.16816": len(re.findall(r"HMMA\.16816", text)),
        "LDGSTS": len(re.findall(r"\bLDGSTS\b", text)),
        "arch": sorted(set(re.findall(r"arch = (sm_\d+\w?)", text))),  # type: ignore[dict-item]
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4series.compile_check")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="(internal) build one JIT module in this interpreter")
    w.add_argument("--module", required=True, choices=sorted(MODULES))
    w.add_argument("--dtype", required=True, choices=(*DTYPES, NO_DTYPE))
    w.add_argument("--arch", required=True)
    w.add_argument("--build-dir", required=True)
    w.add_argument("--py-module")
    w.add_argument("--loader")
    w.add_argument("--utils-module")
    w.add_argument("--flag", action="append", default=[])
    w.add_argument("--cuda-file", action="append", default=[],
                   help="REL=PATH: build PATH where the loader names REL")  # fmt: skip
    c = sub.add_parser("check", help="compile-check Marlin JIT modules of any SGLang tree")
    c.add_argument("--sglang-dir", required=True, help="the tree's python/sglang")
    c.add_argument("--python", required=True, help="a venv python with torch + apache-tvm-ffi")
    c.add_argument("--targets", help="comma list MODULE:DTYPE:ARCH[:FLAG+FLAG] "
                   "(default: as the build's compile check)")  # fmt: skip
    c.add_argument("--cache-dir", default=".work/cache/compile")
    c.add_argument("--build-root", default=".work/build/jit")
    c.add_argument("--force", action="store_true", help="ignore the stamps")
    c.add_argument("--sass", action="store_true", help="print a SASS summary of each build")
    args = parser.parse_args(argv)
    if args.cmd == "worker":
        return _worker(args.module, args.dtype, args.arch, args.build_dir, args.py_module,
                       args.loader, args.utils_module, args.flag, args.cuda_file)  # fmt: skip
    sglang_dir = Path(args.sglang_dir)
    targets = select_targets(sglang_dir, args.targets)
    results = run_compile_checks(
        targets, python=Path(args.python), sglang_dir=sglang_dir,
        cache_dir=Path(args.cache_dir), build_root=Path(args.build_root), force=args.force,
    )  # fmt: skip
    for r in results:
        line = f"{r.target}: {r.status} in {r.seconds:.1f}s"
        if args.sass and r.status != "failed":
            libs = sorted((Path(args.build_root) / r.target.name).glob("*.so"))
            if libs:
                tool = _find_cuobjdump(Path(args.python))
                line += f" {libs[0].name} {json.dumps(sass_summary(libs[0], tool))}"
        print(line, flush=True)
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    run_main(main)
