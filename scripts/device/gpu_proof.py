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
PROBE = """import json, torch, tvm_ffi, sgl_kernel
from sglang.srt.layers.quantization.marlin_utils_fp4 import check_fp4_marlin_supported as check
try:
    check(torch.float16, capability=(7, 5))
    sm75 = True
except ValueError:
    sm75 = False
print(json.dumps({"cuda": torch.cuda.is_available(), "sgl_kernel": sgl_kernel.__file__,
                  "sm75": sm75, "tvm_ffi": tvm_ffi.__version__}))
"""


def log(msg: str) -> None:
    print(f"[gpu-proof {time.time() - START:5.0f}s] {msg}", flush=True)


class Host:
    """Where the trees, extra packages and caches of one run are, and each variant's env."""

    def __init__(self, work: Path, patched: Path, pin: Path, upstream: Path | None) -> None:
        self.work, self.patched, self.upstream, self.pin = work, patched, upstream, pin
        self.unpatched = bundle_mod.unpatched_tree(patched, pin, work)
        self.paths: list[str] = []  # sgl_kernel and the bundled wheels, when bundled
        self.upstream_paths: list[str] = []
        self.env: dict[str, str] = {}

    def variant_env(self, variant: str) -> dict[str, str]:
        tree = {"unpatched": self.unpatched, "upstream": self.upstream}.get(variant, self.patched)
        first = [str(tree), *(self.upstream_paths if variant == "upstream" else [])]
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, **self.env)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "site"), *first, *self.paths,
                                             str(REPO / "src"), *rest])  # fmt: skip
        env["TVM_FFI_CACHE_DIR"] = str(self.work / "cache" / variant)
        env.setdefault("CUDA_HOME", "/usr/local/cuda")
        env.setdefault("CUDA_MODULE_LOADING", "LAZY")  # PTX JIT only of the kernels launched
        env["CUDA_CACHE_MAXSIZE"] = str(4 * 2**30)  # the driver's compute_75 PTX builds
        env["FP4SERIES_PREBUILT_LOG"] = str(self.work / "prebuilt.log")
        env["PYTHONUNBUFFERED"] = "1"
        if variant == "unpatched":
            env["FP4SERIES_TEMPLATES"] = "unpatched"
        if variant == "compute75":
            env["FP4SERIES_FORCE_ARCH"] = "compute_75"
        return env


def local_host(args: argparse.Namespace) -> Host:
    from fp4series import report

    pin = args.pin_tree or REPO / ".work" / "upstream" / report.pin_info(REPO)["tag"] / "python"
    for tree, opt in ((args.patched_tree, "--patched-tree"), (pin, "--pin-tree")):
        if not (tree / "sglang" / "jit_kernel").is_dir():
            raise SeriesError(f"{tree}/sglang/jit_kernel not found", hint=f"run `python -m "
                              f"fp4series prepare-checkout` or pass {opt}")  # fmt: skip
    return Host(args.work, args.patched_tree, pin, args.upstream_tree)


def bundled_host(args: argparse.Namespace) -> Host:
    log(f"checking and unpacking {args.bundle}")
    root, manifest = bundle_mod.unpack(args.bundle, args.work)
    up = root / "trees" / "upstream"
    host = Host(args.work, root / "trees" / "patched", root / "trees" / "pin",
                up if up.is_dir() else args.upstream_tree)  # fmt: skip
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


def probe(host: Host) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=host.variant_env("patched"),
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SeriesError(f"the patched tree does not import here:\n{proc.stderr[-2000:]}",
                          hint="install SGLang's runtime (sgl_kernel, apache-tvm-ffi) or "
                          "run from a bundle: scripts/make-bundle.sh, then --bundle")  # fmt: skip
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if not found["cuda"]:
        raise SeriesError("no CUDA device here (torch.cuda.is_available() is False)",
                          hint="run scripts/gpu-proof.sh on a host with an NVIDIA GPU")  # fmt: skip
    log(f"runtime: sgl_kernel {found['sgl_kernel']}, tvm-ffi {found['tvm_ffi']}, "
        f"series enables SM75: {found['sm75']}")  # fmt: skip
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
    cmd = [sys.executable, *(a.replace("{report_dir}", report_dir) for a in stage.command)]
    log(f"stage {stage.name}: {' '.join(cmd[1:])}")
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
    extras = {"FP4SERIES_PIN_TREE": str(host.pin)}
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


