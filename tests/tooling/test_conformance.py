"""fp4series.conformance: upstream's NVFP4 Marlin tests taken from a verified wheel, edited
only mechanically (skip marks, CI registration), each edit listed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fp4series import conformance, paths
from fp4series.digest import sha256_file
from fp4series.errors import SeriesError

UPSTREAM_TEST = """import pytest
from sglang.srt.utils.common import is_sm80_supported, is_sm90_supported
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_marlin_utils import helper

register_cuda_ci(est_time=13, suite="base")


def test_plain():
    assert helper() == 42


@pytest.mark.skip(reason="Skip, test pass locally but compiling takes too long in CI")
@pytest.mark.skipif(
    not (is_sm80_supported() or is_sm90_supported()),
    reason="NVFP4 Marlin fallback tests require CUDA SM8X/SM9X",
)
@pytest.mark.parametrize("x", [1, 2])
def test_nvfp4_thing(x):
    assert helper() + x > 42
"""
HELPER = "def helper():\n    return 42\n"


def _wheel(tmp_path: Path, test_text: str = UPSTREAM_TEST) -> Path:
    wheel = tmp_path / "sglang-0.5.13-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for upstream in conformance.TEST_FILES:
            zf.writestr(upstream, test_text)
        for path in conformance.HELPER_MODULES.values():
            zf.writestr(path, HELPER)
    return wheel


def test_edits_remove_only_skip_marks_and_ci_registration() -> None:
    name = "sglang/jit_kernel/tests/test_gptq_marlin.py"
    edited, edits = conformance.mechanical_edits(name, UPSTREAM_TEST)
    assert [(e.line, e.kind) for e in edits] == [
        (2, "skipif"),
        (3, "ci-registration"),
        (6, "ci-registration"),
        (13, "skip"),
        (14, "skipif"),
    ]
    assert edits[4].removed.startswith("@pytest.mark.skipif(\n    not (is_sm80")
    assert all(e.file == name for e in edits)
    # everything else is upstream's text, line for line
    kept = UPSTREAM_TEST
    for e in edits:
        kept = kept.replace(e.removed + "\n", "", 1)
    assert edited == kept
    assert "@pytest.mark.parametrize" in edited and "def test_nvfp4_thing(x):" in edited


def test_edits_refuse_an_unexpected_upstream_text() -> None:
    with pytest.raises(SeriesError, match=r"expected upstream's \['skip'\] lines"):
        conformance.mechanical_edits("f.py", UPSTREAM_TEST.replace("@pytest.mark.skip(", "#("))
    changed = UPSTREAM_TEST + "\nassert is_sm90_supported()\n"
    with pytest.raises(SeriesError, match="is_sm90_supported is still used"):
        conformance.mechanical_edits("f.py", changed)


def test_extract_runs_with_the_wheels_helper(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    dest = tmp_path / "out"
    got = conformance.extract(wheel, sha256_file(wheel), dest, "0.5.13")
    assert len(got.edits) == 5 * len(conformance.TEST_FILES)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.py")) == sorted(
        [*conformance.TEST_FILES.values(), "conftest.py", *got.helpers.values()]
    )
    # a run in the extracted directory: the helper module comes from the wheel, not sglang;
    # a stub sglang package stands in for the patched tree on PYTHONPATH
    tree = tmp_path / "tree"
    (tree / "sglang" / "test").mkdir(parents=True)
    (tree / "sglang" / "__init__.py").write_text("")
    (tree / "sglang" / "test" / "__init__.py").write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "nvfp4", "tests"],
        cwd=dest,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert "4 passed, 2 deselected" in proc.stdout, proc.stdout + proc.stderr


def test_extract_verifies_the_wheel_and_keeps_dest(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    with pytest.raises(SeriesError, match="sha256"):
        conformance.extract(wheel, "0" * 64, tmp_path / "a", "0.5.13")
    assert not (tmp_path / "a").exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    with pytest.raises(SeriesError, match="not empty"):
        conformance.extract(wheel, sha256_file(wheel), busy, "0.5.13")
    assert [p.name for p in busy.iterdir()] == ["mine.txt"]


def test_real_upstream_wheel_when_cached(tmp_path: Path) -> None:
    """The verified 0.5.13 wheel (fetched by the rebase check or fetch-upstream)."""
    release = conformance.upstream_release()
    wheel = paths.default_cache_dir() / "wheels" / release.wheel_filename
    if not wheel.is_file():
        pytest.skip(f"{release.wheel_filename} not in the cache (fetch-upstream --version 0.5.13)")
    got = conformance.extract(wheel, release.sha256, tmp_path / "out", release.version)
    kinds = [(e.file.rsplit("/", 1)[-1], e.kind) for e in got.edits]
    assert kinds.count(("test_gptq_marlin.py", "skip")) == 2
    assert kinds.count(("test_moe_wna16_marlin.py", "skip")) == 3
    text = (tmp_path / "out" / "tests" / "test_gptq_marlin.py").read_text()
    for name in conformance.REQUIRED:
        assert f"def {name}(" in text
    moe = (tmp_path / "out" / "tests" / "test_moe_wna16_marlin.py").read_text()
    for name in conformance.NOT_APPLICABLE:
        assert f"def {name}(" in moe


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_gptq_marlin"
  name="test_nvfp4_marlin_dense_matches_dequant_reference[dtype0]" time="1"/>
<testcase classname="tests.test_gptq_marlin"
  name="test_nvfp4_marlin_dense_matches_dequant_reference[dtype1]" time="1">
  <failure message="AssertionError: Tensor-likes are not close!">trace</failure></testcase>
<testcase classname="tests.test_gptq_marlin"
  name="test_nvfp4_marlin_support_and_scale_transforms_sm80_sm90[dtype0]" time="1">
  <skipped message="no GPU"/></testcase>
<testcase classname="tests.test_moe_wna16_marlin"
  name="test_fused_marlin_moe_nvfp4_non_gated_matches_dequant_reference" time="1">
  <failure message="ValueError: non-gated experts are not supported">trace</failure></testcase>
</testsuite></testsuites>
"""


