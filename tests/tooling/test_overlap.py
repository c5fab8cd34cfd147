"""The patch model on real format-patch files, line mapping through the series, overlaps and
derived dependencies."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import _fakepin as fakepin
import pytest

from fp4series import overlap as ov
from fp4series.errors import SeriesError
from fp4series.patch import Hunk, parse_patch, parse_patch_text
from fp4series.series import load_series

ENV = fakepin.IDENTITY
BASE = "".join(f"line {i}\n" for i in range(1, 61))


git = functools.partial(fakepin.git, env=ENV)


def series(tmp_path: Path, steps: list[tuple[str, dict[str, str], str]]) -> Path:
    """Commit each (name, files, trailers) on a repo holding f.txt = BASE; format-patch them."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", ".")
    (repo / "f.txt").write_text(BASE)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    git(repo, "tag", "base")
    for name, files, trailers in steps:
        for path, text in files.items():
            (repo / path).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"[Quant] {name}\n\nWhy:\nx\n\n{trailers}".strip() + "\n")
    out = tmp_path / "patches"
    git(repo, "format-patch", "-q", "--full-index", "-o", str(out), "base..HEAD")
    names = []
    for i, (p, (name, _, _)) in enumerate(zip(sorted(out.glob("*.patch")), steps, strict=True), 1):
        new = out / f"{i:04d}-{name}.patch"
        p.rename(new)
        names.append(new.name)
    (out / "series").write_text("\n".join(names) + "\n")
    return out


