"""The GPU proof on a CUDA host: build the JIT modules the chosen stages need, run the stages.

``scripts/gpu-proof.sh [--stages numerics,compute75,bench] [--out DIR] [--bundle PATH]``.
Without ``--bundle`` it uses this host's SGLang runtime (torch, sgl_kernel, apache-tvm-ffi,
nvcc, ninja), the patched tree (``.work/checkout/python``) and the pin's tree. With it, the
trees, sgl_kernel, the missing wheels and any prebuilt modules come from the bundle
(bundle.py), unpacked once under ``--work``; everything after that is the same code.

Every JIT module is built by its own process, all in parallel, each variant in its own tvm-ffi
cache under ``--work`` (a second run reuses them). Builds run in their own sessions: if this
run is stopped, they finish anyway and the next run finds them. ``--deadline S`` interrupts
the running stage at S seconds (SIGINT: pytest still writes its report), so a host with a wall
limit gets what finished. Each stage's reports are copied into ``--out`` when it ends.

``--line V`` runs a maintained series line's stages (stages.LINE_STAGES[V]) on its tree, with the
bare release it is made on as the repro (variant ``upstream``), into reports/h200/V by default;
a line bundle (make-bundle.sh --line V) says its line itself. ``--kernel-set fp4`` (a line's
default) builds the Marlin GEMM modules with their dispatch reduced to the FP4 kernels
(bundle.reduced_tree): the same kernels the FP4 layers run, in a fraction of the build time and
of the driver's compute_75 PTX compile. ``--dry-run`` does all of it on a machine without a GPU
except building and running: it checks the bundle, makes the trees, prints the plan (modules,
stages, reports), and runs the suites through tests/gpu/_dryrun.py (SGLang's real layers,
stand-in kernels) and pytest's collection, so a GPU run does not trip over an import or an API.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src"))

import bundle as bundle_mod  # noqa: E402
import stages as stage_table  # noqa: E402

from fp4series.errors import SeriesError, run_reporting_errors  # noqa: E402

START = time.time()
WARM = [sys.executable, str(REPO / "tests" / "gpu" / "_jitenv.py"), "warm"]  # + one module spec
PROBE = """import json, sys, torch
sys.path.insert(0, {tests!r})
if {dry_run!r}:
    import _dryrun
    _dryrun.install()
import tvm_ffi, sgl_kernel
import _sglang_api as api
for name in {imports!r}:
    __import__(name)
sm75, _ = api.fp4_marlin_supported(torch.float16, (7, 5))
print(json.dumps({{"cuda": torch.cuda.is_available(), "sgl_kernel": sgl_kernel.__file__,
                  "sm75": sm75, "tvm_ffi": tvm_ffi.__version__, "layout": api.layout(),
                  "torch": torch.__version__}}))
