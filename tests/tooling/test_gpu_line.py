"""A series line's GPU proof on the CPU: its stage table, its bundle (the line's tree, the bare
release rebuilt from a delta and checked), the trees reduced to the FP4 kernels, the runner's
line defaults, and the harness's SGLang interface choosing by the tree's layout."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "device"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import _sglang_api as api  # noqa: E402
import bundle  # noqa: E402
import gpu_proof  # noqa: E402
import stages  # noqa: E402

from fp4series import report  # noqa: E402
from fp4series.errors import SeriesError  # noqa: E402

LINE = "0.5.23"
# A Marlin dispatch the way upstream 0.5.17+ writes it (named get_marlin_kernel): one INT4 and
# one FP4 kernel.
DISPATCH = r"""#include "kernel.h"
#define _GET_IF(W_TYPE, M, N, K, M8, G, T, Z) \
  else if (q_type == W_TYPE) { kernel = Marlin<scalar_t, W_TYPE.id(), T, M, N, K, M8, G, Z>; }
template <typename scalar_t>
MarlinFuncPtr get_marlin_kernel(const host::ScalarType q_type) {
  auto kernel = MarlinDefault;
  if (false) {
  }
  _GET_IF(host::kU4B8, 1, 8, 8, true, -1, 256, false)
  _GET_IF(host::kFE2M1f, 1, 8, 8, true, 1, 256, false)
  return kernel;
}
"""
WRAPPER = 'load_jit("{name}", *args, cuda_files=["{cuda}"])'


def _kernels_tree(root: Path, marker: str) -> Path:
    """An sglang tree of the kernels/ layout with a gptq_marlin and a moe_wna16_marlin module."""
    sg = root / "sglang"
    jit = sg / "kernels" / "jit"
    for rel, name in (("gemm/marlin/gptq_marlin.cuh", "gptq_marlin"),
                      ("gemm/marlin_moe/moe_wna16_marlin.cuh", "moe_wna16_marlin")):  # fmt: skip
        (jit / "csrc" / rel).parent.mkdir(parents=True, exist_ok=True)
        (jit / "csrc" / rel).write_text(DISPATCH + f"// {marker}\n")
        (jit / "csrc" / rel).with_name("kernel.h").write_text("// kernel\n")
        ops = sg / "kernels" / "ops" / name
        ops.mkdir(parents=True, exist_ok=True)
        (ops / "__init__.py").write_text(
            "from sglang.kernels.jit.utils import load_jit\n\n\n"
            f"def _jit_{name}_module(dtype):\n    return {WRAPPER.format(name=name, cuda=rel)}\n"
        )  # fmt: skip
    (jit / "include").mkdir()
    (jit / "utils").mkdir()
    (jit / "utils" / "__init__.py").write_text("def load_jit(*args, **kwargs):\n    pass\n")
    (sg / "srt").mkdir()
    (sg / "srt" / "common.py").write_text(f"MARK = {marker!r}\n")
    return root


@pytest.fixture()
def line_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    patched = _kernels_tree(tmp_path / "line", "line")
    bare = _kernels_tree(tmp_path / "bare", "bare")
    (patched / "sglang" / "srt" / "added_by_the_line.py").write_text("X = 1\n")
    (bare / "sglang" / "srt" / "dropped_by_the_line.py").write_text("Y = 2\n")
    (bare / "sglang" / "srt" / "same.py").write_text("same\n")
    (patched / "sglang" / "srt" / "same.py").write_text("same\n")
    cache = tmp_path / "cache"
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "apache_tvm_ffi-0.1.11-py3-none-any.whl", "w") as z:
        z.writestr("tvm_ffi/__init__.py", "VERSION = '0.1.11'\n")
    ops = cache / "sgl_kernel-0.4.2-sm90" / "sgl_kernel"
    (ops / "sm90").mkdir(parents=True)
    (ops / "__init__.py").write_text("")
    (ops / "sm90" / "common_ops.abi3.so").write_bytes(b"\x7fELF fake")
    req = tmp_path / "gpu-host.txt"
    req.write_text("apache-tvm-ffi==0.1.11\n")
    conf = tmp_path / "sglang-0.5.13-cp311-cp311-manylinux_2_34_x86_64.whl"
    conf.write_bytes(b"the verified wheel")
    monkeypatch.setattr(bundle, "_conformance_wheel", lambda line, cache, offline: conf)
    return {"patched": patched, "bare": bare, "cache": cache, "wheels": req,
            "out": tmp_path / "out", "conf": conf}  # fmt: skip


def _make_line(s: dict[str, Path], *extra: str) -> int:
    return bundle.main([str(s["out"]), "--line", LINE, "--offline", "--cache", str(s["cache"]),
                        "--wheels", str(s["wheels"]), "--patched-tree", str(s["patched"]),
                        "--upstream-tree", str(s["bare"]), *extra])  # fmt: skip


def test_line_bundle_carries_the_line_and_rebuilds_the_bare_release(
    line_sources: dict[str, Path], tmp_path: Path
) -> None:
    assert _make_line(line_sources, "--part-size", "3K") == 0
    manifest = json.loads((line_sources["out"] / "bundle.json").read_text())
    assert manifest["line"] == LINE and manifest["pin"]["version"] == LINE
    assert manifest["sgl_kernel"] == bundle.LINE_SGL_KERNEL[LINE]
    assert manifest["series_revision"] == report.series_revision(REPO, LINE)
    assert manifest["upstream_delta"]["removed"] == ["sglang/srt/added_by_the_line.py"]
    delta = sorted(f for f in manifest["files"] if f.startswith("trees/upstream-delta/"))
    assert "trees/upstream-delta/sglang/srt/dropped_by_the_line.py" in delta
    assert "trees/upstream-delta/sglang/srt/same.py" not in delta  # identical: not carried
    assert not any(f.startswith("trees/pin/") for f in manifest["files"])
    assert f"extra/wheels/{line_sources['conf'].name}" in manifest["files"]
    root, _ = bundle.unpack(line_sources["out"], tmp_path / "work")
    bare = bundle.bare_tree(root, manifest, tmp_path / "work")
    assert bundle.tree_digest(bare) == bundle.tree_digest(line_sources["bare"])
    assert (bare / "sglang/srt/common.py").read_text() == "MARK = 'bare'\n"
    patched = root / "trees" / "patched"
    assert (patched / "sglang/srt/common.py").read_text() == "MARK = 'line'\n"  # left alone
    assert (patched / "sglang/srt/added_by_the_line.py").is_file()
    assert bundle.bare_tree(root, manifest, tmp_path / "work") == bare  # made once


def test_a_bare_tree_that_does_not_rebuild_exactly_is_refused(
    line_sources: dict[str, Path], tmp_path: Path
) -> None:
    assert _make_line(line_sources) == 0
    root, manifest = bundle.unpack(line_sources["out"], tmp_path / "work")
    manifest["upstream_delta"]["removed"] = []  # the line's added file would stay in
    with pytest.raises(SeriesError, match="differs from the one the bundle was made from"):
        bundle.bare_tree(root, manifest, tmp_path / "work")


def test_line_bundle_refuses_the_pin_options(
    line_sources: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _make_line(line_sources, "--prebuild", "sm_90") == 1
    assert "are for the pin's bundle" in capsys.readouterr().err
    line_sources["patched"] = line_sources["out"] / "nowhere"
    assert _make_line(line_sources) == 1
    assert f"prepare-checkout --line {LINE}" in capsys.readouterr().err


def test_reduced_tree_keeps_the_fp4_kernels_and_leaves_the_tree(
    line_sources: dict[str, Path], tmp_path: Path
) -> None:
    bare = line_sources["bare"]
    dest = bundle.reduced_tree(bare, "fp4", tmp_path / "work")
    rel = "sglang/kernels/jit/csrc/gemm/marlin/gptq_marlin.cuh"
    reduced = (dest / rel).read_text()
    assert "_GET_IF(host::kFE2M1f" in reduced and "not built: _GET_IF(host::kU4B8" in reduced
    assert (bare / rel).read_text() == DISPATCH + "// bare\n"  # never written through a link
    assert "1 of 2 dispatch kernels" in (dest / "kernel-set.txt").read_text()
    assert bundle.reduced_tree(bare, "fp4", tmp_path / "work") == dest
    (bare / rel).write_text("// no dispatch\n")
    (bare / rel).parents[1].joinpath("marlin_moe", "moe_wna16_marlin.cuh").write_text("//\n")
    with pytest.raises(SeriesError, match="no Marlin dispatch to reduce"):
        bundle.reduced_tree(bare, "fp4", tmp_path / "work2")


def test_line_stage_table() -> None:
    table = stages.table(LINE)
    assert tuple(table) == stages.LINE_DEFAULT_STAGES == ("numerics", "conformance", "compute75")
    assert [s.name for s in stages.select("compute75,numerics", LINE)] == ["numerics", "compute75"]
    with pytest.raises(ValueError, match="no GPU stages for the 9.9 line"):
        stages.select("numerics", "9.9")
    with pytest.raises(ValueError, match="unknown stage"):
        stages.select("bench", LINE)
    numerics = table["numerics"]
    assert "tests/gpu/test_kernel_repro.py::test_bare_release_repro" in numerics.command
    assert "test_unpatched_templates_fail" not in " ".join(numerics.command)
    assert {v for v, _ in numerics.modules} == {"patched", "upstream"}
    assert {v for v, _ in table["compute75"].modules} == {"compute75"}
    for stage in table.values():
        for _variant, spec in stage.modules:
            api.parse_spec(spec)  # well-formed
        for arg in stage.command:
            path = arg.split("::")[0]
            if path.endswith(".py"):
                assert (REPO / path).is_file(), path
    # both routing flag variants of the MoE module, per dtype, as fused_marlin_moe asks
    moe = [s for _, s in numerics.modules if s.startswith("moe_wna16_marlin:bf16")]
    assert len(set(moe)) == 2


def test_runner_defaults_for_a_line(
    line_sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = {}
    monkeypatch.setattr(gpu_proof, "run_reporting_errors", lambda fn, args: seen.update(
        vars(args)) or 0)  # fmt: skip
    assert gpu_proof.main(["--line", LINE]) == 0
    assert seen["out"] == REPO / "reports" / "h200" / LINE
    assert seen["kernel_set"] == "fp4" and seen["stages"] == "numerics,conformance,compute75"
    assert _make_line(line_sources) == 0
    assert gpu_proof.main(["--bundle", str(line_sources["out"])]) == 0  # the bundle says
    assert seen["line"] == LINE
    assert gpu_proof.main([]) == 0
    assert seen["out"] == REPO / "reports" / "h200" and seen["kernel_set"] == "full"
    assert "compute75" in seen["stages"] and "bench" in seen["stages"]


def test_a_bundle_of_another_line_is_refused(line_sources: dict[str, Path], tmp_path: Path) -> None:
    assert _make_line(line_sources) == 0
    args = gpu_proof.argparse.Namespace(
        bundle=line_sources["out"], work=tmp_path / "w", line=None, kernel_set="fp4"
    )
    with pytest.raises(SeriesError, match="the bundle is the 0.5.23 line's, not the pin's"):
        gpu_proof.bundled_host(args)


def test_line_host_environments(line_sources: dict[str, Path], tmp_path: Path) -> None:
    host = gpu_proof.Host(tmp_path / "work", line_sources["patched"], None,
                          line_sources["bare"], LINE, "fp4")  # fmt: skip
    assert host.unpatched is None and host.patched.name.startswith("fp4-line-")
    upstream = host.variant_env("upstream")
    assert upstream["PYTHONPATH"].split(":")[1] == str(host.upstream)
    assert upstream["FP4SERIES_TEMPLATES"] == "upstream" and upstream["FP4SERIES_LINE"] == LINE
    assert upstream["SGLANG_JIT_CACHE_DIR"].endswith("cache/upstream")
    assert host.variant_env("compute75")["FP4SERIES_FORCE_ARCH"] == "compute_75"
    assert host.variant_env("patched")["FP4SERIES_KERNEL_SET"] == "fp4"
    args = gpu_proof.argparse.Namespace(work=tmp_path / "work", argv=["--line", LINE])
    env = gpu_proof.stage_env(host, args, float("inf"))
    assert env["FP4SERIES_BARE_TREE"] == str(host.upstream)
    assert "FP4SERIES_UNPATCHED_TREE" not in env and "FP4SERIES_PIN_TREE" not in env
    assert env["FP4SERIES_REPORT_COMMAND"] == f"scripts/gpu-proof.sh --line {LINE}"


def test_the_harness_picks_the_interface_from_the_tree(
    line_sources: dict[str, Path], tmp_path: Path
) -> None:
    assert api.layout(line_sources["patched"] / "sglang") == api.KERNELS_LAYOUT
    assert api.cache_env(api.KERNELS_LAYOUT) == "SGLANG_JIT_CACHE_DIR"
    pin = tmp_path / "pin" / "sglang" / "jit_kernel" / "csrc"
    pin.mkdir(parents=True)
    assert api.layout(pin.parents[1]) == api.PIN_LAYOUT
    assert api.cache_env(api.PIN_LAYOUT) == "TVM_FFI_CACHE_DIR"
    with pytest.raises(ImportError, match="neither sglang/jit_kernel/ nor sglang/kernels/jit/"):
        api.layout(tmp_path)
    assert api.parse_spec("moe_wna16_marlin:bf16:a+b") == ("moe_wna16_marlin", "bf16", ("a", "b"))
    assert api.parse_spec("repack") == ("repack", "-", ())
    with pytest.raises(ValueError, match="expected NAME"):
        api.parse_spec("gptq_marlin:fp8")


def test_the_harness_loaders_resolve_in_the_real_trees() -> None:
    """Every module spec of a stage table names a loader of the tree it runs on."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    trees = {None: REPO / ".work" / "checkout", LINE: REPO / ".work" / "lines" / LINE / "checkout"}
    for version, checkout in trees.items():
        tree = checkout / "python"
        if not tree.is_dir():
            continue
        layout = api.layout(tree / "sglang")
        for stage in stages.table(version).values():
            for _variant, spec in stage.modules:
                name, _, _ = api.parse_spec(spec)
                name = api.ALIASES.get(name.removeprefix("up_"), {}).get(layout, name)
                if "." in name:  # a loader function: its module is in the tree
                    module = name.rpartition(".")[0]
                    assert (tree / Path(*module.split("."))).with_suffix(".py").is_file(), spec
                elif not spec.startswith("up_"):
                    from fp4series.compile_check import discover_layout

                    discover_layout(tree / "sglang").module(name)


