"""The GPU proof on the device with JIT modules prebuilt on the CPU machine.

``scripts/device/run.sh prebuilt`` (the carry, FP4SERIES_CARRY, default ``.carry``, from
pack.py; with every module prebuilt it exceeds one call's 64 MiB, so ``pack.py --split`` makes
``.carry-numerics`` and ``.carry-bench`` for two calls):
  1. unpack the carry into /tmp/fp4proof (trees, sgl_kernel, wheels unzipped, prebuilt .so's,
     upstream 0.5.23 and its tvm-ffi when carried),
  2. run the stages FP4SERIES_STAGES picks (numerics, compute75, bench; default all) under one
     wall budget (FP4SERIES_BUDGET_S, default 240 s after unpacking), every process with the
     loader hook (site/sitecustomize.py -> prebuilt_hook.py), so that SGLang's JIT loads the
     matching prebuilt .so and compiles only what is missing (logged):
       group 1 (concurrent pytest sessions, each stopped with SIGINT at its slice so that
       conftest still writes its report): dense bf16 | MoE bf16 + unpatched repro |
       fp16 dense + MoE | compute_75 | tracing; meanwhile upstream 0.5.23's modules compile
       in the background when the benchmark runs,
       group 2 (alone, for clean timings): the benchmark (all shapes, M 1..1024, MoE;
       FP4SERIES_BENCH_* narrow it), which waits for 0.5.23's build before its turn,
  3. write into $OUT as each stage ends (flat, <= 8 files): numerics.json (cases merged over
     the stages), turing_ptx.json, bench.json, bench.md, bench.png, summary.json, logs.txt.
A stage that has no time left, or needs a module that is not prebuilt, is recorded as not run.
"""

from __future__ import annotations

import contextlib
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import device_run as dr  # noqa: E402
import prebuilt_hook  # noqa: E402

sys.path.insert(0, str(dr.REPO / "src"))
from fp4series.digest import sha256_file  # noqa: E402

REPO = dr.REPO
START = time.time()
SUMMARY: dict[str, Any] = {"stages": {}, "prebuilt": {}, "notes": []}