def run(args: argparse.Namespace) -> int:
    selected = stage_table.select(args.stages)
    args.work.mkdir(parents=True, exist_ok=True)
    logs = args.logs or args.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    deadline = START + args.deadline if args.deadline else float("inf")
    host = bundled_host(args) if args.bundle else local_host(args)
    found = probe(host)
    modules = [m for s in selected for m in s.modules]
    if not found["sm75"]:
        modules = [m for m in modules if m[0] != "compute75"]
    if host.upstream is None:
        modules = [m for m in modules if m[0] != "upstream"]
    built = build(host, list(dict.fromkeys(modules)), logs, deadline)
    (logs / "builds.json").write_text(json.dumps({f"{v} {s}": rc for (v, s), rc in built.items()}))
    if any(rc for (_, spec), rc in built.items() if spec.startswith("act")):
        host.env["FP4SERIES_ACT_FALLBACK"] = "sgl_kernel"  # see jit_hook.py
        log("activation module did not build: served by sgl_kernel's AOT kernels")
    failed = [k for k, rc in built.items() if rc and not k[1].startswith("act")]
    running = [k for k, rc in built.items() if rc is None]
    if failed:
        log(f"FAILED builds (logs in {logs}): {failed}")
    if running or args.build_only:
        log(f"builds still running (they go on): {running}" if running else "--build-only: done")
        return 1 if failed or running else 0
    env = host.variant_env("patched")
    env.update(FP4SERIES_REPORT_DIR=str(args.work / "reports"), FP4SERIES_REQUIRE_GPU="1",
               FP4SERIES_REPORT_COMMAND=recorded_command(args.argv),
               FP4SERIES_UNPATCHED_TREE=str(host.unpatched),
               FP4SERIES_UNPATCHED_CACHE=str(args.work / "cache" / "unpatched"),
               FP4SERIES_C75_CACHE=str(args.work / "cache" / "compute75"))  # fmt: skip
    env.update(stage_extras(host, deadline))
    if not found["sm75"]:
        env["FP4SERIES_SKIP_TURING"] = "1"
    if host.upstream is not None and not any(built.get(m) for m in modules if m[0] == "upstream"):
        up = host.variant_env("upstream")
        extra = json.dumps(host.upstream_paths + host.paths)
        env.update(FP4SERIES_UPSTREAM_TREE=str(host.upstream), FP4SERIES_UPSTREAM_EXTRA_PATH=extra,
                   FP4SERIES_UPSTREAM_CACHE=up["TVM_FFI_CACHE_DIR"])  # fmt: skip
    rcs = {s.name: run_stage(s, dict(env), args.out, logs, deadline) for s in selected}
    log(f"done: {rcs}; reports in {args.out} (check: python -m fp4series check-reports)")
    return 1 if failed or any(rcs.values()) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="scripts/gpu-proof.sh", description=__doc__.split("\n")[0])
    p.add_argument("--stages", default=",".join(stage_table.DEFAULT_STAGES),
                   help=f"comma list of {', '.join(stage_table.STAGES)}")  # fmt: skip
    p.add_argument("--out", type=Path, default=REPO / "reports" / "h200", help="report directory")
    p.add_argument("--bundle", type=Path, help="run from a bundle (its directory or manifest)")
    p.add_argument("--work", type=Path, default=REPO / ".work" / "gpu-proof",
                   help="unpacked bundle, JIT caches, stage reports")  # fmt: skip
    p.add_argument("--logs", type=Path, help="build and stage logs (default WORK/logs)")
    p.add_argument("--patched-tree", type=Path, default=REPO / ".work" / "checkout" / "python")
    p.add_argument("--pin-tree", type=Path, help="default .work/upstream/<pin tag>/python")
    p.add_argument("--upstream-tree", type=Path, help="upstream 0.5.23's python dir (benchmark)")
    p.add_argument("--deadline", type=float, metavar="S",
                   help="stop at S s: builds go on detached, the stage gets SIGINT")  # fmt: skip
    p.add_argument("--build-only", action="store_true", help="build the modules, run no stage")
    args = p.parse_args(argv)
    args.argv = argv
    for name in ("work", "out", "logs", "bundle"):  # the stages run from the repository root
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    try:
        stage_table.select(args.stages)
    except ValueError as exc:
        p.error(str(exc))
    return run_reporting_errors(run, args)


if __name__ == "__main__":
    sys.exit(main())
