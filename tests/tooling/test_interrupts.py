"""No traceback reaches the user: SIGINT at any moment is one line, exit status 130 and what to
run next; export with a symlinked patches/ and two prepare-checkouts at once are messages too.

Commands run as processes with SIGINT reset to its default first (a suite started with SIGINT
ignored must not change what they do), and are stopped at named pause points
(FP4SERIES_PAUSE_AT), never after a sleep.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _fakepin import Env, default_signals, git, isolate_git, make_env

from fp4series import build, cli, export
from fp4series.progress import quiet

SRC = Path(__file__).resolve().parents[2] / "src"
P2 = "0002-return-two-and-add-new-module.patch"


@pytest.fixture(autouse=True)
def _git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_git(monkeypatch, tmp_path)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    env = make_env(tmp_path)
    git(env.root, "init", "-q")
    git(env.root, "add", "patches")
    git(env.root, "commit", "-qm", "series")
    return env


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def start(argv: list[str], point: str, pause_dir: Path, cwd: Path) -> subprocess.Popen:
    """`python -m fp4series ARGV` stopped at POINT (its marker file exists on return)."""
    pause_dir.mkdir()
    environ = {**os.environ, "PYTHONPATH": str(SRC), "FP4SERIES_PAUSE_AT": point}
    environ["FP4SERIES_PAUSE_DIR"] = str(pause_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fp4series", *argv],
        cwd=cwd,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    while not (pause_dir / f"{point}.reached").exists():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before {point}: {proc.communicate()}")
        time.sleep(0.01)
    return proc


def export_argv(env: Env, work: Path) -> list[str]:
    return [
        "export", str(work), "--patches", str(env.patches), "--lock", str(env.lock.path),
        "--cache-dir", str(env.cache),
    ]  # fmt: skip


def amend(work: Path) -> None:
    """Change the second series commit's message: export then rewrites one patch."""
    git(work, "commit", "-q", "--amend", "-m", git(work, "log", "-1", "--format=%B") + "More.\n")


def test_sigint_before_export_writes_is_one_line_and_changes_nothing(
    env: Env, tmp_path: Path
) -> None:
    work = env.root / "authoring"
    amend(work)
    before = snapshot(env.patches)
    proc = start(export_argv(env, work), "export-planned", tmp_path / "pause", env.root)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "\nerror: export was interrupted before it wrote anything\n" in err
    assert err.count("error: ") == 1
    assert f"run scripts/export.sh {work} again" in err
    assert snapshot(env.patches) == before


def test_sigint_while_export_writes_waits_until_the_series_is_whole(
    env: Env, tmp_path: Path
) -> None:
    work = env.root / "authoring"
    amend(work)
    reference = tmp_path / "reference"
    export.export_series(work, reference, lock=env.lock, cache_dir=env.cache, progress=quiet())
    pause = tmp_path / "pause"
    proc = start(export_argv(env, work), "export-wrote-one", pause, env.root)
    proc.send_signal(signal.SIGINT)
    (pause / "export-wrote-one.release").write_text("")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert "export was interrupted after it wrote every file" in err
    assert snapshot(env.patches) == snapshot(reference)  # every file new, none left old


def test_sigint_while_the_modules_load_is_one_line(env: Env, tmp_path: Path) -> None:
    before = snapshot(env.patches)
    proc = start(export_argv(env, env.root / "authoring"), "start", tmp_path / "p", env.root)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert err == (
        "error: interrupted while starting; nothing was done\n"
        "  what to do: run the same command again\n"
    )
    assert snapshot(env.patches) == before


def test_sigint_during_argument_parsing_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.argparse.ArgumentParser, "parse_args", interrupted)
    assert cli.main(["export", "x"]) == 130
    assert capsys.readouterr().err.startswith("error: interrupted while starting")


def test_export_into_a_symlinked_patches_dir_is_a_message(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.move(env.patches, elsewhere)
    env.patches.symlink_to(elsewhere)
    work = env.root / "authoring"
    argv = export_argv(env, work)
    assert cli.main(argv) == 0, capsys.readouterr()  # unchanged: nothing at risk
    amend(work)
    before = snapshot(elsewhere)
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"overwrite {env.patches / P2} (not in a git work tree)" in err
    assert "--force" in err and snapshot(elsewhere) == before
    assert cli.main([*argv, "--force"]) == 0
    assert snapshot(elsewhere) != before


def test_a_second_prepare_checkout_waits_for_the_first(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / ".work").mkdir(parents=True)
    fd = os.open(root / ".work" / build.PREPARE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"pid 4242\n", 0)
    environ = {**os.environ, "PYTHONPATH": str(SRC), "FP4SERIES_ROOT": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fp4series", "prepare-checkout"],
        cwd=root,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the event: it says it waits (and does not go on)
    assert first.startswith("waiting for another prepare-checkout (pid 4242) to finish"), first
    assert proc.poll() is None
    os.close(fd)  # the first one is done
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode == 1 and "error: " in err  # this bare project has no upstream.lock


def test_sigint_while_a_command_runs_names_it_and_what_to_run_next(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from fp4series import rebase_series

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(rebase_series, "cmd_rebase", interrupted)
    assert cli.main(["rebase", "--status"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("error: rebase was interrupted\n"), err
    assert "scripts/rebase.sh --status says where it stopped" in err and "--abort" in err
    assert err.count("\n") == 2  # one line and its hint
