"""The device loader hook serves the prebuilt .so of exactly this module, arch and tree."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "device"))

import prebuilt_hook  # noqa: E402


def _tree(root: Path, marlin: str) -> Path:
    kdir = root / "sglang" / "jit_kernel"
    (kdir / "csrc" / "gemm" / "marlin").mkdir(parents=True)
    (kdir / "include").mkdir()
    (kdir / "csrc" / "gemm" / "marlin" / "marlin_template.h").write_text(marlin)
    (kdir / "include" / "utils.h").write_text("// shared")
    (kdir / "gptq_marlin.py").write_text("# python is not part of the hash")
    return kdir


def _entry(module: str, arch: str, thash: str, fname: str, **extra: Any) -> dict[str, Any]:
    return {
        "module": module,
        "spec": extra.pop("spec", "gptq_marlin:bf16"),
        "arch": arch,
        "arch_list": {"sm_90": "9.0", "compute_75": "7.5"}[arch],
        "ptx_only": arch.startswith("compute_"),
        "tree_hash": thash,
        "file": fname + ".xz",
        **extra,
    }


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    patched = _tree(tmp_path / "patched", "patched body")
    pin = _tree(tmp_path / "pin", "pin body")
    hp, hu = prebuilt_hook.tree_hash(patched), prebuilt_hook.tree_hash(pin)
    pre = tmp_path / "prebuilt"
    pre.mkdir()
    files = {
        "p90": _entry("sgl_kernel_jit_gptq_marlin_bf16_t", "sm_90", hp, "p90.so"),
        "p90h": _entry("sgl_kernel_jit_gptq_marlin_fp16_t", "sm_90", hp, "p90h.so"),
        "u90": _entry("sgl_kernel_jit_gptq_marlin_bf16_t", "sm_90", hu, "u90.so"),
        "p75": _entry("sgl_kernel_jit_gptq_marlin_fp16_t", "compute_75", hp, "p75.so"),
        "act": _entry(
            "sgl_kernel_jit_activation_bf16_t_true",
            "sm_90",
            hp,
            "act.so",
            spec="act:bf16",
            also_tree_hashes=[hu],
        ),  # fmt: skip
    }
    for e in files.values():
        (pre / e["file"][:-3]).write_bytes(b"\x7fELF fake")
    (pre / "manifest.json").write_text(json.dumps({"modules": list(files.values())}))
    calls: dict[str, list[Any]] = {"compiled": [], "loaded": []}

    def original(name: str, **kw: Any) -> str:
        calls["compiled"].append(name)
        return f"compiled:{name}"

    def load_module(path: str) -> str:
        calls["loaded"].append(Path(path).name)
        return f"module:{Path(path).name}"

    current = {"kdir": patched}
    loader = prebuilt_hook.make_loader(pre, original, load_module, lambda: current["kdir"])
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0")
    monkeypatch.delenv("FP4SERIES_FORCE_ARCH", raising=False)
    monkeypatch.delenv(prebuilt_hook.LOG_ENV, raising=False)
    return {"loader": loader, "calls": calls, "current": current, "patched": patched, "pin": pin}


def test_picks_module_dtype_and_tree(setup: dict[str, Any]) -> None:
    load = setup["loader"]
    assert load("sgl_kernel_jit_gptq_marlin_bf16_t", cuda_sources=["x"]) == "module:p90.so"
    assert load("sgl_kernel_jit_gptq_marlin_fp16_t") == "module:p90h.so"
    setup["current"]["kdir"] = setup["pin"]
    assert load("sgl_kernel_jit_gptq_marlin_bf16_t") == "module:u90.so"
    assert setup["calls"]["compiled"] == []


def test_arch_and_ptx_only_select_the_compute75_build(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "7.5")
    monkeypatch.setenv("FP4SERIES_FORCE_ARCH", "compute_75")
    assert setup["loader"]("sgl_kernel_jit_gptq_marlin_fp16_t") == "module:p75.so"
    # compute_75 bf16 was never prebuilt: compile, never the sm_90 .so
    assert setup["loader"]("sgl_kernel_jit_gptq_marlin_bf16_t") == (
        "compiled:sgl_kernel_jit_gptq_marlin_bf16_t"
    )


def test_no_match_compiles_loudly(
    setup: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    logf = tmp_path / "hook.log"
    monkeypatch.setenv(prebuilt_hook.LOG_ENV, str(logf))
    setup["current"]["kdir"] = setup["pin"]
    got = setup["loader"]("sgl_kernel_jit_gptq_marlin_fp16_t")  # only patched has fp16
    assert got == "compiled:sgl_kernel_jit_gptq_marlin_fp16_t"
    err = capsys.readouterr().err
    assert "NO PREBUILT" in err and "COMPILING" in err
    assert "NO PREBUILT" in logf.read_text()


def test_edited_tree_never_gets_a_stale_module(setup: dict[str, Any]) -> None:
    kdir = setup["patched"]
    (kdir / "csrc" / "gemm" / "marlin" / "marlin_template.h").write_text("patched body v2")
    prebuilt_hook._hash_cache.clear()
    assert setup["loader"]("sgl_kernel_jit_gptq_marlin_bf16_t").startswith("compiled:")


def test_shared_sources_serve_both_trees_and_load_once(setup: dict[str, Any]) -> None:
    load = setup["loader"]
    name = "sgl_kernel_jit_activation_bf16_t_true"
    assert load(name) == "module:act.so"
    setup["current"]["kdir"] = setup["pin"]
    assert load(name) == "module:act.so"
    assert setup["calls"]["loaded"] == ["act.so"]


def test_python_files_do_not_change_the_hash(setup: dict[str, Any]) -> None:
    kdir = setup["patched"]
    before = prebuilt_hook.tree_hash(kdir)
    (kdir / "gptq_marlin.py").write_text("# edited")
    prebuilt_hook._hash_cache.clear()
    assert prebuilt_hook.tree_hash(kdir) == before


def test_install_is_off_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(prebuilt_hook.DIR_ENV, raising=False)
    assert prebuilt_hook.install() is False


def test_record_pack_and_find_round_trip(tmp_path: Path) -> None:
    """prebuild.py record + pack -> manifest entry the hook finds; sha256 is of the raw .so."""
    import hashlib
    import lzma
    import shutil

    import prebuild

    tree = tmp_path / "tree" / "python"
    kdir = _tree(tree, "body")
    so = tmp_path / "build" / "m.so"
    so.parent.mkdir()
    shutil.copy2("/bin/true", so)  # any ELF file: pack strips debug info
    rec_dir = tmp_path / "rec"
    assert prebuild.record(so, "sgl_kernel_jit_x_bf16_t", "gptq_marlin:bf16", "sm_90", tree,
                           rec_dir, "test") == 0  # fmt: skip
    dest = tmp_path / "prebuilt"
    assert prebuild.pack([rec_dir], dest, []) == 0
    manifest = json.loads((dest / "manifest.json").read_text())
    (entry,) = manifest["modules"]
    raw = lzma.decompress((dest / entry["file"]).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == entry["sha256"]
    found = prebuilt_hook.find(manifest, "sgl_kernel_jit_x_bf16_t", "9.0", False,
                               prebuilt_hook.tree_hash(kdir))  # fmt: skip
    assert found == entry
    assert prebuilt_hook.find(manifest, "sgl_kernel_jit_x_bf16_t", "7.5", True,
                              prebuilt_hook.tree_hash(kdir)) is None  # fmt: skip


def test_merge_numerics_keeps_every_stage(tmp_path: Path) -> None:
    import prebuilt_run

    dirs = []
    for name, cases, tracing in (("a", [{"rel_l2": 1e-3}], []), ("b", [{"rel_l2": 0.6}],
                                                                   [{"name": "t"}])):  # fmt: skip
        d = tmp_path / name
        d.mkdir()
        (d / "numerics.json").write_text(json.dumps({"cases": cases, "tracing": tracing,
                                                     "git": "x"}))  # fmt: skip
        dirs.append((name, d))
    dirs.append(("c", tmp_path / "missing"))
    out = tmp_path / "out"
    out.mkdir()
    prebuilt_run.merge_numerics(out, dirs)
    data = json.loads((out / "numerics.json").read_text())
    assert [c["stage"] for c in data["cases"]] == ["a", "b"]
    assert data["tracing"] == [{"name": "t"}] and data["stages"] == ["a", "b"]
    assert sorted(p.name for p in out.iterdir()) == ["numerics.json"]


def test_harvest_repro_cases_from_a_stopped_worker(tmp_path: Path) -> None:
    import device_run
    import prebuilt_run

    lay = device_run.Layout(tmp_path / "root", tmp_path / "carry")
    wdir = lay.root / "tmp" / "fp4-repro-abc"
    wdir.mkdir(parents=True)
    lay.logs.mkdir(parents=True)
    (wdir / "worker.log").write_text('noise\n[repro] {"path": "ct-dense", "rel_l2": 0.67}\n'
                                     "Traceback (killed)\n")  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    (out / "numerics.json").write_text(json.dumps({"cases": [{"templates": "patched"}]}))
    prebuilt_run.harvest_workers(lay, out)
    cases = json.loads((out / "numerics.json").read_text())["cases"]
    assert cases[1] == {"path": "ct-dense", "rel_l2": 0.67, "templates": "unpatched",
                        "expect": "fail", "stage": "repro-worker-log"}  # fmt: skip
    assert (lay.logs / "worker_repro.log").is_file()


def test_activation_without_prebuilt_uses_sgl_kernel_only_when_asked(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "sgl_kernel_jit_activation_fp16_t_true"  # not in the manifest
    monkeypatch.delenv(prebuilt_hook.ACT_FALLBACK_ENV, raising=False)
    assert setup["loader"](name) == f"compiled:{name}"
    monkeypatch.setenv(prebuilt_hook.ACT_FALLBACK_ENV, "sgl_kernel")
    mod = setup["loader"](name)
    assert isinstance(mod, prebuilt_hook.SglKernelActivation)
    # a prebuilt activation still wins over the fallback
    assert setup["loader"]("sgl_kernel_jit_activation_bf16_t_true") == "module:act.so"


def test_activation_fallback_rejects_unknown_ops() -> None:
    with pytest.raises(ValueError, match="sgl_kernel fallback knows"):
        prebuilt_hook.SglKernelActivation("x")._fn("relu2")


def test_tree_without_known_jit_layout_compiles(
    setup: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_tree() -> Path:
        raise ImportError("No module named 'sglang.jit_kernel'")

    pre = tmp_path / "prebuilt"  # the fixture's manifest (patched and pin trees)
    loader = prebuilt_hook.make_loader(pre, lambda name, **kw: f"compiled:{name}", str, no_tree)
    name = "sgl_kernel_jit_gptq_marlin_bf16_t"
    assert loader(name) == f"compiled:{name}"
    assert "cannot locate" in capsys.readouterr().err
