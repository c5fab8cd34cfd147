"""bench/plot.py and the bench's Markdown table, on synthetic numbers (no GPU needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plot
import pytest

from fp4series import report

REPO = Path(__file__).resolve().parents[2]


def _synthetic() -> dict[str, Any]:
    rows = []
    for shape, n, k in (("qkv_8b", 6144, 4096), ("down_70b", 8192, 28672)):
        for m in report.BENCH_MS:
            roof = (n * k / 2 + n * k / 16 + 2 * m * k + 2 * m * n) / 4.25e12 * 1e6
            rows.append(
                {"shape": shape, "kind": "dense", "m": m, "n": n, "k": k, "fp4_us": roof * 2.5,
                 "bf16_us": roof * 4 + m * 0.01, "int4_us": roof * 2.0, "roofline_us": roof,
                 "upstream_fp4_us": roof * 2.6, "dispatch_us": roof * (2.5 if m < 256 else 1.5),
                 "dispatch_path": "marlin" if m < 256 else "dequant+cublas",
                 "fp8_us": roof * (1.5 if m < 256 else 1.0)}
            )  # fmt: skip
    rows.append({"shape": "moe_e64_top8_h2048_i1408", "kind": "moe", "m": 16, "n": 1408,
                 "k": 2048, "fp4_us": 90.0, "bf16_us": None, "int4_us": 70.0, "roofline_us": 40.0,
                 "upstream_fp4_us": None, "note": "bf16 baseline failed", "dispatch_us": 90.0,
                 "dispatch_path": "marlin"})  # fmt: skip
    return {
        "command": "python bench/bench_fp4_marlin.py",
        "series_revision": {"git": "abc", "series_sha256": "0" * 64},
        "pin": {"tag": "v0.5.11", "wheel_sha256": "f" * 64},
        "device": "NVIDIA H200",
        "torch": "2.11.0+cu130",
        "date": "2026-11-30T00:00:00+00:00",
        "copy_bandwidth_tb_s": 4.25,
        "method": "median of 7 replays",
        "rows": rows,
    }


def test_speedups_skip_missing_baselines() -> None:
    series = plot.speedups(_synthetic()["rows"], "bf16_us")
    assert set(series) == {"qkv_8b", "down_70b"}  # the MoE row has no bf16 number
    assert [m for m, _ in series["qkv_8b"]] == sorted(report.BENCH_MS)
    assert all(r > 1.0 for _, r in series["qkv_8b"])
    over_marlin = dict(plot.speedups(_synthetic()["rows"], "fp4_us", "dispatch_us")["qkv_8b"])
    assert over_marlin[1] == 1.0 and over_marlin[1024] == pytest.approx(2.5 / 1.5)


def test_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = plot.plot_bench(_synthetic(), tmp_path / "bench.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_markdown_table_and_schema(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import bench_fp4_marlin as bench

    data = _synthetic()
    data["goals"] = bench.goal_rows(data["rows"])
    bench.write_markdown(data, tmp_path / "bench.md")
    text = (tmp_path / "bench.md").read_text()
    assert "| qkv_8b | 6144 | 4096 | 1 |" in text and "bf16/FP4" in text
    assert "| dequant+cublas |" in text and "FP4/disp" in text and "FP8/disp" in text
    table = text.split("## Every row")[1]
    assert table.count("\n| ") == len(data["rows"]) + 1  # header + one line per row
    problems: list[str] = []
    report.check_bench(data, problems)
    assert problems == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dispatch_us": None}, "dispatch_us missing or <= 0"),
        ({"dispatch_path": "fast"}, "dispatch_path 'fast' is not one of"),
        ({"dispatch_us": 100.0}, "slower than FP4 Marlin"),
        ({"dequant_us": -1.0}, "dequant_us must be a positive number or null"),
        ({"fp8_us": None}, "fp8_us is null without the run's fp8_note"),
        ({"fp8_us": 0.0}, "fp8_us must be a positive number or null"),
        ({"epilogue_us": -2.0}, "epilogue_us must be a positive number or null"),
    ],
)
def test_bench_dispatch_fields_are_checked(change: dict[str, Any], message: str) -> None:
    data = _synthetic()
    row = next(r for r in data["rows"] if r["shape"] == "qkv_8b" and r["m"] == 1024)
    row.update(change)
    problems: list[str] = []
    report.check_bench(data, problems)
    assert len(problems) == 1 and message in problems[0], problems


def test_missing_fp8_column_is_named() -> None:
    data = _synthetic()
    del data["rows"][0]["fp8_us"]
    problems: list[str] = []
    report.check_bench(data, problems)
    assert problems == ["bench.json: rows[0] (qkv_8b): missing fp8_us (null + fp8_note if not run)"]
    for row in data["rows"]:  # a GPU without FP8 GEMMs: null everywhere, with the run's note
        row["fp8_us"] = None
    data["fp8_note"] = "FP8 not timed: e4m3 GEMMs need SM89 or newer"
    problems = []
    report.check_bench(data, problems)
    assert problems == []


def test_goals_follow_the_numbers(tmp_path: Path) -> None:
    """Issue 23's goals from the rows: the synthetic dispatch is Marlin below 256 (speed-up 1)
    and 1.5 roofline-times from 256 (bf16 is 4 roofline-times, so 2.7x bf16's speed at 1024):
    decode goals missed, prefill met; slowing one prefill row below 0.8x bf16 names it."""
    pytest.importorskip("torch")
    import bench_fp4_marlin as bench

    data = _synthetic()
    goals = {g["goal"].split(":")[0]: g for g in bench.goal_rows(data["rows"])}
    assert goals["M 1-4"]["measured"] == "1.00x" and goals["M 1-4"]["met"] is False
    assert goals["M 8-16"]["met"] is False and goals["M 32-64"]["met"] is True
    assert goals["M >= 1024"]["met"] is True
    assert goals["never slower than Marlin (where the dispatch leaves it)"]["met"] is True
    assert goals["M = 1"]["measured"] == "down_70b 40%"  # qkv_8b's roofline is under 8 us
    row = next(r for r in data["rows"] if r["shape"] == "down_70b" and r["m"] == 4096)
    row["dispatch_us"] = row["bf16_us"] / 0.75
    goals = {g["goal"].split(":")[0]: g for g in bench.goal_rows(data["rows"])}
    assert goals["M >= 1024"]["met"] is False
    assert goals["M >= 1024"]["measured"].endswith("below: down_70b (M 4096: 0.75x)")
    data["goals"] = bench.goal_rows(data["rows"])
    bench.write_markdown(data, tmp_path / "bench.md")
    assert (
        "| M >= 1024: >= 0.8x bf16 cuBLAS's speed on every shape |"
        in (tmp_path / "bench.md").read_text()
    )


def test_roofline_formula() -> None:
    pytest.importorskip("torch")
    import bench_fp4_marlin as bench

    # 8192x8192 at M=1: 37.8 MB of weight+scales (environment doc) at 4.25 TB/s
    us = bench.roofline_us(1, 8192, 8192, 4.25)
    assert us == pytest.approx((8192 * 8192 * (0.5 + 1 / 16) + 2 * 8192 * 2) / 4.25e12 * 1e6)
    assert 8.8 < us < 8.9  # the anchor measurement's fp4 roofline at M=1 (8.88 us)


def test_upstream_worker_finds_the_modules_built_for_it(tmp_path: Path) -> None:
    """0.5.23 builds through SGLang's own JIT cache (SGLANG_JIT_CACHE_DIR), 0.5.11 through
    tvm-ffi's: the worker gets the upstream build's directory for both, never the patched
    tree's (a miss there recompiled 0.5.23's Marlin for minutes on the GPU host), and the
    patched tree leaves its import path."""
    pytest.importorskip("torch")
    import bench_fp4_marlin as bench

    patched, upstream_cache = tmp_path / "patched", str(tmp_path / "cache" / "upstream")
    environ = {
        "PYTHONPATH": f"/site:{patched}:/src",
        "TVM_FFI_CACHE_DIR": str(tmp_path / "cache" / "patched"),
        "SGLANG_JIT_CACHE_DIR": str(tmp_path / "cache" / "patched"),
        "FP4SERIES_UPSTREAM_CACHE": upstream_cache,
        "FP4SERIES_UPSTREAM_EXTRA_PATH": '["/site-upstream"]',
    }
    env = bench.upstream_worker_env("/up/python", patched, environ)
    assert env["TVM_FFI_CACHE_DIR"] == env["SGLANG_JIT_CACHE_DIR"] == upstream_cache
    assert env["PYTHONPATH"].split(":") == ["/up/python", "/site-upstream", "/site", "/src"]
    del environ["FP4SERIES_UPSTREAM_CACHE"]
    env = bench.upstream_worker_env("/up/python", patched, environ)
    own = str(tmp_path / "cache" / "patched") + "-0523"  # a directory of its own
    assert env["TVM_FFI_CACHE_DIR"] == env["SGLANG_JIT_CACHE_DIR"] == own


def test_render_recomputes_goals_and_keeps_the_measurements(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import json

    import bench_fp4_marlin as bench

    data = _synthetic()
    data["goals"] = [{"goal": "stale", "measured": "-", "met": None}]
    (tmp_path / "bench.json").write_text(json.dumps(data))
    assert bench.main(["--render", str(tmp_path / "bench.json")]) == 0
    got = json.loads((tmp_path / "bench.json").read_text())
    assert got["rows"] == data["rows"] and got["command"] == data["command"]
    assert got["goals"] == bench.goal_rows(data["rows"]) and "stale" not in str(got["goals"])
    assert "## Every row" in (tmp_path / "bench.md").read_text()
