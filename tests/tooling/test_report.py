"""check-reports: schema and threshold checks of the committed GPU reports."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fp4series import report
from fp4series.cli import main
from fp4series.commands import check_reports
from fp4series.errors import SeriesError

META: dict[str, Any] = {
    "command": "scripts/gpu-proof.sh",
    "series_revision": {"git": "69c8b78-dirty", "series_sha256": "ab" * 32},
    "pin": {"tag": "v0.5.11", "version": "0.5.11", "wheel_sha256": "fe07" * 16},
    "device": "NVIDIA H200",
    "torch": "2.11.0+cu130",
    "date": "2026-11-30T00:00:00+00:00",
}


def _case(path: str, dtype: str, templates: str = "patched", rel: float = 3e-3) -> dict[str, Any]:
    case: dict[str, Any] = {
        "path": path,
        "dtype": dtype,
        "m": 16,
        "n": 4096,
        "k": 4096,
        "bias": False,
        "templates": templates,
        "rel_l2": rel,
    }
    if path.endswith("moe"):
        case.update(e=8, topk=2, n=1408, k=2048)
        if dtype == "bfloat16":
            case["rel_l2_no_atomic_add"] = rel
    return case


def _numerics() -> dict[str, Any]:
    cases = [_case(p, d) for p in report.PATHS for d in report.DTYPES]
    cases += [_case("modelopt-dense", "bfloat16", "unpatched", 0.67)]
    cases += [_case("ct-moe", "bfloat16", "unpatched", 1.3)]
    return {
        **META,
        "cases": cases,
        "tracing": [
            {"name": "cuda_graph", "passed": True},
            {"name": "torch_compile", "passed": True},
        ],
        "turing_ptx": {"status": "ran"},
        "marlin_epilogue": [{"dtype": "bfloat16", "m": 1, "bit_equal": True}],
        "fused_shards": _fused_shards(),
        "tensor_parallel": _tensor_parallel(),
    }


def _fused_shards() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in report.DENSE_PATHS:
        for layer in report.FUSED_LAYERS:
            for dtype in report.DTYPES:
                for ratio in report.FUSED_RATIOS:
                    cases.append(
                        {"path": path, "layer": layer, "dtype": dtype, "ratio": ratio,
                         "outcome": "served", "m": 33, "n": 6144, "k": 4096, "rel_l2": 3e-3,
                         "rel_l2_per_shard": [3e-3, 4e-3, 3e-3]}
                    )  # fmt: skip
    for path in report.MOE_PATHS:
        for dtype in report.DTYPES:
            for ratio in report.FUSED_RATIOS:
                cases.append(
                    {"path": path, "layer": "moe_w13", "dtype": dtype, "ratio": ratio,
                     "outcome": "served", "m": 33, "rel_l2": 5e-3}
                )  # fmt: skip
            cases.append(
                {"path": path, "layer": "moe_w13", "dtype": dtype, "ratio": 1e-5,
                 "outcome": "refused",
                 "error": "expert 0 (w1 global scale 0.0002, w3 global scale 2e-09): ..."}
            )  # fmt: skip
    return cases


def _conformance() -> dict[str, Any]:
    gptq = "sglang/jit_kernel/tests/test_gptq_marlin.py"
    moe = "sglang/jit_kernel/tests/test_moe_wna16_marlin.py"
    tests = [
        {"id": f"{gptq}::{name}[{p}]", "status": "pass"}
        for name in report.CONFORMANCE_REQUIRED
        for p in ("dtype0", "dtype1")
    ]
    tests.append(
        {"id": f"{moe}::test_fused_marlin_moe_nvfp4_non_gated_matches_dequant_reference",
         "status": "not-applicable", "needs": "fused_marlin_moe(is_gated=, activation=)"}
    )  # fmt: skip
    return {
        **META,
        "upstream": {"version": "0.5.13", "wheel": "sglang-0.5.13-x.whl", "sha256": "9d" * 32},
        "edits": [{"file": gptq, "line": 118, "kind": "skip", "removed": "@pytest.mark.skip"}],
        "tests": tests,
    }


def _turing() -> dict[str, Any]:
    cases = [dict(_case(p, "float16"), arch="compute_75") for p in ("modelopt-dense", "ct-moe")]
    return {**META, "arch": "compute_75", "cases": cases}


def _bench() -> dict[str, Any]:
    rows = []
    for m in report.BENCH_MS:
        roof = 3.3 + m * 0.01
        rows.append(
            {"shape": "qkv_8b", "kind": "dense", "m": m, "n": 6144, "k": 4096, "fp4_us": roof * 3,
             "bf16_us": 15.0, "int4_us": roof * 2.5, "roofline_us": roof, "upstream_fp4_us": 14.0,
             "dispatch_us": roof * 3, "dispatch_path": "marlin", "dequant_us": None,
             "fp8_us": roof * 2}
        )  # fmt: skip
    return {**META, "copy_bandwidth_tb_s": 4.25, "rows": rows}


def _write(
    tmp_path: Path,
    numerics: Any = None,
    bench: Any = None,
    turing: Any = "default",
    conformance: Any = "default",
) -> Path:
    (tmp_path / "numerics.json").write_text(json.dumps(numerics or _numerics()))
    (tmp_path / "bench.json").write_text(json.dumps(bench or _bench()))
    if conformance == "default":
        conformance = _conformance()
    if conformance is not None:
        (tmp_path / "conformance.json").write_text(json.dumps(conformance))
    if turing == "default":
        turing = _turing()
    if turing is not None:
        (tmp_path / "turing_ptx.json").write_text(json.dumps(turing))
    return tmp_path


def test_valid_reports_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path)
    assert report.check_report_dir(tmp_path) == []
    assert main(["check-reports", "--dir", str(tmp_path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_patched_case_over_threshold_fails(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["cases"][3]["rel_l2"] = 0.02
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert len(problems) == 1 and "2.000e-02 > 1.0e-02" in problems[0]


def test_small_scale_rows_are_checked_too(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["cases"][1]["rel_l2_small_scales"] = 0.5
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert any("rel_l2_small_scales" in p for p in problems)


def _bf16_moe(numerics: dict[str, Any]) -> dict[str, Any]:
    return next(
        c for c in numerics["cases"]
        if c["path"] == "ct-moe" and c["dtype"] == "bfloat16" and c["templates"] == "patched"
    )  # fmt: skip


def test_bf16_moe_gate_allows_atomic_reduce_but_not_the_series_error(tmp_path: Path) -> None:
    numerics = _numerics()
    _bf16_moe(numerics)["rel_l2"] = 1.2e-2  # upstream's bf16 atomicAdd split-K: 1.5e-2 gate
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == []
    _bf16_moe(numerics)["rel_l2"] = 1.6e-2
    _bf16_moe(numerics)["rel_l2_no_atomic_add"] = 1.1e-2  # the series' own: 1e-2 gate
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert len(problems) == 2
    assert "rel_l2 1.600e-02 > 1.5e-02" in problems[0]
    assert "rel_l2_no_atomic_add 1.100e-02 > 1.0e-02" in problems[1]
    del _bf16_moe(numerics)["rel_l2_no_atomic_add"]
    _bf16_moe(numerics)["rel_l2"] = 8e-3
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert len(problems) == 1 and "needs rel_l2_no_atomic_add" in problems[0]


def test_repro_with_non_finite_output_fails_as_expected(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["cases"][-1].update(rel_l2=None, nonfinite_outputs=2048)
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == []
    numerics["cases"][-1]["nonfinite_outputs"] = 0  # None without garbage: the run failed
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert len(problems) == 1 and "run failed" in problems[0]


def test_unpatched_repro_must_fail(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["cases"][-2]["rel_l2"] = 3e-3  # the pin's templates "passing" is a broken repro
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert any("should fail" in p for p in problems)


def test_failed_run_is_not_a_pass(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["cases"][0]["rel_l2"] = None  # inf/NaN are stored as null
    numerics["cases"][-1]["rel_l2"] = None
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert sum("run failed" in p for p in problems) == 2


@pytest.mark.parametrize("field", report.META_FIELDS)
def test_missing_metadata_field(tmp_path: Path, field: str) -> None:
    numerics = _numerics()
    del numerics[field]
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert any(f"missing top-level field {field!r}" in p for p in problems)


def test_missing_case_fields_and_coverage(tmp_path: Path) -> None:
    numerics = _numerics()
    del numerics["cases"][0]["bias"]  # modelopt-dense float16: no longer usable
    numerics["cases"][2]["e"] = 0
    numerics["cases"] = [c for c in numerics["cases"] if c["templates"] == "patched"]
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    text = "\n".join(problems)
    assert "bias must be true/false" in text
    assert "no patched case for modelopt-dense float16" in text
    assert "no unpatched-template repro case for dense" in text
    assert "no unpatched-template repro case for moe" in text


def test_tracing_must_pass(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["tracing"][1]["passed"] = False
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert problems == ["numerics.json: tracing check 'torch_compile' did not pass"]


def test_further_tracing_checks_and_prefill_dequant_must_pass(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["tracing"].append({"name": "cuda_graph_m1024", "passed": True})
    numerics["prefill_dequant"] = [{"dtype": "bfloat16", "bit_equal": True}]
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == []
    numerics["tracing"][-1]["passed"] = False
    numerics["prefill_dequant"].append({"dtype": "float16", "bit_equal": False})
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert problems == [
        "numerics.json: tracing check 'cuda_graph_m1024' did not pass",
        "numerics.json: prefill dequant not bit-equal to the checkpoint: "
        "{'dtype': 'float16', 'bit_equal': False}",
    ]


def test_marlin_epilogue_records_must_be_there_and_bit_equal(tmp_path: Path) -> None:
    numerics = _numerics()
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == []
    numerics["marlin_epilogue"].append({"dtype": "float16", "m": 33, "bit_equal": False})
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert problems == [
        "numerics.json: Marlin epilogue not bit-equal to the float32 ops: "
        "{'dtype': 'float16', 'm': 33, 'bit_equal': False}"
    ]
    del numerics["marlin_epilogue"]
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert problems == ["numerics.json: no marlin_epilogue records (the kernel after Marlin)"]


def test_the_dequant_path_needs_its_own_proof(tmp_path: Path) -> None:
    numerics = _numerics()
    dense = next(c for c in numerics["cases"] if c["templates"] == "patched")
    dense["gemm"] = "dequant+cublas"
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert problems == [
        "numerics.json: dense cases ran the dequant path, but no prefill_dequant",
        "numerics.json: dense cases ran the dequant path, but no 'cuda_graph_m1024'",
        "numerics.json: dense cases ran the dequant path, but no 'torch_compile_m1024'",
    ]
    numerics["prefill_dequant"] = [{"dtype": "bfloat16", "bit_equal": True}]
    numerics["tracing"] += [{"name": n, "passed": True} for n in report.PREFILL_TRACING_CHECKS]
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == []


def test_turing_missing_needs_not_run_reason(tmp_path: Path) -> None:
    numerics = _numerics()
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics, turing=None))
    assert any("turing_ptx.json: missing" in p for p in problems)
    numerics["turing_ptx"] = {"status": "not run", "reason": "patch 9 not in the series yet"}
    assert report.check_report_dir(_write(tmp_path, numerics=numerics, turing=None)) == []


def test_turing_cases_checked(tmp_path: Path) -> None:
    turing = _turing()
    turing["cases"][0]["arch"] = "sm_90"
    turing["cases"][1]["dtype"] = "bfloat16"
    turing["cases"][1]["rel_l2"] = 0.4
    problems = report.check_report_dir(_write(tmp_path, turing=turing))
    text = "\n".join(problems)
    assert "arch must be 'compute_75'" in text
    assert "SM75 runs fp16 only" in text
    assert "rel_l2 4.000e-01 >" in text


def test_bench_schema_and_roofline(tmp_path: Path) -> None:
    bench = _bench()
    bench["rows"][0]["fp4_us"] = 1.0  # faster than HBM allows: measured L2, not HBM
    bench["rows"][1]["upstream_fp4_us"] = None
    del bench["rows"][2]["int4_us"]
    del bench["rows"][3]["dispatch_us"]  # the linear as served: required beside Marlin
    bench["rows"] = [r for r in bench["rows"] if r["m"] != 1024]
    problems = report.check_report_dir(_write(tmp_path, bench=bench))
    text = "\n".join(problems)
    assert "beats the HBM roofline" in text
    assert "upstream_fp4_us is null without a note" in text
    assert "int4_us missing" in text
    assert "m=8): dispatch_us missing" in text
    assert "lacks M in [1024]" in text
    bench2 = copy.deepcopy(_bench())
    bench2["rows"][1]["upstream_fp4_us"] = None
    bench2["upstream_note"] = "0.5.23 tree not carried"
    assert report.check_report_dir(_write(tmp_path, bench=bench2)) == []


def test_missing_dir_is_a_clear_error(tmp_path: Path) -> None:
    args = type("A", (), {"dir": str(tmp_path / "nope"), "allow_none": False})()
    with pytest.raises(SeriesError) as err:
        check_reports._cmd_check(args)  # type: ignore[arg-type]
    assert "does not exist" in str(err.value) and "gpu-proof.sh" in err.value.hint


def test_cli_failure_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, bench={"rows": []})
    assert main(["check-reports", "--dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "bench.json: 'rows' must be a non-empty list" in captured.out
    assert "what to do" in captured.err


def test_metadata_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "series").write_text("0001-a.patch\n# comment\n0002-b.patch\n")
    (patches / "0001-a.patch").write_text("a")
    first = report.series_sha256(patches)
    (patches / "0002-b.patch").write_text("b")  # a listed patch appearing changes the hash
    assert report.series_sha256(patches) != first
    assert report.series_sha256(tmp_path) == "absent"
    monkeypatch.setenv(report.REVISION_ENV, json.dumps({"git": "x", "series_sha256": "y"}))
    assert report.series_revision() == {"git": "x", "series_sha256": "y"}
    meta = report.run_metadata("cmd", device="cpu")
    assert meta["pin"]["tag"] == "v0.5.11" and len(meta["pin"]["wheel_sha256"]) == 64
    assert report.json_number(float("inf")) is None and report.json_number(1.5) == 1.5


def test_allow_none_passes_only_an_empty_report_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = type("A", (), {"dir": str(tmp_path), "allow_none": True})()
    assert check_reports._cmd_check(args) == 0  # type: ignore[arg-type]
    assert "GPU proof pending" in capsys.readouterr().out
    _write(tmp_path, bench={"rows": []})
    with pytest.raises(SeriesError):
        check_reports._cmd_check(args)  # type: ignore[arg-type]


def test_fused_shards_gated_per_shard(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["fused_shards"][0]["rel_l2_per_shard"][1] = 0.87  # a wrong shard hides in the whole
    numerics["fused_shards"][1]["rel_l2"] = None
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert len(problems) == 2
    assert "rel_l2_per_shard[1] 8.700e-01 > 1.0e-02" in problems[0]
    assert "rel_l2 is None (run failed?)" in problems[1]


def test_fused_shards_refusal_must_name_the_scales_and_coverage(tmp_path: Path) -> None:
    numerics = _numerics()
    refused = next(c for c in numerics["fused_shards"] if c["outcome"] == "refused")
    refused["error"] = "ValueError"
    numerics["fused_shards"] = [
        c for c in numerics["fused_shards"] if not (c["layer"] == "qkv" and c["ratio"] == 1e-3)
    ]
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    text = "\n".join(problems)
    assert "a refusal must carry the error naming the global scales" in text
    assert "no case for modelopt-dense qkv float16 ratio 0.001" in text
    numerics = _numerics()  # an MoE ratio refused (or absent) where it must be served
    moe = next(c for c in numerics["fused_shards"] if c["layer"] == "moe_w13" and c["ratio"] == 0.5)
    moe.update(outcome="refused", error="expert 1 (w1 global scale 0.5, w3 global scale 0.25)")
    text = "\n".join(report.check_report_dir(_write(tmp_path, numerics=numerics)))
    assert f"no served w1 != w3 case for {moe['path']} {moe['dtype']} w3/w1 0.5" in text
    del numerics["fused_shards"]
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert problems == [
        "numerics.json fused_shards: missing (the cases of tests/gpu/test_fused_shards.py)"
    ]


def test_conformance_required_tests_must_pass(tmp_path: Path) -> None:
    conformance = _conformance()
    conformance["tests"][2]["status"] = "fail"  # dense numerics, bf16
    conformance["tests"][-1].pop("needs")
    problems = report.check_report_dir(_write(tmp_path, conformance=conformance))
    assert len(problems) == 2
    assert "not-applicable without the feature it needs" in problems[0]
    assert "test_nvfp4_marlin_dense_matches_dequant_reference does not pass" in problems[1]


def test_conformance_schema_and_presence(tmp_path: Path) -> None:
    problems = report.check_report_dir(_write(tmp_path, conformance=None))
    assert len(problems) == 1 and "conformance.json: not found" in problems[0]
    conformance = _conformance()
    conformance["edits"] = []
    conformance["tests"] = [t for t in conformance["tests"] if "support" not in t["id"]]
    conformance["tests"][0]["status"] = "xfail"
    problems = report.check_report_dir(_write(tmp_path, conformance=conformance))
    text = "\n".join(problems)
    assert "'edits' must list every mechanical edit" in text
    assert "is not one of the three" in text
    assert "test_nvfp4_marlin_support_and_scale_transforms_sm80_sm90 was not run" in text


# --------------------------------------------------------------------------- e2e.json


def _e2e() -> dict[str, Any]:
    """A passing e2e.json in the shape serve/e2e.py writes (issue 13)."""
    cases, speed, memory, unquantized = [], [], [], []
    for fmt in report.E2E_FORMATS:
        for model in report.E2E_MODELS:
            for dtype in report.DTYPES:
                cases.append(
                    {"format": fmt, "model": model, "dtype": dtype, "ppl_nvfp4": 7.43,
                     "ppl_reference": 7.41, "top1_agreement": 0.995, "tokens_scored": 32704,
                     "agreement_prompts": 16, "agreement_new_tokens": 128, "status": "done"}
                )  # fmt: skip
            for batch in report.E2E_DECODE_BATCHES:
                speed.append(
                    {"format": fmt, "model": model, "dtype": "bfloat16", "kind": "decode",
                     "batch": batch, "nvfp4_tok_s": 900.0 * batch, "reference_tok_s": 800.0 * batch}
                )  # fmt: skip
            speed.append(
                {"format": fmt, "model": model, "dtype": "bfloat16", "kind": "prefill", "batch": 1,
                 "prompt_tokens": 1024, "nvfp4_tok_s": 4e4, "reference_tok_s": 5e4}
            )  # fmt: skip
            memory.append(
                {"format": fmt, "model": model, "dtype": "bfloat16", "nvfp4_weight_gib": 0.06,
                 "reference_weight_gib": 0.12}
            )  # fmt: skip
    for model in report.E2E_MODELS:
        for dtype in report.DTYPES:
            unquantized.append({"model": model, "dtype": dtype, "ppl": 7.2, "tokens_scored": 32704})
    speed_large, memory_large = [], []
    for fmt in report.E2E_FORMATS:
        for model in report.E2E_LARGE_MODELS:
            rates = {"nvfp4_tok_s": 300.0, "reference_tok_s": 200.0, "fp8_tok_s": 250.0}
            for batch in report.E2E_LARGE_DECODE_BATCHES:
                speed_large.append({"format": fmt, "model": model, "kind": "decode",
                                    "batch": batch, **rates})  # fmt: skip
            for tokens in report.E2E_LARGE_PREFILL_TOKENS:
                speed_large.append({"format": fmt, "model": model, "kind": "prefill", "batch": 1,
                                    "prompt_tokens": tokens, **rates})  # fmt: skip
            memory_large.append({"format": fmt, "model": model, "nvfp4_weight_gib": 1.0,
                                 "reference_weight_gib": 3.5, "fp8_weight_gib": 1.8})  # fmt: skip
    request = {"endpoint": "/v1/completions", "model": "m", "prompt": "def f(", "max_tokens": 32,
               "temperature": 0}  # fmt: skip
    return {
        **META,
        "commands": ["serve/e2e.py run", "python -m sglang.launch_server --model-path m"],
        "versions": {"sglang": "0.5.11", "torch": "2.11.0+cu130"},
        "cases": cases,
        "unquantized": unquantized,
        "speed": speed,
        "memory": memory,
        "speed_large": speed_large,
        "memory_large": memory_large,
        "http": {"ok": True, "request": request, "response": {"text": " x):"}},
        "http_marlin": {"ok": True, "request": request, "fp4_gemm_backend": "marlin"},
        "negative_control": {
            "refused": True,
            "bare": True,
            "message": "ValueError: The quantization method modelopt_fp4 is not supported for "
            "the current GPU. Minimum capability: 100. Current capability: 90.",
        },
    }


def _e2e_problems(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    _write(tmp_path)
    (tmp_path / "e2e.json").write_text(json.dumps(data))
    return report.check_report_dir(tmp_path)


def test_e2e_report_passes_and_is_checked_only_where_present(tmp_path: Path) -> None:
    assert _e2e_problems(tmp_path, _e2e()) == []
    (tmp_path / "e2e.json").unlink()
    assert report.check_report_dir(tmp_path) == []


def _speed_rerun() -> dict[str, Any]:
    """A passing e2e-speed/e2e.json: serve/gpu-host.sh --speed's report (other units pending)."""
    full = _e2e()
    units = {f"speed/{m}/{v}": {"status": "done", "seconds": 90, "error": None}
             for m in report.E2E_LARGE_MODELS
             for v in ("bf16", "modelopt-nvfp4", "modelopt-fp8", "ct-nvfp4", "ct-fp8")}  # fmt: skip
    units["case/dense/modelopt/bfloat16"] = {"status": None, "seconds": None, "error": None}
    keep = ("commands", "versions", "speed_large", "memory_large", *META)
    return {**{k: full[k] for k in keep}, "units": units, "complete": False}


