"""scripts/*.sh on a fresh clone with no environment: the tooling venv is made on first use.

A copy of the project's files (what a clone holds, uncommitted edits included, no .work/) runs
apply.sh --help, apply.sh --check on a synthetic pin and lint-patches.sh with only python3.11,
git and pip on the machine. Creating .work/tooling-venv needs pip's index (PyPI, or pip's cache):
marked ``network``; it takes seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from _fakepin import Env, make_env

PROJECT = Path(__file__).resolve().parents[2]


def fresh_copy(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=PROJECT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, (f.decode() for f in files)):
        src = PROJECT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    return dest


def script_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FP4SERIES_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    return env


@pytest.mark.network
def test_fresh_clone_runs_the_scripts_without_an_environment(tmp_path: Path) -> None:
    if not shutil.which("python3.11"):
        pytest.skip("python3.11 is not on PATH")
    root = fresh_copy(tmp_path / "fresh")
    pin: Env = make_env(tmp_path / "pin")
    co = pin.clone("co")

    def script(name: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(root / "scripts" / name), *args],
            capture_output=True,
            text=True,
            env={**script_env(), **extra},
            check=False,
            timeout=300,
        )

    first = script("apply.sh", "--help")
    assert first.returncode == 0, first.stderr
    assert "usage: fp4series apply" in first.stdout
    assert "tooling-venv" in first.stderr  # said what it was doing on first use
    assert (root / ".work" / "tooling-venv" / "bin" / "python").exists()
    assert not (root / ".work" / "venv").exists()

    check = script(
        "apply.sh", "--check", str(co), "--patches-dir", str(pin.patches),
        "--lock", str(pin.lock.path), "--cache-dir", str(pin.cache),
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "would-apply" in check.stdout and "tooling-venv" not in check.stderr  # reused

    lint = script("lint-patches.sh")
    assert lint.returncode == 0, lint.stdout + lint.stderr

    typo = script("lint-patches.sh", FP4SERIES_PYTHON=str(tmp_path / "no-such-python"))
    assert typo.returncode == 2
    assert f"FP4SERIES_PYTHON={tmp_path / 'no-such-python'} is not an executable" in typo.stderr
    assert "Traceback" not in typo.stderr
