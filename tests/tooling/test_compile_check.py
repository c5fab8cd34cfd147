"""The compile check on both SGLang source layouts: the pin's ``jit_kernel/`` and the
``kernels/jit/`` + ``kernels/ops/`` of 0.5.17+ (0.5.23), discovered from the tree itself."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from _fakepin import compile_kwargs

from fp4series import compile_check
from fp4series.errors import SeriesError

WRAPPER = """from __future__ import annotations

import torch

from {utils} import cache_once, load_jit, make_cpp_args


@cache_once
def {loader}({params}):
    args = make_cpp_args(dtype)
    return load_jit(
        {name!r},
        *args,
        cuda_files=[{cuda!r}],
        cuda_wrappers=[("f", "f")],
    )
"""


def fake_0523(root: Path) -> Path:
    """A tree shaped like 0.5.23: kernels/jit/{csrc,include,utils/}, wrappers in kernels/ops/."""
    sg = root / "v0523" / "python" / "sglang"
    jit = sg / "kernels" / "jit"
    for sub in ("include/sgl_kernel", "csrc/gemm/marlin", "csrc/gemm/marlin_moe",
                "utils/compile"):  # fmt: skip
        (jit / sub).mkdir(parents=True, exist_ok=True)
    (jit / "__init__.py").write_text("")
    (jit / "utils" / "__init__.py").write_text(
        "from sglang.kernels.jit.utils.compile.loader import load_jit\n"
    )
    (jit / "utils" / "compile" / "loader.py").write_text("def load_jit(*args, **kw): ...\n")
    (jit / "include/sgl_kernel/utils.cuh").write_text("// utils\n")
    marlin, moe = jit / "csrc/gemm/marlin", jit / "csrc/gemm/marlin_moe"
    (marlin / "marlin.cuh").write_text("#include <sgl_kernel/utils.cuh>\n// helpers\n")
    (marlin / "marlin_template.h").write_text('#include "marlin.cuh"\n')
    (marlin / "gptq_marlin.cuh").write_text('#include "marlin_template.h"\n')
    (moe / "marlin_template.h").write_text(
        '#include "../marlin/marlin.cuh"\n'
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 750\n// shfl fallback\n#endif\n"
    )
    (moe / "moe_wna16_marlin.cuh").write_text('#include "marlin_template.h"\n')
    ops = sg / "kernels" / "ops"
    for sub, name, loader, params, cuda in (
        ("gemm", "gptq_marlin", "_jit_gptq_marlin_module", "dtype: torch.dtype",
         "gemm/marlin/gptq_marlin.cuh"),
        ("moe", "moe_wna16_marlin", "_jit_moe_wna16_marlin_module",
         "dtype: torch.dtype, is_ep: bool, has_bias: bool, expert_ids_are_sorted: bool = False",
         "gemm/marlin_moe/moe_wna16_marlin.cuh"),
    ):  # fmt: skip
        (ops / sub).mkdir(parents=True, exist_ok=True)
        (ops / sub / f"{name}.py").write_text(
            WRAPPER.format(
                utils="sglang.kernels.jit.utils", loader=loader, params=params, name=name, cuda=cuda
            )  # fmt: skip
        )
    # a benchmark that also calls load_jit("gptq_marlin") is not the wrapper
    (jit / "benchmark").mkdir()
    (jit / "benchmark" / "bench_gptq.py").write_text(
        "from sglang.kernels.jit.utils import load_jit\n"
        "def f():\n    return load_jit('gptq_marlin', cuda_files=['x.cuh'])\n"
    )
    return sg


def fake_pin(root: Path) -> Path:
    sg = root / "pin" / "python" / "sglang"
    jit = sg / "jit_kernel"
    for sub in ("include", "csrc/gemm/marlin", "csrc/gemm/marlin_moe"):
        (jit / sub).mkdir(parents=True, exist_ok=True)
    (jit / "utils.py").write_text("def load_jit(*args, **kw): ...\n")
    (jit / "csrc/gemm/marlin/gptq_marlin.cuh").write_text("// dense\n")
    (jit / "gptq_marlin.py").write_text(
        WRAPPER.format(
            utils="sglang.jit_kernel.utils",
            loader="_jit_gptq_marlin_module",
            params="dtype: torch.dtype",
            name="gptq_marlin",
            cuda="gemm/marlin/gptq_marlin.cuh",
        )  # fmt: skip
    )
    return sg


def test_discovers_the_0523_layout(tmp_path: Path) -> None:
    layout = compile_check.discover_layout(fake_0523(tmp_path))
    assert layout.root.name == "jit" and layout.root.parent.name == "kernels"
    dense, moe = layout.module("gptq_marlin"), layout.module("moe_wna16_marlin")
    assert (dense.py_module, dense.loader, dense.utils_module) == (
        "sglang.kernels.ops.gemm.gptq_marlin", "_jit_gptq_marlin_module",
        "sglang.kernels.jit.utils",
    )  # fmt: skip
    assert moe.py_module == "sglang.kernels.ops.moe.moe_wna16_marlin"
    assert moe.cuda_files == ("gemm/marlin_moe/moe_wna16_marlin.cuh",)
    # the MoE module is built from its folder plus the dense helpers it includes
    names = {p.relative_to(layout.csrc).as_posix() for p in layout.sources("moe_wna16_marlin")}
    assert names == {"gemm/marlin_moe/marlin_template.h", "gemm/marlin_moe/moe_wna16_marlin.cuh",
                     "gemm/marlin/marlin.cuh"}  # fmt: skip
    assert layout.module_path(dense.utils_module).is_dir()
    with pytest.raises(SeriesError, match="no JIT loader for module 'awq_marlin_repack'"):
        layout.module("awq_marlin_repack")


def test_discovers_the_pin_layout(tmp_path: Path) -> None:
    layout = compile_check.discover_layout(fake_pin(tmp_path))
    assert layout.root.name == "jit_kernel"
    dense = layout.module("gptq_marlin")
    assert (dense.py_module, dense.utils_module) == (
        "sglang.jit_kernel.gptq_marlin", "sglang.jit_kernel.utils",
    )  # fmt: skip
    assert layout.module_path(dense.utils_module).name == "utils.py"


def test_a_tree_without_a_jit_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    with pytest.raises(SeriesError, match="no single SGLang JIT kernel root"):
        compile_check.discover_layout(tmp_path / "sglang")


def test_upstream_0523_shuffle_fallback_is_not_a_turing_path(tmp_path: Path) -> None:
    sg = fake_0523(tmp_path)
    assert not compile_check.has_turing_path(sg)  # only `__CUDA_ARCH__ == 750`
    assert compile_check.select_targets(sg, None) == [
        compile_check.Target.parse(t) for t in compile_check.DEFAULT_TARGETS
    ]
    marlin = sg / "kernels/jit/csrc/gemm/marlin/marlin.cuh"
    marlin.write_text(marlin.read_text() + "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750\n")
    assert compile_check.has_turing_path(sg)
    names = [str(t) for t in compile_check.select_targets(sg, None)]
    assert names == [*compile_check.DEFAULT_TARGETS, *compile_check.TURING_TARGETS]


def test_keys_follow_the_include_closure(tmp_path: Path) -> None:
    sg = fake_0523(tmp_path)
    py, nvcc = Path("/nonexistent/python"), "/nonexistent/nvcc"
    dense = compile_check.Target.parse("gptq_marlin:fp16:sm_75")
    moe = compile_check.Target.parse("moe_wna16_marlin:fp16:sm_75")

    def keys() -> tuple[str, str]:
        return (compile_check.target_key(dense, sg, py, nvcc),
                compile_check.target_key(moe, sg, py, nvcc))  # fmt: skip

    k0 = keys()
    (sg / "kernels/jit/csrc/gemm/marlin_moe/marlin_template.h").write_text("// moe v2\n")
    k1 = keys()
    assert k1[0] == k0[0] and k1[1] != k0[1]  # not an input of the dense module
    (sg / "kernels/jit/csrc/gemm/marlin_moe/marlin_template.h").write_text(
        '#include "../marlin/marlin.cuh"\n'
    )
    k2 = keys()
    (sg / "kernels/jit/csrc/gemm/marlin/marlin.cuh").write_text("// helpers v2\n")
    k3 = keys()
    assert k3[0] != k2[0] and k3[1] != k2[1]  # included by both
    (sg / "kernels/jit/utils/compile/loader.py").write_text("def load_jit(*a, **k): return 1\n")
    k4 = keys()
    assert k4[0] != k3[0] and k4[1] != k3[1]  # the loader package decides the flags


def test_target_flags_and_dtype_less_modules() -> None:
    t = compile_check.Target.parse("moe_wna16_marlin:fp16:sm_75:expert_ids_are_sorted+has_bias")
    assert t.flags == ("expert_ids_are_sorted", "has_bias")
    assert t.name == "moe_wna16_marlin-fp16-sm_75-expert_ids_are_sorted+has_bias"
    assert str(compile_check.Target.parse(str(t))) == str(t)
    r = compile_check.Target.parse("gptq_marlin_repack:-:sm_75")
    assert r.name == "gptq_marlin_repack-nodtype-sm_75"
    with pytest.raises(SeriesError, match="bad loader flag"):
        compile_check.Target.parse("moe_wna16_marlin:fp16:sm_75:not-a-name")


def test_loader_arguments() -> None:
    dtype = object()

    def moe(dtype: torch.dtype, is_ep: bool, has_bias: bool,  # noqa: F821
            expert_ids_are_sorted: bool = False) -> None: ...  # fmt: skip

    assert compile_check._loader_args(moe, dtype, ()) == (
        [dtype], {"is_ep": False, "has_bias": False},
    )  # fmt: skip
    args, kwargs = compile_check._loader_args(moe, dtype, ("expert_ids_are_sorted",))
    assert kwargs == {"is_ep": False, "has_bias": False, "expert_ids_are_sorted": True}

    def repack() -> None: ...

    assert compile_check._loader_args(repack, None, ()) == ([], {})
    with pytest.raises(SystemExit, match="needs an activation dtype"):
        compile_check._loader_args(moe, None, ())
    with pytest.raises(SystemExit, match="no parameter"):
        compile_check._loader_args(moe, dtype, ("zero_inactive_output",))


def test_worker_gets_the_discovered_loader(tmp_path: Path, fake_tools: tuple[Path, Path]) -> None:
    sg = fake_0523(tmp_path)
    py, log = fake_tools
    targets = [compile_check.Target.parse("moe_wna16_marlin:fp16:sm_75:expert_ids_are_sorted")]
    kw = compile_kwargs(tmp_path, py, sg)
    assert [r.status for r in compile_check.run_compile_checks(targets, **kw)] == ["built"]
    call = log.read_text()
    assert "worker --module moe_wna16_marlin --dtype fp16 --arch sm_75" in call
    assert "--py-module sglang.kernels.ops.moe.moe_wna16_marlin" in call
    assert "--loader _jit_moe_wna16_marlin_module --utils-module sglang.kernels.jit.utils" in call
    assert "--flag expert_ids_are_sorted" in call
    assert [r.status for r in compile_check.run_compile_checks(targets, **kw)] == ["cached"]
    with pytest.raises(SeriesError, match="no JIT loader"):
        compile_check.run_compile_checks(
            [compile_check.Target.parse("awq_marlin_repack:-:sm_75")], **kw
        )


# ------------------------------------------------------------------------ kernel sets (@fp4)

DENSE_DISPATCH = r"""#include "marlin_template.h"
#define _GET_IF(W, M, N, K, M8, G, T, Z) else if (q_type == W) { kernel = Marlin<W.id(), M>; }
#define TWO_GET_IF(W) _GET_IF(W, 1, 8, 8, true, G1, 256, false) \
  _GET_IF(W, 2, 8, 8, false, G1, 256, false)

