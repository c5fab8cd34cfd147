"""Every git command of the tooling goes through fp4series.gitops (gitpython, or its one runner
for plain processes): no other module builds a git command line of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fp4series import gitops

SRC = Path(__file__).resolve().parents[2] / "src" / "fp4series"
RAW_GIT = re.compile(r"""\[\s*["']git["']\s*,|GIT_PYTHON_GIT_EXECUTABLE""")
NOT_YET = {"report.py"}  # imported on a GPU host without gitpython: its `git describe`


def test_no_module_but_gitops_starts_git() -> None:
    found = [
        f"{path.relative_to(SRC)}:{no}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "gitops.py" and path.relative_to(SRC).as_posix() not in NOT_YET
        for no, line in enumerate(path.read_text().splitlines(), 1)
        if RAW_GIT.search(line)
    ]
    assert not found, "start git through fp4series.gitops:\n" + "\n".join(found)


def test_run_drops_the_callers_git_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gitops.run(tmp_path, "init", "-q", check=True)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    proc = gitops.run(tmp_path, "rev-parse", "--absolute-git-dir", check=True)
    assert proc.stdout.strip() == str(tmp_path / ".git")


def test_a_failure_names_the_command_the_place_and_what_git_said(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"git rev-parse --verify nope failed in .*: fatal") as info:
        gitops.run(tmp_path, "rev-parse", "--verify", "nope", check=True, hint="do X")
    assert getattr(info.value, "hint", "") == "do X"
    assert gitops.rev(tmp_path, "HEAD") is None
