"""Patch parsing (subject, trailers, hunks) and the patch linter, good and bad patches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _fakepin import P2, Env

from fp4series import cli
from fp4series.errors import SeriesError
from fp4series.lint import lint_paths
from fp4series.patch import ZERO_ID, parse_patch
from fp4series.series import load_series

P1 = "0001-change-value-ten.patch"


def lint(env: Env, *files: Path) -> list[str]:
    return [str(p) for p in lint_paths(list(files), root=env.root, patches_dir=env.patches)]


def test_parse_patch_fields(env: Env) -> None:
    p1, p2 = load_series(env.patches)
    assert p2.name == P2 and p2.subject == "[Quant] Return two and add new module"
    assert p2.author == "Patch Author <author@example.com>"
    assert p2.date == "Sat, 2 May 2026 10:00:00 +0000"
    assert p2.tests() == ["tests/test_fake.py::test_one"]
    assert p2.depends_on == [P1] and p2.provides == [] and p2.upstream_status == "Pending"
    assert p2.message.startswith("Why:") and "How verified:" in p2.message
    assert p2.files == [
        "python/sglang/srt/a.py",
        "python/sglang/srt/b.py",
        "python/sglang/srt/new.py",
    ]
    hunk = p2.hunks[0]
    assert (hunk.file, hunk.old_start, hunk.old_len, hunk.new_start, hunk.new_len) == (
        "python/sglang/srt/a.py", 27, 7, 27, 7,
    )  # fmt: skip
    assert hunk.header.startswith("@@ -27,7 +27,7 @@") and "-value_30 = 30" in hunk.lines
    assert p2.changes[2].old_path is None and p2.changes[2].new_path == "python/sglang/srt/new.py"
    assert p2.text.split("\n")[hunk.line_no - 1] == hunk.header
    a, b, new = p2.changes
    assert p2.text.split("\n")[a.line_no - 1].startswith("diff --git a/python/sglang/srt/a.py")
    assert p2.text.split("\n")[a.line_no] == f"index {a.old_id}..{a.new_id} 100644"
    assert len(a.old_id) == len(a.new_id) == 40 and a.old_id != a.new_id != ZERO_ID
    assert new.old_id == ZERO_ID and new.new_id and new.new_id != ZERO_ID


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda t: t.replace("From 0000", "Frm 0000", 1), "does not start with a 'From"),
        (lambda t: t[: t.index("diff --git")], "contains no diff"),
        (lambda t: t.replace("Subject:", "X-Subject:", 1), "no Subject"),
        (lambda t: t.replace("@@ -1,2 +1,2 @@", "@@ -1,x +1,2 @@"), "malformed hunk header"),
        (lambda t: t.replace(" value_27 = 27\n", ""), "line counts|malformed line|truncated"),
        (lambda t: re.sub(r"(?m)^index .*\n", "", t, count=1), "a.py: file header has no 'index"),
        (lambda t: re.sub(r"(?m)^(index \w{12})\w{28}", r"\1", t, count=1), "malformed index line"),
        (lambda t: t.replace("index " + "0" * 40, "index " + "1" * 40), "new.py: index line's old"),
    ],
)
def test_corrupt_patches_name_the_file(env: Env, mutate, match: str) -> None:
    path = env.patches / P2
    path.write_text(mutate(path.read_text()))
    with pytest.raises(SeriesError, match=match) as exc:
        parse_patch(path)
    assert P2 in str(exc.value) and exc.value.hint


def test_good_series_lints_clean(env: Env) -> None:
    assert lint(env) == []
    assert lint(env, env.patches / P1, env.root / "upstream.lock") == []


def _rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_bad_patch_messages_point_at_lines(env: Env) -> None:
    path = env.patches / P2
    _rewrite(path, "[Quant] Return two and add new module", "[Quant] " + "x" * 70 + ".")
    _rewrite(path, "How verified:\n", "Verified:\n")
    _rewrite(path, "Upstream-Status: Pending", "Upstream-Status: Maybe")
    _rewrite(
        path,
        "Tests: tests/test_fake.py::test_one",
        "Tests: tests/nope.py, gpu:tests/gpu_missing.py",
    )
    _rewrite(path, "Depends-On: 0001-change-value-ten.patch", "Depends-On: 0009-later.patch")
    # an added Python line with trailing blanks (flagged) and a context line with one (not)
    _rewrite(path, "+    return 2\n", "+    return 2  \n")
    _rewrite(path, " value_27 = 27\n", " value_27 = 27 \n")
    problems = lint(env, path)
    text = "\n".join(problems)
    lines = path.read_text().split("\n")
    subject_no = next(i for i, ln in enumerate(lines, 1) if ln.startswith("Subject:"))
    ws_no = lines.index("+    return 2  ") + 1
    assert f"{P2}:{subject_no}: subject is 79 chars, at most 72" in text
    assert f"{P2}:{subject_no}: subject ends with a period" in text
    assert "body has no 'How verified:' section" in text
    assert "Upstream-Status 'Maybe' is not one of" in text
    assert "Tests: tests/nope.py does not exist" in text
    assert "Tests: gpu:tests/gpu_missing.py does not exist" in text
    assert "Depends-On: 0009-later.patch is not an earlier patch" in text
    assert f"{P2}:{ws_no}: trailing whitespace added in python/sglang/srt/b.py" in text
    assert sum("trailing whitespace" in p for p in problems) == 1  # context line not flagged
    assert all(p.startswith(("patches/", str(env.patches))) for p in problems)


def test_missing_trailers_and_series_problems(env: Env) -> None:
    path = env.patches / P1
    _rewrite(path, "Upstream-Status: Pending\nTests: tests/test_fake.py::test_one\n", "")
    (env.patches / "0003-stray.patch").write_text(path.read_text())
    problems = "\n".join(lint(env))
    assert "no 'Upstream-Status:' trailer" in problems
    assert "no 'Tests:' trailer" in problems
    assert "0003-stray.patch exists but is not listed in series" in problems
    assert "number 0001" not in problems


def test_lint_cli_exit_codes(env: Env, capsys: pytest.CaptureFixture) -> None:
    argv = ["lint", "--patches-dir", str(env.patches), "--root", str(env.root)]
    assert cli.main(argv) == 0
    _rewrite(env.patches / P1, "What:\n", "Whatever:\n")
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert f"{P1}:" in out and "'What:'" in out