def test_e2e_speed_rerun_is_checked_where_present(tmp_path: Path) -> None:
    """e2e-speed/e2e.json (the speed models' units alone): checked beside the full report;
    a speed unit not done, an FP8 rate missing or a model's rows missing fail it, units it did
    not run (pending) do not."""
    _write(tmp_path)
    folder = tmp_path / report.E2E_SPEED_RERUN
    folder.mkdir()
    (folder / "e2e.json").write_text(json.dumps(_speed_rerun()))
    assert report.check_report_dir(tmp_path) == []
    bad = _speed_rerun()
    bad["units"]["speed/moe-large/ct-nvfp4"]["status"] = "failed"
    next(r for r in bad["speed_large"] if r["model"] == "dense-large")["fp8_tok_s"] = None
    bad["speed_large"] = [
        r for r in bad["speed_large"] if (r["model"], r["format"]) != ("moe-large", "modelopt")
    ]
    bad.pop("series_revision")
    (folder / "e2e.json").write_text(json.dumps(bad))
    problems = report.check_report_dir(tmp_path)
    name = "e2e-speed/e2e.json"
    assert f"{name}: unit speed/moe-large/ct-nvfp4 is 'failed', not done" in problems
    assert f"{name}: missing top-level field 'series_revision'" in problems
    assert any(p.startswith(f"{name}: speed_large") and "fp8_tok_s missing" in p
               for p in problems)  # fmt: skip
    assert f"{name}: speed_large modelopt moe-large: no decode row for batch 1" in problems
    assert all(p.startswith(name) for p in problems), problems
    # every e2e-speed* folder holds such a run (e2e-speed-8b: serve/gpu-host.sh --speed dense-8b)
    (folder / "e2e.json").write_text(json.dumps(_speed_rerun()))
    (tmp_path / "e2e-speed-8b").mkdir()
    (tmp_path / "e2e-speed-8b" / "e2e.json").write_text(json.dumps(bad))
    deep = report.check_report_dir(tmp_path)
    assert deep and all(p.startswith("e2e-speed-8b/e2e.json: ") for p in deep), deep
    shutil.rmtree(tmp_path / "e2e-speed-8b")
    # one model asked for (--speed dense-large): the other's units and rows are not required
    one = _speed_rerun()
    for unit in [u for u in one["units"] if u.startswith("speed/moe-large/")]:
        one["units"][unit]["status"] = None
    one["speed_large"] = [r for r in one["speed_large"] if r["model"] == "dense-large"]
    one["memory_large"] = [r for r in one["memory_large"] if r["model"] == "dense-large"]
    (folder / "e2e.json").write_text(json.dumps(one))
    assert report.check_report_dir(tmp_path) == []
    for unit in one["units"]:
        one["units"][unit]["status"] = None
    (folder / "e2e.json").write_text(json.dumps(one))
    assert (
        f"{name}: no speed/ unit ran, or other units did too (serve/gpu-host.sh --speed "
        "runs the speed units alone)" in report.check_report_dir(tmp_path)
    )
    one["units"]["speed/dense-large/bf16"]["status"] = "done"
    one["units"]["case/dense/modelopt/bfloat16"]["status"] = "done"  # not a speed run alone
    (folder / "e2e.json").write_text(json.dumps(one))
    assert (
        f"{name}: no speed/ unit ran, or other units did too (serve/gpu-host.sh --speed "
        "runs the speed units alone)" in report.check_report_dir(tmp_path)
    )