def test_records_from_junit(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    got = {r["id"].rsplit("::", 1)[-1]: r for r in conformance.records(
        conformance.outcomes_from_junit(junit)
    )}  # fmt: skip
    assert got["test_nvfp4_marlin_dense_matches_dequant_reference[dtype0]"]["status"] == "pass"
    failed = got["test_nvfp4_marlin_dense_matches_dequant_reference[dtype1]"]
    assert failed["status"] == "fail" and "not close" in failed["message"]
    skipped = got["test_nvfp4_marlin_support_and_scale_transforms_sm80_sm90[dtype0]"]
    assert skipped["status"] == "fail" and skipped["observed"] == "skipped"
    na = got["test_fused_marlin_moe_nvfp4_non_gated_matches_dequant_reference"]
    assert na["status"] == "not-applicable" and na["observed"] == "fail"
    assert "is_gated=False" in na["needs"]
    ids = sorted(r["id"] for r in got.values())
    assert ids[0].startswith("sglang/jit_kernel/tests/test_gptq_marlin.py::")
    assert ids[-1].startswith("sglang/jit_kernel/tests/test_moe_wna16_marlin.py::")


def test_a_line_on_the_new_layout_points_moved_imports_at_their_place() -> None:
    text = UPSTREAM_TEST.replace(
        "import pytest\n", "import pytest\nfrom sglang.jit_kernel.gptq_marlin import gemm\n"
    )
    name = "sglang/jit_kernel/tests/test_gptq_marlin.py"
    edited, edits = conformance.mechanical_edits(name, text, conformance.MODULE_MOVES)
    moved = [e for e in edits if e.kind == "module-move"]
    assert [(e.line, e.removed, e.replacement) for e in moved] == [
        (2, "sglang.jit_kernel.gptq_marlin", "sglang.kernels.ops.gemm.gptq_marlin")
    ]
    assert "from sglang.kernels.ops.gemm.gptq_marlin import gemm\n" in edited
    assert "sglang.jit_kernel" not in edited
    # without the table (the pin's tree) the import stays as upstream wrote it
    pin_text, pin_edits = conformance.mechanical_edits(name, text)
    assert "from sglang.jit_kernel.gptq_marlin import gemm" in pin_text
    assert all(e.kind != "module-move" for e in pin_edits)
    unknown = text.replace("jit_kernel.gptq_marlin", "jit_kernel.other_module")
    with pytest.raises(SeriesError, match="imports sglang.jit_kernel.other_module"):
        conformance.mechanical_edits(name, unknown, conformance.MODULE_MOVES)


def test_profiles() -> None:
    pin = conformance.profile()
    assert pin.required == conformance.REQUIRED and pin.not_applicable
    line = conformance.profile("0.5.23")
    assert line.source_version == "0.5.13" and line.module_moves == conformance.MODULE_MOVES
    assert set(line.required) == {*conformance.REQUIRED, *conformance.NOT_APPLICABLE}
    assert line.not_applicable == {}
    with pytest.raises(SeriesError, match="no conformance profile for the 9.9 line"):
        conformance.profile("9.9")


def test_module_moves_name_the_line_trees_modules() -> None:
    """Each new place is a module of the 0.5.23 tree (the line's checkout, when made)."""
    tree = paths.project_root() / ".work" / "lines" / "0.5.23" / "checkout" / "python"
    if not tree.is_dir():
        pytest.skip("no checkout of the 0.5.23 line (scripts/main.sh --line 0.5.23)")
    for new in conformance.MODULE_MOVES.values():
        assert (tree / Path(*new.split("."))).with_suffix(".py").is_file(), new


def test_real_upstream_wheel_as_the_line_runs_it(tmp_path: Path) -> None:
    release = conformance.upstream_release()
    wheel = paths.default_cache_dir() / "wheels" / release.wheel_filename
    if not wheel.is_file():
        pytest.skip(f"{release.wheel_filename} not in the cache (fetch-upstream --version 0.5.13)")
    got = conformance.extract_from_lock(tmp_path / "out", wheel=wheel, line="0.5.23")
    moves = [e for e in got.edits if e.kind == "module-move"]
    assert len(moves) == 2 and {e.replacement for e in moves} == set(
        conformance.MODULE_MOVES.values()
    )
    for test in ("test_gptq_marlin.py", "test_moe_wna16_marlin.py"):
        assert "sglang.jit_kernel" not in (tmp_path / "out" / "tests" / test).read_text()
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    records = conformance.records(conformance.outcomes_from_junit(junit), {})
    assert all(r["status"] != "not-applicable" for r in records)  # the line takes them all
