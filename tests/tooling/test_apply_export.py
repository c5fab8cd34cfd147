"""apply.sh / export.sh rules on a synthetic pin: every refusal and failure leaves the checkout
byte-identical (HEAD, status, every file incl. .git/index); apply -> export is byte-stable."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _fakepin import Env, edit, git, settle, tree_fingerprint

from fp4series import cli, export
from fp4series.apply import apply_series
from fp4series.errors import SeriesError
from fp4series.progress import quiet
from fp4series.series import load_series


def run_apply(env: Env, checkout: Path, **kw):
    return apply_series(
        checkout,
        load_series(env.patches),
        lock=env.lock,
        cache_dir=env.cache,
        progress=quiet(),
        **kw,
    )


def test_apply_commits_each_patch_keeping_author_subject_message(env: Env) -> None:
    co = env.clone("co")
    report = run_apply(env, co)
    assert report.ok and report.changed
    assert [r.status for r in report.results] == ["applied", "applied"]
    assert report.base is not None and report.base.how == "tag"
    log = git(co, "log", "--format=%an|%ae|%aI|%s", "v0.5.11..HEAD").splitlines()
    who = "Patch Author|author@example.com"
    assert log == [
        f"{who}|2026-05-02T10:00:00+00:00|[Quant] Return two and add new module",
        f"{who}|2026-05-01T10:00:00+00:00|[Quant] Change value ten",
    ]
    body = git(co, "log", "-1", "--format=%B")
    assert "How verified:" in body and "Depends-On: 0001-change-value-ten.patch" in body
    assert git(co, "rev-parse", "--abbrev-ref", "HEAD").strip() == "work"
    assert git(co, "status", "--porcelain") == ""
    assert (co / "python/sglang/srt/new.py").read_text() == "NEW = 1\n"
    assert not (co / ".git" / "worktrees").exists() or not any((co / ".git/worktrees").iterdir())


def test_already_applied_changes_nothing(env: Env) -> None:
    co = env.clone("co")
    run_apply(env, co)
    settle(co)
    before = tree_fingerprint(co)
    report = run_apply(env, co)
    assert report.ok and not report.changed and report.already_applied
    assert "already applied" in report.format()
    assert tree_fingerprint(co) == before


def test_partially_applied_series_gets_the_rest(env: Env) -> None:
    co = env.clone("co")
    first = load_series(env.patches)[:1]
    apply_series(co, first, lock=env.lock, cache_dir=env.cache, progress=quiet())
    report = run_apply(env, co)
    assert [r.status for r in report.results] == ["already-applied", "applied"]


def test_check_reports_and_changes_nothing(env: Env) -> None:
    co = env.clone("co")
    before = tree_fingerprint(co)
    report = run_apply(env, co, check=True)
    assert [r.status for r in report.results] == ["would-apply", "would-apply"]
    assert not report.changed and "nothing was changed" in report.format()
    assert tree_fingerprint(co) == before


@pytest.mark.parametrize("kind", ["modified", "untracked", "staged"])
def test_dirty_tree_is_refused_unchanged(env: Env, kind: str) -> None:
    co = env.clone("co")
    if kind == "untracked":
        (co / "scratch.txt").write_text("mine\n")
    else:
        edit(co, "python/sglang/srt/b.py", "return 1", "return 7")
        if kind == "staged":
            git(co, "add", "python/sglang/srt/b.py")
    before = tree_fingerprint(co)
    with pytest.raises(SeriesError, match="uncommitted changes or untracked") as exc:
        run_apply(env, co)
    assert "stash" in exc.value.hint
    assert tree_fingerprint(co) == before


def test_not_a_repo_is_refused(env: Env, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(SeriesError, match="not a git repository"):
        run_apply(env, plain)
    with pytest.raises(SeriesError, match="does not exist"):
        run_apply(env, tmp_path / "missing")


def _untagged_copy(env: Env, name: str) -> Path:
    co = env.clone(name)
    git(co, "tag", "-d", "v0.5.11")
    return co


def test_base_proven_by_wheel_record_without_tag(env: Env) -> None:
    co = _untagged_copy(env, "co")
    report = run_apply(env, co)
    assert report.ok and report.base is not None and report.base.how == "record"
    again = run_apply(env, co)  # series on top, still recognized via HEAD~2
    assert again.already_applied and again.base is not None and again.base.how == "record"


def test_wrong_base_is_refused_with_what_to_do(env: Env) -> None:
    co = _untagged_copy(env, "co")
    edit(co, "python/sglang/jit/k.h", "kernel_line_1 ", "kernel_line_one ")
    edit(co, "python/sglang/srt/b.py", "existing", "renamed")
    git(co, "commit", "-qam", "local drift")
    settle(co)
    before = tree_fingerprint(co)
    with pytest.raises(SeriesError) as exc:
        run_apply(env, co)
    msg = str(exc.value)
    assert "python/sglang/srt/b.py: content differs from the pin" in msg
    assert "k.h" not in msg  # not touched by the series: not checked
    assert "git -C" in exc.value.hint and "--allow-base-mismatch" in exc.value.hint
    assert tree_fingerprint(co) == before
    # the checkout lacks the tag: the hint fetches it first instead of naming it as if it were there
    assert exc.value.hint.startswith(
        f"this checkout has no tag v0.5.11: fetch it (git -C {co} fetch {env.lock.repo_url} tag "
        f"v0.5.11), then check it out (git -C {co} checkout -b work v0.5.11)"
    )


def test_wrong_base_hint_names_the_tag_the_checkout_has(env: Env) -> None:
    co = env.clone("co")
    git(co, "checkout", "-q", "--orphan", "other")
    git(co, "commit", "-qm", "unrelated")
    with pytest.raises(SeriesError) as exc:
        run_apply(env, co)
    assert exc.value.hint.startswith(f"check out the pin (git -C {co} checkout -b work v0.5.11)")


def test_allow_base_mismatch_applies_with_3way(env: Env) -> None:
    co = _untagged_copy(env, "co")
    edit(co, "python/sglang/srt/a.py", "value_1 = 1\n", "value_1 = 1  # local\n")
    git(co, "commit", "-qam", "local drift")
    with pytest.raises(SeriesError):
        run_apply(env, co)
    report = run_apply(env, co, allow_base_mismatch=True)
    assert report.ok and report.base is not None and report.base.how == "mismatch-allowed"


def test_head_not_on_the_tag_is_refused(env: Env) -> None:
    co = env.clone("co")
    git(co, "checkout", "-q", "--orphan", "other")
    git(co, "commit", "-qm", "unrelated")
    with pytest.raises(SeriesError, match="does not contain the tag"):
        run_apply(env, co)


def test_detached_head_at_unknown_base_is_refused(env: Env) -> None:
    co = _untagged_copy(env, "co")
    edit(co, "python/sglang/srt/b.py", "existing", "renamed")
    git(co, "commit", "-qam", "drift")
    git(co, "checkout", "-q", "--detach")
    with pytest.raises(SeriesError, match="detached HEAD"):
        run_apply(env, co, allow_base_mismatch=True)


def test_failing_hunk_names_patch_file_hunk_lines_and_restores(env: Env) -> None:
    co = env.clone("co")
    # the pin changed under the 2nd patch's second hunk in a.py (value_30) but stays provable
    # by tag: apply must fail on 0002 after 0001 went in, then undo everything.
    edit(
        co,
        "python/sglang/srt/a.py",
        "value_29 = 29\nvalue_30 = 30\n",
        "value_29 = 29\nVALUE_30 = 30\n",
    )
    git(co, "commit", "-qam", "someone else's change")
    settle(co)
    before = tree_fingerprint(co)
    report = run_apply(env, co)
    assert not report.ok and not report.changed
    assert [r.status for r in report.results] == ["would-apply", "failed"]
    text = report.format()
    assert "0002-return-two-and-add-new-module.patch" in text
    assert "python/sglang/srt/a.py" in text and "@@ -27,7 +27,7 @@" in text
    assert "patch expects 'value_30 = 30'" in text and "file has     'VALUE_30 = 30'" in text
    assert "nothing was changed" in text
    assert tree_fingerprint(co) == before


def test_cli_failing_patch_exit_code_and_hint(env: Env, capsys: pytest.CaptureFixture) -> None:
    co = env.clone("co")
    edit(co, "python/sglang/srt/b.py", "    return 1\n", "    return 11\n")
    git(co, "commit", "-qam", "conflicting change")
    settle(co)
    before = tree_fingerprint(co)
    argv = ["apply", str(co), "--patches-dir", str(env.patches), "--lock", str(env.lock.path)]
    rc = cli.main([*argv, "--cache-dir", str(env.cache)])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "0002-return-two-and-add-new-module.patch: failed" in out
    assert "python/sglang/srt/b.py" in out and "'    return 1'" in out
    assert "what to do:" in err and "export.sh" in err
    assert tree_fingerprint(co) == before


def test_corrupt_patch_error_names_the_patch(env: Env) -> None:
    bad = env.patches / "0002-return-two-and-add-new-module.patch"
    text = bad.read_text()
    bad.write_text(text[: text.rindex("@@")] + "@@ -1,5 +1,5 @@\n value_1 = 1\n")
    with pytest.raises(SeriesError, match=r"0002-return-two-and-add-new-module\.patch:\d+: hunk"):
        load_series(env.patches)


def test_export_round_trip_is_byte_identical(env: Env, tmp_path: Path) -> None:
    original = {p.name: p.read_bytes() for p in env.patches.iterdir()}
    co = env.clone("co")
    run_apply(env, co)
    out = tmp_path / "exported"
    shutil.copytree(env.patches, out)
    export.export_series(co, out, lock=env.lock, cache_dir=env.cache, progress=quiet())
    assert {p.name: p.read_bytes() for p in out.iterdir()} == original


def test_export_keeps_stems_renumbers_and_drops_stale(env: Env) -> None:
    co = env.clone("co")
    run_apply(env, co)
    git(co, "rebase", "-q", "--onto", "v0.5.11", "HEAD~1")  # drop patch 1, keep patch 2
    (env.patches / "series").write_text("# the series\n" + (env.patches / "series").read_text())
    # env.patches is in no git work tree: every change to it needs force
    export.export_series(
        co, env.patches, lock=env.lock, cache_dir=env.cache, progress=quiet(), force=True
    )
    names = sorted(p.name for p in env.patches.iterdir())
    assert names == ["0001-return-two-and-add-new-module.patch", "series"]
    assert (env.patches / "series").read_text() == (
        "# the series\n0001-return-two-and-add-new-module.patch\n"
    )


def test_export_refuses_a_dirty_checkout(env: Env) -> None:
    co = env.clone("co")
    (co / "untracked.py").write_text("x\n")
    with pytest.raises(SeriesError, match="untracked"):
        export.export_series(co, env.patches, lock=env.lock, cache_dir=env.cache)


def test_series_consistency_errors(env: Env) -> None:
    series = env.patches / "series"
    names = series.read_text().split()
    series.write_text(names[0] + "\n")
    with pytest.raises(SeriesError, match="exists but is not listed"):
        load_series(env.patches)
    series.write_text(f"{names[0]}\n{names[0]}  # again\n{names[1]}\n")
    with pytest.raises(SeriesError, match="listed twice"):
        load_series(env.patches)
    series.write_text("\n".join([*names, "0003-missing.patch"]) + "\n")
    with pytest.raises(SeriesError, match="0003-missing.patch is listed but does not exist"):
        load_series(env.patches)


@pytest.mark.parametrize("which", [0, 1])
def test_a_subject_changed_in_the_series_names_that_patch(env: Env, which: int) -> None:
    co = env.clone("co")
    assert run_apply(env, co).ok
    head = git(co, "rev-parse", "HEAD")
    patch = load_series(env.patches)[which]
    text = patch.path.read_text()
    patch.path.write_text(text.replace(f"] {patch.subject}\n", f"] {patch.subject}, reworded\n"))
    with pytest.raises(SeriesError) as exc:
        run_apply(env, co)
    msg = str(exc.value)
    assert msg.startswith(f"{patch.name} is applied as commit ") and "another subject" in msg
    assert f"{patch.subject + ', reworded'!r} in {patch.name}" in msg
    other = load_series(env.patches)[1 - which].name
    assert other not in msg and "scripts/export.sh" in exc.value.hint
    assert git(co, "rev-parse", "HEAD") == head


@pytest.mark.parametrize(
    "hook",
    [
        "exit 1\n",  # refuses every patch
        'printf "\\nSigned-off-by: hook <h@example.com>\\n" >> "$1"\n',  # rewrites the message
    ],
)
def test_the_checkouts_am_hooks_do_not_run_on_the_series(env: Env, hook: str) -> None:
    co = env.clone("co")
    for name in ("applypatch-msg", "pre-applypatch"):
        path = co / ".git" / "hooks" / name
        path.write_text("#!/bin/sh\n" + hook)
        path.chmod(0o755)
    report = run_apply(env, co)
    assert report.ok, report.format()
    out = env.root / "exported"
    export.export_series(co, out, lock=env.lock, cache_dir=env.cache, progress=quiet())
    for patch in load_series(env.patches):  # exactly the series: no message rewritten
        assert (out / patch.name).read_bytes() == patch.path.read_bytes(), patch.name


def test_a_corrupt_binary_patch_is_named_corrupt_not_a_rebase(
    env: Env, capsys: pytest.CaptureFixture
) -> None:
    work = env.root / "authoring"
    (work / "python" / "sglang" / "table.bin").write_bytes(bytes(range(256)) * 8)
    git(work, "add", "-A")
    git(work, "commit", "-qm", "[Quant] Add a table\n\nWhy:\nx\n\nWhat:\ny\n")
    export.export_series(
        work, env.patches, lock=env.lock, cache_dir=env.cache, progress=quiet(), force=True
    )
    (binary,) = env.patches.glob("0003-*.patch")
    lines = binary.read_text().split("\n")
    at = next(i for i, ln in enumerate(lines) if ln.startswith("literal ")) + 2
    lines[at] = lines[at][:1] + "~" * (len(lines[at]) - 1)  # not base85: cut the data
    binary.write_text("\n".join(lines))
    co = env.clone("co")
    argv = ["apply", str(co), "--patches-dir", str(env.patches), "--lock", str(env.lock.path)]
    assert cli.main([*argv, "--cache-dir", str(env.cache)]) == 1
    err = capsys.readouterr().err
    assert f"{binary.name} is corrupt: git cannot read it (git am said: " in err, err
    assert "rebase the series" not in err and "git checkout -- " in err
    assert git(co, "status", "--porcelain") == ""