def _e2e_case(data: dict[str, Any], fmt: str, model: str, dtype: str) -> dict[str, Any]:
    return next(
        c for c in data["cases"] if (c["format"], c["model"], c["dtype"]) == (fmt, model, dtype)
    )


def _ppl_apart(d: dict[str, Any]) -> None:
    _e2e_case(d, "modelopt", "moe", "float16")["ppl_nvfp4"] = 7.41 * 1.015


def _top1_low(d: dict[str, Any]) -> None:
    _e2e_case(d, "compressed-tensors", "dense-bias", "bfloat16")["top1_agreement"] = 0.97


def _case_missing(d: dict[str, Any]) -> None:
    d["cases"].remove(_e2e_case(d, "modelopt", "moe", "bfloat16"))


def _case_twice(d: dict[str, Any]) -> None:
    d["cases"].append(dict(_e2e_case(d, "modelopt", "dense", "float16")))


def _case_failed(d: dict[str, Any]) -> None:
    case = _e2e_case(d, "compressed-tensors", "moe", "float16")
    case.update(ppl_nvfp4=None, error="worker exit -9")


def _few_prompts(d: dict[str, Any]) -> None:
    _e2e_case(d, "modelopt", "dense", "bfloat16")["agreement_prompts"] = 4


def _http_down(d: dict[str, Any]) -> None:
    d["http"].update(ok=False, error="server not ready after 600 s")


