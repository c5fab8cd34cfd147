"""Series lines: upstream.lock's [[lines]], where a line keeps its files, --line on commands."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fp4series.errors import SeriesError
from fp4series.line import Line, add_line_option, line_of_patches_dir, line_versions, resolve_line
from fp4series.lock import load_lock

PIN_SHA = "a" * 64
TARGET_SHA = "b" * 64

LOCK = """# a lock with one maintained line
[upstream]
repo_url = "https://example.invalid/sglang"

[pin]
version = "0.5.11"
wheel_filename = "sglang-0.5.11-py3-none-any.whl"
sha256 = "{pin}"

[[targets]]
version = "0.5.12"

[[targets]]
version = "0.5.23"
wheel_filename = "sglang-0.5.23-py3-none-any.whl"
sha256 = "{target}"
{lines}"""

LINE = """
[[lines]]
version = "0.5.23"
patches = "patches/0.5.23"
rebased_from = "0.5.11"
"""


def _project(tmp_path: Path, lines: str = LINE) -> Path:
    (tmp_path / "upstream.lock").write_text(
        LOCK.format(pin=PIN_SHA, target=TARGET_SHA, lines=lines)
    )
    return tmp_path


def test_the_pin_line_keeps_the_layout_it_always_had(tmp_path: Path) -> None:
    root = _project(tmp_path)
    pin = resolve_line(None, root=root)
    assert pin == resolve_line("0.5.11", root=root)
    assert pin.is_pin and pin.version == "0.5.11" and pin.tag == "v0.5.11"
    assert pin.patches_dir == root / "patches"
    assert pin.venv == root / ".work" / "venv"
    assert pin.checkout == root / ".work" / "checkout"
    assert pin.prefix_dir == root / ".work" / "prefix"
    assert pin.upstream_dir == root / ".work" / "upstream" / "v0.5.11"
    assert pin.requirements == ("requirements/cpu-test.txt", "requirements/constraints.txt")
    assert pin.cpu_suites == ("tests/tooling", "tests/sglang", "tests/serve", "tests/gpu")
    assert pin.reports_dir == root / "reports" / "h200"
    assert pin.rebase_matrix == root / "reports" / "rebase-check.json"
    assert pin.lock.pin.sha256 == PIN_SHA


def test_a_maintained_line_is_the_same_layout_one_step_down(tmp_path: Path) -> None:
    root = _project(tmp_path)
    line = resolve_line("0.5.23", root=root)
    assert not line.is_pin and line.rebased_from == "0.5.11"
    assert line.patches_dir == root / "patches" / "0.5.23"
    assert line.work == root / ".work" / "lines" / "0.5.23"
    assert line.venv == line.work / "venv" and line.checkout == line.work / "checkout"
    assert line.upstream_dir == root / ".work" / "upstream" / "0.5.23"
    assert line.requirements == (
        "requirements/0.5.23/cpu-test.txt",
        "requirements/0.5.23/constraints.txt",
    )
    assert line.cpu_suites == ("tests/sglang-0.5.23",)
    assert line.reports_dir == root / "reports" / "h200" / "0.5.23"
    assert line.rebase_matrix == root / "reports" / "0.5.23" / "rebase-check.json"
    # the lock as the line sees it: its release is the base everything verifies against
    assert (line.release.version, line.tag, line.release.sha256) == (
        "0.5.23",
        "v0.5.23",
        TARGET_SHA,
    )
    assert line.lock.release("0.5.23") is line.release
    assert line_versions(load_lock(root / "upstream.lock")) == ["0.5.11", "0.5.23"]
    assert "0.5.23 line" in line.label and "pin" in resolve_line(root=root).label


def test_an_unknown_line_says_which_exist_and_how_to_make_one(tmp_path: Path) -> None:
    root = _project(tmp_path)
    with pytest.raises(SeriesError) as err:
        resolve_line("0.5.12", root=root)
    assert "no series line on 0.5.12" in str(err.value)
    assert "0.5.11, 0.5.23" in err.value.hint and "rebase.sh --to 0.5.12" in err.value.hint
    with pytest.raises(SeriesError, match="no series line on 0.5.12"):
        load_lock(root / "upstream.lock").for_line("0.5.12")


@pytest.mark.parametrize(
    "lines, match",
    [
        (LINE.replace('"0.5.23"\npatches', '"0.6.0"\npatches'), "not a \\[\\[targets\\]\\]"),
        (LINE.replace('version = "0.5.23"', 'version = "0.5.12"'), "no wheel_filename/sha256"),
        (LINE.replace("patches/0.5.23", "patches/../x"), "must be 'patches/0.5.23'"),
        (LINE.replace('rebased_from = "0.5.11"', 'rebased_from = "0.5.12"'), "neither the pin"),
        (LINE + LINE, "already a line on 0.5.23"),
        (LINE.replace('rebased_from = "0.5.11"\n', ""), "has no 'rebased_from'"),
        ('\n[lines]\nversion = "0.5.23"\n', "array of tables"),
    ],
)
def test_bad_line_entries_are_refused_naming_the_key(
    tmp_path: Path, lines: str, match: str
) -> None:
    root = _project(tmp_path, lines)
    with pytest.raises(SeriesError, match=match):
        load_lock(root / "upstream.lock")


def test_line_of_patches_dir(tmp_path: Path) -> None:
    root = _project(tmp_path)
    assert line_of_patches_dir(root / "patches" / "0.5.23", root) == "0.5.23"
    assert line_of_patches_dir(root / "patches", root) is None
    assert line_of_patches_dir(root / "elsewhere", root) is None
    assert line_of_patches_dir(root / "patches" / "0.5.23" / "deeper", root) is None


def test_the_option(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_line_option(parser)
    assert parser.parse_args([]).line is None
    assert parser.parse_args(["--line", "0.5.23"]).line == "0.5.23"


def test_the_project_lock_parses_its_lines() -> None:
    root = Path(__file__).resolve().parents[2]
    lock = load_lock(root / "upstream.lock")
    for entry in lock.lines:
        line = resolve_line(entry.version, root=root)
        assert isinstance(line, Line) and line.patches_dir.is_dir()
        assert (line.patches_dir / "series").is_file()


def test_the_shell_entry_points_ask_the_line_for_its_scratch_dir(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = _project(tmp_path)
    src = Path(__file__).resolve().parents[2] / "src"

    def work(version: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fp4series.line", "work", version],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(src), "FP4SERIES_ROOT": str(root), "PATH": "/usr/bin:/bin"},
        )

    assert work("0.5.11").stdout.strip() == str(root / ".work")  # the pin's own version
    assert work("0.5.23").stdout.strip() == str(root / ".work" / "lines" / "0.5.23")
    unknown = work("0.6.0")
    assert unknown.returncode != 0 and "no series line on 0.6.0" in unknown.stderr
