"""The generated tables of the README and docs/: rewritten from patches/ and reports/, drift is
caught."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fp4series import readme
from fp4series.errors import SeriesError

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_documents_are_current() -> None:
    names = set()
    for doc in readme.documents(REPO):
        text = doc.read_text()
        names |= {m["name"] for m in readme.BLOCK.finditer(text)}
        assert readme.render(text, REPO) == (text, []), doc
    assert {"series", "gpu-numerics", "gpu-bench", "line-0.5.23", "tp-matrix"} <= names


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    for rel in ("patches", "reports/h200", "docs"):
        shutil.copytree(REPO / rel, tmp_path / rel)
    for rel in ("README.md", "upstream.lock"):  # the lock names the lines (line-V blocks)
        shutil.copy2(REPO / rel, tmp_path / rel)
    (tmp_path / "tests/sglang").mkdir(parents=True)
    shutil.copy2(REPO / "tests/sglang/_tp_spec.py", tmp_path / "tests/sglang/_tp_spec.py")
    return tmp_path


def test_the_tp_matrix_follows_the_test_data(project: Path) -> None:
    """The block is the CPU test's data (tests/sglang/_tp_spec.py), regenerated as it is."""
    text = (project / "README.md").read_text()
    block = text.split("<!-- generated: tp-matrix -->")[1].split("<!-- end generated")[0]
    assert "| Qwen2.5-7B (`Qwen/Qwen2.5-7B`) | served | served | served | refused (qkv: " in block
    assert "| Qwen2.5-72B (`Qwen/Qwen2.5-72B`) | served | served | padded: down K 7392->7424 |" in (
        block
    )
    assert "experts I 96->128 |" in block
    new, changed = readme.render(text, project)
    assert changed == [] and new == text


def test_a_changed_report_is_drift_and_rewriting_fixes_it(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = project / "reports/h200/bench.json"
    data = json.loads(bench.read_text())
    for row in data["rows"]:
        if row["kind"] == "dense" and row["m"] == 1:
            row["bf16_us"] = row["fp4_us"] * 9.99
    bench.write_text(json.dumps(data))
    monkeypatch.setenv("FP4SERIES_ROOT", str(project))
    doc = project / "docs" / "gpu-proof-and-reports.md"
    from fp4series import cli

    assert cli.main(["readme", "--check"]) == 1
    said = capsys.readouterr().out
    assert f"{doc}: generated blocks out of date: gpu-bench" in said
    assert f"{project / 'README.md'}: generated blocks up to date" in said
    before = doc.read_text()
    assert cli.main(["readme"]) == 0
    after = doc.read_text()
    dense = [r for r in data["rows"] if r["kind"] == "dense"]
    low = min(r["bf16_us"] / r["fp4_us"] for r in dense if r["m"] in (2, 4, 8))
    assert f"| bf16 cuBLAS time / FP4 time (dense) | {low:.2f}-9.99 |" in after
    # patch 13's path is timed from M = 128: no ratio below, Marlin's over it from there
    at_128 = [r["fp4_us"] / r["dequant_us"] for r in dense if r["m"] == 128]
    cell = f"{min(at_128):.2f}-{max(at_128):.2f}"
    assert f"| FP4 time / dequant + cuBLAS time (dense, patch 13) | - | - | - | {cell} |" in after
    for marker, side in (
        ("<!-- generated: gpu-bench -->", 0),
        ("<!-- end generated: gpu-bench", 1),
    ):
        assert before.split(marker)[side] == after.split(marker)[side]  # only the block changed
    assert cli.main(["readme", "--check"]) == 0


def test_a_patch_subject_change_shows_in_the_series_table(project: Path) -> None:
    first = sorted((project / "patches").glob("0001-*.patch"))[0]
    text = first.read_text()
    first.write_text(text.replace("with the 8-bit stride", "with the byte stride", 1))
    new, changed = readme.render((project / "README.md").read_text(), project)
    assert changed == ["series"]
    assert "Marlin: read FP4 block scales with the byte stride (dense)" in new


def test_a_line_block_shows_its_patches_sources_and_drops(project: Path) -> None:
    table = readme.line_table(project, "0.5.23")
    assert (
        "| 1 | NVFP4 Marlin: add the linear bias in its original order | 0004 | Pending |" in table
    )
    assert "| 0003 | 0.5.13 | upstream, dropped as judged upstream |" in table
    dropped = project / "patches" / "0.5.23" / "dropped"
    dropped.write_text(
        dropped.read_text().replace("Applied-Upstream: 0.5.13", "Applied-Upstream: 9.9.9")
    )
    new, changed = readme.render((project / "docs/lines-and-rebase.md").read_text(), project)
    assert changed == ["line-0.5.23"] and "| 9.9.9 |" in new


def test_unknown_block_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SeriesError, match="unknown generated blocks"):
        readme.render("<!-- generated: nope -->\nx\n<!-- end generated: nope -->\n", tmp_path)


def test_the_numerics_table_names_non_finite_repro_output(project: Path) -> None:
    table = readme.numerics_table(project)
    assert "| MoE, the pin's templates | bfloat16 | 3 | non-finite output (3 of 3) |  |" in table
    cases = json.loads((project / "reports/h200/numerics.json").read_text())["cases"]
    dense16 = [c for c in cases if c["path"].endswith("-dense") and c["dtype"] == "float16"
               and c.get("templates", "patched") == "patched"]  # fmt: skip
    assert f"| dense, series | float16 | {len(dense16)} | " in table