"""
# What a line's probe imports: the layers the harness drives (an import the host lacks shows
# here, in seconds, not in every test)
LINE_IMPORTS = (
    "sglang.srt.layers.quantization.modelopt_quant",
    "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors",
    "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe",
    "sglang.srt.layers.linear",
)
DRY_RUN = [sys.executable, str(REPO / "tests" / "gpu" / "_dryrun.py")]
# dry run: the worker suite that stands for what each variant runs
DRY_RUN_SUITES = {"patched": "upstream", "upstream": "upstream", "unpatched": "repro",
                  "compute75": "turing"}  # fmt: skip


def log(msg: str) -> None:
    print(f"[gpu-proof {time.time() - START:5.0f}s] {msg}", flush=True)


class Host:
    """Where the trees, extra packages and caches of one run are, and each variant's env.

    The pin's: the patched tree, the pin's (for its templates) and optionally upstream 0.5.23's
    (the benchmark's column). A line's (``line``): its tree and the bare release (``upstream``),
    both reduced to ``kernel_set`` unless that is "full"."""

    def __init__(self, work: Path, patched: Path, pin: Path | None, upstream: Path | None,
                 line: str | None = None, kernel_set: str = "full") -> None:  # fmt: skip
        self.work, self.pin, self.line, self.kernel_set = work, pin, line, kernel_set
        unpatched = bundle_mod.unpatched_tree(patched, pin, work) if pin else None
        if kernel_set != "full":
            log(f"reducing the Marlin GEMM dispatch of the trees to {kernel_set}")
            patched, upstream, unpatched = (
                bundle_mod.reduced_tree(t, kernel_set, work) if t else None
                for t in (patched, upstream, unpatched)
            )
        self.patched, self.upstream, self.unpatched = patched, upstream, unpatched
        self.paths: list[str] = []  # sgl_kernel and the bundled wheels, when bundled
        self.upstream_paths: list[str] = []
        self.env: dict[str, str] = {}
        if line:
            self.env["FP4SERIES_LINE"] = line
        if kernel_set != "full":
            self.env["FP4SERIES_KERNEL_SET"] = kernel_set

    def variant_env(self, variant: str) -> dict[str, str]:
        tree = {"unpatched": self.unpatched, "upstream": self.upstream}.get(variant, self.patched)
        first = [str(tree), *(self.upstream_paths if variant == "upstream" else [])]
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, **self.env)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "site"), *first, *self.paths,
                                             str(REPO / "src"), *rest])  # fmt: skip
        env["TVM_FFI_CACHE_DIR"] = str(self.work / "cache" / variant)  # the pin's loader
        env["SGLANG_JIT_CACHE_DIR"] = str(self.work / "cache" / variant)  # 0.5.17 on
        env.setdefault("CUDA_HOME", "/usr/local/cuda")
        env.setdefault("CUDA_MODULE_LOADING", "LAZY")  # PTX JIT only of the kernels launched
        env["CUDA_CACHE_MAXSIZE"] = str(4 * 2**30)  # the driver's compute_75 PTX builds
        env["FP4SERIES_PREBUILT_LOG"] = str(self.work / "prebuilt.log")
        env["PYTHONUNBUFFERED"] = "1"
        if variant == "unpatched" or (variant == "upstream" and self.line):
            env["FP4SERIES_TEMPLATES"] = variant
        if variant == "compute75":
            env["FP4SERIES_FORCE_ARCH"] = "compute_75"
        return env


def local_host(args: argparse.Namespace) -> Host:
    from fp4series import report

    if args.line:
        from fp4series.line import resolve_line

        line = resolve_line(args.line, root=REPO)
        patched = args.patched_tree or line.checkout / "python"
        bare = args.upstream_tree or line.upstream_dir / "python"
        for tree, opt in ((patched, "--patched-tree"), (bare, "--upstream-tree")):
            if not (tree / "sglang").is_dir():
                hint = (
                    f"run `python -m fp4series prepare-checkout --line {args.line}` or pass {opt}"
                )
                raise SeriesError(f"{tree}/sglang not found", hint=hint)
        return Host(args.work, patched, None, bare, args.line, args.kernel_set)
    args.patched_tree = args.patched_tree or REPO / ".work" / "checkout" / "python"
    pin = args.pin_tree or REPO / ".work" / "upstream" / report.pin_info(REPO)["tag"] / "python"
    for tree, opt in ((args.patched_tree, "--patched-tree"), (pin, "--pin-tree")):
        if not (tree / "sglang" / "jit_kernel").is_dir():
            raise SeriesError(f"{tree}/sglang/jit_kernel not found", hint=f"run `python -m "
                              f"fp4series prepare-checkout` or pass {opt}")  # fmt: skip
    return Host(args.work, args.patched_tree, pin, args.upstream_tree, None, args.kernel_set)


def bundled_host(args: argparse.Namespace) -> Host:
    log(f"checking and unpacking {args.bundle}")
    root, manifest = bundle_mod.unpack(args.bundle, args.work)
    line = manifest.get("line")
    if line != args.line:
        raise SeriesError(
            f"the bundle is {f'the {line} line' if line else 'the pin'}'s, not "
            f"{f'the {args.line} line' if args.line else 'the pin'}'s",
            hint=f"run with{f' --line {line}' if line else 'out --line'} (or make the bundle "
            "for the line you mean)",
        )
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest.get("python", here) != here:
        raise SeriesError(
            f"the bundle's wheels are for Python {manifest['python']}, this is Python {here}",
            hint=f"make it with scripts/make-bundle.sh --python-version {here} (and a --cache of "
            "its own), or run with that Python",
        )
    if line:
        bare = bundle_mod.bare_tree(root, manifest, args.work)
        host = Host(args.work, root / "trees" / "patched", None, bare, line, args.kernel_set)
    else:
        up = root / "trees" / "upstream"
        host = Host(args.work, root / "trees" / "patched", root / "trees" / "pin",
                    up if up.is_dir() else args.upstream_tree, None, args.kernel_set)  # fmt: skip
    host.paths = [str(root / "sgl"), str(root / "site")]
    host.upstream_paths = [str(root / "site-upstream")]
    host.env["FP4SERIES_SERIES_REVISION"] = json.dumps(manifest["series_revision"])
    if (root / "prebuilt" / "manifest.json").is_file():
        host.env["FP4SERIES_PREBUILT_DIR"] = str(root / "prebuilt")
    if (root / "lib").is_dir():
        ld = [str(root / "lib"), os.environ.get("LD_LIBRARY_PATH", ""), "/usr/local/cuda/lib64"]
        host.env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in ld if p)
    if (root / "extra").is_dir():
        host.env["FP4SERIES_BUNDLE_EXTRA"] = str(root / "extra")
    log(f"bundle of {manifest['made']} (series {manifest['series_revision']}) in {root}")
    return host


def probe(host: Host, dry_run: bool = False) -> dict:
    code = PROBE.format(tests=str(REPO / "tests" / "gpu"), dry_run=dry_run,
                        imports=LINE_IMPORTS if host.line else ())  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=host.variant_env("patched"),
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SeriesError(f"the patched tree does not import here:\n{proc.stderr[-2000:]}",
                          hint="install SGLang's runtime (sgl_kernel, apache-tvm-ffi) or "
                          "run from a bundle: scripts/make-bundle.sh, then --bundle")  # fmt: skip
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if not found["cuda"]:
        raise SeriesError("no CUDA device here (torch.cuda.is_available() is False)",
                          hint="run scripts/gpu-proof.sh on a host with an NVIDIA GPU")  # fmt: skip
    log(f"runtime: torch {found['torch']}, sgl_kernel {found['sgl_kernel']}, tvm-ffi "
        f"{found['tvm_ffi']}, JIT layout {found['layout']}, series enables SM75: "
        f"{found['sm75']}")  # fmt: skip
    return found


def build(host: Host, modules: list[tuple[str, str]], logs: Path, deadline: float) -> dict:
    """Every module in its own detached process; (variant, spec) -> exit status (None: running)."""
    rc_dir = host.work / "builds"
    rc_dir.mkdir(parents=True, exist_ok=True)
    pending = {}
    for variant, spec in modules:
        key = f"{variant}-{spec.replace(':', '-')}"
        (rc_dir / f"{key}.rc").unlink(missing_ok=True)
        warm = [*WARM, spec]
        logf = (logs / f"build-{key}.log").open("w")
        subprocess.Popen(["sh", "-c", '"$@"; echo $? > "$0"', str(rc_dir / f"{key}.rc"), *warm],
                         env=host.variant_env(variant), cwd=REPO, start_new_session=True,
                         stdout=logf, stderr=subprocess.STDOUT)  # fmt: skip
        pending[(variant, spec)] = rc_dir / f"{key}.rc"
    log(f"building {len(pending)} JIT modules in parallel ({os.cpu_count()} cores)")
    done: dict[tuple[str, str], int | None] = {}
    while pending and time.time() < deadline:
        time.sleep(2)
        for key, rc_file in list(pending.items()):
            if rc_file.is_file() and rc_file.read_text().strip():
                done[key] = int(rc_file.read_text())
                del pending[key]
                log(f"built {key[0]} {key[1]}: exit {done[key]}")
    done.update(dict.fromkeys(pending))
    return done


def run_stage(stage: stage_table.Stage, env: dict[str, str], out: Path, logs: Path,
              deadline: float) -> int:  # fmt: skip
    report_dir = env["FP4SERIES_REPORT_DIR"] = str(Path(env["FP4SERIES_REPORT_DIR"]) / stage.name)
    shutil.rmtree(report_dir, ignore_errors=True)
    Path(report_dir).mkdir(parents=True)
    runner = [a.replace("{report_dir}", report_dir) for a in stage.runner]
    if runner and shutil.which(runner[0]) is None:  # a CUDA tool outside PATH
        runner[0] = str(Path(env.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / runner[0])
    cmd = [*runner, sys.executable,
           *(a.replace("{report_dir}", report_dir) for a in stage.command)]  # fmt: skip
    under = f"under {Path(runner[0]).name}: " if runner else ""
    log(f"stage {stage.name}: {under}{' '.join(cmd[len(runner) + 1 :])}")
    with (logs / f"{stage.name}.log").open("w") as fh:
        # SIGINT back to default in the child: started in the background it would be ignored
        sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        proc = subprocess.Popen(cmd, env={**env, **stage.env}, cwd=REPO, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=sigint)  # fmt: skip
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            log(f"stage {stage.name}: --deadline reached, interrupting (its report is written)")
            os.killpg(proc.pid, signal.SIGINT)
            try:
                rc = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in stage.reports:
        if (Path(report_dir) / name).is_file():
            shutil.copy2(Path(report_dir) / name, out / name)
            copied.append(name)
    log(f"stage {stage.name}: exit {rc}; wrote {copied or 'no report'} to {out}")
    return rc


def stage_extras(host: Host, deadline: float) -> dict[str, str]:
    """What serve/e2e.py reads from the stage's environment: the pin's tree (a bundle's holds
    only its jit_kernel sources: e2e.py then falls back to the pin's wheel) and the deadline."""
    extras = {"FP4SERIES_PIN_TREE": str(host.pin)} if host.pin else {}
    if deadline != float("inf"):
        extras["FP4SERIES_DEADLINE_EPOCH"] = f"{deadline:.1f}"
    return extras


def recorded_command(argv: list[str]) -> str:
    """The command line the reports record: host-specific directories left out."""
    words, skip = ["scripts/gpu-proof.sh"], False
    for i, word in enumerate(argv):
        if skip:
            skip = False
        elif word in ("--out", "--logs", "--work"):
            skip = True
        elif not word.startswith(("--out=", "--logs=", "--work=")):
            words.append(Path(word).name if i and argv[i - 1] == "--bundle" else word)
    return " ".join(words)


def stage_env(host: Host, args: argparse.Namespace, deadline: float) -> dict[str, str]:
    """What every stage process gets: the patched variant's env and the other variants' trees
    and caches (the repro and compute_75 workers), the recorded command, the deadline."""
    env = host.variant_env("patched")
    env.update(FP4SERIES_REPORT_DIR=str(args.work / "reports"), FP4SERIES_REQUIRE_GPU="1",
               FP4SERIES_REPORT_COMMAND=recorded_command(args.argv),
               FP4SERIES_C75_CACHE=str(args.work / "cache" / "compute75"))  # fmt: skip
    if host.unpatched is not None:
        env.update(FP4SERIES_UNPATCHED_TREE=str(host.unpatched),
                   FP4SERIES_UNPATCHED_CACHE=str(args.work / "cache" / "unpatched"))  # fmt: skip
    if host.line and host.upstream is not None:
        env.update(FP4SERIES_BARE_TREE=str(host.upstream),
                   FP4SERIES_BARE_CACHE=str(args.work / "cache" / "upstream"))  # fmt: skip
    env.update(stage_extras(host, deadline))
    return env


def dry_run(host: Host, selected: list[stage_table.Stage], modules: list[tuple[str, str]],
            logs: Path, env: dict[str, str]) -> int:  # fmt: skip
    """The plan, then every variant's suite through _dryrun.py and each pytest stage's
    collection, on this machine (no GPU): what a GPU run would trip over, it trips over here."""
    by_variant: dict[str, list[str]] = {}
    for variant, spec in modules:
        by_variant.setdefault(variant, []).append(spec)
    for variant, specs in by_variant.items():
        log(f"plan: {variant} ({host.variant_env(variant)['PYTHONPATH'].split(os.pathsep)[1]}): "
            f"{len(specs)} JIT modules: {', '.join(specs)}")  # fmt: skip
    for stage in selected:
        log(f"plan: stage {stage.name}: {' '.join(stage.command)} -> {', '.join(stage.reports)}")
    failed = []
    for variant, specs in by_variant.items():
        suite = DRY_RUN_SUITES[variant]
        out = logs / f"dry-run-{variant}.json"
        cmd = [*DRY_RUN, "run", "--suite", suite, "--warm", *specs, "--out", str(out)]
        log(f"dry run: {variant} variant, suite {suite}")
        with (logs / f"dry-run-{variant}.log").open("w") as fh:
            rc = subprocess.run(cmd, env=host.variant_env(variant), cwd=REPO, stdout=fh,
                                stderr=subprocess.STDOUT).returncode  # fmt: skip
        summary = [ln for ln in (logs / f"dry-run-{variant}.log").read_text().splitlines()
                   if "FAILED" in ln or "NOT WARMED" in ln or "cases," in ln]  # fmt: skip
        for line in summary[-12:]:
            log(f"  {line}")
        if rc:
            failed.append(f"{variant} suite")
    collect_env = {k: v for k, v in env.items() if k != "FP4SERIES_REQUIRE_GPU"}
    for stage in selected:
        if stage.command[:2] == ("-m", "pytest"):
            tests = [a for a in stage.command if a.startswith("tests/")]
            cmd = [*DRY_RUN, "collect", str(REPO), *tests]
        elif stage.name == "conformance":
            from fp4series import conformance

            dest = host.work / "dry-run-conformance"
            shutil.rmtree(dest, ignore_errors=True)
            extra = env.get("FP4SERIES_BUNDLE_EXTRA")
            version = conformance.profile(host.line).source_version
            wheels = sorted(Path(extra, "wheels").glob(f"sglang-{version}-*.whl")) if extra else []
            conformance.extract_from_lock(dest, wheel=wheels[0] if wheels else None,
                                          line=host.line)  # fmt: skip
            cmd = [*DRY_RUN, "collect", str(dest), "tests", "-k", conformance.SELECTION]
        else:
            continue
        proc = subprocess.run(cmd, env=collect_env, cwd=REPO, capture_output=True, text=True)
        (logs / f"dry-run-collect-{stage.name}.log").write_text(proc.stdout + proc.stderr)
        tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
        log(f"dry run: stage {stage.name} collects: {tail[0]}")
        if proc.returncode:
            failed.append(f"{stage.name} collection")
    log(f"dry run done: {'FAILED: ' + ', '.join(failed) if failed else 'OK'} (logs in {logs})")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    selected = stage_table.select(args.stages, args.line)
    args.work.mkdir(parents=True, exist_ok=True)
    logs = args.logs or args.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    deadline = START + args.deadline if args.deadline else float("inf")
    host = bundled_host(args) if args.bundle else local_host(args)
    found = probe(host, args.dry_run)
    modules = [m for s in selected for m in s.modules]
    if not found["sm75"]:
        modules = [m for m in modules if m[0] != "compute75"]
    if host.upstream is None:
        modules = [m for m in modules if m[0] != "upstream"]
    modules = list(dict.fromkeys(modules))
    env = stage_env(host, args, deadline)
    if not found["sm75"]:
        env["FP4SERIES_SKIP_TURING"] = "1"
    if args.dry_run:
        return dry_run(host, selected, modules, logs, env)
    built = build(host, modules, logs, deadline)
    (logs / "builds.json").write_text(json.dumps({f"{v} {s}": rc for (v, s), rc in built.items()}))
    if any(rc for (_, spec), rc in built.items() if spec.startswith("act")):
        host.env["FP4SERIES_ACT_FALLBACK"] = "sgl_kernel"  # see jit_hook.py
        env["FP4SERIES_ACT_FALLBACK"] = "sgl_kernel"
        log("activation module did not build: served by sgl_kernel's AOT kernels")
    failed = [k for k, rc in built.items() if rc and not k[1].startswith("act")]
    running = [k for k, rc in built.items() if rc is None]
    if failed:
        log(f"FAILED builds (logs in {logs}): {failed}")
    if running or args.build_only:
        log(f"builds still running (they go on): {running}" if running else "--build-only: done")
        return 1 if failed or running else 0
    if (
        not host.line
        and host.upstream is not None
        and not any(built.get(m) for m in modules if m[0] == "upstream")
    ):
        up = host.variant_env("upstream")
        extra = json.dumps(host.upstream_paths + host.paths)
        env.update(FP4SERIES_UPSTREAM_TREE=str(host.upstream), FP4SERIES_UPSTREAM_EXTRA_PATH=extra,
                   FP4SERIES_UPSTREAM_CACHE=up["TVM_FFI_CACHE_DIR"])  # fmt: skip
    rcs = {s.name: run_stage(s, dict(env), args.out, logs, deadline) for s in selected}
    log(f"done: {rcs}; reports in {args.out} (check: python -m fp4series check-reports"
        f"{f' --line {host.line}' if host.line else ''})")  # fmt: skip
    return 1 if failed or any(rcs.values()) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="scripts/gpu-proof.sh", description=__doc__.split("\n")[0])
    p.add_argument(
        "--line",
        metavar="VERSION",
        help="a maintained series line (e.g. 0.5.23): "
        "its stages, trees and reports (default: the bundle's line, else the pin's)",
    )
    p.add_argument(
        "--stages",
        help=f"comma list of {', '.join(stage_table.STAGES)} (a line's: "
        f"{', '.join(stage_table.LINE_DEFAULT_STAGES)}); default all but e2e",
    )
    p.add_argument("--out", type=Path, help="report directory (default reports/h200, a line's "
                   "reports/h200/VERSION)")  # fmt: skip
    p.add_argument("--kernel-set", choices=("full", "fp4"), help="fp4: the Marlin GEMM modules "
                   "with only their FP4 kernels (a line's default); full: whole modules (the "
                   "pin's default)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="no GPU: check the bundle, make the "
                   "trees, print the plan, run the suites with stand-in kernels (tests/gpu/"
                   "_dryrun.py) and collect the stages' tests")  # fmt: skip
    p.add_argument("--bundle", type=Path, help="run from a bundle (its directory or manifest)")
    p.add_argument("--work", type=Path, default=REPO / ".work" / "gpu-proof",
                   help="unpacked bundle, JIT caches, stage reports")  # fmt: skip
    p.add_argument("--logs", type=Path, help="build and stage logs (default WORK/logs)")
    p.add_argument("--patched-tree", type=Path, help="default .work/checkout/python (a line's: "
                   ".work/lines/VERSION/checkout/python)")  # fmt: skip
    p.add_argument("--pin-tree", type=Path, help="default .work/upstream/<pin tag>/python")
    p.add_argument(
        "--upstream-tree",
        type=Path,
        help="upstream 0.5.23's python dir (the pin's "
        "benchmark); a line's bare release (default .work/upstream/VERSION/python)",
    )
    p.add_argument("--deadline", type=float, metavar="S",
                   help="stop at S s: builds go on detached, the stage gets SIGINT")  # fmt: skip
    p.add_argument("--build-only", action="store_true", help="build the modules, run no stage")
    args = p.parse_args(argv)
    args.argv = argv
    if args.line is None and args.bundle is not None:
        args.line = _bundle_line(args.bundle)
    args.stages = args.stages or ",".join(stage_table.default_stages(args.line))
    args.kernel_set = args.kernel_set or ("fp4" if args.line else "full")
    if args.out is None:
        args.out = REPO / "reports" / "h200" / (args.line or "")
    for name in ("work", "out", "logs", "bundle"):  # the stages run from the repository root
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    try:
        stage_table.select(args.stages, args.line)
    except ValueError as exc:
        p.error(str(exc))
    return run_reporting_errors(run, args)


def _bundle_line(bundle: Path) -> str | None:
    """The line a bundle's manifest names (None: the pin's, or no readable manifest yet)."""
    try:
        return json.loads(bundle_mod._manifest_path(bundle).read_text()).get("line")
    except (OSError, ValueError, SeriesError):
        return None


if __name__ == "__main__":
    sys.exit(main())
