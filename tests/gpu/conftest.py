"""GPU proof harness: skip cleanly without CUDA, collect every case into the JSON reports.

Environment:
    FP4SERIES_REPORT_DIR      where numerics.json / turing_ptx.json go (default reports/h200)
    FP4SERIES_REPORT_COMMAND  the command recorded in the reports (default: this pytest argv)
    FP4SERIES_REQUIRE_GPU=1   no CUDA / no SGLang is an error, not a skip (scripts/gpu-proof.sh)
    FP4SERIES_FORCE_ARCH      compute_75: build every JIT module as compute_75 PTX (_jitenv.py)
    FP4SERIES_TEMPLATES       what runs: patched | unpatched (pin) | upstream (a line's release)
    FP4SERIES_UNPATCHED_TREE  python tree whose jit_kernel sources are the pin's (repro test)
    FP4SERIES_LINE            the series line under test (unset: the pin's); the reports name it
    FP4SERIES_BARE_TREE       python tree of the release a line is made on (its repro test)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _p in (str(HERE), str(REPO / "src")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _jitenv  # noqa: E402

REQUIRE_ENV = "FP4SERIES_REQUIRE_GPU"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def gpu_skip_reason() -> str | None:
    """Why the GPU tests cannot run here (None: they can)."""
    if not _cuda_available():
        return "no CUDA device (the GPU proof runs on a GPU machine: scripts/gpu-proof.sh)"
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not importable: put the patched python tree on PYTHONPATH"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_skip_reason()
    if reason is None:
        _start_variant_workers(items)
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        raise pytest.UsageError(f"{REQUIRE_ENV}=1 but {reason}")
    marker = pytest.mark.skip(reason=reason)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(marker)


def _start_variant_workers(items: list[pytest.Item]) -> None:
    """Start the repro / compute_75 workers now and run their tests last: they overlap."""
    names = {item.name for item in items}
    if "test_unpatched_templates_fail" in names:
        env, _ = _jitenv.unpatched_env()
        if env is not None:
            _jitenv.start_worker("repro", env)
    if "test_bare_release_repro" in names:
        env, _ = _jitenv.upstream_env()
        if env is not None:
            _jitenv.start_worker("upstream", env)
    if "test_turing_compute75_ptx" in names and _jitenv.turing_enabled()[0]:
        _jitenv.start_worker("turing", _jitenv.c75_env())
    items.sort(key=lambda item: item.fspath.basename == "test_kernel_repro.py")


class GpuReport:
    """Cases and checks of one pytest session, written as JSON when the session ends."""

    def __init__(self) -> None:
        self.cases: list[dict[str, Any]] = []
        self.tracing: list[dict[str, Any]] = []
        self.turing: dict[str, Any] | None = None
        self.turing_cases: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}

    def add_cases(self, cases: list[dict[str, Any]]) -> None:
        self.cases.extend(cases)

    def add_tracing(self, name: str, passed: bool, **detail: Any) -> None:
        self.tracing.append({"name": name, "passed": passed, **detail})

    def set_turing(self, status: str, reason: str = "", cases: list[dict] | None = None) -> None:
        self.turing = {"status": status, **({"reason": reason} if reason else {})}
        self.turing_cases = list(cases or [])

    def write(self) -> list[Path]:
        if not (self.cases or self.tracing or self.turing or self.extra):
            return []
        from fp4series import report

        out_dir = Path(os.environ.get("FP4SERIES_REPORT_DIR", str(REPO / "reports" / "h200")))
        command = os.environ.get("FP4SERIES_REPORT_COMMAND") or "pytest " + " ".join(sys.argv[1:])
        meta = report.run_metadata(command)
        meta["environment"] = report.repo_relative(_environment(), REPO)
        written = []
        forced = _jitenv.forced_arch()
        if forced:  # a whole session under compute_75: its cases are the Turing report
            data = {**meta, "arch": forced, "cases": self.cases}
            report.write_json(out_dir / "turing_ptx.json", data)
            return [out_dir / "turing_ptx.json"]
        data = {**meta, "cases": self.cases, "tracing": self.tracing}
        data.update(report.repo_relative(self.extra, REPO))
        if self.turing is not None:
            data["turing_ptx"] = self.turing
        report.write_json(out_dir / "numerics.json", data)
        written.append(out_dir / "numerics.json")
        if self.turing_cases:
            turing = {**meta, "arch": "compute_75", "cases": self.turing_cases}
            report.write_json(out_dir / "turing_ptx.json", turing)
            written.append(out_dir / "turing_ptx.json")
        return written


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {}
    try:
        env.update(_jitenv.describe())
    except Exception as exc:  # sglang missing: still write what we have
        env["variant_error"] = repr(exc)
    try:
        import sgl_kernel

        env["sgl_kernel"] = getattr(sgl_kernel, "__file__", "?")
    except Exception as exc:
        env["sgl_kernel"] = f"not importable: {type(exc).__name__}"
    for name in ("tvm_ffi", "transformers", "triton"):
        try:
            module = __import__(name)
            env[name] = getattr(module, "__version__", "?")
        except Exception:
            env[name] = "absent"
    return env


_REPORT = GpuReport()


@pytest.fixture(scope="session")
def gpu_report() -> Iterator[GpuReport]:
    """The session's report; every GPU test records its cases here."""
    if gpu_skip_reason() is None:
        import torch

        _jitenv.apply_variant()
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 references stay fp32
        torch.backends.cudnn.allow_tf32 = False
    yield _REPORT


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for path in _REPORT.write():
        print(f"\n[gpu-proof] wrote {path}")
