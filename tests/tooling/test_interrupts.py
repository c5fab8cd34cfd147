"""No traceback reaches the user: SIGINT at any moment is one line, exit status 130 and what to
run next; export with a symlinked patches/ and two prepare-checkouts at once are messages too.

Commands run as processes with SIGINT reset to its default first (a suite started with SIGINT
ignored must not change what they do), and are stopped at named pause points
(FP4SERIES_PAUSE_AT), never after a sleep.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _fakepin import P2, Env, default_signals, git, snapshot

from fp4series import build, cli, errors, export
from fp4series.progress import quiet

SRC = Path(__file__).resolve().parents[2] / "src"
pytestmark = pytest.mark.committed_project


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
        "export", str(work), "--patches-dir", str(env.patches), "--lock", str(env.lock.path),
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
    from fp4series.replay import rebase

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(rebase, "run", interrupted)
    assert cli.main(["rebase", "--status"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("error: rebase was interrupted\n"), err
    assert "scripts/rebase.sh --status says where it stopped" in err and "--abort" in err
    assert err.count("\n") == 2  # one line and its hint


# ------------------------------------------------------------- a Ctrl-C while python itself starts

ROOT = SRC.parent


def _pending_sigint() -> None:
    """preexec_fn: SIGINT blocked and already sent, as when Ctrl-C comes while the interpreter
    starts under scripts/*.sh (which start python with SIGINT blocked)."""
    default_signals()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    os.kill(os.getpid(), signal.SIGINT)


STARTING = (
    "error: interrupted while starting; nothing was done\n"
    "  what to do: run the same command again\n"
)


def started_with_ctrl_c_pending(argv: list[str], **environ: str) -> subprocess.CompletedProcess:
    """ARGV run with a Ctrl-C already pending (and SIGINT blocked) when it starts."""
    env = {k: v for k, v in os.environ.items() if k != errors.SIGINT_BLOCKED_ENV}
    return subprocess.run(
        argv,
        env={**env, **environ},
        capture_output=True,
        text=True,
        preexec_fn=_pending_sigint,
        check=False,
    )


def test_ctrl_c_during_python_start_up_waits_for_one_line() -> None:
    argv = [sys.executable, "-m", "fp4series", "lint", "--help"]
    ours = {errors.SIGINT_BLOCKED_ENV: "1"}  # as scripts/*.sh start it
    proc = started_with_ctrl_c_pending(argv, PYTHONPATH=str(SRC), **ours)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == STARTING
    proc = started_with_ctrl_c_pending(argv, PYTHONPATH=str(SRC))  # a block not ours stays
    assert proc.returncode == 0 and proc.stderr == ""


@pytest.mark.skipif(
    subprocess.run(["env", "--block-signal=INT", "true"], check=False).returncode != 0,
    reason="this env cannot block a signal (not GNU coreutils >= 8.31)",
)
def test_scripts_start_python_so_that_an_early_ctrl_c_is_one_line() -> None:
    """A Ctrl-C already pending when the script execs python (PY_START: SIGINT blocked) is
    reported by fp4series, once; every script starts its python that way."""
    script = str(ROOT / "scripts" / "lint-patches.sh")
    proc = started_with_ctrl_c_pending([script, "--help"], FP4SERIES_PYTHON=sys.executable)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == STARTING
    for script in sorted((ROOT / "scripts").glob("*.sh")):
        for line in script.read_text().splitlines():
            if "-m fp4series" in line and not line.lstrip().startswith("#"):
                assert '${PY_START[@]+"${PY_START[@]}"}' in line, f"{script.name}: {line}"


def test_a_ctrl_c_in_the_scripts_own_steps_is_one_line() -> None:
    proc = subprocess.run(
        ["bash", "-c", f'. "{ROOT}/scripts/lib/sigint.sh"; kill -INT $$; echo not reached'],
        capture_output=True,
        text=True,
        preexec_fn=default_signals,
        check=False,
    )
    assert proc.returncode == 130 and proc.stdout == ""
    assert proc.stderr == (
        "error: interrupted; nothing more was run\n  what to do: run the same command again\n"
    )


def test_a_command_of_ours_that_reported_the_ctrl_c_is_not_reported_twice() -> None:
    child = (
        "import os, signal, sys; os.kill(os.getppid(), signal.SIGINT); "
        "sys.stderr.write('error: the child said it\\n'); sys.exit(130)"
    )
    proc = subprocess.run(
        ["bash", "-c", f'. "{ROOT}/scripts/lib/sigint.sh"; ours {sys.executable} -c "{child}"'],
        capture_output=True,
        text=True,
        preexec_fn=default_signals,
        check=False,
    )
    assert proc.returncode == 130
    assert proc.stderr == "error: the child said it\n"


def test_an_interrupt_python_wraps_is_still_an_interrupt() -> None:
    wrapped = RuntimeError("Error calling __set_name__")
    wrapped.__cause__ = KeyboardInterrupt()
    assert errors.interrupted(wrapped)
    said = errors.SeriesError("export was interrupted before it wrote anything")
    said.__context__ = KeyboardInterrupt()
    assert not errors.interrupted(said)  # it says what the interrupt left: it stands


def test_an_interrupt_caught_after_exec_of_a_string_still_exits_130() -> None:
    """CPython marks a KeyboardInterrupt leaving exec(str) (dataclasses do that while modules
    load) as unhandled and would end the process by SIGINT after our exit 130."""
    code = (
        "from fp4series.errors import run_main\n"
        "def main():\n"
        "    exec('raise KeyboardInterrupt')\n"
        "run_main(main)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        preexec_fn=default_signals,
        check=False,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.startswith("error: interrupted while starting")