def sub(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def test_parse_diff_bounds_hunks_by_counts(tmp_path: Path) -> None:
    # a removed line whose text is "- " renders as "-- ", like the mail signature separator
    text = BASE.replace("line 30\n", "- \n")
    out = series(tmp_path, [("a", {"f.txt": text}, "Tests: t.py\nProvides: f(a, b), g")])
    doc = parse_patch(out / "0001-a.patch")
    edited = doc.text.replace("-line 30\n+- \n", "-- \n+line 30\n")
    parsed = parse_patch_text(edited, tmp_path / "x.patch")
    assert len(parsed.changes) == 1
    (h,) = parsed.changes[0].hunks
    assert h.removed() == ["- "] and h.added() == ["line 30"]
    assert parsed.signature == doc.signature  # the real "-- " after the diff still ends it
    assert doc.trailers["Tests"] == "t.py"
    assert doc.provides == ["f(a, b)", "g"]
    assert doc.subject == "[Quant] a"
    assert len(parsed.changes[0].old_id or "") == 40  # full index kept for 3-way


def test_each_file_section_is_byte_exact(tmp_path: Path) -> None:
    """Lines split on LF alone: a form feed or CR inside a line is content, and an empty
    context line stays empty; the sections give back the patch's diff byte for byte."""
    text = BASE.replace("line 10\n", "line\x0c10\r\n").replace("line 30\n", "line 30!\n")
    out = series(tmp_path, [("a", {"f.txt": text, "g.txt": "one\n\ntwo\n"}, "")])
    doc = parse_patch(out / "0001-a.patch")
    diff = doc.text[doc.text.index("diff --git") : doc.text.rindex("\n-- \n") + 1]
    assert doc.diff_text() == diff
    assert "".join(c.text() for c in doc.changes) == diff
    pre, post = doc.changes[0].hunks[0].images()
    assert "line\x0c10\r\n" in post


def test_truncated_patch_is_a_clear_error(tmp_path: Path) -> None:
    out = series(tmp_path, [("a", {"f.txt": sub(BASE, "line 30\n", "line 30!\n")}, "")])
    text = (out / "0001-a.patch").read_text()
    cut = text[: text.index("+line 30!")] + "garbage\n"
    with pytest.raises(SeriesError, match="malformed line 'garbage'"):
        parse_patch_text(cut, tmp_path / "cut.patch")


def test_rename_rewrites_every_header_line(tmp_path: Path) -> None:
    out = series(tmp_path, [("a", {"f.txt": sub(BASE, "line 30\n", "line 30!\n")}, "")])
    doc = parse_patch(out / "0001-a.patch")
    text = doc.diff_text(rename={"f.txt": "moved/f.txt"})
    assert "diff --git a/moved/f.txt b/moved/f.txt\n" in text
    assert "--- a/moved/f.txt\n+++ b/moved/f.txt\n" in text
    assert "f.txt\n" not in text.replace("moved/f.txt\n", "")


def test_map_line_through_hunks() -> None:
    h = Hunk("f.txt", 10, 3, 10, 4, "@@ -10,3 +10,4 @@", [" a", "-b", "+B", "+C", " c"])
    assert ov.map_line(5, [h]) == 5
    assert ov.map_line(10, [h]) == 10
    assert ov.map_line(11, [h]) is None  # removed
    assert ov.map_line(12, [h]) == 13
    assert ov.map_line(40, [h]) == 41


def test_overlaps_edits_context_and_shifts(tmp_path: Path) -> None:
    a = sub(BASE, "line 20\n", "line 20 A\n")
    # B inserts 5 lines at the top: later patches see A's line at 25
    b = "".join(f"top {i}\n" for i in range(5)) + a
    # C edits A's line (now line 25)
    c = sub(b, "line 20 A\n", "line 20 C\n")
    # D only has A's line in its context (edits line 27 = old line 22)
    d = sub(c, "line 22\n", "line 22 D\n")
    # E is far away
    e = sub(d, "line 50\n", "line 50 E\n")
    out = series(
        tmp_path,
        [("a", {"f.txt": a}, ""), ("b", {"f.txt": b}, ""), ("c", {"f.txt": c}, ""),
         ("d", {"f.txt": d}, ""), ("e", {"f.txt": e}, "")],
    )  # fmt: skip
    docs = load_series(out)
    got = {(o.earlier[5:6], o.later[5:6]): o for o in ov.compute_overlaps(docs)}
    # B's lines are far from the others; C replaced A's line, so D reads C's line, not A's
    assert set(got) == {("a", "c"), ("c", "d")}
    ac = got[("a", "c")]
    assert ac.kind == "edits" and ac.later_ranges == [(25, 25)] and ac.earlier_ranges == [(20, 20)]
    cd = got[("c", "d")]
    assert cd.kind == "context" and cd.later_ranges == [(25, 25)]
    deps = ov.derived_dependencies(docs)
    assert "0001-a.patch" in deps["0003-c.patch"]
    assert deps["0005-e.patch"] == set()
    assert ov.dependency_closure("0004-d.patch", deps) >= {"0001-a.patch", "0003-c.patch"}
    assert "0001-a.patch -> 0003-c.patch: f.txt: 0003-c.patch edits lines 25" in (
        ov.format_overlaps([ac])
    )


def test_deletion_point_and_created_file(tmp_path: Path) -> None:
    a = BASE.replace("line 30\nline 31\n", "")
    b = sub(a, "line 29\n", "line 29 B\n")  # its context spans A's deletion point
    out = series(
        tmp_path,
        [("a", {"f.txt": a}, ""), ("b", {"f.txt": b}, ""),
         ("new", {"g.txt": "x\n"}, ""), ("edit-new", {"g.txt": "y\n"}, ""),
         ("decl", {"h.txt": "h\n"}, "Depends-On: 0001-a.patch")],
    )  # fmt: skip
    docs = load_series(out)
    deps = ov.derived_dependencies(docs)
    assert deps["0002-b.patch"] == {"0001-a.patch"}
    assert deps["0004-edit-new.patch"] == {"0003-new.patch"}
    assert deps["0005-decl.patch"] == {"0001-a.patch"}
    bad = out / "0005-decl.patch"
    bad.write_text(bad.read_text().replace("Depends-On: 0001-a.patch", "Depends-On: 0009-x.patch"))
    with pytest.raises(SeriesError, match="not in the series"):
        ov.derived_dependencies(load_series(out))


def test_overlap_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = sub(BASE, "line 20\n", "line 20 A\n")
    out = series(
        tmp_path, [("a", {"f.txt": a}, ""), ("b", {"f.txt": sub(a, "line 20 A\n", "B\n")}, "")]
    )
    from fp4series.commands import overlap as overlap_command

    parser = argparse.ArgumentParser()
    overlap_command.register(parser.add_subparsers())
    args = parser.parse_args(["overlap", "--patches-dir", str(out), "--json"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == [
        {
            "earlier": "0001-a.patch",
            "later": "0002-b.patch",
            "file": "f.txt",
            "later_ranges": [[20, 20]],
            "earlier_ranges": [[20, 20]],
            "kind": "edits",
        }
    ]
    args = parser.parse_args(["overlap", "--patches-dir", str(out)])
    assert args.func(args) == 0
    assert "0001-a.patch -> 0002-b.patch: f.txt" in capsys.readouterr().out


def test_uses_a_name_another_patch_provides(tmp_path: Path) -> None:
    out = series(
        tmp_path,
        [("mod", {"mod_fp4.py": "def helper_fp4():\n    return 1\n"}, "Provides: helper_fp4"),
         ("other", {"f.txt": sub(BASE, "line 5\n", "line 5 x\n")}, ""),
         ("user", {"user.py": "from mod_fp4 import helper_fp4\n"}, "")],
    )  # fmt: skip
    why = ov.explain_dependencies(load_series(out))
    assert why["0003-user.patch"] == {"0001-mod.patch": ["uses helper_fp4, mod_fp4"]}
    assert why["0002-other.patch"] == {}
