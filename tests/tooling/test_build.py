"""Build pipeline: wheel repack, stamp caching (venv, compile check), prefix test selection."""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import platform
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import _fakepin as fakepin
import pytest
from _fakepin import compile_kwargs

from fp4series import build, compile_check, prefix
from fp4series.errors import SeriesError

ENV = {**fakepin.IDENTITY, **fakepin.FIXED_DATES}


git = functools.partial(fakepin.git, env=ENV)


def digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


# ------------------------------------------------------------------------------------ repack

FILES = {
    "sglang/__init__.py": b"",
    "sglang/a.py": b"A = 1\n",
    "sglang/old.py": b"OLD = True\n",
    "sglang/jit_kernel/csrc/k.cuh": b"// kernel v1\n",
}


def make_wheel(folder: Path, files: dict[str, bytes] = FILES) -> Path:
    """A tiny but valid wheel: METADATA, WHEEL and a RECORD with every file's sha256."""
    name = "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"
    dist = "sglang-0.5.11.dist-info"
    meta = {
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.11\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
        b"Tag: cp311-cp311-manylinux_2_34_x86_64\n",
    }
    every = {**files, **meta}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for path, data in every.items():
        writer.writerow([path, f"sha256={digest(data)}", len(data)])
    writer.writerow([f"{dist}/RECORD", "", ""])
    path = folder / name
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in every.items():
            zf.writestr(member, data)
        zf.writestr(f"{dist}/RECORD", out.getvalue())
    return path


