"""The rebase command on synthetic releases: a fake project (a git repo with upstream.lock and a
7-patch series on the pin 0.5.11) and two newer releases. 0.5.12 absorbed patch 1; 0.5.13 (the
target) also shifted a.py's lines, moved jit/k.h to kernels/jit/k.h, changed a context line of
d.py, changed the very line patch 5 changes (a conflict) and has the new file of patch 6.

Expected line on 0.5.13: 1 dropped (upstream since 0.5.12), 2 offset, 3 clean on the moved
file, 4 three-way, 5 stopped for the user, 6 shrunk (its new file is upstream), 7 clean.
Kills happen at named pause points (FP4SERIES_PAUSE_AT), never after a sleep.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import _fakepin as fakepin
import pytest

from fp4series import cli, export, upstream
from fp4series.lock import load_lock
from fp4series.progress import quiet
from fp4series.replay import engine as replay
from fp4series.replay.record import parse_dropped, stable_patch_id
from fp4series.series import read_series_names

SRC = Path(__file__).resolve().parents[2] / "src"
V = "0.5.13"
C_PY = "".join(f"c_{i} = {i}\n" for i in range(1, 21))
D_PY = "".join(f"d_{i} = {i}\n" for i in range(1, 31))
E_PY = "".join(f"e_{i} = {i}\n" for i in range(1, 21))
HELPERS = "HELPER_A = 1\nHELPER_B = 2\nHELPER_C = 3\nHELPER_D = 4\n"
PIN = {
    "sglang/srt/a.py": fakepin.A_PY,
    "sglang/srt/b.py": fakepin.B_PY,
    "sglang/srt/c.py": C_PY,
    "sglang/srt/d.py": D_PY,
    "sglang/srt/e.py": E_PY,
    "sglang/jit/k.h": fakepin.K_H,
}
ABSORBED = E_PY.replace("e_5 = 5\n", "e_5 = 500\n")
R12 = {**PIN, "sglang/srt/e.py": ABSORBED}
R13 = {
    **{k: v for k, v in R12.items() if k != "sglang/jit/k.h"},
    "sglang/srt/a.py": "".join(f"# upstream header {i}\n" for i in range(5)) + fakepin.A_PY,
    "sglang/kernels/jit/k.h": fakepin.K_H.replace("int kernel_line_1 = 1;\n", "// moved\n"),
    "sglang/srt/d.py": D_PY.replace("d_18 = 18\n", "d_18 = 1800\n"),
    "sglang/srt/c.py": C_PY.replace("c_10 = 10\n", "c_10 = 11\n"),
    "sglang/srt/helpers.py": HELPERS + "MORE = 5\n",
}
SOURCE = [
    "0001-absorbed-change.patch",
    "0002-offset-change.patch",
    "0003-kernel-change.patch",
    "0004-three-way-change.patch",
    "0005-conflicting-change.patch",
    "0006-partly-upstream-change.patch",
    "0007-clean-change.patch",
]
LINE = [
    "0001-offset-change.patch",
    "0002-kernel-change.patch",
    "0003-three-way-change.patch",
    "0004-conflicting-change.patch",
    "0005-partly-upstream-change.patch",
    "0006-clean-change.patch",
]
C_REL = "python/sglang/srt/c.py"
RESOLVED = C_PY.replace("c_10 = 10\n", "c_10 = 100\n")


def wheel_name(version: str) -> str:
    return f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"


def build_project(tmp: Path) -> tuple[Path, Path]:
    """(project root, wheel cache): the lock names three verified wheels, the releases are
    materialized under .work/upstream, and patches/ holds the series exported from commits."""
    root, cache = tmp / "project", tmp / "cache"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_fake.py").write_text("def test_one():\n    pass\n")
    (root / ".gitignore").write_text("/.work/\n")
    (cache / "wheels").mkdir(parents=True)
    sha = {
        v: upstream.sha256_file(fakepin.make_wheel(cache / "wheels" / wheel_name(v), files))
        for v, files in (("0.5.11", PIN), ("0.5.12", R12), (V, R13))
    }
    text = (
        '# test lock\n[upstream]\nrepo_url = "https://github.com/sgl-project/sglang"\n\n'
        '[pin]\nversion = "0.5.11"\ntag = "v0.5.11"\ncommit = "unresolved"  # fill me\n'
        f'wheel_filename = "{wheel_name("0.5.11")}"\nsha256 = "{sha["0.5.11"]}"\n\n'
        '[paths]\nwheel_prefix = "sglang/"\nrepo_prefix = "python/sglang/"\n'
    )
    for v in ("0.5.12", V):
        text += (
            f'\n[[targets]]\nversion = "{v}"\ntag = "v{v}"\ncommit = "unresolved"\n'
            f'wheel_filename = "{wheel_name(v)}"\nsha256 = "{sha[v]}"\n'
        )
    (root / "upstream.lock").write_text(text)
    lock = load_lock(root / "upstream.lock")
    assert [lock.release(v).sha256 for v in sha] == list(sha.values())
    for v in sha:
        upstream.materialize(
            lock.release(v), root / ".work" / "upstream" / v, cache, lock=lock, progress=quiet()
        )
    work = tmp / "authoring"
    fakepin.git(tmp, "clone", "-q", str(root / ".work" / "upstream" / "0.5.11"), str(work))
    fakepin.git(work, "checkout", "-q", "-b", "work", "v0.5.11")

    def change(rel: str, old: str, new: str, subject: str, extra: str = "") -> None:
        fakepin.edit(work, f"python/sglang/{rel}", old, new)
        n = len(fakepin.git(work, "rev-list", "v0.5.11..HEAD").split()) + 1
        fakepin.commit(work, f"[Quant] {subject}", rel, f"2026-05-0{n}T10:00:00+0000", extra)

    change("srt/e.py", "e_5 = 5\n", "e_5 = 500\n", "Absorbed change")
    change("srt/a.py", "value_20 = 20\n", "value_20 = 2000\n", "Offset change")
    change("jit/k.h", "kernel_line_15 = 15;", "kernel_line_15 = 150;", "Kernel change")
    dep = "\nDepends-On: 0001-absorbed-change.patch"
    change("srt/d.py", "d_20 = 20\n", "d_20 = 2000\n", "Three-way change", dep)
    change("srt/c.py", "c_10 = 10\n", "c_10 = 100\n", "Conflicting change")
    (work / "python/sglang/srt/helpers.py").write_text(HELPERS)
    dep = "\nDepends-On: 0002-offset-change.patch"
    change("srt/a.py", "value_35 = 35\n", "value_35 = 350\n", "Partly upstream change", dep)
    change("srt/b.py", "    return 1\n", "    return 2\n", "Clean change")
    export.export_series(work, root / "patches", lock=lock, cache_dir=cache, progress=quiet())
    assert read_series_names(root / "patches") == SOURCE
    write_report(root, "0.5.12")
    fakepin.git(root, "init", "-q", ".")
    fakepin.git(root, "add", "-A")
    fakepin.git(root, "commit", "-qm", "project", env=fakepin.IDENTITY)
    return root, cache


def write_report(root: Path, absorbed_in: str) -> None:
    """A committed rebase check of this series: patch 1 judged upstream from ABSORBED_IN on."""
    releases = ["0.5.12", V]
    details = {n: {r: {"verdict": "clean"} for r in releases} for n in SOURCE}
    for r in releases[releases.index(absorbed_in) :]:
        details[SOURCE[0]][r] = {"verdict": "upstream"}
    report = {"pin": "0.5.11", "releases": releases, "patches": SOURCE, "details": details}
    (root / "reports").mkdir(exist_ok=True)
    (root / "reports" / "rebase-check.json").write_text(json.dumps(report))


@contextmanager
def in_project(root: Path, cache: Path) -> Iterator[None]:
    old_env = {k: os.environ.get(k) for k in ("FP4SERIES_ROOT", "FP4SERIES_CACHE")}
    old_cwd = Path.cwd()
    os.environ.update(FP4SERIES_ROOT=str(root), FP4SERIES_CACHE=str(cache))
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Project:
    def __init__(self, root: Path, cache: Path) -> None:
        self.root, self.cache = root, cache
        self.work = root / ".work" / "rebase" / V
        self.co = self.work / "checkout"
        self.out = root / "patches" / V

    def rebase(self, *args: str) -> tuple[int, str]:
        """The command in this process; (exit status, stdout + stderr)."""
        out, err = io.StringIO(), io.StringIO()
        with in_project(self.root, self.cache), redirect_stdout(out), redirect_stderr(err):
            rc = cli.main(["rebase", *args])
        return rc, out.getvalue() + err.getvalue()

    def proc_env(self, point: str = "", pause_dir: Path | None = None) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(SRC), "FP4SERIES_ROOT": str(self.root)}
        env["FP4SERIES_CACHE"] = str(self.cache)
        if pause_dir is not None:
            env.update(FP4SERIES_PAUSE_AT=point, FP4SERIES_PAUSE_DIR=str(pause_dir))
        return env

    def kill_at(self, point: str, *args: str) -> None:
        """Run the command as a process, wait until it reaches POINT, SIGKILL it there."""
        proc = self.paused_at(point, *args)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)

    def paused_at(self, point: str, *args: str) -> subprocess.Popen:
        """The command as a process, waiting at POINT (release: touch <dir>/<point>.release)."""
        where = self.root.parent / f"pause-{point}"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "fp4series", "rebase", *args],
            cwd=self.root,
            env=self.proc_env(point, where),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        while not (where / f"{point}.reached").exists():  # the process says it is there
            if proc.poll() is not None:
                pytest.fail(f"exited {proc.returncode} before {point}:\n{proc.communicate()[0]}")
            time.sleep(0.01)
        return proc

    def git(self, *args: str) -> str:
        return fakepin.git(self.co, *args)

    def state(self) -> dict:
        return json.loads((self.work / "state.json").read_text())

    def project_status(self) -> str:
        return fakepin.git(self.root, "status", "--porcelain", "--untracked-files=all")

    def resolve(self) -> None:
        (self.co / C_REL).write_text(RESOLVED)
        self.git("add", C_REL)


def copy_project(src: Project, tmp: Path) -> Project:
    dest = tmp / "copy"
    shutil.copytree(src.root.parent, dest, symlinks=True)
    return Project(dest / "project", dest / "cache")


@pytest.fixture(scope="module", autouse=True)
def _isolated_git(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No user/system git config leaks in (module-wide: the fixtures build repos too)."""
    with pytest.MonkeyPatch.context() as mp:
        fakepin.isolate_git(mp, tmp_path_factory.mktemp("git"))
        yield


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Project:
    return Project(*build_project(tmp_path_factory.mktemp("rebase")))


