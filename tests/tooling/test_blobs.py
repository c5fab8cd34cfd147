"""Post-image blob ids: a tree either holds exactly what each patch says it writes, or every
differing file is named with both ids."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from _fakepin import Env, commit, edit, git

from fp4series import cli, export
from fp4series.blobs import blob_id, blob_mismatches, check_series_blobs
from fp4series.errors import SeriesError
from fp4series.gitops import open_repo
from fp4series.lint import lint_paths
from fp4series.patch import parse_patch
from fp4series.progress import quiet
from fp4series.series import load_series

A_PY = "python/sglang/srt/a.py"
NEW_PY = "python/sglang/srt/new.py"


def test_authored_commits_match_their_patches(env: Env) -> None:
    repo = open_repo(env.root / "authoring")
    p1, p2 = load_series(env.patches)
    assert blob_mismatches(repo, "HEAD~1", p1) == []
    assert blob_mismatches(repo, "HEAD", p2) == []


def test_a_differing_or_missing_file_is_named(env: Env) -> None:
    repo = open_repo(env.root / "authoring")
    p1, p2 = load_series(env.patches)
    # at the pin, nothing p2 writes is there yet: a.py differs, new.py is absent
    found = {m.file: m for m in blob_mismatches(repo, "v0.5.11", p2)}
    assert set(found) == {A_PY, "python/sglang/srt/b.py", NEW_PY}
    pin_a = git(env.root / "authoring", "rev-parse", f"v0.5.11:{A_PY}").strip()
    assert found[A_PY].actual == pin_a and found[A_PY].expected == p2.changes[0].new_id
    assert found[NEW_PY].actual is None
    text = found[NEW_PY].describe()
    assert (
        p2.name in text and NEW_PY in text and "<absent>" in text and p2.changes[2].new_id in text
    )


def test_a_deletion_must_be_absent(env: Env) -> None:
    work = env.root / "authoring"
    git(work, "rm", "-q", NEW_PY)
    git(work, "commit", "-q", "-m", "drop new")
    patch_text = git(work, "format-patch", "--full-index", "--stdout", "-1", "HEAD")
    path = env.root / "0003-drop.patch"
    path.write_text(patch_text)

    drop = parse_patch(path)
    assert drop.changes[0].new_path is None
    repo = open_repo(work)
    assert blob_mismatches(repo, "HEAD", drop) == []
    (miss,) = blob_mismatches(repo, "HEAD~1", drop)
    assert miss.file == NEW_PY and miss.expected is None and miss.actual
    replayed = check_series_blobs([drop], repo, "HEAD~1")
    assert replayed.problems == [] and replayed.checked == 1


# --- lint: the series replayed on the pin's blobs ---------------------------------------------

P1 = "0001-change-value-ten.patch"
P3 = "0003-two-hunks-in-a-and-one-in-b.patch"
B_PY = "python/sglang/srt/b.py"


def add_two_hunk_patch(env: Env) -> Path:
    """A third patch: two hunks far apart in a.py, then b.py (so it can be cut between them)."""
    work = env.root / "authoring"
    edit(work, A_PY, "value_3 = 3\n", "value_3 = 33\n")
    edit(work, A_PY, "value_38 = 38\n", "value_38 = 3838\n")
    edit(work, B_PY, "def existing():\n", "def existing():  # kept\n")
    commit(work, "[Quant] Two hunks in a and one in b", "a.py, b.py", "2026-05-03T10:00:00+0000")
    export.export_series(
        work, env.patches, lock=env.lock, cache_dir=env.cache, progress=quiet(), force=True
    )
    return env.patches / P3


def lint(env: Env, **kw: object) -> list[str]:
    found = lint_paths([], root=env.root, patches_dir=env.patches, pin=env.pin, **kw)
    return [str(p) for p in found]


def test_whole_series_replays_to_its_blob_ids(env: Env) -> None:
    add_two_hunk_patch(env)
    result = check_series_blobs(load_series(env.patches), open_repo(env.pin), "v0.5.11")
    assert result.problems == [] and result.skipped == []
    assert result.checked == 6  # a.py, a.py+b.py+new.py, a.py+b.py
    assert lint(env) == []


def test_patch_cut_at_a_hunk_boundary_is_refused(env: Env) -> None:
    path = add_two_hunk_patch(env)
    text = path.read_text()
    second = text.index("@@ -35,")  # a.py's second hunk: it and everything after are lost
    first_header = text[text.index("@@ -1,") :].split("\n", 1)[0]
    path.write_text(text[:second])
    problems = "\n".join(lint(env))
    assert f"{P3}:" in problems
    assert f"{A_PY}: its hunks turn blob" in problems and repr(first_header) in problems
    assert "a hunk is missing after its last hunk" in problems
    assert f"ends after hunk {first_header!r} of {A_PY}" in problems
    # the same cut with the end marker put back: the blob ids alone still refuse it
    path.write_text(text[:second] + "-- \nfp4series\n\n")
    problems = "\n".join(lint(env))
    assert f"{A_PY}: its hunks turn blob" in problems and "end marker" not in problems


def test_patch_cut_at_a_file_boundary_is_refused(env: Env) -> None:
    path = add_two_hunk_patch(env)
    text = path.read_text()
    path.write_text(text[: text.index(f"diff --git a/{B_PY}")])  # b.py's change lost
    problems = "\n".join(lint(env))
    assert f"{P3}:" in problems and "without its end marker" in problems
    assert f"of {A_PY}" in problems and "cut short there" in problems


def test_one_changed_added_line_is_refused(env: Env) -> None:
    path = env.patches / P1
    path.write_text(path.read_text().replace("+value_10 = 100\n", "+value_10 = 101\n"))
    (problem,) = lint(env)
    assert problem.startswith(f"{path}:") or P1 in problem
    assert f"{A_PY}: its hunks turn blob" in problem and "a line in a hunk was changed" in problem


def test_edited_context_line_names_the_hunk(env: Env) -> None:
    path = env.patches / P1
    path.write_text(path.read_text().replace(" value_9 = 9\n", " value_9 = 99\n"))
    (problem,) = lint(env)
    assert f"{A_PY}: hunk '@@ -7,7 +7,7 @@ value_6 = 6' does not match its pre-image" in problem


def test_without_the_pin_the_blob_check_says_it_was_skipped(env: Env) -> None:
    notes: list[str] = []
    found = lint_paths([], root=env.root, patches_dir=env.patches, notes=notes)
    assert found == []
    (note,) = [n for n in notes if "blob check" in n]
    assert "blob check skipped" in note and "fetch-upstream.sh" in note and "--pin" in note
    with pytest.raises(SeriesError, match="blob check cannot run"):
        lint_paths([], root=env.root, patches_dir=env.patches, require_pin=True)


def test_lint_cli_blobs_flag(env: Env, capsys: pytest.CaptureFixture) -> None:
    argv = ["lint", "--patches-dir", str(env.patches), "--root", str(env.root)]
    assert cli.main(argv) == 0
    assert "note: blob check skipped" in capsys.readouterr().err
    assert cli.main([*argv, "--blobs"]) == 1
    err = capsys.readouterr().err
    assert "blob check cannot run" in err and "Traceback" not in err
    assert cli.main([*argv, "--pin", str(env.pin)]) == 0


def test_no_newline_at_end_of_file_round_trips(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f.txt").write_bytes(b"one\ntwo\r\nthree")  # a CR is content; no final LF
    git(repo, "add", "f.txt")
    git(repo, "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-qm", "base")
    (repo / "f.txt").write_bytes(b"one\ntwo\r\nTHREE\n")
    git(repo, "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-qam", "change")
    out = tmp_path / "0001-change.patch"
    out.write_bytes(
        subprocess.run(
            ["git", "format-patch", "--full-index", "--stdout", "-1", "HEAD"],
            cwd=repo,
            capture_output=True,
            check=True,
        ).stdout
    )
    patch = parse_patch(out)
    assert "\\ No newline at end of file" in patch.text
    result = check_series_blobs([patch], open_repo(repo), "HEAD~1")
    assert result.problems == [] and result.checked == 1
    assert blob_id(b"one\ntwo\r\nTHREE\n") == patch.changes[0].new_id
