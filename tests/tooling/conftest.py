"""Fixtures every tooling test shares (helpers to build things with are in _fakepin.py).

- a git that sees no user or system configuration and has a fixed identity (autouse);
- ``env``: the synthetic pin and its two-patch series (_fakepin.make_env); a module marked
  ``pytestmark = pytest.mark.committed_project`` gets the project's patches/ committed to git,
  as export and its safety checks expect of a real project;
- ``fake_tools``: a "python" that logs its compile-check worker calls and an "nvcc" that only
  prints its version (the compile check without a compiler).

The tools tested here that are scripts rather than modules of the package (scripts/device,
bench, bench/kernels, tests/gpu's reference) are importable by their module names, from here
alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _fakepin import Env, git, isolate_git, make_env

from fp4series import compile_check

REPO = Path(__file__).resolve().parents[2]
for _folder in ("scripts/device", "bench", "bench/kernels", "tests/gpu"):
    if str(REPO / _folder) not in sys.path:
        sys.path.insert(0, str(REPO / _folder))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "committed_project: the env fixture's project has patches/ committed to git"
    )


@pytest.fixture(autouse=True)
def _isolated_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_git(monkeypatch, tmp_path)


@pytest.fixture
def env(tmp_path: Path, request: pytest.FixtureRequest) -> Env:
    made = make_env(tmp_path)
    if request.node.get_closest_marker("committed_project"):
        git(made.root, "init", "-q")
        git(made.root, "add", "patches")
        git(made.root, "commit", "-qm", "series")
    return made


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the fake python, the log of its calls); nvcc is found as the fake one."""
    log = tmp_path / "calls.log"
    py = tmp_path / "fakepy"
    py.write_text(f'#!/bin/sh\necho "$@" >> {log}\necho built\n')
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0'\n")
    for f in (py, nvcc):
        f.chmod(0o755)
    monkeypatch.setattr(compile_check.shutil, "which", lambda name: str(nvcc))
    return py, log