@pytest.fixture(scope="module")
def lined(template: Project, tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The template with the 0.5.13 line made (the conflict resolved) and committed."""
    p = copy_project(template, tmp_path_factory.mktemp("lined"))
    assert p.rebase("--to", V)[0] == 1
    p.resolve()
    rc, out = p.rebase("--continue")
    assert rc == 0, out
    fakepin.git(p.root, "add", "-A")
    fakepin.git(p.root, "commit", "-qm", "line 0.5.13", env=fakepin.IDENTITY)
    return p


@pytest.fixture
def project(template: Project, tmp_path: Path) -> Project:
    return copy_project(template, tmp_path)


def outside_work(root: Path) -> dict[str, str]:
    """Every file of the project but the tool's .work (and git's index, which status may
    refresh): what 'nothing changed' means."""
    fp = fakepin.tree_fingerprint(root)
    return {k: v for k, v in fp.items() if not k.startswith(".work") and k != ".git/index"}


def outcomes(state: dict) -> dict[str, str]:
    return {d["patch"]: d["outcome"] for d in state["done"]}


# --------------------------------------------------------------------------------------- tests


def test_replay_stops_at_the_conflict_then_continue_writes_the_line(project: Project) -> None:
    p = project
    fakepin.git(p.root, "rm", "-q", "reports/rebase-check.json")  # judge 0.5.12 itself
    fakepin.git(p.root, "commit", "-qm", "no report", env=fakepin.IDENTITY)
    lock_before = (p.root / "upstream.lock").read_text()
    rc, out = p.rebase("--to", V)
    assert rc == 1, out
    assert "judge the series on 0.5.12 (where did upstream take it?)" in out
    st = p.state()
    assert outcomes(st) == {
        SOURCE[0]: "dropped",
        SOURCE[1]: "offset",
        SOURCE[2]: "clean",
        SOURCE[3]: "three-way",
    }
    assert (
        "followed python/sglang/jit/k.h -> python/sglang/kernels/jit/k.h" in st["done"][2]["detail"]
    )
    # stopped: the 3-way conflict is in the work checkout, the message is prepared
    assert st["step"]["phase"] == "stopped" and st["step"]["patch"] == SOURCE[4]
    assert "<<<<<<<" in (p.co / C_REL).read_text()
    assert p.git("ls-files", "-u", C_REL).count(C_REL) == 3
    msg = (p.work / "message").read_text()
    pid = stable_patch_id((p.root / "patches" / SOURCE[4]).read_text())
    assert msg.startswith("[Quant] Conflicting change\n\nWhy:\n")
    assert msg.endswith(f"Tests: tests/test_fake.py::test_one\nRebased-From: {SOURCE[4]} {pid}\n")
    for needle in (
        f"stopped at {SOURCE[4]} (5 of 7; judged conflict on {V})",
        f"    {C_REL}\n",
        f"git -C .work/rebase/{V}/checkout add {C_REL}",
        "scripts/rebase.sh --continue\n",
        'scripts/rebase.sh --continue --drop "why"',
        "scripts/rebase.sh --abort",
        f"commit -F .work/rebase/{V}/message",
    ):
        assert needle in out, needle
    assert p.project_status() == ""  # nothing of the project's was written before the end
    assert (p.root / "upstream.lock").read_text() == lock_before
    # --continue refuses while unmerged paths remain
    rc, out = p.rebase("--continue")
    assert rc == 1 and f"unmerged paths remain in {p.co}: {C_REL}" in out
    p.resolve()
    rc, out = p.rebase("--continue")
    assert rc == 0, out
    assert not p.work.exists()
    # the line: the series, the patches, the drop record, the lock entry
    assert read_series_names(p.out) == LINE
    texts = {n: (p.out / n).read_text() for n in LINE}
    for name, source in zip(LINE, SOURCE[1:], strict=True):
        pid = stable_patch_id((p.root / "patches" / source).read_text())
        assert f"\nRebased-From: {source} {pid}\n" in texts[name]
        assert "From: Patch Author <author@example.com>" in texts[name]
    assert "Depends-On" not in texts[LINE[2]]  # its dependency was dropped
    assert "\nDepends-On: 0001-offset-change.patch\n" in texts[LINE[4]]
    assert "+++ b/python/sglang/kernels/jit/k.h" in texts[LINE[1]]
    assert "helpers.py" not in texts[LINE[4]] and "+value_35 = 350" in texts[LINE[4]]
    assert "+c_10 = 100" in texts[LINE[3]] and "-c_10 = 11" in texts[LINE[3]]
    (stanza,) = parse_dropped(p.out / "dropped").stanzas
    pid = stable_patch_id((p.root / "patches" / SOURCE[0]).read_text())
    assert stanza.fields[:4] == [
        ("Patch", SOURCE[0]),
        ("Patch-Id", pid),
        ("Applied-Upstream", "0.5.12"),  # judged on 0.5.12: no committed report here
        ("Verdict", "upstream"),
    ]
    assert stanza.get("Evidence")
    lock_after = (p.root / "upstream.lock").read_text()
    assert lock_after == lock_before.rstrip("\n") + (
        f'\n\n[[lines]]\nversion = "{V}"\npatches = "patches/{V}"\nrebased_from = "0.5.11"\n'
    )
    assert p.project_status() == " M upstream.lock\n" + "".join(
        f"?? patches/{V}/{n}\n" for n in sorted([*LINE, "dropped", "series"])
    )
    for needle in (
        f"rebased 7 patches from 0.5.11 onto {V}: 6 in patches/{V}",
        f"dropped (upstream has them) (1):\n    {SOURCE[0]}: upstream since 0.5.12",
        f"shrunk (1):\n    {SOURCE[5]} -> {LINE[4]}: 1 of 2 hunks removed (already upstream: "
        "python/sglang/srt/helpers.py hunk #1), the rest offset",
        f"resolved by hand (1):\n    {SOURCE[4]} -> {LINE[3]}: resolved by hand",
        f"    {SOURCE[3]} -> {LINE[2]}: three-way",
    ):
        assert needle in out, needle
    assert p.rebase("--status") == (0, "no rebase in progress\n")


def test_drop_by_hand_never_throws_away_changes(project: Project) -> None:
    p = project
    assert p.rebase("--to", V)[0] == 1
    (p.co / C_REL).write_text(RESOLVED)  # started resolving, not added yet
    rc, out = p.rebase("--continue", "--drop", "upstream went its own way")
    assert rc == 1 and "--drop would throw your changes away" in out
    assert (p.co / C_REL).read_text() == RESOLVED
    rc, out = p.rebase("--continue")
    assert rc == 1 and "unmerged paths remain" in out
    p.git("checkout", "HEAD", "--", C_REL)  # the user discards it: no change at all
    rc, out = p.rebase("--continue")
    assert rc == 1 and "nothing changed since the rebase stopped there" in out
    assert '--continue --drop "why"' in out
    rc, out = p.rebase("--continue", "--drop", "upstream went its own way")
    assert rc == 0, out
    assert "dropped by hand (1):\n    0005-conflicting-change.patch: upstream went its own" in out
    stanzas = parse_dropped(p.out / "dropped").stanzas
    assert [s.get("Patch") for s in stanzas] == [SOURCE[0], SOURCE[4]]
    assert stanzas[1].fields[2:6] == [
        ("Applied-Upstream", V),  # never judged (partly) upstream before: the target
        ("Verdict", "conflict"),
        ("Resolution", "dropped by hand"),
        ("Reason", "upstream went its own way"),
    ]
    assert len(read_series_names(p.out)) == 5


def test_abort_and_a_second_start_while_one_is_in_progress(project: Project) -> None:
    p = project
    write_report(p.root, V)  # the committed report says: upstream since 0.5.13
    fakepin.git(p.root, "add", "-A")
    fakepin.git(p.root, "commit", "-qm", "report", env=fakepin.IDENTITY)
    before = outside_work(p.root)
    rc, out = p.rebase("--to", V)
    assert rc == 1
    assert "Applied-Upstream: 0.5.13\n" in p.state()["drops"][0] + "\n"  # read, not judged
    assert "judge the series on 0.5.12" not in out
    rc, out = p.rebase("--to", V)
    assert rc == 1
    assert f"a rebase is in progress: to {V}, stopped at {SOURCE[4]} (conflict)" in out
    assert "scripts/rebase.sh --continue" in out and "scripts/rebase.sh --abort" in out
    rc, out = p.rebase("--status")
    assert rc == 0 and f"{SOURCE[3]}: three-way" in out and f"{SOURCE[6]}: to do" in out
    assert f"stopped at {SOURCE[4]}" in out
    rc, out = p.rebase("--abort")
    assert rc == 0 and f"removed .work/rebase/{V}" in out
    assert not p.work.exists()
    assert outside_work(p.root) == before
    assert p.rebase("--continue")[1].startswith("error: no rebase in progress")


def test_sigkill_mid_rebase_and_mid_write_then_continue(project: Project, lined: Project) -> None:
    p = project
    p.kill_at("step-committed", "--to", V)  # patch 2 committed, its step not yet recorded done
    st = p.state()
    assert st["step"] == {"patch": SOURCE[1], "start": st["step"]["start"], "phase": "working"}
    assert len(p.git("rev-list", f"v{V}..HEAD").split()) == 1
    rc, out = p.rebase("--continue")
    assert rc == 1 and "interrupted before it was handed to you; redoing it" in out
    assert len(p.git("rev-list", f"v{V}..HEAD").split()) == 3  # the killed step's commit redone
    p.resolve()
    p.kill_at("write-exported", "--continue")  # the line exported into patches/, nothing else
    assert p.state()["phase"] == "write"
    assert (
        not (p.out / "dropped").exists()
        and "[[lines]]" not in (p.root / "upstream.lock").read_text()
    )
    rc, out = p.rebase("--continue")
    assert rc == 0, out
    for name in [*LINE, "series", "dropped"]:  # as if never killed
        assert (p.out / name).read_bytes() == (lined.out / name).read_bytes(), name
    assert (p.root / "upstream.lock").read_text() == (lined.root / "upstream.lock").read_text()


def line_and_lock(p: Project) -> dict[str, tuple[bytes, int]]:
    """The files the final write may change, with their modes."""
    files = [p.root / "upstream.lock", *(sorted(p.out.iterdir()) if p.out.is_dir() else [])]
    return {str(f.relative_to(p.root)): (f.read_bytes(), f.stat().st_mode & 0o777) for f in files}


def test_abort_moves_a_resolution_begun_and_untracked_files_aside(project: Project) -> None:
    p = project
    before = outside_work(p.root)
    assert p.rebase("--to", V)[0] == 1
    (p.co / C_REL).write_text(RESOLVED)  # half done: edited, not yet added
    (p.co / "notes.txt").write_text("mine\n")
    rc, out = p.rebase("--abort")
    assert rc == 0, out
    assert "held changes or untracked files of yours: moved it to .work/rebase-aborted/" in out
    (kept,) = (p.root / ".work" / "rebase-aborted").iterdir()
    assert f"moved it to .work/rebase-aborted/{kept.name}/checkout" in out
    assert (kept / "checkout" / C_REL).read_text() == RESOLVED
    assert (kept / "checkout" / "notes.txt").read_text() == "mine\n"
    assert (kept / "message").is_file()
    assert not p.work.exists() and outside_work(p.root) == before
    assert "the project's patches and lock were not touched" in out


def test_abort_of_a_stop_as_the_rebase_left_it_keeps_nothing_aside(project: Project) -> None:
    assert project.rebase("--to", V)[0] == 1
    rc, out = project.rebase("--abort")
    assert rc == 0 and "moved it to" not in out, out
    assert not (project.root / ".work" / "rebase-aborted").exists()


@pytest.mark.parametrize("point", ["write-exported", "write-done"])
def test_abort_after_the_final_write_began_puts_line_and_lock_back(
    project: Project, point: str
) -> None:
    p = project
    (p.root / "upstream.lock").chmod(0o664)
    before, files = line_and_lock(p), outside_work(p.root)
    assert p.rebase("--to", V)[0] == 1
    p.resolve()
    p.kill_at(point, "--continue")
    assert p.state()["phase"] == ("write" if point == "write-exported" else "done")
    assert line_and_lock(p) != before  # the write had begun
    rc, out = p.rebase("--abort")
    assert rc == 0, out
    assert f"put back as they were before it: patches/{V}/, upstream.lock" in out
    assert "were not touched" not in out
    assert line_and_lock(p) == before and not p.out.exists()
    assert outside_work(p.root) == files and not p.work.exists()


def test_a_kill_inside_abort_is_said_and_a_second_abort_finishes_it(project: Project) -> None:
    p = project
    (p.root / "upstream.lock").chmod(0o664)
    before = line_and_lock(p)
    assert p.rebase("--to", V)[0] == 1
    p.resolve()
    p.kill_at("write-exported", "--continue")
    (p.co / "notes.txt").write_text("mine\n")
    p.kill_at("abort-restored", "--abort")
    rc, out = p.rebase("--status")
    assert rc == 0 and "an --abort was interrupted" in out and "scripts/rebase.sh --abort" in out
    rc, out = p.rebase("--continue")
    assert rc == 1 and "is being aborted" in out and "finish the abort" in out
    rc, out = p.rebase("--abort")
    assert rc == 0 and not p.work.exists(), out
    assert line_and_lock(p) == before
    (kept,) = (p.root / ".work" / "rebase-aborted").iterdir()
    assert (kept / "checkout" / "notes.txt").read_text() == "mine\n"


def test_a_work_dir_no_rebase_made_is_never_removed(project: Project) -> None:
    p = project
    p.work.mkdir(parents=True)
    (p.work / "mine.txt").write_text("mine\n")
    rc, out = p.rebase("--to", V)
    assert rc == 1 and f".work/rebase/{V} exists but no rebase made it" in out, out
    assert (p.work / "mine.txt").read_text() == "mine\n"
    assert p.rebase("--abort")[1].startswith("error: no rebase in progress")
    assert (p.work / "mine.txt").read_text() == "mine\n"


def test_kill_in_the_final_cleanup_is_a_finished_rebase(project: Project, lined: Project) -> None:
    p = project
    (p.root / "upstream.lock").chmod(0o664)
    assert p.rebase("--to", V)[0] == 1
    p.resolve()
    p.kill_at("write-done", "--continue")
    rc, out = p.rebase("--status")
    assert rc == 0 and f"rebase to {V} finished: the line is written into patches/{V}" in out
    assert "scripts/rebase.sh --continue" in out and "no rebase in progress" not in out
    rc, out = p.rebase("--continue")
    assert rc == 0 and f"rebased 7 patches from 0.5.11 onto {V}" in out, out
    assert not p.work.exists()
    for name in [*LINE, "series", "dropped"]:
        assert (p.out / name).read_bytes() == (lined.out / name).read_bytes(), name
    assert (p.root / "upstream.lock").stat().st_mode & 0o777 == 0o664  # its mode kept


def test_kill_after_the_work_dir_was_renamed_away_leaves_no_half_rebase(project: Project) -> None:
    p = project
    assert p.rebase("--to", V)[0] == 1
    p.resolve()
    p.kill_at("work-renamed", "--continue")
    assert not p.work.exists()
    assert p.rebase("--status") == (0, "no rebase in progress\n")
    rc, out = p.rebase("--abort")
    assert rc == 1 and "no rebase in progress; nothing to abort" in out
    assert read_series_names(p.out) == LINE
    rc, out = p.rebase("--continue")  # any later command clears the renamed directory
    assert rc == 1 and not [d for d in p.work.parent.iterdir() if d.name.startswith(".")]


def test_status_while_another_rebase_runs_says_so(project: Project) -> None:
    p = project
    proc = p.paused_at("begun", "--to", V)
    rc, out = p.rebase("--status")
    assert rc == 0 and f"a rebase command is running now (pid {proc.pid})" in out, out
    assert "has not recorded its first step yet" in out and "no rebase in progress" not in out
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    rc, out = p.rebase("--status")
    assert rc == 0 and "killed while it started" in out and "--abort" in out, out
    assert p.rebase("--abort")[0] == 0 and not p.work.exists()


def test_own_commit_without_the_trailer_gets_it(project: Project) -> None:
    p = project
    assert p.rebase("--to", V)[0] == 1
    p.resolve()
    p.git("commit", "-qm", "[Quant] Conflicting change\n\nmy own words\n\nTests: tests/x.py")
    rc, out = p.rebase("--continue")
    assert rc == 1 and "does not pass the linter" in out  # own words lack Why:/What: sections
    assert f"fix the commits in .work/rebase/{V}/checkout" in out
    assert p.state()["phase"] == "finish" and not p.out.exists()
    message = p.git("log", "-1", "--format=%B", "HEAD~2")
    pid = stable_patch_id((p.root / "patches" / SOURCE[4]).read_text())
    assert message == "[Quant] Conflicting change\n\nmy own words\n\nTests: tests/x.py\n" + (
        f"Rebased-From: {SOURCE[4]} {pid}\n\n"
    )
    assert p.rebase("--abort")[0] == 0


def test_rewritten_message_without_the_trailer_gets_it(project: Project) -> None:
    """A prepared message rewritten for the line (its trailer left out) still records
    where the line patch came from, so a later rebase and --check carry it."""
    p = project
    assert p.rebase("--to", V)[0] == 1
    p.resolve()
    prepared = (p.work / "message").read_text()
    own = "\n".join(ln for ln in prepared.split("\n") if not ln.startswith("Rebased-From:"))
    (p.work / "message").write_text(own.replace("Why:\n", "Why:\nthe line's own words\n", 1))
    rc, out = p.rebase("--continue")
    assert rc == 0, out
    pid = stable_patch_id((p.root / "patches" / SOURCE[4]).read_text())
    text = (p.out / LINE[3]).read_text()
    assert "the line's own words" in text
    assert f"\nRebased-From: {SOURCE[4]} {pid}\n" in text


def test_check_reproduces_the_committed_line_and_fails_on_an_edit(
    lined: Project, tmp_path: Path
) -> None:
    p = copy_project(lined, tmp_path)
    before = outside_work(p.root)
    rc, out = p.rebase("--to", V, "--check")
    assert rc == 0, out
    assert f"reproduces patches/{V} byte for byte (8 files)" in out
    assert outside_work(p.root) == before
    assert not (p.root / ".work" / "rebase" / "check" / V).exists()
    # a real rerun with the line present replays the record and rewrites it identically
    rc, out = p.rebase("--to", V)
    assert rc == 0, out
    assert "replayed from the record (6)" in out and "dropped as recorded (1)" in out
    assert p.project_status() == ""
    # a hand edit of a line patch is not what the rebase makes
    fakepin.edit(p.out, LINE[5], "+    return 2\n", "+    return 3\n")
    fakepin.git(p.root, "commit", "-qam", "edit", env=fakepin.IDENTITY)
    rc, out = p.rebase("--to", V, "--check")
    assert rc == 1, out
    assert f"  differs: patches/{V}/{LINE[5]}\n" in out
    assert out.count("differs:") == 1, out


def test_one_source_patch_split_into_two_line_patches_is_replayed(
    lined: Project, tmp_path: Path
) -> None:
    """A line may carry one source patch as several single-purpose patches, each with the same
    Rebased-From: the rerun replays them in order and --check reproduces the split line."""
    p = copy_project(lined, tmp_path)
    work = tmp_path / "split"
    fakepin.git(tmp_path, "clone", "-q", str(p.root / ".work" / "upstream" / V), str(work))
    fakepin.git(work, "checkout", "-q", "-b", "line", f"v{V}")
    for name in LINE:
        fakepin.git(work, "am", "-q", "--keep-cr", "--keep-non-patch", str(p.out / name))
    # the clean change (last line patch) becomes two: b.py, then a second change of a.py
    message = fakepin.git(work, "log", "-1", "--format=%B")
    fakepin.edit(work, "python/sglang/srt/a.py", "value_3 = 3\n", "value_3 = 30\n")
    fakepin.git(work, "add", "-A")
    second = message.replace("[Quant] Clean change", "[Quant] Clean change, second part", 1)
    env = {"GIT_AUTHOR_NAME": "Patch Author", "GIT_AUTHOR_EMAIL": "author@example.com"}
    fakepin.git(work, "commit", "-q", "-m", second, env={**fakepin.IDENTITY, **env})
    with in_project(p.root, p.cache):
        lock = load_lock(p.root / "upstream.lock")
        export.export_series(work, p.out, base=f"v{V}", lock=lock, progress=quiet())
    split = [*LINE, "0007-clean-change-second-part.patch"]
    assert read_series_names(p.out) == split
    pid = stable_patch_id((p.root / "patches" / SOURCE[6]).read_text())
    for name in split[-2:]:
        assert f"\nRebased-From: {SOURCE[6]} {pid}\n" in (p.out / name).read_text()
    fakepin.git(p.root, "add", "-A")
    fakepin.git(p.root, "commit", "-qm", "split", env=fakepin.IDENTITY)
    rc, out = p.rebase("--to", V, "--check")
    assert rc == 0, out
    assert f"reproduces patches/{V} byte for byte (9 files)" in out
    rc, out = p.rebase("--to", V)
    assert rc == 0, out
    assert f"{SOURCE[6]} -> {split[-2]}, {split[-1]}" in out
    assert p.project_status() == ""


def test_stale_record_and_uncarried_line_patch_are_said(lined: Project, tmp_path: Path) -> None:
    p = copy_project(lined, tmp_path)
    fakepin.edit(p.root / "patches", SOURCE[4], "+c_10 = 100\n", "+c_10 = 101\n")
    text = (p.out / LINE[5]).read_text()  # a line patch made by hand: no Rebased-From
    hand = "\n".join(ln for ln in text.split("\n") if not ln.startswith("Rebased-From:"))
    (p.out / "0007-hand-made.patch").write_text(hand)
    (p.out / "series").write_text((p.out / "series").read_text() + "0007-hand-made.patch\n")
    rc, out = p.rebase("--to", V, "--check")
    assert rc == 1, out
    assert f"stale record for {SOURCE[4]}: {LINE[3]} (from " in out
    assert "0007-hand-made.patch in " in out and "the rebase does not carry it" in out
    assert f"--check: the replay stopped at {SOURCE[4]} (conflict in {C_REL})" in out
    assert p.project_status() == (
        f" M patches/{V}/series\n M patches/{SOURCE[4]}\n?? patches/{V}/0007-hand-made.patch\n"
    )


def test_line_message_renames_dependencies_and_replaces_the_trailer() -> None:
    msg = "S\n\nWhy:\nx\n\nTests: t.py\nDepends-On: 0001-a.patch, 0002-b.patch\nRebased-From: o 1"
    got = replay.line_message(msg, "0003-c.patch abc", {"0001-a.patch": [], "0002-b.patch": ["N"]})
    assert got == "S\n\nWhy:\nx\n\nTests: t.py\nDepends-On: N\nRebased-From: 0003-c.patch abc\n"
    assert replay.line_message("S\n\nbody", "x y", {}) == "S\n\nbody\n\nRebased-From: x y\n"


def test_options_that_would_be_ignored_are_refused(project: Project) -> None:
    rc, out = project.rebase("--to", V, "--out", str(project.root / "elsewhere"))
    assert rc != 0 and f"a line on {V} lives in" in out and "--check" in out
    assert not project.work.exists()
    rc, out = project.rebase("--to", V, "--line", "0.5.11", "--patches-dir", "patches")
    assert rc != 0 and "both name the series to rebase" in out
    for flag in ("--line", "--out"):
        rc, out = project.rebase("--status", flag, "x")
        assert rc != 0 and "only go with --to" in out