def _http_not_greedy(d: dict[str, Any]) -> None:
    d["http"]["request"] = {**d["http"]["request"], "temperature": 0.7}


def _marlin_not_explicit(d: dict[str, Any]) -> None:
    d["http_marlin"]["fp4_gemm_backend"] = "auto"


def _not_refused(d: dict[str, Any]) -> None:
    d["negative_control"].update(refused=False, message="")


def _not_bare(d: dict[str, Any]) -> None:
    d["negative_control"]["bare"] = False


def _no_decode_32(d: dict[str, Any]) -> None:
    d["speed"] = [r for r in d["speed"] if not (r["model"] == "moe" and r.get("batch") == 32)]


def _short_prefill(d: dict[str, Any]) -> None:
    for r in d["speed"]:
        if r["kind"] == "prefill":
            r["prompt_tokens"] = 512


def _no_memory(d: dict[str, Any]) -> None:
    d["memory"] = [m for m in d["memory"] if m["model"] != "dense-bias"]


def _no_fp8_at_128(d: dict[str, Any]) -> None:
    for r in d["speed_large"]:
        if r["model"] == "moe-large" and r.get("batch") == 128:
            r["fp8_tok_s"] = None


def _no_prefill_8192(d: dict[str, Any]) -> None:
    d["speed_large"] = [r for r in d["speed_large"] if r.get("prompt_tokens") != 8192]


