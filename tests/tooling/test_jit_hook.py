"""The JIT loader hook serves the prebuilt .so of exactly this module, arch and tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jit_hook
import pytest


def _tree(root: Path, marlin: str) -> Path:
    kdir = root / "sglang" / "jit_kernel"
    (kdir / "csrc" / "gemm" / "marlin").mkdir(parents=True)
    (kdir / "csrc" / "gemm" / "marlin" / "marlin_template.h").write_text(marlin)
    (kdir / "gptq_marlin.py").write_text("# python is not part of the hash")
    return kdir


def _entry(module: str, arch: str, thash: str, fname: str) -> dict[str, Any]:
    arch_list, ptx_only = jit_hook.arch_key(arch)
    return {"module": module, "spec": "s", "arch": arch, "arch_list": arch_list,
            "ptx_only": ptx_only, "tree_hash": thash, "file": fname}  # fmt: skip


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    patched = _tree(tmp_path / "patched", "patched body")
    pin = _tree(tmp_path / "pin", "pin body")
    hp, hu = jit_hook.tree_hash(patched), jit_hook.tree_hash(pin)
    pre = tmp_path / "prebuilt"
    pre.mkdir()
    entries = [
        _entry("sgl_kernel_jit_gptq_marlin_bf16_t", "sm_90", hp, "p90.so"),
        _entry("sgl_kernel_jit_gptq_marlin_fp16_t", "sm_90", hp, "p90h.so"),
        _entry("sgl_kernel_jit_gptq_marlin_bf16_t", "sm_90", hu, "u90.so"),
        _entry("sgl_kernel_jit_gptq_marlin_fp16_t", "compute_75", hp, "p75.so"),
        _entry("sgl_kernel_jit_activation_bf16_t_true", "sm_90", hp, "act.so"),
    ]
    (pre / "manifest.json").write_text(json.dumps({"modules": entries}))
    calls: dict[str, list[Any]] = {"compiled": [], "loaded": []}

    def original(name: str, **kw: Any) -> str:
        calls["compiled"].append(name)
        return f"compiled:{name}"

    def load_module(path: str) -> str:
        calls["loaded"].append(Path(path).name)
        return f"module:{Path(path).name}"

    current = {"kdir": patched}
    loader = jit_hook.make_loader(pre, original, load_module, lambda: current["kdir"])
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0")
    for var in ("FP4SERIES_FORCE_ARCH", jit_hook.LOG_ENV, jit_hook.ACT_FALLBACK_ENV):
        monkeypatch.delenv(var, raising=False)
    return {"loader": loader, "calls": calls, "current": current, "patched": patched, "pin": pin}


def test_picks_module_dtype_and_tree_and_loads_once(setup: dict[str, Any]) -> None:
    load = setup["loader"]
    assert load("sgl_kernel_jit_gptq_marlin_bf16_t", cuda_sources=["x"]) == "module:p90.so"
    assert load("sgl_kernel_jit_gptq_marlin_bf16_t") == "module:p90.so"
    assert load("sgl_kernel_jit_gptq_marlin_fp16_t") == "module:p90h.so"
    setup["current"]["kdir"] = setup["pin"]
    assert load("sgl_kernel_jit_gptq_marlin_bf16_t") == "module:u90.so"
    assert setup["calls"] == {"compiled": [], "loaded": ["p90.so", "p90h.so", "u90.so"]}


def test_ptx_only_selects_the_compute75_build(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "7.5")
    monkeypatch.setenv("FP4SERIES_FORCE_ARCH", "compute_75")
    assert setup["loader"]("sgl_kernel_jit_gptq_marlin_fp16_t") == "module:p75.so"
    name = "sgl_kernel_jit_gptq_marlin_bf16_t"  # no compute_75 bf16: compile, never sm_90's
    assert setup["loader"](name) == f"compiled:{name}"


def test_no_match_compiles_loudly(
    setup: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(jit_hook.LOG_ENV, str(tmp_path / "hook.log"))
    setup["current"]["kdir"] = setup["pin"]
    name = "sgl_kernel_jit_gptq_marlin_fp16_t"  # only the patched tree has fp16
    assert setup["loader"](name) == f"compiled:{name}"
    assert "NO PREBUILT" in capsys.readouterr().err
    assert "COMPILING" in (tmp_path / "hook.log").read_text()


def test_edited_sources_never_get_a_stale_module_but_python_edits_do_not_matter(
    setup: dict[str, Any],
) -> None:
    kdir = setup["patched"]
    before = jit_hook.tree_hash(kdir)
    (kdir / "gptq_marlin.py").write_text("# edited")
    jit_hook._hash_cache.clear()
    assert jit_hook.tree_hash(kdir) == before
    (kdir / "csrc" / "gemm" / "marlin" / "marlin_template.h").write_text("patched body v2")
    jit_hook._hash_cache.clear()
    assert setup["loader"]("sgl_kernel_jit_gptq_marlin_bf16_t").startswith("compiled:")


def test_activation_falls_back_to_sgl_kernel_only_when_asked(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "sgl_kernel_jit_activation_fp16_t_true"  # not prebuilt
    assert setup["loader"](name) == f"compiled:{name}"
    monkeypatch.setenv(jit_hook.ACT_FALLBACK_ENV, "sgl_kernel")
    assert isinstance(setup["loader"](name), jit_hook.SglKernelActivation)
    assert setup["loader"]("sgl_kernel_jit_activation_bf16_t_true") == "module:act.so"
    with pytest.raises(ValueError, match="sgl_kernel fallback knows"):
        jit_hook.SglKernelActivation(name)._fn("relu2")


def test_without_a_manifest_only_the_fallback_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = jit_hook.make_loader(None, lambda name: f"compiled:{name}", str, Path)
    assert (
        loader("sgl_kernel_jit_gptq_marlin_bf16_t") == "compiled:sgl_kernel_jit_gptq_marlin_bf16_t"
    )
    monkeypatch.delenv(jit_hook.DIR_ENV, raising=False)
    monkeypatch.delenv(jit_hook.ACT_FALLBACK_ENV, raising=False)
    assert jit_hook.install() is False


def test_tree_without_known_jit_layout_compiles(
    setup: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_tree() -> Path:
        raise ImportError("No module named 'sglang.jit_kernel'")

    loader = jit_hook.make_loader(tmp_path / "prebuilt", lambda name: f"compiled:{name}", str,
                                  no_tree)  # fmt: skip
    assert loader("x") == "compiled:x"
    assert "cannot locate" in capsys.readouterr().err