def log(msg: str) -> None:
    print(f"[{time.time() - START:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- unpack


def _unzip_wheel(wheel: Path, site: Path) -> None:
    """What pip does for these wheels, minus metadata checks: unzip, lift .data/*lib."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for data in site.glob("*.data"):
        for sub in ("purelib", "platlib"):
            if (data / sub).is_dir():
                for item in (data / sub).iterdir():
                    dest = site / item.name
                    if dest.exists():
                        shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
                    shutil.move(str(item), dest)
        shutil.rmtree(data, ignore_errors=True)


def unpack(lay: dr.Layout) -> Path:
    carry = lay.carry
    assert carry is not None
    t = time.time()
    prebuilt = lay.root / "prebuilt"
    jobs = []
    with ThreadPoolExecutor(8) as pool:
        if not (lay.patched / ".done").is_file():
            jobs.append(pool.submit(dr._extract, carry / "sglang-patched.tar.xz", lay.patched))
        if not (lay.sgl / ".done").is_file():
            jobs.append(pool.submit(dr._extract, carry / "sgl_kernel.tar.xz", lay.sgl))
        if not (lay.site / ".done").is_file():
            lay.site.mkdir(parents=True, exist_ok=True)
            for w in sorted((carry / "wheels").glob("*.whl")):
                jobs.append(pool.submit(_unzip_wheel, w, lay.site / ("_w_" + w.name)))
        # upstream 0.5.23 (benchmark comparison) and the tvm-ffi 0.1.11 it pins
        if (carry / "sglang-0523.tar.xz").is_file() and not (lay.up0523 / ".done").is_file():
            jobs.append(pool.submit(dr._extract, carry / "sglang-0523.tar.xz", lay.up0523))
            for w in sorted((carry / "wheels-0523").glob("*.whl")):
                jobs.append(pool.submit(_unzip_wheel, w, lay.site0523))
        prebuilt.mkdir(parents=True, exist_ok=True)
        manifest = carry / "prebuilt" / "manifest.json"
        if manifest.is_file():
            shutil.copy2(manifest, prebuilt / "manifest.json")
            for xz in (carry / "prebuilt").glob("*.so.xz"):
                if not (prebuilt / xz.name[:-3]).is_file():
                    jobs.append(pool.submit(_unxz, xz, prebuilt / xz.name[:-3]))
        for j in jobs:
            j.result()
    # wheels were unzipped into one dir each (parallel); merge into site/
    for d in sorted(lay.site.glob("_w_*")):
        for item in d.iterdir():
            dest = lay.site / item.name
            if dest.exists():
                shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
            shutil.move(str(item), dest)
        shutil.rmtree(d)
    for stamp in (lay.patched / ".done", lay.sgl / ".done", lay.site / ".done"):
        stamp.write_text(str(time.time()))
    if lay.up0523.is_dir():
        (lay.up0523 / ".done").write_text(str(time.time()))
    lay.lib.mkdir(parents=True, exist_ok=True)
    for p in (carry / "lib").glob("*"):
        shutil.copy2(p, lay.lib / p.name)
    if not (lay.unpatched / ".done").is_file():
        dr._make_unpatched(lay, carry / "pin-jit.tar.xz", None)
        (lay.unpatched / ".done").write_text("")
    log(f"unpacked in {time.time() - t:.1f}s")
    return prebuilt


def _unxz(src: Path, dest: Path) -> None:
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(lzma.decompress(src.read_bytes()))  # no xz binary needed there
    tmp.rename(dest)


def check_prebuilt(prebuilt: Path, lay: dr.Layout) -> dict[str, bool]:
    """Which modules the trees here have prebuilt (also verifies sha256 of each .so)."""
    man = json.loads((prebuilt / "manifest.json").read_text()) if (
        prebuilt / "manifest.json").is_file() else {"modules": []}  # fmt: skip
    hashes = {
        "patched": prebuilt_hook.tree_hash(lay.patched / "sglang" / "jit_kernel"),
        "unpatched": prebuilt_hook.tree_hash(lay.unpatched / "sglang" / "jit_kernel"),
    }
    have: dict[str, bool] = {}
    for e in man["modules"]:
        so = prebuilt / e["file"][:-3]
        ok = so.is_file() and sha256_file(so) == e["sha256"]
        for label, h in hashes.items():
            if h in (e["tree_hash"], *e.get("also_tree_hashes", [])):
                key = f"{label}:{e['spec']}:{e['arch']}"
                have[key] = ok
    SUMMARY["prebuilt"] = {"tree_hashes": hashes, "have": have, "tvm_ffi": man.get("tvm_ffi")}
    log(f"prebuilt modules matching the trees here: {sorted(k for k, v in have.items() if v)}")
    bad = [k for k, v in have.items() if not v]
    if bad:
        log(f"WARNING prebuilt sha256 mismatch / missing: {bad}")
    return {k: v for k, v in have.items() if v}


# ----------------------------------------------------------------------------- stages


_PYTEST_END = re.compile(r"\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s")


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Stage:
    def __init__(self, name: str, cmd: list[str], env: dict[str, str], logf: Path,
                 report_dir: Path | None) -> None:  # fmt: skip
        self.name, self.cmd, self.env, self.logf, self.report_dir = name, cmd, env, logf, report_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.t0 = 0.0
        self.stopped = False

    def start(self) -> None:
        self.t0 = time.time()
        # SIGINT back to default in the child: a runner that starts us in the background
        # leaves SIGINT ignored, and Python then never raises KeyboardInterrupt (no report).
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=str(REPO),
                                     stdout=self.logf.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     preexec_fn=_sigint_default)  # fmt: skip
        log(f"stage {self.name}: started")

    def interrupt(self) -> None:
        """SIGINT: pytest then runs sessionfinish and conftest still writes its report."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.stopped = True
            log(f"stage {self.name}: time slice over -> SIGINT")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)

    def stop(self, grace_s: float = 12) -> None:
        assert self.proc is not None
        self.interrupt()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def record(self) -> dict[str, Any]:
        assert self.proc is not None
        tail = self.logf.read_text(errors="replace").splitlines()
        res = {
            "status": "stopped at time slice" if self.stopped else "ran",
            "rc": self.proc.returncode,
            "seconds": round(time.time() - self.t0, 1),
            "summary": next(
                (ln.strip("= ") for ln in reversed(tail) if _PYTEST_END.search(ln)), ""
            ),
        }
        SUMMARY["stages"][self.name] = res
        log(f"stage {self.name}: {res}")
        return res