def _no_fp8_memory(d: dict[str, Any]) -> None:
    d["memory_large"][0]["fp8_weight_gib"] = None


def _no_unquantized(d: dict[str, Any]) -> None:
    d["unquantized"] = d["unquantized"][1:]


def _no_commands(d: dict[str, Any]) -> None:
    d["commands"] = []
    del d["versions"]["sglang"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_ppl_apart, "e2e.json: modelopt moe float16: perplexity 7.5211 vs reference 7.4100: "
                     "1.50% apart (gate 1%)"),
        (_top1_low, "compressed-tensors dense-bias bfloat16: top-1 agreement 0.9700 < 0.98"),
        (_case_missing, "e2e.json: no case for modelopt moe bfloat16"),
        (_case_twice, "e2e.json: 2 cases for modelopt dense float16"),
        (_case_failed, "compressed-tensors moe float16: ppl_nvfp4 is None (run failed?)"),
        (_few_prompts, "agreement_prompts must be an integer >= 8, got 4"),
        (_http_down, "e2e.json http: the server did not answer: server not ready after 600 s"),
        (_http_not_greedy, "e2e.json http: the request must be greedy (temperature 0)"),
        (_marlin_not_explicit, "http_marlin: must be the run with --fp4-gemm-backend marlin"),
        (_not_refused, "negative_control: the bare pin did not refuse the checkpoint"),
        (_not_bare, "negative_control: not run on the bare pin"),
        (_no_fp8_at_128, "speed_large modelopt moe-large decode batch 128: fp8_tok_s missing"),
        (_no_prefill_8192, "modelopt dense-large: no prefill row for prompt_tokens 8192"),
        (_no_fp8_memory, "(nvfp4, bf16 and fp8) for compressed-tensors dense-large"),
        (_no_decode_32, "speed for compressed-tensors moe lacks 32"),
        (_short_prefill, "prefill of 512 tokens (>= 1024 needed)"),
        (_no_memory, "no weight memory (nvfp4 and reference) for modelopt dense-bias"),
        (_no_unquantized, "no unquantized (bf16 checkpoint) perplexity for dense float16"),
        (_no_commands, "'commands' must list every command the run made"),
    ],
)  # fmt: skip
def test_e2e_gates(tmp_path: Path, mutate: Any, expected: str) -> None:
    data = copy.deepcopy(_e2e())
    mutate(data)
    problems = _e2e_problems(tmp_path, data)
    assert any(expected in p for p in problems), problems
    assert all(p.startswith("e2e.json") for p in problems)


def test_e2e_extra_failure_details(tmp_path: Path) -> None:
    data = _e2e()
    _not_refused(data)
    _case_failed(data)
    del data["series_revision"]
    text = "\n".join(_e2e_problems(tmp_path, data))
    assert "no minimum-capability message recorded" in text
    assert "compressed-tensors moe float16: failed: worker exit -9" in text
    assert "e2e.json: missing top-level field 'series_revision'" in text


def test_allow_none_checks_a_lone_e2e_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _e2e()
    _top1_low(data)
    (tmp_path / "e2e.json").write_text(json.dumps(data))
    args = type("A", (), {"dir": str(tmp_path), "allow_none": True})()
    with pytest.raises(SeriesError):  # present, so checked in full: not "GPU proof pending"
        check_reports._cmd_check(args)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "top-1 agreement 0.9700 < 0.98" in out and "numerics.json: not found" in out


def _tensor_parallel() -> list[dict[str, Any]]:
    """What tests/gpu/test_tensor_parallel.py records: every path and dtype covered."""
    cases: list[dict[str, Any]] = []
    for dtype in report.DTYPES:
        for path in report.DENSE_PATHS:
            for layer, tp, n, k, padded in (
                ("gate_up", 8, 7392, 8192, True),
                ("qkv", 4, 1152, 3584, False),
                ("down", 8, 8192, 3696, True),
            ):
                cases.append({"path": path, "layer": layer, "model": "Qwen2.5-72B",
                              "tp_size": tp, "dtype": dtype, "n": n, "k": k,
                              "padded": padded, "outcome": "served", "m": 33,
                              "rel_l2": 4e-3})  # fmt: skip
        for path in report.MOE_PATHS:
            for size, padded in (("tp_size", True), ("tp_size", False), ("ep_size", False)):
                for value in (8, 4) if size == "tp_size" else report.EP_SIZES:
                    if size == "tp_size" and padded != (value == 8):
                        continue
                    cases.append({"path": path, "layer": "moe", "model": "Qwen3-30B-A3B",
                                  size: value, "dtype": dtype, "n": 768 // value, "k": 2048,
                                  "padded": padded, "outcome": "served", "m": 1,
                                  "rel_l2": 1.2e-2 if dtype == "bfloat16" else 4e-3})  # fmt: skip
    return cases


