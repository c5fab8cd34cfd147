"""The Marlin kernel dispatch read from its source and reduced to the FP4 kernels: what the
compile check's ``MODULE@fp4`` targets build instead of the whole module."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp4series import marlin_dispatch as md
from fp4series.errors import SeriesError

FP4 = md.KERNEL_SETS["fp4"]

# The shape of the pin's gptq_marlin.cuh dispatch, small: a leaf macro over continuation lines,
# per-type macros built from it, FP4 between the others, a dtype-guarded block, comments.
DISPATCH = r"""
#include "kernel.h"
#include <sgl_kernel/tensor.h>

#define _GET_IF(                                                              \
    W_TYPE, THREAD_M_BLOCKS, THREAD_N_BLOCKS, THREAD_K_BLOCKS, M_BLOCK_SIZE_8, \
    GROUP_BLOCKS, NUM_THREADS, IS_ZP_FLOAT)                                    \
  else if (q_type == W_TYPE && thread_m_blocks == THREAD_M_BLOCKS) {           \
    kernel = Marlin<scalar_t, W_TYPE.id(), NUM_THREADS, THREAD_M_BLOCKS,       \
        THREAD_N_BLOCKS, THREAD_K_BLOCKS, M_BLOCK_SIZE_8, pipe_stages,         \
        GROUP_BLOCKS, IS_ZP_FLOAT>;                                            \
  }

#define COMMON_GET_IF_M1(W_TYPE, N_BLOCKS, K_BLOCKS, NUM_THREADS)      \
  _GET_IF(W_TYPE, 1, N_BLOCKS, K_BLOCKS, true, -1, NUM_THREADS, false) \
  _GET_IF(W_TYPE, 1, N_BLOCKS, K_BLOCKS, false, 4, NUM_THREADS, false)

#define COMMON_GET_IF(W_TYPE)         \
  COMMON_GET_IF_M1(W_TYPE, 8, 8, 256) \
  COMMON_GET_IF_M1(W_TYPE, 8, 4, 128)

#define FP4_GET_IF_M1(W_TYPE, N_BLOCKS, K_BLOCKS, NUM_THREADS)        \
  _GET_IF(W_TYPE, 1, N_BLOCKS, K_BLOCKS, true, 1, NUM_THREADS, false) \
  _GET_IF(W_TYPE, 1, N_BLOCKS, K_BLOCKS, false, 1, NUM_THREADS, false)

#define FP4_GET_IF_M234(W_TYPE, N_BLOCKS, K_BLOCKS, NUM_THREADS)       \
  _GET_IF(W_TYPE, 2, N_BLOCKS, K_BLOCKS, false, 1, NUM_THREADS, false) \
  _GET_IF(W_TYPE, 3, N_BLOCKS, K_BLOCKS, false, 1, NUM_THREADS, false)

#define FP4_GET_IF(W_TYPE)            \
  FP4_GET_IF_M1(W_TYPE, 8, 8, 256)    \
  FP4_GET_IF_M234(W_TYPE, 16, 4, 256)

template <typename scalar_t>
MarlinFuncPtr get_marlin_kernel_impl(const host::ScalarType q_type, int thread_m_blocks) {
  auto kernel = MarlinDefault;
  if (false) {
  }

  COMMON_GET_IF(host::kU4)
  COMMON_GET_IF(host::kU4B8)  // GPTQ

  FP4_GET_IF(host::kFE2M1f)
  /* FP4_GET_IF(host::kFE2M1f) in a comment is not a kernel */

  if (std::is_same<scalar_t, half>::value) {
    if (false) {
    }
    COMMON_GET_IF(host::kU8B128)
  }
  return kernel;
}