def merge_numerics(out: Path | None, stage_dirs: list[tuple[str, Path]]) -> None:
    """numerics.json = the first report's metadata + every finished stage's cases/tracing."""
    merged: dict[str, Any] | None = None
    for name, d in stage_dirs:
        f = d / "numerics.json"
        if not f.is_file():
            continue
        data = json.loads(f.read_text())
        for c in data.get("cases", []):
            c.setdefault("stage", name)
        if merged is None:
            merged = dict(data)
            merged["cases"] = list(data.get("cases", []))
            merged["tracing"] = list(data.get("tracing", []))
            merged["stages"] = [name]
        else:
            merged["cases"] += data.get("cases", [])
            merged["tracing"] += data.get("tracing", [])
            merged["stages"].append(name)
            for k, v in data.items():
                if k not in merged:
                    merged[k] = v
        if "turing_ptx" in data:
            merged["turing_ptx"] = data["turing_ptx"]
        t = d / "turing_ptx.json"
        if t.is_file() and out is not None:
            shutil.copy2(t, out / "turing_ptx.json")
    if merged is not None:
        merged["command"] = report_command()
        merged["prebuilt"] = SUMMARY["prebuilt"]
        if out is not None:
            _atomic(out / "numerics.json", json.dumps(merged, indent=1))


def harvest_workers(lay: dr.Layout, out: Path | None) -> None:
    """Cases a stopped repro / compute_75 worker printed before it was stopped.

    The workers (tests/gpu/_jitenv.py) print ``[suite] {case json}`` per case and write their
    result only at the end; a stage stopped at its slice would lose them otherwise.
    """
    if out is None:
        return
    for suite in ("repro", "turing"):
        # this run's only: a machine kept warm between calls still holds the last call's logs
        logs = sorted(
            p for p in (lay.root / "tmp").glob(f"fp4-{suite}-*/worker.log")
            if p.stat().st_mtime >= START
        )  # fmt: skip
        if not logs:
            continue
        cases = []
        for line in logs[-1].read_text(errors="replace").splitlines():
            if line.startswith(f"[{suite}] {{"):
                with contextlib.suppress(json.JSONDecodeError):
                    cases.append(json.loads(line[len(suite) + 3 :]))
        shutil.copy2(logs[-1], lay.logs / f"worker_{suite}.log")
        if suite == "repro":
            f = out / "numerics.json"
            data = json.loads(f.read_text()) if f.is_file() else {"cases": []}
            if any(c.get("templates") == "unpatched" for c in data["cases"]) or not cases:
                continue
            for c in cases:
                c.update(templates="unpatched", expect="fail", stage="repro-worker-log")
            data["cases"] += cases
            data["repro_note"] = "cases harvested from the repro worker log (stage stopped)"
            _atomic(f, json.dumps(data, indent=1))
        elif not (out / "turing_ptx.json").is_file() and cases:
            for c in cases:
                c["arch"] = "compute_75"
            data = {"arch": "compute_75", "cases": cases, "command": report_command(),
                    "note": "harvested from the compute_75 worker log"}  # fmt: skip
            _atomic(out / "turing_ptx.json", json.dumps(data, indent=1))
        SUMMARY["stages"][f"worker_{suite}"] = {"status": f"{len(cases)} cases in its log"}


def report_command() -> str:
    """The command line as reports record it (the settings that shape the run included)."""
    shaping = ("FP4SERIES_BUDGET", "FP4SERIES_BENCH", "FP4SERIES_STAGES", "FP4SERIES_CARRY",
               "FP4SERIES_WORKER_TIMEOUT")  # fmt: skip
    knobs = " ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith(shaping))
    run = "scripts/device/run.sh prebuilt (.carry from scripts/device/pack.sh)"
    return f"{knobs} {run}" if knobs else run


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def write_logs(out: Path | None, lay: dr.Layout) -> None:
    if out is None:
        return
    parts = [f"===== summary\n{json.dumps(SUMMARY, indent=1)}"]
    for p in sorted(lay.logs.glob("*.log")) + sorted(lay.root.glob("prebuilt_hook.log")):
        parts.append(f"===== {p.name}\n{p.read_text(errors='replace')[-300_000:]}")
    _atomic(out / "logs.txt", "\n".join(parts))
    _atomic(out / "summary.json", json.dumps(SUMMARY, indent=1))