def test_tensor_parallel_required_once_a_run_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    numerics = _numerics()
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == []
    del numerics["tensor_parallel"]
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == [
        "numerics.json tensor_parallel: missing (the cases of tests/gpu/test_tensor_parallel.py)"
    ]
    monkeypatch.setattr(report, "TENSOR_PARALLEL_REQUIRED", False)  # before that run
    assert report.check_report_dir(_write(tmp_path, numerics=numerics)) == []


def _tp_problems(tmp_path: Path, edit: Any) -> str:
    numerics = _numerics()
    numerics["tensor_parallel"] = _tensor_parallel()
    edit(numerics["tensor_parallel"])
    return "\n".join(report.check_report_dir(_write(tmp_path, numerics=numerics)))


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda c: c[0].update(rel_l2=0.3), "tp=8 float16 n=7392 k=8192 m=33: rel_l2 3.000e-01"),
        (lambda c: c[0].update(rel_l2=None), "rel_l2 is None (run failed?)"),
        # bf16 MoE as shipped keeps its 1.5e-2 gate, dense bf16 1e-2
        (lambda c: c[-1].update(rel_l2=1.6e-2), "rel_l2 1.600e-02 > 1.5e-02"),
        (
            lambda c: c[0].update(outcome="refused", error="NVFP4 Marlin cannot run"),
            "refused at load, every case must be served: NVFP4 Marlin cannot run",
        ),
        (lambda c: c[0].update(tp_size=3), "tp_size must be one of (2, 4, 8)"),
        (lambda c: c[0].update(ep_size=2), "needs exactly one of tp_size and ep_size"),
        (lambda c: c[0].update(layer="moe"), "layer 'moe' does not go with path"),
        (lambda c: c[0].pop("padded"), "padded must be true/false"),
        (lambda c: c[0].update(model=""), "model must name the model"),
        (lambda c: c[0].update(outcome="skipped"), "outcome must be one of ('served', 'refused')"),
    ],
)
def test_tensor_parallel_gates_and_schema(tmp_path: Path, edit: Any, expected: str) -> None:
    assert expected in _tp_problems(tmp_path, edit)


def test_tensor_parallel_coverage(tmp_path: Path) -> None:
    def drop(cases: list[dict[str, Any]], keep: Any) -> None:
        cases[:] = [c for c in cases if keep(c)]

    text = _tp_problems(tmp_path, lambda c: drop(c, lambda x: not x["padded"]))
    assert "modelopt-dense float16: no served tensor-parallel case with a padded shape" in text
    assert "ct-moe bfloat16: no served tensor-parallel case with a padded shape" in text
    text = _tp_problems(tmp_path, lambda c: drop(c, lambda x: x.get("ep_size") != 4))
    assert "modelopt-moe float16: no served expert-parallel case with ep 4" in text
    text = _tp_problems(tmp_path, lambda c: drop(c, lambda x: x["layer"] != "down"))
    assert "ct-dense bfloat16: no row-parallel layer (o or down)" in text
    # a refused case does not count as covered
    text = _tp_problems(
        tmp_path,
        lambda c: [x.update(outcome="refused", error="x") for x in c if x["layer"] == "moe"],
    )
    assert "ct-moe float16: no served expert-parallel case with ep 2" in text


# --------------------------------------------------------------------------- a series line

LINE = "0.5.23"
LINE_META: dict[str, Any] = {
    **META,
    "command": f"scripts/gpu-proof.sh --line {LINE}",
    "pin": {"tag": f"v{LINE}", "version": LINE, "wheel_sha256": "00b3" * 16},
    "line": LINE,
}


def _line_numerics() -> dict[str, Any]:
    """What scripts/gpu-proof.sh --line writes: the line's cases, and its bare release's
    (templates: upstream) with a bias the size of the output, each dense path and dtype."""
    cases = [_case(p, d) for p in report.PATHS for d in report.DTYPES]
    for path in report.DENSE_PATHS:
        for dtype in report.DTYPES:
            strong = dict(_case(path, dtype), bias=True, bias_scale=1.0)
            cases += [strong, dict(strong, templates="upstream", rel_l2=0.98)]
    cases.append(_case("ct-moe", "bfloat16", "upstream", 6e-3))  # recorded, not gated
    fused = _fused_shards()
    fused.append(
        {
            "path": "ct-dense",
            "layer": "qkv",
            "dtype": "float16",
            "ratio": 2.0,
            "templates": "upstream",
            "outcome": "refused",
            "error": "requires all fused projections to share one weight_global_scale",
        }
    )
    fused.append({"path": "modelopt-dense", "layer": "qkv", "dtype": "float16", "ratio": 2.0,
                  "templates": "upstream", "outcome": "served", "m": 33, "rel_l2": 0.87,
                  "rel_l2_per_shard": [0.7, 1.2, 0.9]})  # fmt: skip
    return {**_numerics(), **LINE_META, "cases": cases, "fused_shards": fused}


def _line_conformance() -> dict[str, Any]:
    from fp4series import conformance

    tests = [{"id": f"sglang/jit_kernel/tests/x.py::{name}[dtype0]", "status": "pass"}
             for name in conformance.profile(LINE).required]  # fmt: skip
    edits = [{"file": "sglang/jit_kernel/tests/test_gptq_marlin.py", "line": 8,
              "kind": "module-move", "removed": "sglang.jit_kernel.gptq_marlin",
              "replacement": "sglang.kernels.ops.gemm.gptq_marlin"}]  # fmt: skip
    return {**_conformance(), **LINE_META, "tests": tests, "edits": edits}


def _write_line(tmp_path: Path, **override: Any) -> Path:
    data = {"numerics.json": _line_numerics(), "conformance.json": _line_conformance(),
            "turing_ptx.json": {**_turing(), **LINE_META}}  # fmt: skip
    for name, value in {**data, **override}.items():
        if value is not None:
            (tmp_path / name).write_text(json.dumps(value))
    return tmp_path


