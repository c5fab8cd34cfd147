"""check-reports on the kernel rounds (reports/h200/kernels/round-*): the committed rounds pass,
and each claim a round makes fails the check when it does not hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fp4series.kernel_reports import ROUND_FILES, check_kernel_rounds

REPO = Path(__file__).resolve().parents[2]
ROUNDS = REPO / "reports" / "h200" / "kernels"


def test_committed_rounds_pass() -> None:
    problems: list[str] = []
    check_kernel_rounds(ROUNDS, problems, repo=REPO)
    assert problems == []


def _copy_round(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The newest committed round in a project of its own (no fp4_kernels.py: no dispatch check)."""
    newest = sorted(ROUNDS.glob("round-*"))[-1]
    dst = tmp_path / "reports" / "h200" / "kernels" / newest.name
    shutil.copytree(newest, dst)
    return dst, json.loads((dst / "kernels.json").read_text())


def _problems(round_dir: Path, data: dict[str, Any] | None = None) -> list[str]:
    if data is not None:
        (round_dir / "kernels.json").write_text(json.dumps(data))
    problems: list[str] = []
    check_kernel_rounds(round_dir.parent, problems, repo=round_dir.parents[3])
    return problems


def test_copy_passes(tmp_path: Path) -> None:
    round_dir, _ = _copy_round(tmp_path)
    assert _problems(round_dir) == []


def test_failed_case_named(tmp_path: Path) -> None:
    round_dir, data = _copy_round(tmp_path)
    case = next(c for c in data["cases"] if c.get("path") == "gemv")
    case.update(passed=False, rel_l2=0.3)
    (problem,) = _problems(round_dir, data)
    assert "case failed" in problem and case["shape"] in problem and "0.3" in problem


def test_faster_than_roofline_flagged(tmp_path: Path) -> None:
    round_dir, data = _copy_round(tmp_path)
    row = data["rows"][0]
    row["paths_us"]["gemv"] = row["roofline_us"] / 2
    (problem,) = _problems(round_dir, data)
    assert "beats the HBM roofline" in problem and row["shape"] in problem


@pytest.mark.parametrize("field", ["command", "series_revision", "device"])
def test_metadata_required(tmp_path: Path, field: str) -> None:
    round_dir, data = _copy_round(tmp_path)
    del data[field]
    assert any(field in p for p in _problems(round_dir, data))


def test_incomplete_round_and_layout_check(tmp_path: Path) -> None:
    round_dir, data = _copy_round(tmp_path)
    data["complete"] = False
    data["layout_checks"][0]["passed"] = False
    problems = _problems(round_dir, data)
    assert any("did not run to its end" in p for p in problems)
    assert any("layout check failed" in p for p in problems)


@pytest.mark.parametrize("missing", ROUND_FILES)
def test_round_files_required(tmp_path: Path, missing: str) -> None:
    round_dir, _ = _copy_round(tmp_path)
    (round_dir / missing).unlink()
    assert any(missing in p for p in _problems(round_dir))


def test_dispatch_source_must_be_committed(tmp_path: Path) -> None:
    round_dir, _ = _copy_round(tmp_path)
    kernels = tmp_path / "bench" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "fp4_kernels.py").write_text(
        'DISPATCH_SOURCE = "measured: reports/h200/kernels/round-9/dispatch.json (H200)"\n'
    )
    (problem,) = _problems(round_dir)
    assert "round-9/dispatch.json is not committed" in problem


def _project_with_dispatch(tmp_path: Path, code_entries: str) -> Path:
    round_dir, _ = _copy_round(tmp_path)
    table = {"shapes": {"o_8b": {"dispatch": [[4, "gemv"], [64, "marlin"], [1 << 30, "prefill"]]}}}
    (round_dir / "dispatch.json").write_text(json.dumps(table))
    kernels = tmp_path / "bench" / "kernels"
    kernels.mkdir(parents=True)
    rel = (round_dir / "dispatch.json").relative_to(tmp_path)
    (kernels / "fp4_kernels.py").write_text(
        "OPEN_END = 1 << 30\n"
        f"DISPATCH: dict[str, list[tuple[int, str]]] = {{{code_entries}}}\n"
        f'DISPATCH_SOURCE = "measured: {rel} (H200)"\n'
    )
    return round_dir


def test_dispatch_matches_its_round(tmp_path: Path) -> None:
    entries = '"*": [(64, "marlin"), (OPEN_END, "prefill")], '
    entries += '"o_8b": [(4, "gemv"), (64, "marlin"), (OPEN_END, "prefill")]'
    assert _problems(_project_with_dispatch(tmp_path, entries)) == []


def test_dispatch_differing_from_its_round_named(tmp_path: Path) -> None:
    entries = '"*": [(64, "marlin"), (OPEN_END, "prefill")], '
    entries += '"o_8b": [(8, "gemv"), (64, "marlin"), (OPEN_END, "prefill")]'
    (problem,) = _problems(_project_with_dispatch(tmp_path, entries))
    assert "DISPATCH['o_8b']" in problem and "measured [(4, 'gemv')" in problem


def _compile_report(round_dir: Path) -> dict[str, Any]:
    shutil.copy(ROUNDS / "round-4" / "compile.json", round_dir / "compile.json")
    return json.loads((round_dir / "compile.json").read_text())


def test_compile_report_passes(tmp_path: Path) -> None:
    round_dir, _ = _copy_round(tmp_path)
    _compile_report(round_dir)
    assert _problems(round_dir) == []


def test_compiled_case_differing_from_eager_named(tmp_path: Path) -> None:
    round_dir, _ = _copy_round(tmp_path)
    report = _compile_report(round_dir)
    report["cases"][2]["bitwise_equal"] = False
    report["cudagraph_skips"] = 1
    (round_dir / "compile.json").write_text(json.dumps(report))
    problems = _problems(round_dir)
    assert any("differs from eager" in p and "'m': 16" in p for p in problems)
    assert any("skipped CUDA graphs" in p for p in problems)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["cases"][0].update(finite=False), "differs from eager"),
        (lambda r: r.update(passed=False), "passed is not true"),
        (lambda r: r.update(cases=[]), "non-empty list"),
    ],
)
def test_compile_report_claims_checked(tmp_path: Path, change: Any, message: str) -> None:
    round_dir, _ = _copy_round(tmp_path)
    report = _compile_report(round_dir)
    change(report)
    (round_dir / "compile.json").write_text(json.dumps(report))
    assert any(message in p for p in _problems(round_dir))


def test_compile_report_of_other_kernels_flagged(tmp_path: Path) -> None:
    round_dir, data = _copy_round(tmp_path)
    report = _compile_report(round_dir)
    report["kernel_sources"] = {**data["kernel_sources"], "fp4_gemv.cu": "0" * 64}
    (round_dir / "compile.json").write_text(json.dumps(report))
    assert any("kernel_sources differ" in p for p in _problems(round_dir))
    report["kernel_sources"] = data["kernel_sources"]
    (round_dir / "compile.json").write_text(json.dumps(report))
    assert _problems(round_dir) == []