template <typename scalar_t>
MarlinFuncPtr get_marlin_kernel(const host::ScalarType q_type, int thread_m_blocks) {
  return get_marlin_kernel_impl<scalar_t>(q_type, thread_m_blocks);
}
"""


def test_the_dispatch_lists_every_kernel_it_instantiates() -> None:
    kernels = md.dispatch_kernels(DISPATCH)
    by_type = {t: sum(k.w_type == t for k in kernels) for t in ("kU4", "kU4B8", "kU8B128")}
    assert by_type == {"kU4": 4, "kU4B8": 4, "kU8B128": 4}
    fp4 = [k for k in kernels if k.w_type == "kFE2M1f"]
    assert len(fp4) == 4  # the commented-out invocation is not counted
    assert str(fp4[0]) == "_GET_IF(kFE2M1f, 1, 8, 8, true, 1, 256, false)"
    assert {(k.m_blocks, k.n_blocks, k.group_blocks) for k in fp4} == {
        ("1", "8", "1"), ("2", "16", "1"), ("3", "16", "1"),
    }  # fmt: skip


def test_the_reduced_dispatch_keeps_every_fp4_kernel_and_nothing_else() -> None:
    red = md.reduce_source(DISPATCH, FP4)
    assert sorted(red.kept) == sorted(k for k in md.dispatch_kernels(DISPATCH)
                                      if k.w_type == "kFE2M1f")  # fmt: skip
    assert len(red.dropped) == 12 and red.summary(FP4) == "4 of 16 dispatch kernels (kFE2M1f)"
    assert "COMMON_GET_IF(host::kU4)\n" not in red.text
    assert "not built: COMMON_GET_IF(host::kU8B128)" in red.text
    # the else-if chains stay well formed: every `if (false) {}` head is kept
    assert red.text.count("if (false) {") == 2
    # outside the dispatch nothing changes
    head = DISPATCH.split("template <typename scalar_t>")[0]
    assert red.text.startswith(head) and red.text.endswith(DISPATCH[DISPATCH.rindex("template") :])


def test_a_reduction_that_loses_an_fp4_kernel_is_refused() -> None:
    """The check that guards every @fp4 build: drop one FP4 instantiation and it fails."""
    reduced = md.reduce_source(DISPATCH, FP4).text
    md.verify_reduction(DISPATCH, reduced, FP4)
    lost_one = reduced.replace(
        "  FP4_GET_IF(host::kFE2M1f)\n",
        "  FP4_GET_IF_M1(host::kFE2M1f, 8, 8, 256)\n",  # the M234 half is gone
    )
    assert lost_one != reduced
    with pytest.raises(SeriesError, match=r"builds 2 of the 4 kFE2M1f kernel\(s\).*lost: "
                       r"_GET_IF\(kFE2M1f, 2, 16, 4, false, 1, 256, false\)"):  # fmt: skip
        md.verify_reduction(DISPATCH, lost_one, FP4)
    with pytest.raises(SeriesError, match="builds 0 of the 0 kFE4M3fn"):
        md.reduce_source(DISPATCH, ("kFE4M3fn",))  # a set the module has no kernel of


def test_a_mixed_statement_is_kept_whole() -> None:
    mixed = DISPATCH.replace(
        "#define FP4_GET_IF(W_TYPE)            \\\n",
        "#define FP4_GET_IF(W_TYPE)            \\\n  COMMON_GET_IF_M1(host::kU4, 4, 8, 128) \\\n",
    )
    red = md.reduce_source(mixed, FP4)
    assert "  FP4_GET_IF(host::kFE2M1f)\n" in red.text
    assert sum(k.w_type == "kU4" for k in red.kept) == 2  # built along, never lost


def test_a_dispatch_of_another_shape_is_refused_with_a_way_out() -> None:
    with pytest.raises(SeriesError, match="found 0 definitions of get_marlin_kernel_impl") as e:
        md.dispatch_kernels(DISPATCH.replace("get_marlin_kernel_impl", "pick_kernel"))
    assert "without @SET" in e.value.hint
    leaf = "_GET_IF(W_TYPE, 1, N_BLOCKS, K_BLOCKS, true, 1, NUM_THREADS, false)"
    seven = DISPATCH.replace(leaf, leaf.replace(", false)", ")"))
    with pytest.raises(SeriesError, match="_GET_IF with 7 arguments"):
        md.dispatch_kernels(seven)


def test_the_dispatch_of_upstream_and_of_a_line_that_wraps_it() -> None:
    """Upstream from 0.5.17 (bare v0.5.23) names its dispatch get_marlin_kernel; the 0.5.23
    line's Turing patch renames it get_marlin_kernel_impl and wraps it in a per-arch
    get_marlin_kernel that instantiates nothing itself: either way the same kernels."""
    want = md.dispatch_kernels(DISPATCH)
    upstream = DISPATCH.replace("get_marlin_kernel_impl", "get_marlin_kernel")
    assert md.has_dispatch(upstream) and md.dispatch_kernels(upstream) == want
    assert sorted(md.reduce_source(upstream, FP4).kept) == sorted(
        k for k in want if k.w_type == "kFE2M1f"
    )
    wrapper = """