def _line_problems(tmp_path: Path, **override: Any) -> str:
    return "\n".join(report.check_report_dir(_write_line(tmp_path, **override), LINE))


def test_line_reports_pass_without_a_benchmark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _line_problems(tmp_path) == ""
    assert main(["check-reports", "--dir", str(tmp_path), "--line", LINE]) == 0
    assert f"the {LINE} line's GPU reports" in capsys.readouterr().out
    # the same files as the pin's: the pin's repro is missing and so is the benchmark
    pin = "\n".join(report.check_report_dir(tmp_path))
    assert "no unpatched-template repro case" in pin and "bench.json: not found" in pin
    assert "templates must be 'patched' or 'unpatched'" in pin
    assert f"a report of the {LINE} line in the pin's report directory" in pin


def test_line_bare_release_must_add_a_large_bias_wrong(tmp_path: Path) -> None:
    numerics = _line_numerics()
    bare = [c for c in numerics["cases"] if c["templates"] == "upstream" and c.get("bias")]
    bare[0]["rel_l2"] = 0.31  # a bare release that adds the bias right needs no patch 1
    bare[1]["rel_l2"] = None  # a run that failed
    bare[2].update(rel_l2=None, nonfinite_outputs=12)  # garbage: fails as expected
    problems = _line_problems(tmp_path, **{"numerics.json": numerics})
    assert "should add the bias wrong, but rel_l2 3.100e-01 < 0.5" in problems
    assert "repro rel_l2 is None (run failed?)" in problems
    assert problems.count("\n") == 1, problems


def test_line_needs_the_strong_bias_cases_of_both_and_gates_the_line(tmp_path: Path) -> None:
    numerics = _line_numerics()
    numerics["cases"] = [
        c
        for c in numerics["cases"]
        if not (c["templates"] == "upstream" and c["path"] == "ct-dense")
    ]
    line_strong = next(c for c in numerics["cases"] if c.get("bias_scale"))
    line_strong["rel_l2"] = 0.9  # the line's own bias case is gated like every patched one
    problems = _line_problems(tmp_path, **{"numerics.json": numerics})
    for dtype in report.DTYPES:
        assert (
            f"no bare-release dense case with a bias the size of the output for ct-dense "
            f"{dtype}" in problems
        )
    assert "bias=True" in problems and "rel_l2 9.000e-01 > 1.0e-02" in problems


def test_line_fused_shards_of_the_bare_release_are_recorded_not_gated(tmp_path: Path) -> None:
    numerics = _line_numerics()
    assert _line_problems(tmp_path, **{"numerics.json": numerics}) == ""
    numerics["fused_shards"][-1]["outcome"] = "crashed"
    assert "[upstream]: outcome must be one of" in _line_problems(
        tmp_path, **{"numerics.json": numerics}
    )


def test_line_reports_must_name_the_line_and_its_release(tmp_path: Path) -> None:
    numerics = {**_line_numerics(), "pin": META["pin"]}  # the pin's report copied over
    turing = {k: v for k, v in {**_turing(), **LINE_META}.items() if k != "line"}
    problems = _line_problems(tmp_path, **{"numerics.json": numerics, "turing_ptx.json": turing})
    assert "numerics.json: pin.version '0.5.11' is not the line's release 0.5.23" in problems
    assert "turing_ptx.json: line is None, expected '0.5.23'" in problems


def test_line_conformance_requires_the_moe_tests_too(tmp_path: Path) -> None:
    from fp4series import conformance

    conf = _line_conformance()
    assert len(conformance.profile(LINE).required) > len(report.CONFORMANCE_REQUIRED)
    moe = "test_fused_marlin_moe_nvfp4_non_gated_matches_dequant_reference"
    conf["tests"] = [t for t in conf["tests"] if moe not in t["id"]]
    problems = _line_problems(tmp_path, **{"conformance.json": conf})
    assert f"upstream test {moe} was not run" in problems


def test_line_is_found_from_the_report_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(__file__).resolve().parents[2]
    assert report.line_of_report_dir(root / "reports" / "h200" / LINE, root) == LINE
    assert report.line_of_report_dir(root / "reports" / "h200", root) is None
    assert report.line_of_report_dir(root / "reports" / "h200" / "9.9.9", root) is None
    assert report.line_of_report_dir(tmp_path / LINE, root) is None
    fake = tmp_path / "project"
    (fake / "reports" / "h200" / LINE).mkdir(parents=True)
    (fake / "upstream.lock").write_text((root / "upstream.lock").read_text())
    monkeypatch.setenv("FP4SERIES_ROOT", str(fake))
    monkeypatch.chdir(fake)
    assert main(["check-reports", "--dir", f"reports/h200/{LINE}", "--allow-none"]) == 0
    assert (
        f"no GPU reports of the {LINE} line in reports/h200/{LINE} yet" in capsys.readouterr().out
    )
    _write_line(fake / "reports" / "h200" / LINE)
    assert main(["check-reports", "--dir", f"reports/h200/{LINE}"]) == 0
    assert f"the {LINE} line's GPU reports in reports/h200/{LINE}: OK" in capsys.readouterr().out


def test_run_metadata_of_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(report.REVISION_ENV, raising=False)
    monkeypatch.setenv(report.LINE_ENV, LINE)
    meta = report.run_metadata("cmd", device="cpu")
    assert meta["line"] == LINE and meta["pin"]["version"] == LINE
    assert meta["pin"]["tag"] == f"v{LINE}" and len(meta["pin"]["wheel_sha256"]) == 64
    root = Path(__file__).resolve().parents[2]
    assert meta["series_revision"]["series_sha256"] == report.series_sha256(root / "patches" / LINE)
    assert meta["series_revision"]["series_sha256"] != report.series_sha256(root / "patches")


# --------------------------------------------------------------------------- e2e.json: two GPUs