template <typename scalar_t>
MarlinFuncPtr get_marlin_kernel_impl(const host::ScalarType q_type) {
  auto kernel = MarlinDefault;
  if (false) {
  }
  TWO_GET_IF(host::kU4B8)
  TWO_GET_IF(host::kFE2M1f)
  return kernel;
}
"""


def test_kernel_set_targets_parse_and_name() -> None:
    t = compile_check.Target.parse("gptq_marlin@fp4:fp16:sm_75")
    assert (t.module, t.kernels, t.dtype, t.arch) == ("gptq_marlin", "fp4", "fp16", "sm_75")
    assert str(t) == "gptq_marlin@fp4:fp16:sm_75" and t.name == "gptq_marlin@fp4-fp16-sm_75"
    assert compile_check.Target.parse(str(t)) == t
    assert compile_check.Target.parse("gptq_marlin:fp16:sm_75").kernels is None
    with pytest.raises(SeriesError, match="unknown kernel set 'int4'") as e:
        compile_check.Target.parse("gptq_marlin@int4:fp16:sm_75")
    assert "@fp4" in e.value.hint
    with pytest.raises(SeriesError, match="gptq_marlin_repack has no kernel dispatch"):
        compile_check.Target.parse("gptq_marlin_repack@fp4:-:sm_75")


def test_the_default_gemm_targets_are_fp4_and_full_builds_whole_modules(tmp_path: Path) -> None:
    sg = fake_0523(tmp_path)
    marlin = sg / "kernels/jit/csrc/gemm/marlin/marlin.cuh"
    marlin.write_text(marlin.read_text() + "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750\n")
    targets = compile_check.select_targets(sg, None)
    gemm = [t for t in targets if t.module in compile_check.GEMM_MODULES]
    assert gemm and all(t.kernels == ("fp4v" if t.arch == "sm_75" else "fp4") for t in gemm)
    assert {t.arch for t in gemm} == {"sm_75", "sm_80", "sm_90"}
    assert all(t.kernels is None for t in targets if t.module not in compile_check.GEMM_MODULES)
    full = compile_check.select_targets(sg, "full")
    assert [str(t) for t in full] == [str(t).split("@")[0] + ":" + str(t).split(":", 1)[1]
                                      if "@" in str(t) else str(t) for t in targets]  # fmt: skip


def test_an_fp4_target_builds_the_reduced_source_and_has_its_own_stamp(
    tmp_path: Path, fake_tools: tuple[Path, Path]
) -> None:
    sg = fake_0523(tmp_path)
    dense = sg / "kernels/jit/csrc/gemm/marlin/gptq_marlin.cuh"
    dense.write_text(DENSE_DISPATCH)
    py, log = fake_tools
    kw = compile_kwargs(tmp_path, py, sg)
    fp4 = compile_check.Target.parse("gptq_marlin@fp4:fp16:sm_75")
    (r,) = compile_check.run_compile_checks([fp4], **kw)
    assert r.status == "built" and r.kernels == "2 of 4 dispatch kernels (kFE2M1f)"
    staged = tmp_path / "jit" / fp4.name / "reduced" / "gemm/marlin/gptq_marlin.cuh"
    assert f"--cuda-file gemm/marlin/gptq_marlin.cuh={staged.resolve()}" in log.read_text()
    assert "not built: TWO_GET_IF(host::kU4B8)" in staged.read_text()
    assert "  TWO_GET_IF(host::kFE2M1f)\n" in staged.read_text()
    stamp = json.loads((tmp_path / "cache" / f"{fp4.name}.stamp").read_text().splitlines()[1])
    assert stamp["kernels"] == r.kernels
    # the full module is another target: its own build, no --cuda-file
    full = compile_check.Target.parse("gptq_marlin:fp16:sm_75")
    nvcc = str(tmp_path / "nvcc")  # the fake one (conftest's fake_tools)
    assert compile_check.target_key(full, sg, py, nvcc) != compile_check.target_key(
        fp4, sg, py, nvcc
    )
    assert [r.status for r in compile_check.run_compile_checks([fp4, full], **kw)] == [
        "cached", "built",
    ]  # fmt: skip
    assert log.read_text().splitlines()[-1].count("--cuda-file") == 0
    # a dispatch the reduction cannot read fails that target with the way out, builds nothing
    dense.write_text(DENSE_DISPATCH.replace("get_marlin_kernel_impl", "pick"))
    (r,) = compile_check.run_compile_checks([fp4], **kw)
    assert r.status == "failed" and "no CUDA source of gptq_marlin" in r.detail
    assert "gptq_marlin:fp16:sm_75" in r.detail
    assert log.read_text().count(" worker ") == 2


def test_the_worker_hands_the_reduced_source_to_load_jit() -> None:
    calls: list[list[str]] = []
    wrapper = types.SimpleNamespace(load_jit=lambda *a, cuda_files=None, **k: calls.append(
        cuda_files))  # fmt: skip
    swaps = compile_check._swap_cuda_files(wrapper, ["gemm/marlin/gptq_marlin.cuh=/b/r.cuh"])
    wrapper.load_jit("gptq_marlin", cuda_files=["gemm/marlin/gptq_marlin.cuh", "x.cuh"])
    assert calls == [["/b/r.cuh", "x.cuh"]] and swaps.used == {"gemm/marlin/gptq_marlin.cuh"}
    with pytest.raises(SystemExit, match="no module-level load_jit"):
        compile_check._swap_cuda_files(types.SimpleNamespace(), ["a=b"])