def test_the_test_command_checks_a_lines_reports_once_they_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """scripts/test.sh --line V: "pending" while reports/h200/V is absent or empty, then the
    line's check-reports in full (a failing report fails the run)."""
    from test_report import _write_line

    from fp4series import prefix
    from fp4series.line import resolve_line

    root = tmp_path / "project"
    (root / f"tests/sglang-{LINE}").mkdir(parents=True)
    (root / f"tests/sglang-{LINE}/test_ok.py").write_text("def test_ok():\n    pass\n")
    (root / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    monkeypatch.setenv("FP4SERIES_SKIP_PREFIXES", "1")
    monkeypatch.delenv("FP4SERIES_SKIP_REPORTS", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))  # check-reports runs in a subprocess
    line = resolve_line(LINE, root=root)

    def run() -> tuple[int, str]:
        rc = prefix.run_all(root, Path(sys.executable), line.checkout, [], line)
        return rc, capfd.readouterr().out

    rc, out = run()
    assert rc == 0 and f"no GPU reports for the {LINE} line (reports/h200/{LINE}): pending" in out
    reports = root / "reports" / "h200" / LINE
    reports.mkdir(parents=True)
    rc, out = run()
    assert rc == 0 and f"no GPU reports of the {LINE} line in reports/h200/{LINE} yet" in out
    _write_line(reports)
    rc, out = run()
    assert rc == 0 and "pending" not in out, out
    assert f"the {LINE} line's GPU reports in reports/h200/{LINE}: OK" in out
    numerics = json.loads((reports / "numerics.json").read_text())
    numerics["cases"][0]["rel_l2"] = 0.5
    (reports / "numerics.json").write_text(json.dumps(numerics))
    rc, out = run()
    assert rc != 0 and "check-reports: FAILED" in out