def run(lay: dr.Layout, out: Path | None, budget_s: float) -> int:
    t_begin = time.time()

    def left() -> float:
        return budget_s - (time.time() - t_begin)

    prebuilt = lay.root / "prebuilt"
    have = check_prebuilt(prebuilt, lay)
    sgl_dir = dr.choose_sgl_kernel(lay)
    envs = dr.variant_envs(lay, sgl_dir)
    hook_log = lay.root / "prebuilt_hook.log"
    site_dir = str(HERE / "site")
    lay.logs.mkdir(parents=True, exist_ok=True)
    for e in envs.values():
        e["PYTHONPATH"] = os.pathsep.join([site_dir, e["PYTHONPATH"]])
        e["FP4SERIES_PREBUILT_DIR"] = str(prebuilt)
        e["FP4SERIES_PREBUILT_LOG"] = str(hook_log)
        e.setdefault("FP4SERIES_ACT_FALLBACK", "sgl_kernel")  # see prebuilt_hook.py
        e["LD_LIBRARY_PATH"] = os.pathsep.join(
            [e.get("LD_LIBRARY_PATH", ""), "/usr/local/cuda/lib64"]
        )  # libcudart.so.13
    base = dict(envs["patched"])
    (lay.root / "tmp").mkdir(parents=True, exist_ok=True)
    base.update(
        TMPDIR=str(lay.root / "tmp"),  # the variant workers' logs land here (harvest_workers)
        FP4SERIES_REQUIRE_GPU="1",
        FP4SERIES_REPORT_COMMAND=report_command(),
        FP4SERIES_UNPATCHED_TREE=str(lay.unpatched),
        FP4SERIES_UNPATCHED_CACHE=lay.cache_dir("unpatched"),
        FP4SERIES_C75_CACHE=lay.cache_dir("compute75"),
    )
    need = {
        "bf16": ["patched:gptq_marlin:bf16:sm_90", "patched:repack:sm_90"],
        "moe_bf16": ["patched:moe_wna16_marlin:bf16:sm_90"],  # activation: sgl_kernel fallback
        # the repro worker prints each case as it goes: without the pin's MoE module it
        # still yields the dense cases (harvested from its log when it is stopped)
        "repro": ["unpatched:gptq_marlin:bf16:sm_90"],
        "fp16_dense": ["patched:gptq_marlin:fp16:sm_90"],
        "fp16_moe": ["patched:moe_wna16_marlin:fp16:sm_90"],
        "c75": ["patched:gptq_marlin:fp16:compute_75", "patched:moe_wna16_marlin:fp16:compute_75"],
    }
    allow_compile = os.environ.get("FP4SERIES_ALLOW_COMPILE") == "1"

    def ready(what: str) -> bool:
        missing = [k for k in need[what] if k not in have]
        if missing:
            SUMMARY["notes"].append(f"{what}: not prebuilt {missing}")
            then = " (compiling: FP4SERIES_ALLOW_COMPILE=1)" if allow_compile else " -> skipped"
            log(f"{what}: NOT PREBUILT {missing}{then}")
        return allow_compile or not missing

    # FP4SERIES_STAGES: any of "numerics" (sm_90 tests/gpu), "compute75", "bench" (default:
    # all). pack.py --split makes the carries of two calls (numerics | compute75,bench)
    wanted = set(os.environ.get("FP4SERIES_STAGES", "numerics,compute75,bench").split(","))
    up_build: subprocess.Popen[bytes] | None = None
    up_rc = lay.root / "up0523_build.rc"
    if "bench" in wanted and "up0523" in envs and os.environ.get("FP4SERIES_UPSTREAM", "1") == "1":
        # nothing prebuilt for 0.5.23 (other tvm-ffi, other tree layout): compile it here
        # while the tests run, so the benchmark's comparison finds it in its cache
        up_env = dict(envs["up0523"], TVM_FFI_CACHE_DIR=lay.cache_dir("up0523"))
        up_rc.unlink(missing_ok=True)
        warm = [sys.executable, str(REPO / "tests" / "gpu" / "_jitenv.py"), "warm",
                "up_gptq_marlin:bf16", "up_repack"]  # fmt: skip
        # the exit status lands in up_rc; the benchmark waits for it before 0.5.23's turn
        up_build = subprocess.Popen(
            ["sh", "-c", '"$@"; echo $? > "$0"', str(up_rc), *warm],
            env=up_env, cwd=str(REPO), stdout=(lay.logs / "build_up0523.log").open("w"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log("upstream 0.5.23 modules: compiling in the background")
    py = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    nm = "tests/gpu/test_marlin_numerics.py"
    stages: list[Stage] = []
    stage_dirs: list[tuple[str, Path]] = []

    def add(name: str, args: list[str], extra: dict[str, str] | None = None) -> None:
        rdir = lay.reports / name
        rdir.mkdir(parents=True, exist_ok=True)
        env = dict(base, FP4SERIES_REPORT_DIR=str(rdir), **(extra or {}))
        stages.append(Stage(name, py + args, env, lay.logs / f"{name}.log", rdir))
        stage_dirs.append((name, rdir))

    if ready("bf16"):
        add("dense_bf16", [f"{nm}::test_dense", "-k", "bfloat16"])
    else:
        SUMMARY["stages"]["dense_bf16"] = {"status": "not run: modules not prebuilt"}
    moe_args = [f"{nm}::test_moe", "-k", "bfloat16 or unpatched"]
    if ready("repro"):
        moe_args.insert(1, "tests/gpu/test_kernel_repro.py::test_unpatched_templates_fail")
    else:
        SUMMARY["stages"]["repro"] = {"status": "not run: unpatched modules not prebuilt"}
    if ready("moe_bf16"):
        add("moe_bf16_repro" if len(moe_args) == 4 else "moe_bf16", moe_args)
    elif len(moe_args) == 4:
        add("repro", ["tests/gpu/test_kernel_repro.py::test_unpatched_templates_fail"])
    fp16_tests = []
    if ready("fp16_dense"):
        fp16_tests.append(f"{nm}::test_dense")
    if ready("fp16_moe"):
        fp16_tests.append(f"{nm}::test_moe")
    if fp16_tests:
        add("fp16", [*fp16_tests, "-k", "float16 and not bfloat16"])
    else:
        SUMMARY["stages"]["fp16"] = {"status": "not run: fp16 modules not prebuilt"}
    if ready("c75"):  # its own session: the driver JIT-compiles the compute_75 PTX
        add("compute75", ["tests/gpu/test_kernel_repro.py::test_turing_compute75_ptx"])
    else:
        SUMMARY["stages"]["compute75"] = {"status": "not run: compute_75 modules not prebuilt"}
    if "patched:gptq_marlin:bf16:sm_90" in have or allow_compile:
        add("tracing", ["tests/gpu/test_tracing.py"])
    else:
        SUMMARY["stages"]["tracing"] = {"status": "not run: gptq_marlin bf16 not prebuilt"}

    for st in list(stages):
        if ("compute75" if st.name == "compute75" else "numerics") not in wanted:
            SUMMARY["stages"][st.name] = {"status": "not run: FP4SERIES_STAGES"}
            stages.remove(st)
            stage_dirs[:] = [(n, d) for n, d in stage_dirs if n != st.name]
    bench_s = float(os.environ.get("FP4SERIES_BENCH_S", "70")) if "bench" in wanted else 0.0
    group1_deadline = time.time() + max(60.0, left() - bench_s)
    for s in stages:
        s.start()
    pending = list(stages)
    while pending:
        time.sleep(1)
        if time.time() >= group1_deadline:
            for st in pending:
                st.interrupt()  # all at once; then a shared grace period
            grace_end = time.time() + 12
            for st in pending:
                st.stop(grace_s=max(0.1, grace_end - time.time()))
        for st in list(pending):
            assert st.proc is not None
            if st.proc.poll() is None:
                continue
            st.record()
            pending.remove(st)
            merge_numerics(out, stage_dirs)
            write_logs(out, lay)
    harvest_workers(lay, out)
    write_logs(out, lay)
    # group 2: the benchmark alone on the GPU
    b_left = left() - 8
    if "bench" not in wanted:
        SUMMARY["stages"]["bench"] = {"status": "not run: FP4SERIES_STAGES"}
    elif b_left < 30 or not have.get("patched:gptq_marlin:bf16:sm_90"):
        SUMMARY["stages"]["bench"] = {"status": f"not run: {b_left:.0f}s left / module missing"}
    else:
        benv = dict(base, FP4SERIES_REPORT_DIR=str(lay.reports))
        if up_build is not None:  # the benchmark waits for up_rc before 0.5.23's turn
            extra = [str(lay.site0523), *([str(sgl_dir)] if sgl_dir else []), str(lay.site)]
            benv.update(FP4SERIES_UPSTREAM_TREE=str(lay.up0523),
                        FP4SERIES_UPSTREAM_CACHE=lay.cache_dir("up0523"),
                        FP4SERIES_UPSTREAM_BUILD_RC=str(up_rc),
                        FP4SERIES_UPSTREAM_EXTRA_PATH=json.dumps(extra))  # fmt: skip
        shapes = os.environ.get("FP4SERIES_BENCH_SHAPES", "")
        ms = os.environ.get("FP4SERIES_BENCH_MS", "1,2,4,8,16,32,64,128,256,1024")
        cmd = [sys.executable, "bench/bench_fp4_marlin.py", "--out", str(lay.reports),
               *(["--shapes", shapes] if shapes else []), "--ms", ms,
               "--replays", os.environ.get("FP4SERIES_BENCH_REPLAYS", "5"),
               "--budget-s", str(int(b_left - 12))]  # fmt: skip
        if os.environ.get("FP4SERIES_BENCH_MOE", "1") != "1":
            cmd.append("--no-moe")
        b = Stage("bench", cmd, benv, lay.logs / "bench.log", None)
        b.start()
        with contextlib.suppress(subprocess.TimeoutExpired):
            b.proc.wait(timeout=b_left)  # type: ignore[union-attr]
        b.stop()
        b.record()
        if out is not None:
            for n in ("bench.json", "bench.md", "bench.png"):
                if (lay.reports / n).is_file():
                    shutil.copy2(lay.reports / n, out / n)
    if up_build is not None:
        SUMMARY["stages"]["build_up0523"] = {
            "rc": up_rc.read_text().strip() if up_rc.is_file() else "not finished",
            "log_tail": (lay.logs / "build_up0523.log").read_text(errors="replace")[-1500:],
        }
    SUMMARY["seconds_after_unpack"] = round(time.time() - t_begin, 1)
    write_logs(out, lay)
    print_table(lay, out)
    return 0


def print_table(lay: dr.Layout, out: Path | None) -> None:
    print("\n==== prebuilt device run: summary", flush=True)
    for name, st in SUMMARY["stages"].items():
        print(f"  {name:16s} {st.get('status', '?'):24s} rc={st.get('rc', '-')} "
              f"{st.get('seconds', '-')}s  {st.get('summary', '')[:90]}")  # fmt: skip
    f = (out or lay.reports) / "numerics.json"
    if f.is_file():
        rows: dict[tuple[str, str, str], list[float]] = {}
        for c in json.loads(f.read_text()).get("cases", []):
            key = (c.get("path", "?"), c.get("dtype", "?"), c.get("templates", "?"))
            rows.setdefault(key, []).append(c.get("rel_l2") if c.get("rel_l2") is not None
                                            else float("nan"))  # fmt: skip
        print(f"  {'path':16s} {'dtype':10s} {'templates':10s} {'n':>4s} {'max rel_l2':>11s}")
        for (p, d, t), v in sorted(rows.items()):
            print(f"  {p:16s} {str(d):10s} {t:10s} {len(v):4d} {max(v):11.3e}")
    b = (out or lay.reports) / "bench.json"
    if b.is_file():
        for r in json.loads(b.read_text()).get("rows", []):
            print(
                f"  bench {r['shape']:10s} m={r['m']:5d} fp4 {r['fp4_us']} us  bf16 "
                f"{r['bf16_us']} us  int4 {r['int4_us']} us  roof {r['roofline_us']:.1f} us"
            )
    hl = lay.root / "prebuilt_hook.log"
    if hl.is_file():
        compiled = [ln for ln in hl.read_text().splitlines() if "COMPILING" in ln]
        print(f"  JIT modules compiled on the device (no prebuilt): {len(compiled)}")
        for ln in compiled[:8]:
            print("   ", ln[:200])


def main() -> int:
    carry = Path(os.environ.get("FP4SERIES_CARRY", REPO / ".carry")).resolve()
    root = Path(os.environ.get("FP4SERIES_DEVICE_ROOT", "/tmp/fp4proof")).resolve()
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    if not (carry / "meta.json").is_file():
        print(f"error: {carry}/meta.json missing: run scripts/device/pack.sh and carry .carry",
              file=sys.stderr)  # fmt: skip
        return 1
    if not (carry / "prebuilt" / "manifest.json").is_file():
        print(f"error: {carry}/prebuilt/manifest.json missing: prebuild the JIT modules "
              "(scripts/device/prebuild.py) or use `run.sh build` + `run.sh test`",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    lay = dr.Layout(root, carry)
    unpack(lay)
    if not cuda and os.environ.get("FP4SERIES_DRY_RUN") != "1":
        print("error: no CUDA device here (torch.cuda.is_available() is False): "
              "`run.sh prebuilt` runs on the GPU machine; unpacking was checked, nothing ran",
              file=sys.stderr)  # fmt: skip
        check_prebuilt(lay.root / "prebuilt", lay)
        return 3
    budget = float(os.environ.get("FP4SERIES_BUDGET_S", "240"))
    return run(lay, out, budget)


if __name__ == "__main__":
    sys.exit(main())
