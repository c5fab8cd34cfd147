"""export never loses what is in patches/: uncommitted edits and untracked files it would
overwrite or delete are refused (listed) unless --force, a checkout with no series commits is
refused unless --allow-empty, and a write interrupted half-way leaves each file old or new."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _fakepin import P2, Env, git, snapshot

from fp4series import cli, export, paths
from fp4series.errors import SeriesError
from fp4series.progress import quiet

P1 = "0001-change-value-ten.patch"
pytestmark = pytest.mark.committed_project


def run_export(env: Env, checkout: Path, **kw: object) -> list[Path]:
    return export.export_series(
        checkout, env.patches, lock=env.lock, cache_dir=env.cache, progress=quiet(), **kw
    )


def test_hand_edit_is_not_overwritten_without_force(env: Env) -> None:
    (env.patches / P1).write_text((env.patches / P1).read_text() + "a hand edit\n")
    before = snapshot(env.patches)
    with pytest.raises(SeriesError, match="nothing was written") as exc:
        run_export(env, env.root / "authoring")
    assert f"overwrite {env.patches / P1} (uncommitted changes)" in str(exc.value)
    assert P2 not in str(exc.value) and "--force" in exc.value.hint
    assert snapshot(env.patches) == before
    run_export(env, env.root / "authoring", force=True)
    assert git(env.root, "status", "--porcelain", "patches") == ""  # back to the export


def test_untracked_patch_is_not_deleted_without_force(env: Env) -> None:
    stray = env.patches / "0003-my-new-work.patch"
    stray.write_text("not exported yet\n")
    before = snapshot(env.patches)
    with pytest.raises(SeriesError, match=r"delete +\S+0003-my-new-work\.patch"):
        run_export(env, env.root / "authoring")
    assert snapshot(env.patches) == before
    run_export(env, env.root / "authoring", force=True)
    assert not stray.exists()


def test_committed_patches_may_be_replaced_and_removed(env: Env) -> None:
    work = env.clone("shorter")
    git(work, "fetch", "-q", str(env.root / "authoring"), "work")
    git(work, "reset", "-q", "--hard", "FETCH_HEAD~1")  # only the first series commit
    run_export(env, work)  # P2 is committed: git still has it, no --force needed
    assert sorted(snapshot(env.patches)) == [P1, "series"]
    status = git(env.root, "status", "--porcelain", "patches").splitlines()
    assert status == [f" D patches/{P2}", " M patches/series"]


def test_export_of_a_bare_pin_is_refused_unless_allow_empty(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    bare = env.clone("bare")
    before = snapshot(env.patches)
    argv = ["export", str(bare), "--patches-dir", str(env.patches), "--lock", str(env.lock.path)]
    assert cli.main([*argv, "--cache-dir", str(env.cache)]) == 1
    err = capsys.readouterr().err
    assert "has no commits on top of the pin" in err and "--allow-empty" in err
    assert f"delete {env.patches / P1}" in err and f"delete {env.patches / P2}" in err
    assert snapshot(env.patches) == before
    assert cli.main([*argv, "--cache-dir", str(env.cache), "--allow-empty"]) == 0
    assert sorted(snapshot(env.patches)) == ["series"]
    assert (env.patches / "series").read_text() == ""


def test_an_interrupted_export_leaves_each_file_old_or_new(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = env.root / "authoring"
    git(work, "commit", "-q", "--amend", "-m", git(work, "log", "-1", "--format=%B") + "More.\n")
    old = {p.name: p.read_bytes() for p in env.patches.iterdir()}
    new_dir = tmp_path / "complete"
    export.export_series(work, new_dir, lock=env.lock, cache_dir=env.cache, progress=quiet())
    new = {p.name: p.read_bytes() for p in new_dir.iterdir()}
    assert new[P1] == old[P1] and new[P2] != old[P2]
    real_replace = os.replace
    calls: list[str] = []

    def replace_then_die(src: str, dst: str) -> None:
        calls.append(Path(dst).name)
        if Path(dst).name == P2:
            raise KeyboardInterrupt  # killed as it renames P2's new text into place
        real_replace(src, dst)

    monkeypatch.setattr(paths.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_export(env, work)
    assert calls == [P2]  # P1's bytes are the same: left as it is
    now = {p.name: p.read_bytes() for p in env.patches.iterdir()}
    assert now == old  # P2 untouched, no temporary file


def test_export_keeps_each_files_mode_and_new_files_get_the_umasks(
    env: Env, tmp_path: Path
) -> None:
    work = env.root / "authoring"
    git(work, "commit", "-q", "--amend", "-m", git(work, "log", "-1", "--format=%B") + "More.\n")
    git(env.root, "add", "-A")
    git(env.root, "commit", "-qm", "clone")  # only the series' own files are left to change
    for name, mode in ((P1, 0o664), (P2, 0o644), ("series", 0o444 | 0o200)):
        (env.patches / name).chmod(mode)
    old_mask = os.umask(0o027)
    try:
        run_export(env, work)  # P2's text changes, P1's and the series' do not
        fresh = tmp_path / "fresh"
        export.export_series(work, fresh, lock=env.lock, cache_dir=env.cache, progress=quiet())
    finally:
        os.umask(old_mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in env.patches.iterdir()}
    assert modes == {P1: 0o664, P2: 0o644, "series": 0o644}
    assert git(env.root, "status", "--porcelain", "patches") == f" M patches/{P2}\n"
    assert {p.name: p.stat().st_mode & 0o777 for p in fresh.iterdir()} == {
        P1: 0o640,
        P2: 0o640,
        "series": 0o640,
    }


def test_atomic_write_keeps_the_mode_and_a_refused_text_changes_nothing(tmp_path: Path) -> None:
    f = tmp_path / "dir" / "upstream.lock"
    f.parent.mkdir()
    f.write_text("old\n")
    f.chmod(0o664)

    def refuse(tmp: Path) -> None:
        assert tmp.stat().st_mode & 0o777 == 0o664
        raise SeriesError("not a lock")

    with pytest.raises(SeriesError, match="not a lock"):
        paths.write_atomically(f, b"new\n", check=refuse)
    assert f.read_text() == "old\n" and [p.name for p in f.parent.iterdir()] == ["upstream.lock"]
    paths.write_atomically(f, b"new\n")
    assert f.read_text() == "new\n" and f.stat().st_mode & 0o777 == 0o664


def test_a_base_above_the_pin_that_would_delete_patches_is_refused_listing_them(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    work = env.root / "authoring"
    before = snapshot(env.patches)
    argv = ["export", str(work), "--patches-dir", str(env.patches), "--lock", str(env.lock.path)]
    argv += ["--cache-dir", str(env.cache), "--base", "HEAD~1"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "--base HEAD~1 (" in err and "leaves 1 commit(s) on top of it" in err
    assert f"delete {env.patches / P1}" in err and "nothing was written" in err
    assert "--allow-delete" in err and "Traceback" not in err
    assert snapshot(env.patches) == before
    assert cli.main([*argv, "--allow-delete"]) == 0
    assert sorted(snapshot(env.patches)) == ["0001-return-two-and-add-new-module.patch", "series"]
    git(env.root, "checkout", "-q", "--", "patches")
    git(env.root, "clean", "-fq", "--", "patches")
    assert cli.main([*argv[:-2], "--base", "v0.5.11"]) == 0  # the pin: nothing to delete
    assert snapshot(env.patches) == before
