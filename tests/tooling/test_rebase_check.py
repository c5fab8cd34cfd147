"""Rebase check on synthetic upstreams: one scenario per verdict, series order, policy, outputs."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from fp4series import rebase_check as rc
from fp4series.overlap import load_patch, load_patch_docs

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00",
}

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


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=ENV, input=stdin, capture_output=True, text=True, check=True
    ).stdout


def write_tree(repo: Path, files: dict[str, str]) -> None:
    for p in repo.iterdir():
        if p.name != ".git":
            subprocess.run(["rm", "-rf", str(p)], check=True)
    for path, text in files.items():
        f = repo / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def make_release(root: Path, version: str, files: dict[str, str]) -> rc.Target:
    """A one-commit repo tagged v<version>, like upstream.materialize builds."""
    repo = root / f"rel-{version}"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", ".")
    write_tree(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"sglang {version}")
    git(repo, "tag", f"v{version}")
    return rc.Target(version, repo, f"v{version}")


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


def judge_one(tmp_path: Path, patch: Path, release_files: dict[str, str]) -> rc.Verdict:
    pin = make_release(tmp_path, "0.0.1", PIN)
    target = make_release(tmp_path, "0.0.2", release_files)
    repo = rc.JudgeRepo(tmp_path / "judge")
    m = rc.run_matrix(repo, [load_patch(patch)], pin, [target], log=lambda s: None)
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
    docs = load_patch_docs(tmp_path / "patches")
    pin = make_release(tmp_path, "0.0.1", PIN)
    same = make_release(tmp_path, "0.0.2", {**PIN, "python/pkg/x.py": "x = 1\n"})
    broken = make_release(
        tmp_path,
        "0.0.3",
        {**PIN, "python/pkg/a.py": edit(A_PY, "value_20 = 20\n", "value_20 = 7\n")},
    )
    lines: list[str] = []
    m = rc.run_matrix(rc.JudgeRepo(tmp_path / "j"), docs, pin, [same, broken], log=lines.append)
    r2 = m.results["0.0.2"]
    assert r2["0001-a.patch"].verdict.verdict == "clean"
    assert r2["0002-b.patch"].verdict.verdict == "clean"
    assert r2["0002-b.patch"].judged == "in-series"
    assert r2["0002-b.patch"].alone.verdict == "conflict"  # B needs A's line as context
    r3 = m.results["0.0.3"]
    assert r3["0001-a.patch"].verdict.verdict == "conflict"
    assert r3["0002-b.patch"].judged == "alone"  # its prerequisite failed
    assert r3["0002-b.patch"].prerequisites == ["0001-a.patch"]
    assert lines[0].startswith("[1/2] 0.0.2: 2 patches judged in ")
    assert lines[1].startswith("[2/2] 0.0.3: 2 patches judged in ")


def _matrix_with(verdicts: dict[str, dict[str, str]]) -> rc.Matrix:
    releases = list(next(iter(verdicts.values())))
    results = {
        r: {
            p: rc.PatchResult(rc.Verdict(v[r], evidence="e"), rc.Verdict(v[r]), None, "alone", [])
            for p, v in verdicts.items()
        }
        for r in releases
    }
    return rc.Matrix(releases, list(verdicts), results, {}, {}, "0.0.1")


def test_policy_exit_codes() -> None:
    m = _matrix_with(
        {"p1": {"1": "conflict", "2": "upstream"}, "p2": {"1": "clean", "2": "offset"}}
    )
    assert rc.apply_policy(m, "newest")[0] == 0  # conflict only on an older release
    status, why = rc.apply_policy(m, "any")
    assert status == 1 and why == ["p1 on 1: conflict: e"]
    assert rc.apply_policy(m, "report") == (0, [])
    m2 = _matrix_with({"p1": {"1": "clean", "2": "deleted"}, "p2": {"1": "clean", "2": "clean"}})
    assert rc.apply_policy(m2, "newest")[0] == 1
    assert rc.apply_policy(m2, "report")[0] == 0
    m3 = _matrix_with({"p1": {"1": "clean", "2": "partly-upstream"}})
    assert rc.apply_policy(m3, "newest")[0] == 0  # a warning, not a failure
    moved = _matrix_with({"p1": {"1": "clean", "2": "moved"}})
    moved.results["2"]["p1"].verdict.moved_verdict = "conflict"
    assert rc.apply_policy(moved, "newest")[0] == 1
    unchecked = _matrix_with({"p1": {"1": "clean", "2": "clean"}})
    del unchecked.results["2"]
    unchecked.errors["2"] = "wheel not found"
    assert rc.apply_policy(unchecked, "newest")[0] == 1
    with pytest.raises(Exception, match="unknown policy"):
        rc.apply_policy(m, "lenient")


def test_json_and_markdown(tmp_path: Path) -> None:
    patch = make_patch(tmp_path, "0001-a.patch", PIN, A_CHANGE)
    pin = make_release(tmp_path, "0.0.1", PIN)
    ok = make_release(tmp_path, "0.0.2", PIN)
    bad = make_release(
        tmp_path,
        "0.0.3",
        {**PIN, "python/pkg/a.py": edit(A_PY, "value_20 = 20\n", "value_20 = 9\n")},
    )
    m = rc.run_matrix(
        rc.JudgeRepo(tmp_path / "j"),
        [load_patch(patch)],
        pin,
        [ok, bad, ("0.0.4", "fetch failed: no such wheel")],
        log=lambda s: None,
    )
    status, failures = rc.apply_policy(m, "any")
    data = json.loads(json.dumps(m.to_json("any", status, failures)))
    assert data["releases"] == ["0.0.2", "0.0.3", "0.0.4"]
    assert data["patches"] == ["0001-a.patch"]
    assert data["verdicts"] == {"0001-a.patch": {"0.0.2": "clean", "0.0.3": "conflict"}}
    assert data["details"]["0001-a.patch"]["0.0.3"]["conflicts"][0]["file"] == "python/pkg/a.py"
    assert data["errors"] == {"0.0.4": "fetch failed: no such wheel"}
    assert status == 1
    md = rc.to_markdown(m, "any", status, failures)
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
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
