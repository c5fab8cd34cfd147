"""The GPU proof's bundle and stage table, on the CPU: make a bundle from fake trees and wheels,
split it into parts, unpack it byte-exact; damaged or missing parts and wheels are clear errors."""

from __future__ import annotations

import json
import os
import random
import sys
import time
import zipfile
from pathlib import Path

import bundle
import gpu_proof
import pytest
import stages

from fp4series import report
from fp4series.errors import SeriesError

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path, kernel: str) -> Path:
    kdir = root / "sglang" / "jit_kernel"
    (kdir / "csrc").mkdir(parents=True)
    (kdir / "csrc" / "marlin.cuh").write_text(kernel)
    (kdir / "gptq_marlin.py").write_text("# the series' python\n")
    (root / "sglang" / "srt").mkdir()
    (root / "sglang" / "srt" / "big.bin").write_bytes(random.Random(0).randbytes(60_000))
    return root


def _wheel(folder: Path, dist: str, version: str, module: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", f"VERSION = {version!r}\n")
        z.writestr(f"{dist}-{version}.data/purelib/{module}_extra.py", "X = 1\n")
    return path


@pytest.fixture()
def sources(tmp_path: Path) -> dict[str, Path]:
    cache = tmp_path / "cache"
    _wheel(cache / "wheels", "apache_tvm_ffi", "0.1.15.post2", "tvm_ffi")
    _wheel(cache / "wheels", "pydantic_core", "2.50.5", "pydantic_core")
    ops = cache / "sgl_kernel-0.4.2-sm90" / "sgl_kernel"
    (ops / "sm90").mkdir(parents=True)
    (ops / "__init__.py").write_text("")
    (ops / "sm90" / "common_ops.abi3.so").write_bytes(b"\x7fELF fake")
    wheels = tmp_path / "wheels.txt"
    wheels.write_text("# comment\napache-tvm-ffi==0.1.15.post2\npydantic-core==2.50.5\n")
    return {
        "patched": _tree(tmp_path / "patched", "patched body"),
        "pin": _tree(tmp_path / "pin", "pin body"),
        "cache": cache,
        "wheels": wheels,
        "out": tmp_path / "out",
    }


@pytest.fixture(autouse=True)
def conformance_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The verified upstream wheel the conformance stage's tests come from (a stand-in)."""
    wheel = tmp_path / "sglang-0.5.13-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"PK stand-in")
    monkeypatch.setattr(bundle, "_conformance_wheel", lambda line, cache, offline: wheel)
    return wheel


def _make(s: dict[str, Path], *extra: str) -> int:
    return bundle.main([str(s["out"]), "--offline", "--cache", str(s["cache"]), "--wheels",
                        str(s["wheels"]), "--patched-tree", str(s["patched"]), "--pin-tree",
                        str(s["pin"]), *extra])  # fmt: skip


def test_parts_reassemble_byte_exact_and_unpack(sources: dict[str, Path], tmp_path: Path) -> None:
    assert _make(sources, "--part-size", "20K", "--name", "gpu") == 0
    manifest = json.loads((sources["out"] / "gpu.json").read_text())
    parts = sorted(sources["out"].glob("gpu.tar.xz.*"))
    assert len(parts) == len(manifest["parts"]) > 1
    assert all(p.stat().st_size <= 20 * 1024 for p in parts)
    assert manifest["series_revision"] == report.series_revision(REPO)
    root, got = bundle.unpack(sources["out"], tmp_path / "work")
    assert got == manifest
    for name in (
        "trees/patched/sglang/srt/big.bin",
        "trees/patched/sglang/jit_kernel/gptq_marlin.py",
    ):
        assert (root / name).read_bytes() == (
            sources["patched"] / name.split("/", 2)[2]
        ).read_bytes()
    assert (root / "trees/pin/sglang/jit_kernel/csrc/marlin.cuh").read_text() == "pin body"
    assert not (root / "trees/pin/sglang/jit_kernel/gptq_marlin.py").exists()  # sources only
    assert (root / "site/tvm_ffi/__init__.py").is_file()
    assert (root / "site/pydantic_core_extra.py").is_file()  # .data/purelib lifted like pip
    assert (root / "sgl/sgl_kernel/sm90/common_ops.abi3.so").read_bytes() == b"\x7fELF fake"
    assert bundle.unpack(sources["out"] / "gpu.json", tmp_path / "work")[0] == root  # once


def test_a_damaged_or_missing_part_is_refused(sources: dict[str, Path], tmp_path: Path) -> None:
    assert _make(sources, "--part-size", "20K") == 0
    parts = sorted(sources["out"].glob("bundle.tar.xz.*"))
    data = bytearray(parts[1].read_bytes())
    data[100] ^= 1
    parts[1].write_bytes(bytes(data))
    with pytest.raises(SeriesError, match="sha256 differs"):
        bundle.unpack(sources["out"], tmp_path / "work")
    parts[1].unlink()
    with pytest.raises(SeriesError, match="is missing"):
        bundle.unpack(sources["out"], tmp_path / "work")
    assert not list((tmp_path / "work").glob("bundle-*"))


def test_a_missing_wheel_is_a_clear_error(
    sources: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    sources["wheels"].write_text("apache-tvm-ffi==0.1.15.post2\nnot-cached==1.0\n")
    assert _make(sources) == 1
    err = capsys.readouterr().err
    assert "no wheel for not-cached==1.0" in err and "what to do" in err
    assert "Traceback" not in err


def test_an_unpinned_wheel_and_a_missing_tree_are_clear_errors(
    sources: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sources["wheels"].write_text("apache-tvm-ffi>=0.1\n")
    assert _make(sources) == 1
    assert "not pinned" in capsys.readouterr().err
    sources["patched"] = tmp_path / "nowhere"
    assert _make(sources) == 1
    assert "prepare-checkout" in capsys.readouterr().err


def test_includes_land_under_extra(sources: dict[str, Path], tmp_path: Path) -> None:
    tests = tmp_path / "upstream-tests"
    (tests / "kernels").mkdir(parents=True)
    (tests / "kernels" / "test_x.py").write_text("def test_x(): pass\n")
    assert _make(sources, "--include", f"{tests}:upstream_tests") == 0
    root, _ = bundle.unpack(sources["out"], tmp_path / "work")
    assert (root / "extra/upstream_tests/kernels/test_x.py").is_file()


def test_the_conformance_stage_brings_its_upstream_wheel(
    sources: dict[str, Path], tmp_path: Path, conformance_wheel: Path
) -> None:
    """Its tests come from that wheel on a host without network: bundled where the stage is."""
    name = f"extra/wheels/{conformance_wheel.name}"
    assert _make(sources, "--stages", "numerics,conformance") == 0
    root, manifest = bundle.unpack(sources["out"], tmp_path / "work")
    assert (root / name).read_bytes() == conformance_wheel.read_bytes() and name in manifest[
        "files"
    ]
    assert _make(sources, "--stages", "numerics,bench") == 0
    assert not any(f.startswith("extra/wheels/") for f in
                   json.loads((sources["out"] / "bundle.json").read_text())["files"])  # fmt: skip
    other = tmp_path / "sglang-0.5.23-cp310-abi3-manylinux2014_x86_64.whl"  # not the tests' one
    other.write_bytes(b"PK other")
    assert _make(sources, "--include", f"{other}:wheels/{other.name}") == 0
    files = json.loads((sources["out"] / "bundle.json").read_text())["files"]
    assert name in files and f"extra/wheels/{other.name}" in files


def test_unpatched_tree_has_pin_sources_and_leaves_the_patched_tree(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    dest = bundle.unpatched_tree(sources["patched"], sources["pin"], tmp_path / "work")
    kernel = "sglang/jit_kernel/csrc/marlin.cuh"
    assert (dest / kernel).read_text() == "pin body"
    assert (sources["patched"] / kernel).read_text() == "patched body"
    assert (dest / "sglang/jit_kernel/gptq_marlin.py").read_text() == "# the series' python\n"


def test_stage_table() -> None:
    assert [s.name for s in stages.select("bench,numerics")] == ["numerics", "bench"]
    with pytest.raises(ValueError, match="unknown stage"):
        stages.select("numerics,nope")
    reported = {f for s in stages.STAGES.values() for f in s.reports}
    assert set(report.REPORT_FILES) <= reported
    for stage in stages.STAGES.values():
        assert stage.modules and stage.reports
        for variant, _spec in stage.modules:
            assert variant in ("patched", "unpatched", "compute75", "upstream")
        for arg in stage.command:  # every test file or script a stage names exists
            path = arg.split("::")[0]
            if path.endswith(".py"):
                assert (REPO / path).is_file(), path


def test_e2e_stage_gets_the_pin_and_the_deadline(sources: dict[str, Path], tmp_path: Path) -> None:
    stage = stages.STAGES["e2e"]
    assert "e2e" not in stages.DEFAULT_STAGES  # it needs SGLang's whole runtime and checkpoints
    assert stage.command[:2] == ("serve/e2e.py", "run") and "{report_dir}" in stage.command
    assert {v for v, _ in stage.modules} == {"patched"}
    assert {s.split(":")[1] for _, s in stage.modules if ":" in s} == {"bf16", "fp16"}
    host = gpu_proof.Host(tmp_path / "work", sources["patched"], sources["pin"], None)
    assert gpu_proof.stage_extras(host, float("inf")) == {"FP4SERIES_PIN_TREE": str(sources["pin"])}
    assert gpu_proof.stage_extras(host, 1234.5)["FP4SERIES_DEADLINE_EPOCH"] == "1234.5"


def test_recorded_command_leaves_out_host_directories() -> None:
    argv = ["--bundle", "/x/y/bundle.json", "--stages", "numerics", "--out", "/host/out/a",
            "--logs=/host/out/l", "--work", "/tmp/w"]  # fmt: skip
    assert gpu_proof.recorded_command(argv) == (
        "scripts/gpu-proof.sh --bundle bundle.json --stages numerics"
    )


def test_builds_run_in_parallel_and_report_each_exit_status(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = "import sys, os\n"
    fake += "print(os.environ['TVM_FFI_CACHE_DIR']); sys.exit(3 * ('bad' in sys.argv[1]))"
    monkeypatch.setattr(gpu_proof, "WARM", [sys.executable, "-c", fake])
    host = gpu_proof.Host(tmp_path / "work", sources["patched"], sources["pin"], None)
    logs = tmp_path / "logs"
    logs.mkdir()
    got = gpu_proof.build(
        host, [("patched", "good:bf16"), ("compute75", "bad")], logs, float("inf")
    )
    assert got == {("patched", "good:bf16"): 0, ("compute75", "bad"): 3}
    assert (logs / "build-compute75-bad.log").read_text().strip().endswith("cache/compute75")


def test_a_stage_stopped_at_the_deadline_still_delivers_its_report(tmp_path: Path) -> None:
    script = tmp_path / "stage.py"
    script.write_text(
        "import sys, time, pathlib\n"
        "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
        "    pathlib.Path(sys.argv[1], 'r.json').write_text('{}')\n    sys.exit(2)\n"
    )
    stage = stages.Stage("s", (str(script), "{report_dir}"), ("r.json", "absent.json"), ())
    env = dict(os.environ, FP4SERIES_REPORT_DIR=str(tmp_path / "reports"))
    logs = tmp_path / "logs"
    logs.mkdir()
    rc = gpu_proof.run_stage(stage, env, tmp_path / "out", logs, time.time() + 1)
    assert rc == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.json"]


def test_a_stage_runs_under_its_runner_with_the_report_dir_filled_in(tmp_path: Path) -> None:
    """kernels-profile's shape: a program (ncu) the stage's python runs under, writing into the
    stage's report directory; its options may name that directory too."""
    script = tmp_path / "stage.py"
    script.write_text(
        "import os, sys, pathlib\npathlib.Path(sys.argv[1]).write_text(os.environ['UNDER'])\n"
    )
    stage = stages.Stage(
        "s", (str(script), "{report_dir}/r.txt"), ("r.txt",), (),
        runner=("env", "UNDER=the runner, {report_dir}"),
    )  # fmt: skip
    env = dict(os.environ, FP4SERIES_REPORT_DIR=str(tmp_path / "reports"))
    logs = tmp_path / "logs"
    logs.mkdir()
    assert gpu_proof.run_stage(stage, env, tmp_path / "out", logs, time.time() + 30) == 0
    report_dir = tmp_path / "reports" / "s"
    assert (tmp_path / "out" / "r.txt").read_text() == f"the runner, {report_dir}"
    profile = stages.STAGES["kernels-profile"]
    assert profile.runner[0] == "ncu" and "{report_dir}/ncu.txt" in profile.runner
    assert profile.reports == ("ncu.txt",) and profile.name not in stages.DEFAULT_STAGES