@pytest.mark.parametrize(
    ("wheel", "python", "fits"),
    [
        ("x-1-py3-none-any.whl", "3.11", True),
        ("x-1-cp312-cp312-manylinux_2_17_x86_64.whl", "3.12", True),
        ("x-1-cp312-cp312-manylinux_2_17_x86_64.whl", "3.11", False),
        ("apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_28_x86_64.whl", "3.11", False),
        ("apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_28_x86_64.whl", "3.13", True),
        ("sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl", "3.12", True),
        ("x-1-cp311-cp311-manylinux_2_17_x86_64.whl", None, True),
    ],
)
def test_a_cached_wheel_counts_only_for_the_python_it_runs_on(
    wheel: str, python: str | None, fits: bool
) -> None:
    assert bundle.wheel_fits(wheel, python) is fits


def test_a_bundle_for_another_python_is_refused(
    line_sources: dict[str, Path], tmp_path: Path
) -> None:
    other = "3.9" if sys.version_info[:2] != (3, 9) else "3.10"
    assert _make_line(line_sources, "--python-version", other) == 0
    args = gpu_proof.argparse.Namespace(
        bundle=line_sources["out"], work=tmp_path / "w", line=LINE, kernel_set="fp4"
    )
    with pytest.raises(SeriesError, match=f"wheels are for Python {other}") as err:
        gpu_proof.bundled_host(args)
    assert "--python-version" in err.value.hint
