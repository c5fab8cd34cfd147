"""A synthetic pin for the tooling tests: a fake sglang wheel, a lock naming it, a materialized
repo tagged v0.5.11, and a small series exported from commits on a clone of it."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from fp4series import export, upstream
from fp4series.lock import Lock, load_lock
from fp4series.progress import quiet

WHEEL = "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"
P1 = "0001-change-value-ten.patch"  # the two patches make_env exports
P2 = "0002-return-two-and-add-new-module.patch"
A_PY = "".join(f"value_{i} = {i}\n" for i in range(1, 41))
B_PY = "def existing():\n    return 1\n"
K_H = "".join(f"int kernel_line_{i} = {i};\n" for i in range(1, 31))
FILES = {"sglang/srt/a.py": A_PY, "sglang/srt/b.py": B_PY, "sglang/jit/k.h": K_H}

MESSAGE = """{subject}

Why:
Because the test needs a reason.

What:
{what}

How verified:
tests/tooling/test_x.py

Upstream-Status: Pending
Tests: tests/test_fake.py::test_one{extra}
"""


def default_signals() -> None:
    """preexec_fn for a command a test signals: SIGINT (and SIGTERM, SIGHUP) as a terminal's
    foreground process has them, whatever the suite was started with (a backgrounded
    scripts/main.sh or a CI runner starts it with SIGINT ignored, which the child inherits)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def isolate_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, identity: bool = True) -> None:
    """No user/system git config leaks in; a fixed identity (IDENTITY false: none at all, as
    on a bare CI machine); a private cache dir."""
    cfg = tmp_path / ("gitconfig" if identity else "no-gitconfig")
    cfg.write_text("[user]\n\tname = Test User\n\temail = test@example.com\n" if identity else "")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    gone = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
    gone += () if identity else ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL")
    for var in gone:
        monkeypatch.delenv(var, raising=False)


# A fixed git identity (and, where commit ids must be reproducible, fixed dates).
IDENTITY = {
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}
FIXED_DATES = {
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00",
}


def git(repo: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    """``git ARGS`` in ``repo`` (``env`` on top of os.environ); stdout, raising on failure."""
    return subprocess.run(
        ["git", *args],
        cwd=repo,
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    ).stdout


def make_wheel(path: Path, files: dict[str, str]) -> Path:
    rows = []
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            data = text.encode()
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        rows.append("sglang-0.5.11.dist-info/RECORD,,")
        zf.writestr("sglang-0.5.11.dist-info/RECORD", "\n".join(rows) + "\n")
    return path


def write_lock(path: Path, sha256: str) -> Path:
    path.write_text(
        "# test lock\n[upstream]\n"
        'repo_url = "https://github.com/sgl-project/sglang"  # upstream\n\n'
        "[pin]\n"
        'version = "0.5.11"\ntag = "v0.5.11"\ncommit = "unresolved"  # fill me\n'
        f'wheel_filename = "{WHEEL}"\nsha256 = "{sha256}"\n\n'
        '[paths]\nwheel_prefix = "sglang/"\nrepo_prefix = "python/sglang/"\n\n'
        "# targets\n[[targets]]\n"
        'version = "0.5.12"\ntag = "v0.5.12"\ncommit = "unresolved"\n'
        'wheel_filename = ""  # empty until fetched\nsha256 = ""\n'
    )
    return path


@dataclass
class Env:
    root: Path  # the fake project (tests/test_fake.py lives here)
    cache: Path
    lock: Lock
    pin: Path  # materialized pin: read-only reference; clone it with .clone()
    patches: Path

    def clone(self, name: str) -> Path:
        dest = self.root / name
        git(self.root, "clone", "-q", str(self.pin), str(dest))
        git(dest, "checkout", "-q", "-b", "work", "v0.5.11")
        settle(dest)
        return dest


def settle(repo: Path) -> None:
    """Age the work tree's mtimes and refresh the index once, so later `git status` runs do not
    rewrite .git/index (racy-git) and byte comparisons of the index are meaningful."""
    old = 1_700_000_000
    for dirpath, dirs, files in os.walk(repo):
        if ".git" in dirs:
            dirs.remove(".git")
        for name in files:
            os.utime(Path(dirpath) / name, (old, old))
    git(repo, "update-index", "--really-refresh")
    git(repo, "status", "--porcelain")


def commit(repo: Path, subject: str, what: str, date: str, extra: str = "") -> None:
    git(repo, "add", "-A")
    env = {
        "GIT_AUTHOR_NAME": "Patch Author",
        "GIT_AUTHOR_EMAIL": "author@example.com",
        "GIT_AUTHOR_DATE": date,
    }
    msg = MESSAGE.format(subject=subject, what=what, extra=extra)
    git(repo, "commit", "-q", "-m", msg, env=env)


def edit(repo: Path, rel: str, old: str, new: str) -> None:
    path = repo / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def make_env(tmp_path: Path) -> Env:
    root = tmp_path / "project"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_fake.py").write_text("def test_one():\n    pass\n")
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheel = make_wheel(cache / "wheels" / WHEEL, FILES)
    lock = load_lock(write_lock(root / "upstream.lock", upstream.sha256_file(wheel)))
    pin = upstream.materialize(lock.pin, tmp_path / "pin", cache, lock=lock, progress=quiet())
    env = Env(root, cache, lock, pin, root / "patches")
    work = env.clone("authoring")
    edit(work, "python/sglang/srt/a.py", "value_10 = 10\n", "value_10 = 100\n")
    commit(work, "[Quant] Change value ten", "a.py: value_10", "2026-05-01T10:00:00+0000")
    edit(work, "python/sglang/srt/b.py", "    return 1\n", "    return 2\n")
    (work / "python/sglang/srt/new.py").write_text("NEW = 1\n")
    edit(work, "python/sglang/srt/a.py", "value_30 = 30\n", "value_30 = 300\n")
    commit(
        work,
        "[Quant] Return two and add new module",
        "b.py, new.py",
        "2026-05-02T10:00:00+0000",
        "\nDepends-On: 0001-change-value-ten.patch",
    )
    export.export_series(work, env.patches, lock=lock, cache_dir=cache, progress=quiet())
    return env


def tree_fingerprint(repo: Path) -> dict[str, str]:
    """sha256 of every file in the work tree and .git (objects excepted: unreachable ones may
    appear), plus HEAD and status: what 'nothing changed' means."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(repo):
        rel_dir = Path(dirpath).relative_to(repo)
        if rel_dir.parts[:2] == (".git", "objects"):
            dirs[:] = []
            continue
        for name in files:
            p = Path(dirpath) / name
            out[str(rel_dir / name)] = hashlib.sha256(p.read_bytes()).hexdigest()
    out["<HEAD>"] = git(repo, "rev-parse", "HEAD")
    out["<status>"] = git(repo, "status", "--porcelain", "--untracked-files=all")
    return out


def snapshot(directory: Path) -> dict[str, str]:
    """sha256 of each file directly in DIRECTORY, by name: what "not one byte changed" means."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def compile_kwargs(tmp_path: Path, python: Path, sglang_dir: Path) -> dict[str, Path]:
    """run_compile_checks' keyword arguments for a tree and the fake python, in TMP_PATH."""
    return {
        "python": python,
        "sglang_dir": sglang_dir,
        "cache_dir": tmp_path / "cache",
        "build_root": tmp_path / "jit",
    }
