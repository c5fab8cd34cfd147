"""Run the GPU proof: build the JIT variants in parallel, then the GPU tests and the benchmark.

Phases (scripts/device/run.sh PHASE on the lent GPU machine; scripts/gpu-proof.sh = local):
  build   unpack .carry into /tmp/fp4proof (only what is not there yet: ninja reuses a build
          only while the sources keep their mtimes), install the carried wheels, then build every
          JIT module the proof needs, one process per heavy module, all in parallel:
            patched   gptq_marlin fp16+bf16, moe_wna16_marlin fp16+bf16, repack, activation
            unpatched gptq_marlin bf16, moe_wna16_marlin bf16, repack, activation (the repro)
            compute75 gptq_marlin fp16, moe_wna16_marlin fp16, repack, activation (PTX only;
                      skipped when the series refuses SM75)
            up0523    0.5.23's gptq_marlin bf16 + repack (benchmark)
          Each variant has its own TVM_FFI_CACHE_DIR. Builds run in their own sessions, so a
          build still running at the deadline keeps going into the next call on a warm machine.
  test    pytest tests/gpu (numerics, tracing, repro, compute_75) then bench/bench_fp4_marlin.py;
          reports are copied flat into $OUT (<= 8 files).
  local   build + test on this machine's own GPU and python environment (scripts/gpu-proof.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - START:6.0f}s] {msg}", flush=True)


class Layout:
    """Where trees, caches and reports live for one run."""

    def __init__(self, root: Path, carry: Path | None) -> None:
        self.root = root
        self.carry = carry
        self.trees = root / "trees"
        self.patched = self.trees / "patched"
        self.unpatched = self.trees / "unpatched"
        self.up0523 = self.trees / "up0523"
        self.sgl = self.trees / "sgl_kernel"
        self.site = root / "site"
        self.site0523 = root / "site0523"
        self.lib = root / "lib"
        self.cache = root / "cache"
        self.reports = root / "reports"
        self.logs = root / "logs"

    def cache_dir(self, variant: str) -> str:
        return str(self.cache / variant)


# ----------------------------------------------------------------------------- unpacking


def _extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, filter="fully_trusted")


def _once(stamp: Path, what: str, fn) -> None:  # noqa: ANN001
    if stamp.is_file():
        log(f"{what}: already there (kept, so ninja keeps its builds)")
        return
    t = time.time()
    fn()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(str(time.time()))
    log(f"{what}: done in {time.time() - t:.0f}s")


def _make_unpatched(lay: Layout, pin_jit: Path | None, pin_tree: Path | None) -> None:
    """Hard-link copy of the patched tree, then the pin's jit_kernel sources swapped in.

    Swapped files are unlinked first: writing through a hard link would change the patched tree.
    """
    if lay.unpatched.exists():
        shutil.rmtree(lay.unpatched)

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another filesystem
            shutil.copy2(src, dst)

    shutil.copytree(lay.patched, lay.unpatched, copy_function=link_or_copy)
    if pin_jit is not None:
        with tarfile.open(pin_jit, "r:xz") as tar:
            for member in tar.getmembers():
                target = lay.unpatched / member.name
                if target.exists():
                    target.unlink()
            tar.extractall(lay.unpatched, filter="fully_trusted")
        return
    assert pin_tree is not None
    src = pin_tree / "sglang" / "jit_kernel"
    for p in src.rglob("*"):
        if p.is_file() and p.suffix != ".py":
            target = lay.unpatched / p.relative_to(pin_tree)
            if target.exists():
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)


def unpack(lay: Layout) -> None:
    carry = lay.carry
    assert carry is not None
    _once(
        lay.patched / ".done",
        "patched tree",
        lambda: _extract(carry / "sglang-patched.tar.xz", lay.patched),
    )
    _once(
        lay.unpatched / ".done",
        "unpatched tree",
        lambda: _make_unpatched(lay, carry / "pin-jit.tar.xz", None),
    )
    if (carry / "sglang-0523.tar.xz").is_file():  # left out by `pack.py --no-0523`
        _once(
            lay.up0523 / ".done",
            "0.5.23 subset",
            lambda: _extract(carry / "sglang-0523.tar.xz", lay.up0523),
        )
    _once(
        lay.sgl / ".done",
        "sgl_kernel subset",
        lambda: _extract(carry / "sgl_kernel.tar.xz", lay.sgl),
    )

    def wheels() -> None:
        for wheel_dir, site in (
            (carry / "wheels", lay.site),
            (carry / "wheels-0523", lay.site0523),
        ):
            wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
            if not wheels:
                continue
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                str(site),
                *wheels,
            ]
            subprocess.run(cmd, check=True)
        lay.lib.mkdir(parents=True, exist_ok=True)
        for p in (carry / "lib").glob("*"):
            shutil.copy2(p, lay.lib / p.name)

    _once(lay.site / ".done", "wheels", wheels)


# ----------------------------------------------------------------------------- environments


def base_env(lay: Layout, tree: Path, sgl_dir: Path | None, variant: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(tree)]
    if sgl_dir is not None:
        paths.append(str(sgl_dir))
    if lay.carry is not None:
        paths.append(str(lay.site))
    paths += [str(REPO / "src")]
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + rest)
    env["TVM_FFI_CACHE_DIR"] = lay.cache_dir(variant)
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    env["CUDA_CACHE_MAXSIZE"] = str(4 * 2**30)  # PTX JIT results of the compute_75 run
    env.setdefault("CUDA_MODULE_LOADING", "LAZY")  # JIT-compile only the kernels launched
    env["PYTHONUNBUFFERED"] = "1"
    if lay.lib.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(lay.lib), env.get("LD_LIBRARY_PATH", "")])
    meta = (lay.carry / "meta.json") if lay.carry else None
    if meta is not None and meta.is_file():
        env["FP4SERIES_SERIES_REVISION"] = json.dumps(
            json.loads(meta.read_text())["series_revision"]
        )
    return env


def choose_sgl_kernel(lay: Layout) -> Path | None:
    """The carried sm90 sgl_kernel if it imports here, else the shim (recorded in the reports)."""
    if lay.carry is None:
        return None  # local: the user's own sgl_kernel
    choice = lay.root / "sgl_choice.txt"
    if choice.is_file():
        return Path(choice.read_text().strip())
    env = base_env(lay, lay.patched, lay.sgl, "patched")
    probe = (
        "import sgl_kernel; from sgl_kernel import moe_align_block_size, moe_sum_reduce; "
        "print(sgl_kernel.__file__)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        chosen = lay.sgl
        log(f"sgl_kernel: carried sm90 build ({proc.stdout.strip()})")
    else:
        chosen = lay.carry / "shim"
        log(f"sgl_kernel: carried build failed, using the shim: {proc.stderr.strip()[-600:]}")
    choice.write_text(str(chosen))
    return chosen


def turing_enabled(env: dict[str, str]) -> bool:
    code = (
        "import torch\nfrom sglang.srt.layers.quantization.marlin_utils_fp4 import "
        "is_fp4_marlin_supported as s\nprint(bool(s(torch.float16, capability=(7, 5))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    enabled = proc.returncode == 0 and proc.stdout.strip().endswith("True")
    log(
        f"series enables SM75: {enabled}"
        + ("" if proc.returncode == 0 else f" ({proc.stderr.strip()[-300:]})")
    )
    return enabled


def variant_envs(lay: Layout, sgl_dir: Path | None) -> dict[str, dict[str, str]]:
    envs = {
        "patched": base_env(lay, lay.patched, sgl_dir, "patched"),
        "unpatched": base_env(lay, lay.unpatched, sgl_dir, "unpatched"),
        "compute75": base_env(lay, lay.patched, sgl_dir, "compute75"),
    }
    envs["unpatched"]["FP4SERIES_TEMPLATES"] = "unpatched"
    envs["compute75"]["FP4SERIES_FORCE_ARCH"] = "compute_75"
    if (lay.up0523 / "sglang").is_dir():
        up = base_env(lay, lay.up0523, sgl_dir, "up0523")
        if lay.site0523.is_dir():  # 0.5.23 pins apache-tvm-ffi 0.1.11
            up["PYTHONPATH"] = os.pathsep.join([str(lay.site0523), up["PYTHONPATH"]])
        envs["up0523"] = up
    return envs


# ----------------------------------------------------------------------------- build


def build(lay: Layout, deadline_s: float) -> dict[str, object]:
    sgl_dir = choose_sgl_kernel(lay)
    envs = variant_envs(lay, sgl_dir)
    jobs = [
        ("patched", ["gptq_marlin:bf16"]), ("patched", ["gptq_marlin:fp16"]),
        ("patched", ["moe_wna16_marlin:bf16"]), ("patched", ["moe_wna16_marlin:fp16"]),
        ("patched", ["repack", "act:bf16", "act:fp16"]),
        ("unpatched", ["gptq_marlin:bf16"]), ("unpatched", ["moe_wna16_marlin:bf16"]),
        ("unpatched", ["repack", "act:bf16"]),
    ]  # fmt: skip
    if "up0523" in envs:
        jobs += [("up0523", ["up_gptq_marlin:bf16"]), ("up0523", ["up_repack"])]
    lay.logs.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[str, list[str], subprocess.Popen[bytes], Path, float]] = []

    def start(variant: str, specs: list[str]) -> None:
        logf = lay.logs / f"build_{len(procs):02d}_{variant}_{specs[0].replace(':', '_')}.log"
        cmd = [sys.executable, str(REPO / "tests" / "gpu" / "_jitenv.py"), "warm", *specs]
        proc = subprocess.Popen(
            cmd, env=envs[variant], stdout=logf.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True, cwd=str(REPO),
        )  # fmt: skip
        procs.append((variant, specs, proc, logf, time.time()))

    for variant, specs in jobs:
        start(variant, specs)
    # Decided while the others build: the compute_75 variant only if the series enables SM75.
    skip_turing = os.environ.get("FP4SERIES_SKIP_TURING") == "1" or not turing_enabled(
        envs["patched"]
    )
    if not skip_turing:
        for specs in (["gptq_marlin:fp16"], ["moe_wna16_marlin:fp16"], ["repack", "act:fp16"]):
            start("compute75", specs)
    log(f"started {len(procs)} build processes ({os.cpu_count()} cores)")
    status: dict[str, object] = {"skip_turing": skip_turing, "jobs": []}
    pending = list(procs)
    while pending and time.time() - START < deadline_s:
        time.sleep(5)
        for item in list(pending):
            variant, specs, proc, logf, t0 = item
            if proc.poll() is not None:
                pending.remove(item)
                log(
                    f"build {variant} {specs}: exit {proc.returncode} after {time.time() - t0:.0f}s"
                )
    jobs_out = []
    for variant, specs, proc, logf, _ in procs:
        rc = proc.poll()
        jobs_out.append(
            {"variant": variant, "specs": specs, "rc": rc, "log": logf.read_text()[-2000:]}
        )
        if rc is None:
            log(f"build {variant} {specs}: STILL RUNNING at the deadline (continues in background)")
        elif rc != 0:
            log(f"build {variant} {specs}: FAILED\n{logf.read_text()[-3000:]}")
    status["jobs"] = jobs_out
    (lay.root / "build_status.json").write_text(json.dumps(status, indent=1))
    if not skip_turing:
        status["compute75_objects"] = ptx_evidence(lay)
    return status


def ptx_evidence(lay: Layout) -> str:
    """cuobjdump listing of the compute_75 builds: PTX for sm_75, no SASS expected."""
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    lines = []
    for so in sorted(Path(lay.cache_dir("compute75")).rglob("*.so")):
        proc = subprocess.run(
            [tool, "--list-elf", "--list-ptx", str(so)], capture_output=True, text=True
        )
        lines.append(f"{so.name}: {(proc.stdout + proc.stderr).strip()[:600]}")
    text = "\n".join(lines) or "no compute75 .so found"
    (lay.root / "compute75_cuobjdump.txt").write_text(text)
    return text


def wait_for_builds(lay: Layout, limit_s: float) -> None:
    """A warm machine may still be finishing builds started by the build phase."""
    t = time.time()
    while time.time() - t < limit_s:
        try:
            busy = subprocess.run(
                ["pgrep", "-f", "_jitenv.py warm"], capture_output=True, text=True
            )
        except OSError:
            return
        if not busy.stdout.strip():
            return
        log("waiting for JIT builds still running from the build phase ...")
        time.sleep(5)
    log("builds still running; tests will wait on their build locks")


# ----------------------------------------------------------------------------- test


def run_tests(
    lay: Layout, out: Path | None, command: str, pytest_timeout: int, bench_timeout: int
) -> int:
    sgl_dir = choose_sgl_kernel(lay)
    envs = variant_envs(lay, sgl_dir)
    env = dict(envs["patched"])
    lay.reports.mkdir(parents=True, exist_ok=True)
    env.update(
        FP4SERIES_REPORT_DIR=str(lay.reports),
        FP4SERIES_REPORT_COMMAND=command,
        FP4SERIES_REQUIRE_GPU="1",
        FP4SERIES_UNPATCHED_TREE=str(lay.unpatched),
        FP4SERIES_UNPATCHED_CACHE=lay.cache_dir("unpatched"),
        FP4SERIES_C75_CACHE=lay.cache_dir("compute75"),
        FP4SERIES_WORKER_TIMEOUT=str(max(60, pytest_timeout - 20)),
    )
    status_file = lay.root / "build_status.json"
    if status_file.is_file() and json.loads(status_file.read_text()).get("skip_turing"):
        env["FP4SERIES_SKIP_TURING"] = "1"
    lay.logs.mkdir(parents=True, exist_ok=True)
    pytest_log = lay.logs / "pytest.log"
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-rA", "-p", "no:cacheprovider",
           "--junitxml", str(lay.reports / "junit.xml")]  # fmt: skip
    log("pytest tests/gpu ...")
    rc_tests = _run_logged(cmd, env, pytest_log, pytest_timeout)
    log(f"pytest exit {rc_tests}")
    bench_env = dict(env)
    if "up0523" in envs:
        bench_env["FP4SERIES_UPSTREAM_TREE"] = str(lay.up0523)
        bench_env["FP4SERIES_UPSTREAM_CACHE"] = lay.cache_dir("up0523")
        if lay.site0523.is_dir():
            bench_env["FP4SERIES_UPSTREAM_EXTRA_PATH"] = json.dumps(
                [str(lay.site0523)] + ([str(sgl_dir)] if sgl_dir else []) + [str(lay.site)]
            )
    bench_log = lay.logs / "bench.log"
    log("bench ...")
    rc_bench = _run_logged(
        [sys.executable, "bench/bench_fp4_marlin.py", "--out", str(lay.reports)],
        bench_env, bench_log, bench_timeout,
    )  # fmt: skip
    log(f"bench exit {rc_bench}")
    if out is not None:
        collect(lay, out)
    return rc_tests or rc_bench


def _run_logged(cmd: list[str], env: dict[str, str], logf: Path, timeout: int) -> int:
    with logf.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=str(REPO))  # fmt: skip
        assert proc.stdout is not None
        t = time.time()
        for line in proc.stdout:
            fh.write(line)
            if (
                line.startswith(("[bench]", "FAILED", "ERROR", "PASSED", "SKIPPED"))
                or "passed" in line
            ):
                print(line.rstrip()[:300], flush=True)
            if time.time() - t > timeout:
                proc.kill()
                fh.write(f"\nKILLED after {timeout}s\n")
                log(f"killed {cmd[:3]} after {timeout}s")
                return 124
        return proc.wait()


def collect(lay: Layout, out: Path) -> None:
    """At most 8 flat files into $OUT: the reports and the logs that explain them."""
    out.mkdir(parents=True, exist_ok=True)
    picks = [
        lay.reports / n
        for n in ("numerics.json", "turing_ptx.json", "bench.json", "bench.md", "bench.png")
    ]
    for p in picks:
        if p.is_file():
            shutil.copy2(p, out / p.name)
    logs = []
    for p in sorted(lay.logs.glob("*.log")):
        logs.append(f"===== {p.name}\n{p.read_text()[-400_000:]}")
    for extra in ("build_status.json", "compute75_cuobjdump.txt", "sgl_choice.txt"):
        if (lay.root / extra).is_file():
            logs.append(f"===== {extra}\n{(lay.root / extra).read_text()}")
    (out / "logs.txt").write_text("\n".join(logs)[-12_000_000:])
    junit = lay.reports / "junit.xml"
    if junit.is_file():
        shutil.copy2(junit, out / "junit.xml")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("phase", choices=["build", "test", "local"])
    parser.add_argument("--carry", default=str(REPO / ".carry"))
    parser.add_argument("--root", default=os.environ.get("FP4SERIES_DEVICE_ROOT", "/tmp/fp4proof"))
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument(
        "--deadline", type=float, default=float(os.environ.get("FP4SERIES_BUILD_DEADLINE", "520"))
    )
    args = parser.parse_args(argv)
    device_cmd = "scripts/device/run.sh build && scripts/device/run.sh test"
    if args.phase == "local":
        return local(args)
    lay = Layout(Path(args.root).resolve(), Path(args.carry).resolve())
    if not (lay.carry and (lay.carry / "meta.json").is_file()):
        print(f"error: {args.carry}/meta.json missing: run scripts/device/pack.sh, carry .carry",
              file=sys.stderr)  # fmt: skip
        return 1
    unpack(lay)
    if args.phase == "build":
        status = build(lay, args.deadline)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            logs = [
                f"===== {p.name}\n{p.read_text()[-200_000:]}"
                for p in sorted(lay.logs.glob("build_*.log"))
            ]
            (Path(args.out) / "build_logs.txt").write_text("\n".join(logs))
            (Path(args.out) / "build_status.json").write_text(json.dumps(status, indent=1))
        bad = [j for j in status["jobs"] if j["rc"] not in (0, None)]  # type: ignore[index,union-attr]
        return 1 if bad else 0
    if not (lay.root / "build_status.json").is_file():
        log("WARNING: no build_status.json: the machine went cold since the build phase; "
            "building now, tests get what time is left")  # fmt: skip
        build(lay, deadline_s=400)
    wait_for_builds(lay, 240)
    budget = float(os.environ.get("FP4SERIES_TEST_BUDGET", "560")) - (time.time() - START)
    bench_s = min(int(os.environ.get("FP4SERIES_BENCH_TIMEOUT", "200")), int(budget * 0.4))
    return run_tests(
        lay,
        Path(args.out) if args.out else None,
        device_cmd,
        pytest_timeout=max(60, int(budget - bench_s)),
        bench_timeout=max(60, bench_s),
    )


def local(args: argparse.Namespace) -> int:
    """A user's own GPU: patched tree from FP4SERIES_PATCHED_TREE or .work/checkout/python."""
    patched = Path(os.environ.get("FP4SERIES_PATCHED_TREE", REPO / ".work" / "checkout" / "python"))
    pin = Path(
        os.environ.get("FP4SERIES_PIN_TREE", REPO / ".work" / "upstream" / "v0.5.11" / "python")
    )
    for tree, what in ((patched, "FP4SERIES_PATCHED_TREE"), (pin, "FP4SERIES_PIN_TREE")):
        if not (tree / "sglang" / "jit_kernel").is_dir():
            print(f"error: {tree}/sglang/jit_kernel not found: set {what} or run "
                  "`python -m fp4series prepare-checkout`", file=sys.stderr)  # fmt: skip
            return 1
    root = Path(os.environ.get("FP4SERIES_DEVICE_ROOT", REPO / ".work" / "gpu-proof"))
    lay = Layout(root, None)
    lay.patched = patched  # used in place
    _once(lay.unpatched / ".done", "unpatched tree", lambda: _make_unpatched(lay, None, pin))
    up = os.environ.get("FP4SERIES_UPSTREAM_TREE")
    if up:
        lay.up0523 = Path(up)
    lay.reports = Path(os.environ.get("FP4SERIES_REPORT_DIR", REPO / "reports" / "h200"))
    status = build(lay, deadline_s=float("inf"))
    bad = [j for j in status["jobs"] if j["rc"] != 0]  # type: ignore[index,union-attr]
    if bad:
        print(f"error: {len(bad)} JIT build(s) failed; see {lay.logs}", file=sys.stderr)
        return 1
    rc = run_tests(lay, None, "scripts/gpu-proof.sh", pytest_timeout=3600, bench_timeout=3600)
    print(f"\nreports: {lay.reports}/numerics.json, turing_ptx.json, bench.json, bench.md, "
          f"bench.png; logs: {lay.logs}")  # fmt: skip
    return rc


if __name__ == "__main__":
    sys.exit(main())