template <typename scalar_t>
MarlinFuncPtr get_marlin_kernel(const host::ScalarType q_type, int thread_m_blocks) {
  if constexpr (marlin_arch_supports_dtype<scalar_t>()) {
    return get_marlin_kernel_impl<scalar_t>(q_type, thread_m_blocks);
  } else {
    return MarlinDefault;
  }
}
"""
    assert md.dispatch_kernels(DISPATCH + wrapper) == want
    assert not md.has_dispatch("int main() { return get_marlin_kernel(1); }")


def test_the_staged_copy_includes_the_original_headers(tmp_path: Path) -> None:
    src = tmp_path / "tree" / "gemm" / "marlin"
    src.mkdir(parents=True)
    (src / "kernel.h").write_text("// kernel\n")
    (src / "gptq_marlin.cuh").write_text(DISPATCH)
    dest = tmp_path / "build" / "reduced" / "gemm" / "marlin" / "gptq_marlin.cuh"
    red = md.write_reduced(src / "gptq_marlin.cuh", dest, FP4)
    text = dest.read_text()
    assert f'#include "{(src / "kernel.h").resolve()}"' in text
    assert "#include <sgl_kernel/tensor.h>" in text  # found through -I as before
    assert "4 of 16 dispatch kernels" in text.splitlines()[1] and len(red.kept) == 4


def _real_dispatch_sources() -> list[Path]:
    """The GEMM modules' dispatch sources of the checkouts the main job made, where present."""
    root = Path(__file__).resolve().parents[2]
    trees = [root / ".work" / "checkout", *sorted((root / ".work" / "lines").glob("*/checkout"))]
    found = []
    for tree in trees:
        for rel in ("gemm/marlin/gptq_marlin.cuh", "gemm/marlin_moe/moe_wna16_marlin.cuh"):
            found += sorted(tree.glob(f"python/sglang/*/csrc/{rel}"))
            found += sorted(tree.glob(f"python/sglang/*/*/csrc/{rel}"))
    return found


@pytest.mark.parametrize("source", _real_dispatch_sources() or [None], ids=str)
def test_the_patched_templates_reduce_to_all_their_fp4_kernels(source: Path | None) -> None:
    """On the real patched trees (the pin's and every line's checkout): the @fp4 build keeps
    every float4_e2m1f kernel the module's dispatch defines, NVFP4 and MXFP4, and builds
    no more than a tenth of the module."""
    if source is None:
        pytest.skip("no checkout under .work (scripts/main.sh makes them)")
    text = source.read_text()
    full = md.dispatch_kernels(text)
    red = md.reduce_source(text, FP4)
    fp4 = [k for k in full if k.w_type == "kFE2M1f"]
    assert sorted(red.kept) == sorted(fp4)
    assert {k.group_blocks for k in fp4} >= {"1"}  # NVFP4 (16-element FP8 scales)
    if "marlin_moe" in source.parts:
        assert {k.group_blocks for k in fp4} == {"1", "2"}  # + MXFP4 (E8M0 scales)
    assert len(red.kept) * 8 < len(full)


def _bare_release_sources() -> list[Path]:
    """The dispatch sources of materialized bare releases of the kernels/jit layout."""
    root = Path(__file__).resolve().parents[2]
    return sorted((root / ".work" / "upstream").glob(
        "*/python/sglang/kernels/jit/csrc/gemm/marlin*/*_marlin.cuh"))  # fmt: skip


@pytest.mark.parametrize("source", _bare_release_sources() or [None], ids=str)
def test_a_bare_release_reduces_to_all_its_fp4_kernels(source: Path | None) -> None:
    """What a line's GPU proof builds for its bare release (the repro) with --kernel-set fp4."""
    if source is None:
        pytest.skip("no bare release of the kernels/ layout under .work/upstream")
    text = source.read_text()
    red = md.reduce_source(text, FP4)
    assert sorted(red.kept) == sorted(k for k in md.dispatch_kernels(text) if k.w_type == "kFE2M1f")
    assert red.kept and not red.variants


def test_the_variant_set_adds_one_kernel_of_every_other_variant() -> None:
    red = md.reduce_source(DISPATCH, FP4, variants=True)
    others = [k for k in red.kept if k.w_type != "kFE2M1f"]
    # kU4, kU4B8, kU8B128 each with (group -1, m8 true) and (group 4, m8 false)
    assert len(others) == 6 and len({k.variant for k in others}) == 6
    assert " _GET_IF(host::kU4, 1, 8, 8, true, -1, 256, false)" in red.text
    assert sum(k.w_type == "kFE2M1f" for k in red.kept) == 4
    # a reduction that loses a variant is refused
    lost = red.text.replace(" _GET_IF(host::kU8B128, 1, 8, 8, false, 4, 256, false)", "")
    assert lost != red.text
    with pytest.raises(SeriesError, match="no kernel of 1 variant"):
        md.verify_reduction(DISPATCH, lost, FP4, variants=True)