def _with_parallel(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with passing ``parallel`` records and ``parallel_speed`` rows, the shape
    serve/e2e.py --parallel writes."""
    data = copy.deepcopy(data)
    data["parallel"] = [
        {"format": fmt, "model": model, "dtype": "bfloat16", "tp_size": tp, "ep_size": ep,
         "ppl_nvfp4": 7.4322, "ppl_tp1": 7.43, "top1_agreement": 0.998, "tokens_scored": 32704,
         "agreement_tokens": 2048, "status": "done"}
        for fmt in report.E2E_FORMATS for model, tp, ep in report.E2E_PARALLEL_RUNS
    ]  # fmt: skip
    data["parallel_speed"] = [
        {"format": fmt, "model": "dense-large", "variant": "x", "dtype": "bfloat16",
         "tp_size": 2, "kind": "decode", "batch": b, "tok_s": 1500.0 * b, "tp1_tok_s": 950.0 * b}
        for fmt in report.E2E_FORMATS for b in report.E2E_PARALLEL_DECODE_BATCHES
    ]  # fmt: skip
    return data


def _parallel(d: dict[str, Any], fmt: str, model: str, ep: int) -> dict[str, Any]:
    return next(r for r in d["parallel"]
                if (r["format"], r["model"], r["ep_size"]) == (fmt, model, ep))  # fmt: skip


def test_parallel_records_pending_when_absent_checked_when_present(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _e2e_problems(tmp_path, _e2e())
    assert main(["check-reports", "--dir", str(tmp_path)]) == 0  # absent: pending, no failure
    out = capsys.readouterr().out
    assert out.endswith(": OK\npending: e2e.json: parallel records (tp 2, and ep 2 for the MoE) "
                        "not run yet: they need a CUDA host with 2 GPUs (serve/gpu-host.sh "
                        "--parallel)\n")  # fmt: skip
    assert _e2e_problems(tmp_path, _with_parallel(_e2e())) == []
    assert main(["check-reports", "--dir", str(tmp_path)]) == 0
    assert "pending: " not in capsys.readouterr().out
    units = {"parallel/modelopt/dense/tp2": {"status": None}}  # planned, nothing written yet
    problems = _e2e_problems(tmp_path, {**_e2e(), "units": units})
    assert "e2e.json: 'parallel' must be a non-empty list (serve/e2e.py --parallel)" in problems


def test_the_committed_e2e_report_passes_with_its_parallel_part_pending(
    capsys: pytest.CaptureFixture[str],
) -> None:
    committed = Path(__file__).resolve().parents[2] / "reports" / "h200"
    pending: list[str] = []
    assert report.check_report_dir(committed, pending=pending) == []
    assert pending == [f"e2e.json: {report.E2E_PARALLEL_PENDING}"]


def _p_drift(d: dict[str, Any]) -> None:
    _parallel(d, "modelopt", "moe", 2)["ppl_nvfp4"] = 7.43 * 1.0015


def _p_top1(d: dict[str, Any]) -> None:
    _parallel(d, "compressed-tensors", "dense-bias", 1)["top1_agreement"] = 0.985


def _p_no_ep2(d: dict[str, Any]) -> None:
    d["parallel"].remove(_parallel(d, "compressed-tensors", "moe", 2))


def _p_twice(d: dict[str, Any]) -> None:
    d["parallel"].append(dict(_parallel(d, "modelopt", "dense", 1)))


def _p_failed(d: dict[str, Any]) -> None:
    _parallel(d, "modelopt", "dense", 1).update(
        ppl_nvfp4=None, error="RuntimeError: NCCL error\n--- log tail:\n..."
    )


def _p_ep_on_dense(d: dict[str, Any]) -> None:
    _parallel(d, "modelopt", "dense", 1)["ep_size"] = 2


def _p_fp16(d: dict[str, Any]) -> None:
    _parallel(d, "modelopt", "dense-bias", 1)["dtype"] = "float16"


def _p_few_tokens(d: dict[str, Any]) -> None:
    _parallel(d, "modelopt", "moe", 1)["agreement_tokens"] = 100


def _p_no_tp1(d: dict[str, Any]) -> None:
    _parallel(d, "compressed-tensors", "moe", 1)["ppl_tp1"] = None


def _p_no_speed_32(d: dict[str, Any]) -> None:
    d["parallel_speed"] = [r for r in d["parallel_speed"]
                           if not (r["format"] == "modelopt" and r["batch"] == 32)]  # fmt: skip


def _p_speed_tp1_missing(d: dict[str, Any]) -> None:
    d["parallel_speed"][0]["tp1_tok_s"] = None


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_p_drift, "e2e.json: parallel modelopt moe bfloat16 tp 2 ep 2: perplexity 7.4411 vs one "
                   "GPU 7.4300: 0.150% apart (gate 0.1%)"),
        (_p_top1, "parallel compressed-tensors dense-bias bfloat16 tp 2 ep 1: top-1 agreement "
                  "with one GPU 0.9850 < 0.99"),
        (_p_no_ep2, "e2e.json: no parallel record for compressed-tensors moe tp 2 ep 2"),
        (_p_twice, "e2e.json: 2 parallel records for modelopt dense tp 2 ep 1"),
        (_p_failed, "parallel modelopt dense bfloat16 tp 2 ep 1: failed: RuntimeError: NCCL error"),
        (_p_ep_on_dense, "e2e.json: no parallel record for modelopt dense tp 2 ep 1"),
        (_p_fp16, "e2e.json: no parallel record for modelopt dense-bias tp 2 ep 1"),
        (_p_few_tokens, "agreement_tokens must be an integer >= 1024, got 100"),
        (_p_no_tp1, "parallel compressed-tensors moe bfloat16 tp 2 ep 1: ppl_tp1 is None"),
        (_p_no_speed_32, "parallel_speed modelopt dense-large tp 2 decode batch 32: no row"),
        (_p_speed_tp1_missing, "parallel_speed compressed-tensors dense-large tp 2 decode batch "
                               "1: tp1_tok_s missing"),
    ],
)  # fmt: skip
def test_e2e_parallel_gates(tmp_path: Path, mutate: Any, expected: str) -> None:
    data = _with_parallel(_e2e())
    mutate(data)
    problems = _e2e_problems(tmp_path, data)
    assert any(expected in p for p in problems), problems
    assert all(p.startswith("e2e.json") for p in problems)


def test_reports_hold_no_absolute_paths_of_the_machine_they_ran_on(tmp_path: Path) -> None:
    numerics = _numerics()
    numerics["environment"] = {"sglang_tree": "/srv/ci/project/.work/gp/trees/patched"}
    problems = report.check_report_dir(_write(tmp_path, numerics=numerics))
    assert problems == [
        "numerics.json: 1 absolute path(s) of the machine it ran on, e.g. "
        "'/srv/ci/project/.work/gp/trees/patched': write them relative to the repository "
        "(report.repo_relative)"
    ]
    root = Path("/srv/ci/project")
    fixed = report.repo_relative(numerics, root)
    assert fixed["environment"] == {"sglang_tree": ".work/gp/trees/patched"}
    assert report.repo_relative({"a": ["/srv/ci/other", 3]}, root) == {"a": ["/srv/ci/other", 3]}
    assert report.check_report_dir(_write(tmp_path, numerics=fixed)) == []
