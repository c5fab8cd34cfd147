"""The bug each kernel patch fixes, and the SM75 path, each under its own JIT variant.

* Repro: the series' host preprocessing (patched python tree) against the pin's UNPATCHED
  Marlin templates. Expected to fail: dense rel L2 ~1.25 on the H200 (legacy scale layout),
  MoE non-finite output (legacy layout and FP8 scale dequant compiled out). The errors are
  recorded in numerics.json as ``templates: unpatched`` cases; they are the evidence patches 1
  and 2 cite.
* A line's repro: the bare release the line is made on (e.g. v0.5.23), the same layers and
  reference, fp16 and bf16, recorded as ``templates: upstream`` beside the line's cases. Its
  dense layers with a bias as large as the output must fail (rel L2 >= 0.5: the bias is added
  in Marlin's permuted order, the line's patch 1); its fused shards with their own global
  scales are recorded as served or refused (the line's patch 6), not gated.
* Turing: the patched templates built as compute_75 PTX only, run on this GPU through the
  driver's PTX JIT (``__CUDA_ARCH__ == 750``), fp16, dense and MoE, within 1e-2; written to
  turing_ptx.json. "not run" (with the reason) when the series does not enable SM75.

A JIT variant cannot share a process with another (``cache_once`` module factories), so each
runs test_marlin_numerics.py as a worker process (_jitenv.py), started by conftest right after
collection so that it overlaps the main session.
"""

from __future__ import annotations

import os
from typing import Any

import _jitenv
import pytest

from fp4series.report import (
    GATED_FIELDS,
    UNPATCHED_MIN_REL_L2,
    UPSTREAM_BIAS_MIN_REL_L2,
    max_rel_l2,
)


@pytest.mark.gpu
def test_unpatched_templates_fail(gpu_report: Any) -> None:
    env, why = _jitenv.unpatched_env()
    if env is None:
        pytest.skip(why)
    result = _jitenv.worker_result("repro", env)
    cases = result["cases"]
    assert cases, "repro worker produced no cases"
    for case in cases:
        case["templates"] = "unpatched"
        case["expect"] = "fail"
    gpu_report.add_cases(cases)
    gpu_report.extra["repro_variant"] = result.get("variant")
    tree = env["PYTHONPATH"].split(os.pathsep)[0]
    assert os.path.samefile(result["variant"]["sglang_tree"], tree), "worker used another tree"
    # None: an exception (crashed) or a non-finite output (garbage: fails as expected)
    crashed = [c for c in cases if c.get("rel_l2") is None and not c.get("nonfinite_outputs")]
    computed = [c for c in cases if c.get("rel_l2") is not None]
    passing = [c for c in computed if c["rel_l2"] <= UNPATCHED_MIN_REL_L2]
    assert not crashed, f"repro cases crashed instead of computing: {crashed}"
    assert not passing, (
        "the pin's templates gave correct results with the series' preprocessing; the kernel "
        f"patches would be unnecessary: {passing}"
    )


@pytest.mark.gpu
def test_bare_release_repro(gpu_report: Any) -> None:
    env, why = _jitenv.upstream_env()
    if env is None:
        pytest.skip(why)
    result = _jitenv.worker_result("upstream", env)
    cases, fused = result["cases"], result.get("fused_shards", [])
    assert cases, "upstream worker produced no cases"
    for case in [*cases, *fused]:
        case["templates"] = "upstream"
    gpu_report.add_cases(cases)
    gpu_report.extra.setdefault("fused_shards", []).extend(fused)
    gpu_report.extra["upstream_variant"] = result.get("variant")
    tree = env["PYTHONPATH"].split(os.pathsep)[0]
    assert os.path.samefile(result["variant"]["sglang_tree"], tree), "worker used another tree"
    crashed = [c for c in cases if c.get("error")]
    assert not crashed, f"the bare release's cases crashed instead of computing: {crashed}"
    strong = [c for c in cases if c.get("bias") and c.get("bias_scale")]
    assert strong, "no strong-bias case ran on the bare release"
    right = [c for c in strong
             if c.get("rel_l2") is not None and c["rel_l2"] < UPSTREAM_BIAS_MIN_REL_L2]  # fmt: skip
    assert not right, (
        "the bare release adds a large bias correctly; the line's bias patch would be "
        f"unnecessary: {right}"
    )


@pytest.mark.gpu
def test_turing_compute75_ptx(gpu_report: Any) -> None:
    enabled, why = _jitenv.turing_enabled()
    if not enabled:
        gpu_report.set_turing("not run", why)
        pytest.skip(why)
    result = _jitenv.worker_result("turing", _jitenv.c75_env())
    cases = result["cases"]
    for case in cases:
        case["arch"] = "compute_75"
    gpu_report.set_turing("ran", cases=cases)

    def bad(c: dict[str, Any]) -> bool:
        return c.get("rel_l2") is None or any(
            c[f] is None or c[f] > max_rel_l2(c, f) for f in GATED_FIELDS if f in c
        )

    failing = [c for c in cases if bad(c)]
    assert cases and not failing, f"compute_75 PTX path failed: {failing}"
