"""Post-image blob ids: a tree either holds exactly what each patch says it writes, or every
differing file is named with both ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fakepin import Env, git, isolate_git, make_env

from fp4series.blobs import blob_mismatches
from fp4series.gitops import open_repo
from fp4series.series import load_series, parse_patch

A_PY = "python/sglang/srt/a.py"
NEW_PY = "python/sglang/srt/new.py"


@pytest.fixture(autouse=True)
def _git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_git(monkeypatch, tmp_path)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return make_env(tmp_path)


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