def wheel_contents(path: Path) -> tuple[dict[str, bytes], dict[str, str], str]:
    with zipfile.ZipFile(path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    record_name = next(n for n in files if n.endswith(".dist-info/RECORD"))
    record = {}
    for row in csv.reader(io.StringIO(files[record_name].decode())):
        if row[1]:
            record[row[0]] = row[1].removeprefix("sha256=")
    metadata = next(v for n, v in files.items() if n.endswith(".dist-info/METADATA")).decode()
    return files, record, metadata


@pytest.fixture
def need_wheel_tool() -> None:
    pytest.importorskip("wheel", reason="the `wheel` tool is in requirements/tooling.txt")


def test_repack_replaces_adds_deletes_and_regenerates_record(
    tmp_path: Path, need_wheel_tool: None
) -> None:
    src = make_wheel(tmp_path)
    changes = {
        "sglang/a.py": b"A = 2  # patched\n",
        "sglang/new_module.py": b"NEW = 1\n",
        "sglang/old.py": None,
    }
    out = build.repack_wheel(
        src, changes, tmp_path / "out", local_version="nvfp4marlin.3.gabc",
        expected_old={"sglang/a.py": digest(FILES["sglang/a.py"]),
                      "sglang/old.py": digest(FILES["sglang/old.py"])},
    )  # fmt: skip
    assert out.name == "sglang-0.5.11+nvfp4marlin.3.gabc-cp311-cp311-manylinux_2_34_x86_64.whl"
    files, record, metadata = wheel_contents(out)
    assert files["sglang/a.py"] == b"A = 2  # patched\n"
    assert record["sglang/a.py"] == digest(b"A = 2  # patched\n")
    assert record["sglang/new_module.py"] == digest(b"NEW = 1\n")
    assert "sglang/old.py" not in files and "sglang/old.py" not in record
    # untouched files keep their bytes and hashes; every file in the zip is in RECORD
    assert record["sglang/jit_kernel/csrc/k.cuh"] == digest(FILES["sglang/jit_kernel/csrc/k.cuh"])
    for name, data in files.items():
        if not name.endswith("RECORD"):
            assert record[name] == digest(data), name
    assert "Version: 0.5.11+nvfp4marlin.3.gabc" in metadata
    assert any(n.startswith("sglang-0.5.11+nvfp4marlin.3.gabc.dist-info/") for n in files)


def test_repack_refuses_a_base_that_is_not_the_wheel(tmp_path: Path, need_wheel_tool: None) -> None:
    src = make_wheel(tmp_path)
    with pytest.raises(SeriesError, match="base differs") as info:
        build.repack_wheel(
            src, {"sglang/a.py": b"x\n"}, tmp_path / "out", local_version=None,
            expected_old={"sglang/a.py": digest(b"A = 0  # some other release\n")},
        )  # fmt: skip
    assert "--allow-base-mismatch" in info.value.hint
    assert not list((tmp_path / "out").glob("*.whl"))


def test_repack_refuses_deleting_a_file_the_wheel_lacks(
    tmp_path: Path, need_wheel_tool: None
) -> None:
    src = make_wheel(tmp_path)
    with pytest.raises(SeriesError, match="does not have"):
        build.repack_wheel(src, {"sglang/nope.py": None}, tmp_path / "out", local_version=None)


def test_checkout_changes_maps_git_diff_to_wheel_paths(tmp_path: Path) -> None:
    repo = tmp_path / "co"
    (repo / "python" / "sglang").mkdir(parents=True)
    for rel, data in FILES.items():
        (repo / "python" / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / "python" / rel).write_bytes(data)
    (repo / "README.md").write_text("outside python/sglang\n")
    git(repo, "init", "-q", ".")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "pin")
    git(repo, "tag", "v0.5.11")
    (repo / "python/sglang/a.py").write_bytes(b"A = 2\n")
    (repo / "python/sglang/new.py").write_bytes(b"N = 1\n")
    (repo / "python/sglang/old.py").unlink()
    (repo / "README.md").write_text("changed, but not part of the wheel\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "[Quant] patch one")
    base = git(repo, "rev-parse", "v0.5.11").strip()
    changes, expected_old = build.checkout_changes(repo, base)
    assert changes == {
        "sglang/a.py": b"A = 2\n",
        "sglang/new.py": b"N = 1\n",
        "sglang/old.py": None,
    }
    assert expected_old == {
        "sglang/a.py": digest(FILES["sglang/a.py"]),
        "sglang/old.py": digest(FILES["sglang/old.py"]),
    }
    head = git(repo, "rev-parse", "HEAD").strip()
    assert build.local_version_for(repo, base) == f"nvfp4marlin.1.g{head[:10]}"


# ------------------------------------------------------------------------------------ stamps


def test_inputs_hash_tracks_content_names_and_extras(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text("torch==2.11.0\n")
    key = build.inputs_hash([a], ["3.11.7"])
    assert key == build.inputs_hash([a], ["3.11.7"])
    assert key != build.inputs_hash([a], ["3.12.0"])
    a.write_text("torch==2.11.1\n")
    assert key != build.inputs_hash([a], ["3.11.7"])
    stamp = tmp_path / "s" / "stamp"
    assert not build.stamp_matches(stamp, key)
    build.write_stamp(stamp, key)
    assert build.stamp_matches(stamp, key) and not build.stamp_matches(stamp, "other")


def fake_venv(root: Path) -> Path:
    venv = root / ".work" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (root / "requirements").mkdir()
    (root / "requirements" / "cpu-test.txt").write_text("torch==2.11.0\n")
    (root / "requirements" / "constraints.txt").write_text("numpy==2.4.6\n")
    return venv


def test_ensure_venv_reuses_until_requirements_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = fake_venv(tmp_path)
    pip_calls: list[list[str]] = []
    real_run = subprocess.run

    def fake_run(cmd: list[str], *args: object, **kwargs: object) -> object:
        if "pip" in cmd:
            pip_calls.append(cmd)
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return real_run(cmd, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(build.subprocess, "run", fake_run)
    assert build.ensure_venv(venv, tmp_path) == "installed"
    assert len(pip_calls) == 1 and "-r" in pip_calls[0] and "-c" in pip_calls[0]
    assert build.ensure_venv(venv, tmp_path).startswith("reused")
    assert len(pip_calls) == 1
    pth = venv / "lib/python3.11/site-packages/fp4series-src.pth"
    assert pth.read_text().strip() == str(tmp_path / "src")
    (tmp_path / "requirements" / "cpu-test.txt").write_text("torch==2.11.0\nnumpy==2.4.6\n")
    assert build.ensure_venv(venv, tmp_path) == "installed"
    assert len(pip_calls) == 2


def test_ensure_venv_pip_failure_leaves_no_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = fake_venv(tmp_path)
    real_run = subprocess.run

    def failing_pip(cmd: list[str], *args: object, **kwargs: object) -> object:
        if "pip" in cmd:
            return subprocess.CompletedProcess(cmd, 1, "", "")
        return real_run(cmd, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(build.subprocess, "run", failing_pip)
    with pytest.raises(SeriesError, match="pip could not install"):
        build.ensure_venv(venv, tmp_path)
    assert not (venv / build.VENV_STAMP).exists()
    assert platform.machine()  # the key includes it; just make sure it is readable here


# ----------------------------------------------------------------------------- compile check


def fake_sglang(root: Path, template: str = "// v1\n") -> Path:
    sg = root / "site" / "sglang"
    for sub in ("include", "csrc/gemm/marlin", "csrc/gemm/marlin_moe"):
        (sg / "jit_kernel" / sub).mkdir(parents=True, exist_ok=True)
    (sg / "jit_kernel" / "utils.py").write_text("def load_jit(*args, **kwargs): ...\n")
    for name, sub in (("gptq_marlin", "marlin"), ("moe_wna16_marlin", "marlin_moe")):
        (sg / "jit_kernel" / f"{name}.py").write_text(
            "from sglang.jit_kernel.utils import load_jit\n"
            f"def _jit_{name}_module(dtype):\n"
            f"    return load_jit({name!r}, cuda_files=['gemm/{sub}/{name}.cuh'])\n"
        )
    (sg / "jit_kernel" / "csrc/gemm/marlin/marlin_template.h").write_text(template)
    (sg / "jit_kernel" / "csrc/gemm/marlin_moe/marlin_template.h").write_text("// moe\n")
    return sg


def test_compile_check_builds_once_then_uses_the_stamp(
    tmp_path: Path, fake_tools: tuple[Path, Path]
) -> None:
    sg = fake_sglang(tmp_path)
    py, log = fake_tools
    targets = [compile_check.Target.parse("gptq_marlin:bf16:sm_90")]
    kw = compile_kwargs(tmp_path, py, sg)
    assert [r.status for r in compile_check.run_compile_checks(targets, **kw)] == ["built"]
    assert "worker --module gptq_marlin --dtype bf16 --arch sm_90" in log.read_text()
    assert [r.status for r in compile_check.run_compile_checks(targets, **kw)] == ["cached"]
    assert log.read_text().count(" worker ") == 1
    # the MoE template is not an input of the dense module ...
    (sg / "jit_kernel/csrc/gemm/marlin_moe/marlin_template.h").write_text("// moe v2\n")
    assert [r.status for r in compile_check.run_compile_checks(targets, **kw)] == ["cached"]
    # ... the dense template is
    (sg / "jit_kernel/csrc/gemm/marlin/marlin_template.h").write_text("// v2\n")
    assert [r.status for r in compile_check.run_compile_checks(targets, **kw)] == ["built"]
    assert [r.status for r in compile_check.run_compile_checks(targets, force=True, **kw)] == [
        "built"
    ]


def test_compile_check_failure_writes_no_stamp(
    tmp_path: Path, fake_tools: tuple[Path, Path]
) -> None:
    sg = fake_sglang(tmp_path)
    bad = tmp_path / "badpy"
    bad.write_text("#!/bin/sh\necho 'error: identifier undefined' >&2\nexit 1\n")
    bad.chmod(0o755)
    targets = [compile_check.Target.parse("moe_wna16_marlin:fp16:sm_80")]
    kw = compile_kwargs(tmp_path, bad, sg)
    (result,) = compile_check.run_compile_checks(targets, **kw)
    assert result.status == "failed" and "identifier undefined" in result.detail
    assert not list((tmp_path / "cache").glob("*.stamp"))


def test_targets_default_turing_and_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(compile_check.ENV_TARGETS, raising=False)
    sg = fake_sglang(tmp_path)
    names = [str(t) for t in compile_check.select_targets(sg)]
    assert names == list(compile_check.DEFAULT_TARGETS)
    (sg / "jit_kernel/csrc/gemm/marlin/marlin_template.h").write_text(
        "#if __CUDA_ARCH__ >= 750 && __CUDA_ARCH__ < 800\n// turing path\n#endif\n"
    )
    names = [str(t) for t in compile_check.select_targets(sg)]
    assert names == [*compile_check.DEFAULT_TARGETS, *compile_check.TURING_TARGETS]
    monkeypatch.setenv(compile_check.ENV_TARGETS, "gptq_marlin:fp16:sm_90a")
    assert [str(t) for t in compile_check.select_targets(sg)] == ["gptq_marlin:fp16:sm_90a"]
    assert compile_check.select_targets(sg, "none") == []
    with pytest.raises(SeriesError, match="unknown JIT module"):
        compile_check.select_targets(sg, "marlin:bf16:sm_90")
    with pytest.raises(SeriesError, match="bad arch"):
        compile_check.select_targets(sg, "gptq_marlin:bf16:90")
    assert compile_check.Target.parse("gptq_marlin:bf16:sm_90a").major_minor_suffix == (9, 0, "a")


# ---------------------------------------------------------------------------- prefix tests


def test_cpu_tests_drop_gpu_and_bench_keep_node_ids() -> None:
    entries = (
        "tests/sglang/test_a.py::test_x",
        "gpu:tests/gpu/test_dense.py",
        "bench:bench/marlin.py",
        "cpu:tests/sglang/test_b.py",
    )
    assert prefix.cpu_tests(entries) == (
        "tests/sglang/test_a.py::test_x",
        "tests/sglang/test_b.py",
    )


def test_prefix_plan_is_cumulative_and_deduplicated() -> None:
    p = [
        prefix.PatchInfo("0001-a.patch", "a", ("t/test_a.py", "gpu:t/g.py")),
        prefix.PatchInfo("0002-b.patch", "b", ()),
        prefix.PatchInfo("0003-c.patch", "c", ("t/test_c.py::test_1", "t/test_a.py")),
    ]
    plan = prefix.prefix_plan(p)
    assert [(k, tests) for k, _, tests in plan] == [
        (1, ("t/test_a.py",)),
        (2, ("t/test_a.py",)),
        (3, ("t/test_a.py", "t/test_c.py::test_1")),
    ]


PATCH_BODY = """\
Why:
because

What:
{what}

How verified:
pytest

Upstream-Status: Pending
Tests: {tests}
"""


def make_series_project(tmp_path: Path) -> tuple[Path, Path]:
    """A project (patches/ + tests/) and a checkout: pin + 2 commits exported as the series."""
    co = tmp_path / "checkout"
    (co / "python" / "mini").mkdir(parents=True)
    (co / "python" / "mini" / "__init__.py").write_text("LEVEL = 0\n")
    git(co, "init", "-q", ".")
    git(co, "add", ".")
    git(co, "commit", "-qm", "pin")
    git(co, "tag", "v0.5.11")
    for level, tests in ((1, "tests/sglang/test_one.py, gpu:tests/gpu/test_g.py"),
                         (2, "tests/sglang/test_two.py::test_two")):  # fmt: skip
        (co / "python" / "mini" / "__init__.py").write_text(f"LEVEL = {level}\n")
        git(
            co,
            "commit",
            "-qam",
            f"[Quant] Raise level to {level}\n\n" + PATCH_BODY.format(what=level, tests=tests),
        )
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    git(co, "format-patch", "-q", "--full-index", "-o", str(root / "patches"), "v0.5.11..HEAD")
    names = sorted(p.name for p in (root / "patches").glob("*.patch"))
    (root / "patches" / "series").write_text("\n".join(names) + "\n")
    tests = root / "tests" / "sglang"
    tests.mkdir(parents=True)
    (tests / "test_one.py").write_text(
        textwrap.dedent("""\
        import mini
        def test_one():
            assert mini.LEVEL >= 1
    """)
    )
    (tests / "test_two.py").write_text(
        textwrap.dedent("""\
        import mini
        def test_two():
            assert mini.LEVEL >= 2
        def test_not_named():
            raise AssertionError("not named in a Tests: trailer, must not run")
    """)
    )
    return root, co


def test_prefixes_run_each_prefix_on_its_own_tree(tmp_path: Path) -> None:
    pytest.importorskip("git")
    root, co = make_series_project(tmp_path)
    patches = prefix.load_patches(root / "patches")
    assert [p.tests for p in patches][0] == (
        "tests/sglang/test_one.py",
        "gpu:tests/gpu/test_g.py",
    )
    base = git(co, "rev-parse", "v0.5.11").strip()
    tally = prefix.Tally()
    rc = prefix.run_prefixes(co, root=root, python=Path(sys.executable), base=base, tally=tally)
    assert rc == 0
    # prefix 1 runs test_one; prefix 2 runs test_one + test_two::test_two (not test_not_named)
    assert (tally.passed, tally.failed) == (3, 0)
    assert (root / ".work/prefix/01/python/mini/__init__.py").read_text() == "LEVEL = 1\n"


def test_prefixes_fail_when_a_prefix_lacks_what_its_test_needs(tmp_path: Path) -> None:
    pytest.importorskip("git")
    root, co = make_series_project(tmp_path)
    # patch 1 now claims test_two, which needs patch 2: prefix 1 must fail
    (root / "tests/sglang/test_one.py").write_text(
        "import mini\n\ndef test_one():\n    assert mini.LEVEL >= 2\n"
    )
    base = git(co, "rev-parse", "v0.5.11").strip()
    tally = prefix.Tally()
    rc = prefix.run_prefixes(co, root=root, python=Path(sys.executable), base=base, tally=tally)
    assert rc == 1 and tally.failures == ["prefix 1"]


def test_prefixes_refuse_a_checkout_out_of_step_with_the_series(tmp_path: Path) -> None:
    pytest.importorskip("git")
    root, co = make_series_project(tmp_path)
    git(co, "reset", "-q", "--hard", "HEAD~1")
    base = git(co, "rev-parse", "v0.5.11").strip()
    with pytest.raises(SeriesError, match="1 commit"):
        prefix.run_prefixes(
            co, root=root, python=Path(sys.executable), base=base, tally=prefix.Tally()
        )


def test_repack_key_changes_with_any_input(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    changes: dict[str, bytes | None] = {"sglang/a.py": b"A = 2\n", "sglang/old.py": None}
    key = build.repack_key(wheel, changes, "nvfp4marlin.1.gabc")
    assert key == build.repack_key(wheel, dict(changes), "nvfp4marlin.1.gabc")
    assert key != build.repack_key(
        wheel, {**changes, "sglang/a.py": b"A = 3\n"}, "nvfp4marlin.1.gabc"
    )
    assert key != build.repack_key(wheel, {"sglang/a.py": b"A = 2\n"}, "nvfp4marlin.1.gabc")
    assert key != build.repack_key(wheel, changes, "nvfp4marlin.2.gdef")


def _test_project_without_a_checkout(tmp_path: Path) -> Path:
    """make_series_project's project with a lock and one passing tooling test, no .work/."""
    root, _co = make_series_project(tmp_path)
    fakepin.write_lock(root / "upstream.lock", "0" * 64)
    for f in (root / "tests" / "sglang").iterdir():  # they need the checkout: not the subject
        f.unlink()
    (root / "tests" / "tooling").mkdir()
    (root / "tests" / "tooling" / "test_ok.py").write_text("def test_ok():\n    pass\n")
    return root


def test_full_run_without_the_checkout_skips_the_prefixes_and_ends_with_its_tally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("git")
    root = _test_project_without_a_checkout(tmp_path)
    monkeypatch.setenv("FP4SERIES_SKIP_REPORTS", "1")
    checkout = root / ".work" / "checkout"
    rc = prefix.run_all(root, Path(sys.executable), checkout, [])
    out = capsys.readouterr().out
    assert rc == 0, out  # the README's own-checkout section: build.sh, then test.sh
    assert f"[test] prefixes: skipped: {checkout} is not a git checkout" in out
    assert out.rstrip().splitlines()[-1] == "1 passed, 0 failed, 0 skipped"
    rc = prefix.run_all(root, Path(sys.executable), checkout, [], checkout_named=True)
    out = capsys.readouterr().out
    assert rc == 1 and f"[test] prefixes: FAILED: {checkout} is not a git checkout" in out
    assert out.rstrip().splitlines()[-1] == "1 passed, 1 failed, 0 skipped"
