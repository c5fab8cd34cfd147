"""Rebase check on synthetic upstreams: one scenario per verdict, series order, policy, outputs."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import _fakepin as fakepin
import pytest

from fp4series.commands import rebase_check as rc
from fp4series.errors import SeriesError
from fp4series.judging.matrix import Matrix, Target, run_matrix
from fp4series.judging.policy import apply_policy, load_baseline
from fp4series.judging.render import to_markdown
from fp4series.judging.repo import JudgeRepo
from fp4series.judging.verdict import PatchResult, Verdict
from fp4series.patch import parse_patch
from fp4series.series import load_series

ENV = {**fakepin.IDENTITY, **fakepin.FIXED_DATES}

A_PY = "".join(f"value_{i} = {i}\n" for i in range(1, 41))
K_H = "".join(f"int kernel_line_{i} = {i};\n" for i in range(1, 31))
MOE_H = "".join(f"int moe_line_{i} = {i * 7};\n" for i in range(1, 31))
B_PY = "def existing():\n    return 1\n"
PIN = {
    "python/pkg/a.py": A_PY,
    "python/pkg/b.py": B_PY,
    "python/pkg/csrc/gemm/k.h": K_H,
    "python/pkg/csrc/moe/k.h": MOE_H,
}


git = functools.partial(fakepin.git, env=ENV)


def write_tree(repo: Path, files: dict[str, str]) -> None:
    for p in repo.iterdir():
        if p.name != ".git":
            subprocess.run(["rm", "-rf", str(p)], check=True)
    for path, text in files.items():
        f = repo / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def make_release(root: Path, version: str, files: dict[str, str]) -> Target:
    """A one-commit repo tagged v<version>, like upstream.materialize builds."""
    repo = root / f"rel-{version}"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", ".")
    write_tree(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"sglang {version}")
    git(repo, "tag", f"v{version}")
    return Target(version, repo, f"v{version}")


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def make_patch(
    root: Path,
    name: str,
    base: dict[str, str],
    changes: dict[str, str | None],
    trailers: str = "",
) -> Path:
    """format-patch --full-index of CHANGES on top of BASE (a fresh clone-like repo)."""
    repo = root / f"mk-{name}"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", ".")
    write_tree(repo, base)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    for path, text in changes.items():
        f = repo / path
        if text is None:
            f.unlink()
        else:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
    git(repo, "add", "-A")
    msg = f"[Quant] {name}\n\nWhy:\nbecause\n\nWhat:\nthings\n\n{trailers}\n"
    git(repo, "commit", "-qm", msg)
    out = root / "patches"
    out.mkdir(exist_ok=True)
    produced = git(repo, "format-patch", "-1", "--full-index", "-o", str(out)).strip()
    target = out / name
    Path(produced).rename(target)
    return target


def judge_one(tmp_path: Path, patch: Path, release_files: dict[str, str]) -> Verdict:
    pin = make_release(tmp_path, "0.0.1", PIN)
    target = make_release(tmp_path, "0.0.2", release_files)
    repo = JudgeRepo(tmp_path / "judge")
    m = run_matrix(repo, [parse_patch(patch)], pin, [target], log=lambda s: None)
    return m.results["0.0.2"][patch.name].verdict


A_CHANGE = {"python/pkg/a.py": edit(A_PY, "value_20 = 20\n", "value_20 = 2000\n")}


def test_clean(tmp_path: Path) -> None:
    patch = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    rel = {**PIN, "python/pkg/other.py": "x = 1\n"}
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "clean"


def test_offset(tmp_path: Path) -> None:
    patch = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    rel = {**PIN, "python/pkg/a.py": "import os\n" * 5 + A_PY}
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "offset"
    assert v.offsets == {"python/pkg/a.py": [5]}


def test_three_way(tmp_path: Path) -> None:
    patch = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    # upstream edits a context line (18) of the hunk: exact apply fails, a 3-way merge does not
    rel = {**PIN, "python/pkg/a.py": edit(A_PY, "value_18 = 18\n", "value_18 = 1800\n")}
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "three-way", v.evidence


def test_conflict_names_file_and_hunk(tmp_path: Path) -> None:
    patch = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    rel = {**PIN, "python/pkg/a.py": edit(A_PY, "value_20 = 20\n", "value_20 = 21\n")}
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "conflict"
    assert v.conflicts == [
        {
            "file": "python/pkg/a.py",
            "hunk": "hunk #1 @@ -17,7 +17,7 @@ value_16 = 16",
            "reason": "expects `value_20 = 20`, line 20 has `value_20 = 21` "
            "(best match at line 17, 6/7 lines equal)",
        }
    ]
    assert "python/pkg/a.py hunk #1" in v.evidence


def test_upstream_by_reverse_apply(tmp_path: Path) -> None:
    patch = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    v = judge_one(tmp_path, patch, {**PIN, **A_CHANGE})
    assert v.verdict == "upstream"
    assert "reverse-applies" in v.evidence


def test_upstream_same_lines_laid_out_differently(tmp_path: Path) -> None:
    long = "value_20 = compute_scale(20, stride=16)\n"
    patch = make_patch(
        tmp_path, "0001-a.patch", PIN, {"python/pkg/a.py": edit(A_PY, "value_20 = 20\n", long)}
    )
    # upstream made the same change, re-indented and next to a rewritten neighbour
    rel_a = edit(A_PY, "value_20 = 20\n", "    value_20  =  compute_scale(20,  stride=16)\n")
    rel_a = edit(rel_a, "value_19 = 19\n", "value_19 = 1900\n")
    v = judge_one(tmp_path, patch, {**PIN, "python/pkg/a.py": rel_a})
    assert v.verdict == "upstream", v.evidence
    assert "line by line" in v.evidence
    assert v.hunks[0]["match"] == "lines"
    # a short one-liner found elsewhere is not evidence
    short = make_patch(tmp_path, "0002-a.patch", PIN, A_CHANGE)
    rel_b = edit(A_PY, "value_20 = 20\n", "value_20 = 21\n") + "value_20 = 2000\n"
    v = judge_one(tmp_path / "b", short, {**PIN, "python/pkg/a.py": rel_b})
    assert v.verdict == "conflict", v.evidence


def test_upstream_by_provides_symbols(tmp_path: Path) -> None:
    new_b = B_PY + "\n\ndef helper_fp4(x):\n    return x * 2\n\n\nclass Runner:\n    MARLIN = 1\n"
    patch = make_patch(
        tmp_path,
        "0001-b.patch",
        PIN,
        {"python/pkg/b.py": new_b},
        "Provides: helper_fp4, Runner.MARLIN, existing",
    )
    # upstream wrote them differently, in another file: no hunk matches, the symbols do
    rel = {
        **PIN,
        "python/pkg/b.py": "def existing():\n    return 2\n",
        "python/pkg/fp4.py": "class Runner:\n    OTHER = 0\n    MARLIN = 'm'\n\n\n"
        "def helper_fp4(y, z=1):\n    return y\n",
    }
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "upstream", v.evidence
    by = {s.symbol: s for s in v.symbols}
    assert by["helper_fp4"].where == ["python/pkg/fp4.py:6"]
    assert by["Runner.MARLIN"].where == ["python/pkg/fp4.py:3"]
    assert by["existing"].at_pin  # defined at the pin: not evidence either way
    assert "helper_fp4 at python/pkg/fp4.py:6" in v.evidence


def test_symbols_only_some_found_is_partly(tmp_path: Path) -> None:
    new_b = B_PY + "\n\ndef helper_fp4(x):\n    return x\n\n\ndef helper_two(x):\n    return x\n"
    patch = make_patch(
        tmp_path,
        "0001-b.patch",
        PIN,
        {"python/pkg/b.py": new_b},
        "Provides: helper_fp4, helper_two",
    )
    rel = {
        **PIN,
        "python/pkg/b.py": "def existing():\n    return 3\n\n\ndef helper_fp4(q):\n    pass\n",
    }
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "partly-upstream", v.evidence
    assert "symbols defined: helper_fp4" in v.evidence


def test_partly_upstream_per_hunk(tmp_path: Path) -> None:
    two = edit(edit(A_PY, "value_5 = 5\n", "value_5 = 50\n"), "value_35 = 35\n", "value_35 = 350\n")
    patch = make_patch(tmp_path, "0001-a.patch", PIN, {"python/pkg/a.py": two})
    # upstream took the first hunk; the second line went another way
    rel_a = edit(edit(A_PY, "value_5 = 5\n", "value_5 = 50\n"), "value_35 = 35\n", "value_35 = 0\n")
    v = judge_one(tmp_path, patch, {**PIN, "python/pkg/a.py": rel_a})
    assert v.verdict == "partly-upstream"
    assert [h["status"] for h in v.hunks] == ["present", "fails"]
    assert v.conflicts[0]["hunk"].startswith("hunk #2 @@ -32,7 +32,7 @@")


def test_moved_by_content_then_rejudged(tmp_path: Path) -> None:
    k2 = edit(K_H, "int kernel_line_15 = 15;\n", "int kernel_line_15 = 16;\n")
    patch = make_patch(tmp_path, "0001-k.patch", PIN, {"python/pkg/csrc/gemm/k.h": k2})
    # upstream moved csrc/ to kernels/jit/ (and touched a far line of the gemm file); the MoE
    # look-alike with the same base name must not be picked
    rel = {
        "python/pkg/a.py": A_PY,
        "python/pkg/b.py": B_PY,
        "python/pkg/kernels/jit/gemm/k.h": edit(K_H, "int kernel_line_1 = 1;\n", "// moved\n"),
        "python/pkg/kernels/jit/moe/k.h": MOE_H,
    }
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "moved"
    assert v.moved_to == {"python/pkg/csrc/gemm/k.h": "python/pkg/kernels/jit/gemm/k.h"}
    assert v.moved_verdict == "clean"
    assert v.effective == "clean"


def test_moved_and_already_upstream(tmp_path: Path) -> None:
    k2 = edit(K_H, "int kernel_line_15 = 15;\n", "int kernel_line_15 = 16;\n")
    patch = make_patch(tmp_path, "0001-k.patch", PIN, {"python/pkg/csrc/gemm/k.h": k2})
    rel = {"python/pkg/a.py": A_PY, "python/pkg/kernels/gemm/k.h": k2}
    v = judge_one(tmp_path, patch, rel)
    assert (v.verdict, v.moved_verdict) == ("moved", "upstream")


def test_new_file_follows_its_moved_directory(tmp_path: Path) -> None:
    patch = make_patch(
        tmp_path, "0001-n.patch", PIN, {"python/pkg/csrc/gemm/extra.cuh": "// sm75 path\n"}
    )
    rel = {
        "python/pkg/a.py": A_PY,
        "python/pkg/kernels/jit/gemm/k.h": K_H,
        "python/pkg/kernels/jit/moe/k.h": MOE_H,
    }
    v = judge_one(tmp_path, patch, rel)
    assert (v.verdict, v.moved_verdict) == ("moved", "clean")
    assert v.moved_to == {"python/pkg/csrc/gemm/extra.cuh": "python/pkg/kernels/jit/gemm/extra.cuh"}


def test_deleted(tmp_path: Path) -> None:
    k2 = edit(K_H, "int kernel_line_15 = 15;\n", "int kernel_line_15 = 16;\n")
    patch = make_patch(tmp_path, "0001-k.patch", PIN, {"python/pkg/csrc/gemm/k.h": k2})
    rel = {"python/pkg/a.py": A_PY, "python/pkg/b.py": B_PY}
    v = judge_one(tmp_path, patch, rel)
    assert v.verdict == "deleted"
    assert v.missing_files == ["python/pkg/csrc/gemm/k.h"]


def _two_patch_series(tmp_path: Path) -> list[Path]:
    """A changes line 20; B changes line 21 (its context holds A's line): B depends on A."""
    a_text = A_CHANGE["python/pkg/a.py"]
    pa = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    after_a = {**PIN, **A_CHANGE}
    pb = make_patch(
        tmp_path,
        "0002-b.patch",
        after_a,
        {"python/pkg/a.py": edit(a_text, "value_21 = 21\n", "value_21 = 2100\n")},
    )
    (tmp_path / "patches" / "series").write_text("0001-a.patch\n0002-b.patch\n")
    return [pa, pb]


def test_series_order_and_alone(tmp_path: Path) -> None:
    _two_patch_series(tmp_path)
    docs = load_series(tmp_path / "patches")
    pin = make_release(tmp_path, "0.0.1", PIN)
    same = make_release(tmp_path, "0.0.2", {**PIN, "python/pkg/x.py": "x = 1\n"})
    broken = make_release(
        tmp_path,
        "0.0.3",
        {**PIN, "python/pkg/a.py": edit(A_PY, "value_20 = 20\n", "value_20 = 7\n")},
    )
    lines: list[str] = []
    m = run_matrix(JudgeRepo(tmp_path / "j"), docs, pin, [same, broken], log=lines.append)
    r2 = m.results["0.0.2"]
    assert r2["0001-a.patch"].verdict.verdict == "clean"
    assert r2["0002-b.patch"].verdict.verdict == "clean"
    assert r2["0002-b.patch"].judged == "in-series"
    assert r2["0002-b.patch"].alone.verdict == "conflict"  # B needs A's line as context
    r3 = m.results["0.0.3"]
    assert r3["0001-a.patch"].verdict.verdict == "conflict"
    assert r3["0002-b.patch"].judged == "partial-series"  # its prerequisite failed
    assert r3["0002-b.patch"].prerequisites == ["0001-a.patch"]
    assert r3["0002-b.patch"].failed_prerequisites == ["0001-a.patch"]
    assert r3["0002-b.patch"].verdict.verdict == "conflict"
    assert lines[0].startswith("[1/2] 0.0.2: 2 patches judged in ")
    assert lines[1].startswith("[2/2] 0.0.3: 2 patches judged in ")


SCHEME_PY = (
    "class Scheme:\n"
    + "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(1, 8))
    + "    @classmethod\n    def get_min_capability(cls):\n        return 100\n"
)


def _creator_series(tmp_path: Path) -> list[str]:
    """Like 0006/0007/0008: C creates scheme.py (and edits b.py), M edits a.py line 5,
    L (Depends-On C and M) edits C's new file and a.py line 30; O edits only C's file."""
    pc = make_patch(
        tmp_path,
        "0001-c.patch",
        PIN,
        {"python/pkg/scheme.py": SCHEME_PY, "python/pkg/b.py": edit(B_PY, "1", "2")},
    )
    a_m = edit(A_PY, "value_5 = 5\n", "value_5 = 50\n")
    pm = make_patch(tmp_path, "0002-m.patch", PIN, {"python/pkg/a.py": a_m})
    after = {**PIN, "python/pkg/scheme.py": SCHEME_PY, "python/pkg/a.py": a_m}
    low = edit(SCHEME_PY, "return 100\n", "return 75\n")
    pl = make_patch(
        tmp_path,
        "0003-l.patch",
        after,
        {
            "python/pkg/scheme.py": low,
            "python/pkg/a.py": edit(a_m, "value_30 = 30\n", "value_30 = 75\n"),
        },
        trailers="Depends-On: 0001-c.patch, 0002-m.patch",
    )
    po = make_patch(
        tmp_path,
        "0004-o.patch",
        {**after, "python/pkg/scheme.py": low},
        {"python/pkg/scheme.py": edit(low, "return 1\n", "return 11\n")},
    )
    names = [pc.name, pm.name, pl.name, po.name]
    (tmp_path / "patches" / "series").write_text("\n".join(names) + "\n")
    return names


def test_files_of_a_failed_prerequisite_are_not_judged_not_deleted(tmp_path: Path) -> None:
    """Regression: 0008 was `deleted` where 0006 (which creates the files it edits) failed."""
    c, mm, low, only = _creator_series(tmp_path)
    docs = load_series(tmp_path / "patches")
    pin = make_release(tmp_path, "0.0.1", PIN)
    a_up = edit(A_PY, "value_5 = 5\n", "value_5 = 6\n")  # M conflicts everywhere
    b_up = edit(B_PY, "1", "3")  # C conflicts from 0.0.3 on
    rels = [
        make_release(tmp_path, "0.0.2", {**PIN, "python/pkg/a.py": a_up}),
        make_release(tmp_path, "0.0.3", {**PIN, "python/pkg/a.py": a_up, "python/pkg/b.py": b_up}),
        make_release(
            tmp_path,
            "0.0.4",
            {
                **PIN,
                "python/pkg/a.py": edit(a_up, "value_30 = 30\n", "value_30 = 80\n"),
                "python/pkg/b.py": b_up,
            },
        ),
        make_release(tmp_path, "0.0.5", {"python/pkg/b.py": b_up}),  # a.py really deleted
    ]
    m = run_matrix(JudgeRepo(tmp_path / "j"), docs, pin, rels, log=lambda s: None)
    # 0.0.2: C applied, M did not: L is judged on release + C, in full, and applies
    r = m.results["0.0.2"][low]
    assert (r.verdict.verdict, r.judged, r.failed_prerequisites) == (
        "clean",
        "partial-series",
        [mm],
    )
    assert r.stacked == [c] and not r.verdict.not_judged
    assert r.alone.verdict != "deleted"  # alone (no C) it skips scheme.py too
    # 0.0.3: C failed: scheme.py is not judged (named, with its creator); a.py decides: clean
    r = m.results["0.0.3"][low]
    assert m.results["0.0.3"][c].verdict.verdict == "conflict"
    assert r.verdict.verdict == "clean", r.verdict.evidence
    assert r.verdict.not_judged == [
        {
            "file": "python/pkg/scheme.py",
            "hunks": 1,
            "from": c,
            "reason": f"the file comes from {c}, which is not applied on this tree: "
            "no evidence about upstream",
        }
    ]
    assert r.verdict.apply_text is not None and "scheme.py" not in r.verdict.apply_text
    # ... and it is not put on the stack (it did not apply in full)
    assert m.results["0.0.3"][only].stacked == []
    # 0.0.4: upstream changed L's a.py line: conflict on a.py only, never `deleted`
    r = m.results["0.0.4"][low]
    assert r.verdict.verdict == "conflict"
    assert [x["file"] for x in r.verdict.conflicts] == ["python/pkg/a.py"]
    assert "value_30 = 80" in r.verdict.conflicts[0]["reason"]
    # O edits nothing but C's file: conflict (nothing to judge), not deleted
    r = m.results["0.0.4"][only]
    assert r.verdict.verdict == "conflict"
    assert "nothing to judge" in r.verdict.evidence and c in r.verdict.evidence
    assert m.results["0.0.2"][only].verdict.verdict == "clean"  # C and L applied there
    # 0.0.5: a.py (at the pin) is gone: that, and only that, is `deleted`
    r = m.results["0.0.5"][low]
    assert r.verdict.verdict == "deleted"
    assert r.verdict.missing_files == ["python/pkg/a.py"]
    assert [x["file"] for x in r.verdict.not_judged] == ["python/pkg/scheme.py"]
    # outputs: JSON details and a Markdown note naming the creator
    data = json.loads(json.dumps(m.to_json("report", 0, [])))
    d = data["details"][low]["0.0.3"]
    assert d["judged"] == "partial-series" and d["prerequisites_not_applied"] == [c, mm]
    assert d["not_judged"][0]["from"] == c
    assert data["verdicts"][low] == {
        "0.0.2": "clean",
        "0.0.3": "clean",
        "0.0.4": "conflict",
        "0.0.5": "deleted",
    }
    md = to_markdown(m, "report", 0, [])
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| {low} |"))
    cells = [c.strip().split("[")[0] for c in row.strip("|").split("|")[1:]]
    assert cells == ["C", "C", "X", "D"]
    assert f"not judged: its hunks on pkg/scheme.py (files {c} creates" in md
    assert "prerequisites not applied: 0001-c.patch, 0002-m.patch" in md


def _matrix_with(verdicts: dict[str, dict[str, str]]) -> Matrix:
    releases = list(next(iter(verdicts.values())))
    results = {
        r: {
            p: PatchResult(Verdict(v[r], evidence="e"), Verdict(v[r]), None, "alone", [])
            for p, v in verdicts.items()
        }
        for r in releases
    }
    return Matrix(releases, list(verdicts), results, {}, {}, "0.0.1")


def test_policy_exit_codes() -> None:
    m = _matrix_with(
        {"p1": {"1": "conflict", "2": "upstream"}, "p2": {"1": "clean", "2": "offset"}}
    )
    assert apply_policy(m, "newest")[0] == 0  # conflict only on an older release
    status, why = apply_policy(m, "any")
    assert status == 1 and why == ["p1 on 1: conflict: e"]
    assert apply_policy(m, "report") == (0, [])
    m2 = _matrix_with({"p1": {"1": "clean", "2": "deleted"}, "p2": {"1": "clean", "2": "clean"}})
    assert apply_policy(m2, "newest")[0] == 1
    assert apply_policy(m2, "report")[0] == 0
    m3 = _matrix_with({"p1": {"1": "clean", "2": "partly-upstream"}})
    assert apply_policy(m3, "newest")[0] == 0  # a warning, not a failure
    moved = _matrix_with({"p1": {"1": "clean", "2": "moved"}})
    moved.results["2"]["p1"].verdict.moved_verdict = "conflict"
    assert apply_policy(moved, "newest")[0] == 1
    unchecked = _matrix_with({"p1": {"1": "clean", "2": "clean"}})
    del unchecked.results["2"]
    unchecked.errors["2"] = "wheel not found"
    assert apply_policy(unchecked, "newest")[0] == 1
    with pytest.raises(Exception, match="unknown policy"):
        apply_policy(m, "lenient")


def test_policy_baseline() -> None:
    m = _matrix_with({"p1": {"1": "conflict", "2": "conflict"}, "p2": {"1": "clean", "2": "moved"}})
    m.results["2"]["p2"].verdict.moved_verdict = "partly-upstream"
    m.results["2"]["p2"].verdict.moved_to = {"old/k.h": "new/k.h"}
    base = json.loads(json.dumps(m.to_json("report", 0, [])))
    # honest conflicts already in the committed matrix do not fail CI
    assert apply_policy(m, "baseline", base) == (0, [])
    assert apply_policy(m, "newest")[0] == 1
    # a patch edited / an upstream re-release: each changed cell, old -> new
    m.results["1"]["p2"].verdict.verdict = "conflict"
    m.results["2"]["p2"].verdict.moved_verdict = "conflict"  # moved->P became moved->X
    status, why = apply_policy(m, "baseline", base)
    assert status == 1
    assert why == [
        "p2 on 1: clean -> conflict",
        "p2 on 2: moved->partly-upstream -> moved->conflict",
    ]
    # a release added upstream (and one that could not be checked)
    m2 = _matrix_with(
        {
            "p1": {"1": "conflict", "2": "conflict", "3": "clean"},
            "p2": {"1": "clean", "2": "moved", "3": "clean"},
        }
    )
    m2.results["2"]["p2"].verdict.moved_verdict = "partly-upstream"
    m2.results["2"]["p2"].verdict.moved_to = {"old/k.h": "new/k.h"}
    del m2.results["3"]
    m2.errors["3"] = "wheel not found"
    status, why = apply_policy(m2, "baseline", base)
    assert status == 1
    assert why == [
        "p1 on 3: (release not in matrix) -> (not checked)",
        "p2 on 3: (release not in matrix) -> (not checked)",
    ]
    with pytest.raises(Exception, match="needs the committed matrix"):
        apply_policy(m, "baseline")


def test_load_baseline_refuses_missing_or_other_series(tmp_path: Path) -> None:
    path = tmp_path / "rebase-check.json"
    with pytest.raises(SeriesError, match="does not exist") as exc:
        load_baseline(path, ["0001-a.patch"], "REGEN")
    assert "REGEN" in exc.value.hint and exc.value.exit_code == 1
    path.write_text("{not json")
    with pytest.raises(SeriesError, match="not readable JSON"):
        load_baseline(path, ["0001-a.patch"], "REGEN")
    path.write_text(json.dumps({"releases": ["1"], "patches": ["0001-a.patch"]}))
    with pytest.raises(SeriesError, match="lacks"):
        load_baseline(path, ["0001-a.patch"], "REGEN")
    base = {"releases": ["1"], "patches": ["0001-a.patch"], "verdicts": {}}
    path.write_text(json.dumps(base))
    with pytest.raises(SeriesError, match=r"another series .*-0001-a.patch, \+0001-b.patch"):
        load_baseline(path, ["0001-b.patch"], "REGEN")
    with pytest.raises(SeriesError, match="same patches, other order"):
        path.write_text(json.dumps({**base, "patches": ["0002-b.patch", "0001-a.patch"]}))
        load_baseline(path, ["0001-a.patch", "0002-b.patch"], "REGEN")
    path.write_text(json.dumps(base))
    assert load_baseline(path, ["0001-a.patch"])["releases"] == ["1"]


def test_json_and_markdown(tmp_path: Path) -> None:
    patch = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    pin = make_release(tmp_path, "0.0.1", PIN)
    ok = make_release(tmp_path, "0.0.2", PIN)
    bad = make_release(
        tmp_path,
        "0.0.3",
        {**PIN, "python/pkg/a.py": edit(A_PY, "value_20 = 20\n", "value_20 = 9\n")},
    )
    m = run_matrix(
        JudgeRepo(tmp_path / "j"),
        [parse_patch(patch)],
        pin,
        [ok, bad, ("0.0.4", "fetch failed: no such wheel")],
        log=lambda s: None,
    )
    status, failures = apply_policy(m, "any")
    data = json.loads(json.dumps(m.to_json("any", status, failures)))
    assert data["releases"] == ["0.0.2", "0.0.3", "0.0.4"]
    assert data["patches"] == ["0001-a.patch"]
    assert data["verdicts"] == {"0001-a.patch": {"0.0.2": "clean", "0.0.3": "conflict"}}
    assert data["details"]["0001-a.patch"]["0.0.3"]["conflicts"][0]["file"] == "python/pkg/a.py"
    assert data["errors"] == {"0.0.4": "fetch failed: no such wheel"}
    assert status == 1
    md = to_markdown(m, "any", status, failures)
    assert "| 0001-a.patch | C | X[1] | ! |" in md
    assert "[1] 0001-a.patch: does not apply: pkg/a.py hunk #1 (first: `@@ -17,7 +17,7 @@" in md
    assert "Policy `any`: exit status 1." in md


def _wheel(path: Path, files: dict[str, str]) -> str:
    """A minimal wheel holding FILES (repo paths python/sglang/... -> wheel sglang/...)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for repo_path, text in files.items():
            zf.writestr(repo_path.removeprefix("python/"), text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sg(files: dict[str, str]) -> dict[str, str]:
    return {k.replace("python/pkg/", "python/sglang/"): v for k, v in files.items()}


def test_cli_fetches_records_sha_and_writes_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end with tooling-core's lock/upstream: wheels come from the cache (no network)."""
    change = _sg(A_CHANGE)
    patch = make_patch(tmp_path, "0001-a.patch", _sg(PIN), change)
    (tmp_path / "patches" / "series").write_text(patch.name + "\n")
    cache = tmp_path / ".work" / "cache"
    trees = {"0.0.1": _sg(PIN), "0.0.2": _sg(PIN), "0.0.3": {**_sg(PIN), **change}}
    shas = {
        v: _wheel(cache / "wheels" / f"sglang-{v}-py3-none-any.whl", t) for v, t in trees.items()
    }
    lock = tmp_path / "upstream.lock"
    lock.write_text(
        '[upstream]\nrepo_url = "https://example.com/x.git"\n\n'
        '[pin]\nversion = "0.0.1"\ntag = "v0.0.1"\ncommit = "unresolved"\n'
        f'wheel_filename = "sglang-0.0.1-py3-none-any.whl"\nsha256 = "{shas["0.0.1"]}"\n\n'
        '[[targets]]\nversion = "0.0.2"\n\n[[targets]]\nversion = "0.0.3"\n'
    )
    monkeypatch.setenv("FP4SERIES_ROOT", str(tmp_path))
    monkeypatch.setenv("FP4SERIES_CACHE", str(cache))
    parser = argparse.ArgumentParser()
    rc.register(parser.add_subparsers())
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["rebase-check", "--lock", str(lock), "--patches-dir", str(tmp_path / "patches")]
    argv += ["--json", str(out_json), "--md", str(out_md), "--quiet"]

    def run(extra: list[str]) -> int:
        args = parser.parse_args(argv + extra)
        return int(args.func(args))

    assert run([]) == 0  # newest release: upstream
    data = json.loads(out_json.read_text())
    assert data["verdicts"] == {"0001-a.patch": {"0.0.2": "clean", "0.0.3": "upstream"}}
    assert "| 0001-a.patch | C | U |" in out_md.read_text()
    text = lock.read_text()
    assert f'sha256 = "{shas["0.0.2"]}"' in text and f'sha256 = "{shas["0.0.3"]}"' in text
    assert 'wheel_filename = "sglang-0.0.3-py3-none-any.whl"' in text
    assert (tmp_path / ".work" / "upstream" / "0.0.3" / ".git").is_dir()
    # second run: materialized releases are reused even with the wheels gone
    for w in (cache / "wheels").glob("*.whl"):
        w.unlink()
    assert run(["--releases", "0.0.2"]) == 0
    assert json.loads(out_json.read_text())["releases"] == ["0.0.2"]
    # --policy baseline: regenerate with report, then an identical matrix passes ...
    base_json, base_md = tmp_path / "reports" / "rebase-check.json", tmp_path / "reports" / "rc.md"
    argv2 = argv[:5] + ["--json", str(base_json), "--md", str(base_md), "--quiet"]
    args = parser.parse_args(argv2 + ["--policy", "report"])
    assert args.func(args) == 0
    bl = ["--policy", "baseline", "--baseline", str(base_json)]
    assert run(bl) == 0
    # ... a changed cell fails, naming it and the command that regenerates the baseline
    data = json.loads(base_json.read_text())
    data["verdicts"]["0001-a.patch"]["0.0.3"] = "conflict"
    base_json.write_text(json.dumps(data))
    capsys.readouterr()
    assert run(bl) == 1
    err = capsys.readouterr().err
    assert "0001-a.patch on 0.0.3: conflict -> upstream" in err
    assert "bash scripts/rebase-check.sh --policy report --json reports/rebase-check.json" in err
    # ... and a missing baseline or one for another series fails before checking anything
    with pytest.raises(SeriesError, match="does not exist") as exc:
        run(["--policy", "baseline", "--baseline", str(tmp_path / "nope.json")])
    assert exc.value.exit_code == 1
    data["patches"] = ["0001-old.patch"]
    base_json.write_text(json.dumps(data))
    with pytest.raises(SeriesError, match="another series"):
        run(bl)
