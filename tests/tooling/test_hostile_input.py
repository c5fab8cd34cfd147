"""Values from patches, the series file and upstream.lock that would point outside the project's
own directories are refused with a message naming them; what was refused leaves everything as
it was. Also: the messages for a CRLF patch and for `split.sh --overlap` from another cwd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _fakepin import P2, Env, git

from fp4series import cli, paths
from fp4series.errors import SeriesError
from fp4series.lint import lint_paths
from fp4series.lock import load_lock
from fp4series.patch import parse_patch
from fp4series.series import load_series

ROOT = Path(__file__).resolve().parents[2]
P1 = "0001-change-value-ten.patch"


def lint(env: Env) -> str:
    found = lint_paths([], root=env.root, patches_dir=env.patches, pin=env.pin)
    return "\n".join(str(p) for p in found)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("a/b", "path separator"),
        ("..", "'..'"),
        ("../x", "path separator"),
        ("/etc", "absolute"),
        ("", "empty"),
        ("x\ny", "line break"),
        ("-rf", "not start with"),
        (".hidden", "not start with"),
        ("a b", "letters, digits"),
    ],
)
def test_plain_names_refuse_what_could_leave_a_directory(value: str, why: str) -> None:
    assert why in (paths.name_problem(value) or "")
    with pytest.raises(SeriesError, match="is not a plain name") as exc:
        paths.safe_name(value, "Group:")
    assert repr(value) in str(exc.value) and exc.value.hint


@pytest.mark.parametrize("value", ["v0.5.11", "marlin-fp4", "0001-x.patch", "a_b+c"])
def test_plain_names_pass(value: str) -> None:
    assert paths.safe_name(value, "x") == value


def test_remove_tree_inside_never_leaves_its_owner(tmp_path: Path) -> None:
    owner = tmp_path / "owner"
    (owner / "tree" / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    (owner / "link").symlink_to(outside)
    for bad in (owner, owner / ".." / "outside", owner / "link" / "keep.txt", tmp_path):
        with pytest.raises(SeriesError, match="does not lie inside"):
            paths.remove_tree_inside(bad, owner)
    paths.remove_tree_inside(owner / "link", owner)  # the link goes, never what it points to
    paths.remove_tree_inside(owner / "tree", owner)
    paths.remove_tree_inside(owner / "absent", owner)
    assert sorted(os.listdir(owner)) == [] and (outside / "keep.txt").read_text() == "keep\n"


@pytest.mark.parametrize("entry", ["../outside.patch", "ABS", "sub/0001-x.patch"])
def test_series_entries_must_be_names_in_the_patches_dir(env: Env, entry: str) -> None:
    target = {"ABS": env.root / "abs.patch"}.get(entry, env.patches / entry)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes((env.patches / P1).read_bytes())  # it exists: only its name is wrong
    entry = str(target) if entry == "ABS" else entry
    series = env.patches / "series"
    series.write_text(f"{P1}\n{entry}\n{P2}\n")
    with pytest.raises(SeriesError, match="not a plain file name") as exc:
        load_series(env.patches)
    assert repr(entry) in str(exc.value) and "series:2" in str(exc.value)
    assert f"series:2: {entry!r} is not a plain file name" in lint(env)


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ('tag = "v0.5.11"', 'tag = "../../x"', "[pin].tag"),
        ('tag = "v0.5.11"', 'tag = "/tmp/x"', "[pin].tag"),
        ('tag = "v0.5.12"', 'tag = "a/b"', "[[targets]] #1.tag"),
        ('wheel_filename = "sglang', 'wheel_filename = "../sglang', "[pin].wheel_filename"),
        ('repo_prefix = "python/sglang/"', 'repo_prefix = "python/../x/"', "repo_prefix"),
    ],
)
def test_lock_values_that_become_paths_are_plain(env: Env, old: str, new: str, named: str) -> None:
    lock = env.root / "upstream.lock"
    lock.write_text(lock.read_text().replace(old, new, 1))
    with pytest.raises(SeriesError, match="not a plain name|not a wheel file name") as exc:
        load_lock(lock)
    assert named in str(exc.value)
    # the linter refuses what apply refuses, also when only the patches are linted
    found = lint_paths([], root=env.root, patches_dir=env.patches)
    assert any("upstream.lock" in str(p) and named in str(p) for p in found), found


def test_crlf_patch_is_named_as_such(env: Env) -> None:
    path = env.patches / P1
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    with pytest.raises(SeriesError, match="CRLF") as exc:
        parse_patch(path)
    assert P1 in str(exc.value) and "dos2unix" in exc.value.hint
    text = lint(env)
    assert "CRLF (Windows) line endings" in text and "contains no diff" not in text


def _overlap(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "split.sh"), "--overlap", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "FP4SERIES_PYTHON": sys.executable},
    )


def test_overlap_from_another_directory_reads_the_project_series(tmp_path: Path) -> None:
    (tmp_path / "patches").mkdir()  # a ./patches that is not the project's
    here = _overlap(tmp_path)
    there = _overlap(ROOT)
    assert here.returncode == there.returncode == 0, here.stderr
    assert here.stdout == there.stdout
    assert "PR order constraints" in here.stdout  # ./patches (empty) was not read


def test_overlap_on_a_directory_without_series_says_so(tmp_path: Path) -> None:
    run = _overlap(tmp_path, "--patches-dir", str(tmp_path))
    assert run.returncode == 1
    assert "holds no series" in run.stderr and "no two patches" not in run.stdout
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("value", ["tests/../../outside.py", "/etc/hostname"])
def test_tests_trailer_stays_inside_the_project(env: Env, value: str) -> None:
    path = env.patches / P1
    path.write_text(
        path.read_text().replace("Tests: tests/test_fake.py::test_one", f"Tests: {value}")
    )
    assert f"Tests: {value} must be a path inside the project" in lint(env)


def apply_refusal(env: Env, capsys: pytest.CaptureFixture) -> str:
    """apply on a fresh clone of the pin: its refusal (stderr); the clone is left as it was."""
    co = env.clone("co")
    head = git(co, "rev-parse", "HEAD")
    argv = ["apply", str(co), "--patches-dir", str(env.patches), "--lock", str(env.lock.path)]
    assert cli.main([*argv, "--cache-dir", str(env.cache)]) == 1
    assert git(co, "rev-parse", "HEAD") == head and git(co, "status", "--porcelain") == ""
    return capsys.readouterr().err


def test_a_reordered_series_is_refused_by_lint_and_apply_alike(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    (env.patches / "series").write_text(f"{P2}\n{P1}\n")
    said = f"series:1: {P2}: number 0002 but position 1 in series"
    assert said in lint(env)
    with pytest.raises(SeriesError, match="number 0002 but position 1"):
        load_series(env.patches)
    assert said in apply_refusal(env, capsys)


def test_a_series_entry_linking_outside_the_patches_dir_is_refused_alike(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    outside = env.root / "elsewhere"
    outside.mkdir()
    (env.patches / P2).rename(outside / P2)
    (env.patches / P2).symlink_to(outside / P2)
    said = f"series:2: {P2} is a symbolic link to {outside / P2}, outside {env.patches}"
    assert said in lint(env)
    assert said in apply_refusal(env, capsys)


@pytest.mark.parametrize("group", ["foo.lock", "a..b", "end.", "x@{y"])
def test_a_group_git_cannot_name_a_branch_by_is_a_lint_problem(env: Env, group: str) -> None:
    text = (env.patches / P1).read_text()
    (env.patches / P1).write_text(
        text.replace("Upstream-Status: Pending\n", f"Upstream-Status: Pending\nGroup: {group}\n")
    )
    assert f"Group: {group!r} is not a plain name (" in lint(env)
    assert paths.ref_name_problem(group) or paths.name_problem(group)
    assert paths.ref_name_problem("quant-marlin") is None
