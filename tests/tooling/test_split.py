"""Split on a synthetic pin: branch contents (patch + deps only), groups, tests, PR description."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import textwrap
from pathlib import Path

import _fakepin as fakepin
import pytest

from fp4series import split as sp
from fp4series.errors import SeriesError
from fp4series.overlap import load_patch_docs

ENV = {**fakepin.IDENTITY, "GIT_AUTHOR_NAME": "Author One", "GIT_AUTHOR_EMAIL": "a@example.com"}
A_PY = "".join(f"value_{i} = {i}\n" for i in range(1, 41))


git = functools.partial(fakepin.git, env=ENV)


def write(repo: Path, path: str, text: str) -> None:
    f = repo / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)


def commit(repo: Path, subject: str, trailers: str, files: dict[str, str]) -> None:
    for path, text in files.items():
        write(repo, path, text)
    git(repo, "add", "-A")
    msg = (
        f"[Quant] {subject}\n\nWhy:\nWhy {subject}: a fact.\n\nWhat:\nWhat {subject} changes.\n\n"
        f"How verified:\nran the tests.\n\n{trailers}\n"
    )
    git(repo, "commit", "-qm", msg)


STEMS = ["change-a", "other-b", "follow-a", "needs-b", "grp-one", "grp-two"]


@pytest.fixture()
def world(tmp_path: Path) -> dict[str, Path]:
    """A pin repo (tag v0.0.1) and a six-patch series made on a clone of it."""
    pin = tmp_path / "pin"
    pin.mkdir()
    git(pin, "init", "-q", "-b", "main", ".")
    write(pin, "python/pkg/__init__.py", "")
    write(pin, "python/pkg/a.py", A_PY)
    write(pin, "python/pkg/b.py", "B = 1\n")
    write(pin, "python/pkg/c.py", "C = 1\n")
    write(pin, "python/pkg/g.py", "G = 1\n")
    git(pin, "add", "-A")
    git(pin, "commit", "-qm", "pin")
    git(pin, "tag", "v0.0.1")
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(pin), str(work))
    a1 = A_PY.replace("value_20 = 20\n", "value_20 = 2000\n")
    commit(work, "Change a", "Tests: tests/test_a.py", {"python/pkg/a.py": a1})
    commit(
        work,
        "Other b",
        "Tests: gpu:tests/gpu/test_dense.py, tests/test_b.py",
        {"python/pkg/b.py": "B = 2\n"},
    )
    # line 21 sits in the context of patch 1's line 20: derived dependency
    commit(
        work, "Follow a", "", {"python/pkg/a.py": a1.replace("value_21 = 21\n", "value_21 = 0\n")}
    )
    commit(
        work,
        "Needs b",
        "Depends-On: 0002-other-b.patch",
        {"python/pkg/c.py": "C = 2\n"},
    )
    commit(work, "Grp one", "Group: grp", {"python/pkg/g.py": "G = 2\n"})
    commit(work, "Grp two", "Group: grp", {"python/pkg/g.py": "G = 2\nH = 3\n"})
    patches = tmp_path / "patches"
    out = git(work, "format-patch", "-q", "--full-index", "-o", str(patches), "v0.0.1..HEAD")
    del out
    names = []
    for i, (p, stem) in enumerate(zip(sorted(patches.glob("*.patch")), STEMS, strict=True), 1):
        name = f"{i:04d}-{stem}.patch"
        p.rename(patches / name)
        names.append(name)
    (patches / "series").write_text("\n".join(names) + "\n")
    target = tmp_path / "target"
    git(tmp_path, "clone", "-q", str(pin), str(target))
    return {"pin": pin, "patches": patches, "target": target, "root": tmp_path}


def subjects(repo: Path, branch: str) -> list[str]:
    return git(repo, "log", "--reverse", "--format=%s", f"v0.0.1..{branch}").split("\n")[:-1]


def run_split(world: dict[str, Path], **kw: object) -> list[sp.SplitResult]:
    docs = load_patch_docs(world["patches"])
    return sp.split(
        world["target"],
        docs,
        base="pin",
        pin_version="0.0.1",
        pin_tag="v0.0.1",
        pin_commit=None,
        out_dir=world["root"] / "split",
        reports_dir=world["root"] / "reports",
        log=lambda s: None,
        **kw,  # type: ignore[arg-type]
    )


def test_branches_hold_patch_plus_only_its_dependencies(world: dict[str, Path]) -> None:
    results = run_split(world)
    assert [r.unit.branch for r in results] == [
        "nvfp4-marlin/change-a",
        "nvfp4-marlin/other-b",
        "nvfp4-marlin/follow-a",
        "nvfp4-marlin/needs-b",
        "nvfp4-marlin/grp",
    ]
    assert all(r.ok for r in results), [r.error for r in results]
    t = world["target"]
    assert subjects(t, "nvfp4-marlin/change-a") == ["[Quant] Change a"]
    assert subjects(t, "nvfp4-marlin/other-b") == ["[Quant] Other b"]
    # derived (overlap) and declared dependencies come along, nothing else
    assert subjects(t, "nvfp4-marlin/follow-a") == ["[Quant] Change a", "[Quant] Follow a"]
    assert subjects(t, "nvfp4-marlin/needs-b") == ["[Quant] Other b", "[Quant] Needs b"]
    assert subjects(t, "nvfp4-marlin/grp") == ["[Quant] Grp one", "[Quant] Grp two"]
    # based on the pin, author kept, content is the patch's
    assert (
        git(t, "merge-base", "nvfp4-marlin/grp", "v0.0.1").strip()
        == git(t, "rev-parse", "v0.0.1").strip()
    )
    assert git(t, "log", "-1", "--format=%an", "nvfp4-marlin/change-a").strip() == "Author One"
    assert "value_21 = 0" in git(t, "show", "nvfp4-marlin/follow-a:python/pkg/a.py")
    assert results[2].dep_units == ["change-a"]
    assert results[2].dep_reasons == {
        "change-a": ["follow-a context lines it wrote in python/pkg/a.py"]
    }
    md = results[2].description.read_text()  # type: ignore[union-attr]
    assert "- `nvfp4-marlin/change-a`: follow-a context lines it wrote in python/pkg/a.py" in md
    # nothing pushed anywhere: the target's origin has no such branch
    assert "nvfp4-marlin" not in git(world["pin"], "branch", "-a")
    # re-running replaces the branches instead of failing
    again = run_split(world, only=["follow-a"])
    assert [r.ok for r in again] == [True]


def test_runner_gets_cpu_tests_and_counts_go_into_description(world: dict[str, Path]) -> None:
    seen: list[tuple[str, list[str]]] = []

    def runner(wt: Path, tests: list[str]) -> sp.TestRun:
        seen.append(((wt / "python/pkg/b.py").read_text(), tests))
        return sp.TestRun(["pytest", *tests], passed=3, failed=1, returncode=1)

    results = run_split(world, only=["other-b"], runner=runner)
    assert seen == [("B = 2\n", ["tests/test_b.py"])]  # gpu: entries are not run here
    r = results[0]
    assert r.skipped_tests == ["gpu:tests/gpu/test_dense.py"]
    md = r.description.read_text() if r.description else ""
    assert "FAILED: 3 passed, 1 failed" in md
    assert "`gpu:tests/gpu/test_dense.py`" in md


def test_pr_description_sections_and_evidence(world: dict[str, Path]) -> None:
    reports = world["root"] / "reports"
    reports.mkdir()
    (reports / "numerics.json").write_text(
        json.dumps(
            {
                "cases": [
                    {"path": "modelopt-dense", "dtype": "bf16", "m": 1, "n": 4096, "k": 4096,
                     "bias": False, "templates": "patched", "rel_l2": 0.0026},
                    {"path": "modelopt-dense", "dtype": "fp16", "m": 33, "n": 4096, "k": 4096,
                     "bias": True, "templates": "patched", "rel_l2": 0.0031},
                    {"path": "ct-moe", "dtype": "bf16", "m": 7, "n": 1024, "k": 2048,
                     "bias": False, "templates": "unpatched", "rel_l2": 0.67},
                ]
            }
        )
    )  # fmt: skip
    (reports / "bench.json").write_text(
        json.dumps(
            {"rows": [{"shape": "4096x4096", "m": 1, "fp4_us": 10.0, "bf16_us": 15.0,
                       "int4_us": 8.0, "roofline_us": 4.0, "upstream_fp4_us": 11.0}]}
        )
    )  # fmt: skip
    results = run_split(world, only=["change-a"])
    md = results[0].description.read_text()  # type: ignore[union-attr]
    heads = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert heads == [
        "## Motivation",
        "## Modifications",
        "## Accuracy Tests",
        "## Benchmarking and Profiling",
        "## Checklist",
    ]
    assert "Why Change a: a fact." in md
    assert "What Change a changes." in md
    assert "- `python/pkg/a.py`: +1 −1" in md
    assert "- `tests/test_a.py`" in md  # declared, not run without a runner
    assert "| modelopt-dense | patched | 2 | 3.10e-03 | dtype=fp16, m=33" in md
    assert "| ct-moe | unpatched | 1 | 6.70e-01 |" in md
    assert "does not touch a kernel or a GEMM path" in md  # a.py is no GEMM path
    unit = results[0].unit
    unit.members[0].trailers["Tests"] += ", bench:bench/bench_fp4.py"  # declares a benchmark
    bench = "\n".join(sp.bench_evidence(unit, reports / "bench.json"))
    assert "| 4096x4096 | 1 | 10.0 | 1.50 | 0.80 | 0.40 | 1.10 |" in bench
    assert "- [x] Unit tests added" in md
    assert "ran the tests." in md


def test_numerics_paths_follow_the_touched_files() -> None:
    assert sp.numerics_paths(["python/sglang/srt/layers/quantization/modelopt_quant.py"]) == {
        "modelopt-dense",
        "modelopt-moe",
    }
    jit = "python/sglang/jit_kernel/csrc/gemm/"
    assert sp.numerics_paths([jit + "marlin/marlin_template.h"]) == {"modelopt-dense", "ct-dense"}
    assert sp.numerics_paths([jit + "marlin_moe/marlin_template.h"]) == {"modelopt-moe", "ct-moe"}


def test_real_pytest_runs_against_the_branch_tree(world: dict[str, Path]) -> None:
    project = world["root"] / "project"
    write(
        project,
        "tests/test_a.py",
        textwrap.dedent(
            """
            import pkg.a

            def test_patched():
                assert pkg.a.value_20 == 2000

            def test_untouched():
                assert pkg.a.value_21 == 21
            """
        ),
    )
    runner = sp.pytest_runner(sys.executable, project)
    results = run_split(world, only=["change-a"], runner=runner)
    t = results[0].tests
    assert t is not None and (t.passed, t.failed, t.ok) == (2, 0, True), t.tail
    run_split(world, only=["follow-a"])  # no declared tests: run the file by hand on its tree
    t = runner(world["root"] / "split" / "worktrees" / "follow-a", ["tests/test_a.py"])
    assert (t.passed, t.failed, t.ok) == (1, 1, False)


def _write_pin_lock(root: Path) -> None:
    """A minimal upstream.lock naming pin v0.0.1, for the CLI tests."""
    (root / "upstream.lock").write_text(
        '[upstream]\nrepo_url = "https://example.com/x.git"\n\n'
        '[pin]\nversion = "0.0.1"\ntag = "v0.0.1"\ncommit = "unresolved"\n'
        f'wheel_filename = "sglang-0.0.1-py3-none-any.whl"\nsha256 = "{"a" * 64}"\n'
    )


def test_cli_prints_commands_never_pushes(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = world["root"]
    _write_pin_lock(root)
    monkeypatch.setenv("FP4SERIES_ROOT", str(root))
    parser = argparse.ArgumentParser()
    sp.register(parser.add_subparsers())
    args = parser.parse_args(
        ["split", str(world["target"]), "--patches-dir", str(world["patches"]), "--patches", "grp"]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"git -C {world['target']} push origin nvfp4-marlin/grp" in out
    assert "gh pr create --repo sgl-project/sglang --base main" in out
    assert f"--body-file {root / '.work' / 'split' / 'grp.md'}" in out
    summary = json.loads((root / ".work" / "split" / "summary.json").read_text())
    assert summary[0]["patches"] == ["0005-grp-one.patch", "0006-grp-two.patch"]
    bad = parser.parse_args(["split", str(world["target"]), "--patches-dir",
                             str(world["patches"]), "--base", "9.9.9"])  # fmt: skip
    with pytest.raises(Exception, match="no tag v9.9.9"):
        sp.split(
            world["target"],
            load_patch_docs(world["patches"]),
            base=bad.base,
            pin_version="0.0.1",
            pin_tag="v0.0.1",
            pin_commit=None,
            out_dir=root / "s2",
            reports_dir=root / "reports",
            log=lambda s: None,
        )


def test_base_on_a_newer_release_fetched_into_the_repo(world: dict[str, Path]) -> None:
    """--base VERSION: a release missing from REPO is materialized (here: a one-commit repo)
    and fetched by tag; --base auto picks the newest release where the branch applies."""
    rel = world["root"] / "rel"
    rel.mkdir()
    git(rel, "init", "-q", ".")
    write(rel, "python/pkg/a.py", "import os\n" * 3 + A_PY)
    write(rel, "python/pkg/b.py", "B = 1\n")
    git(rel, "add", "-A")
    git(rel, "commit", "-qm", "release 0.0.2")
    git(rel, "tag", "v0.0.2")
    asked: list[str] = []

    def fetch_release(version: str) -> Path:
        asked.append(version)
        return rel

    report = world["root"] / "rebase-check.json"
    report.write_text(
        json.dumps(
            {
                "releases": ["0.0.2", "0.0.3"],
                "verdicts": {
                    "0001-change-a.patch": {"0.0.2": "offset", "0.0.3": "conflict"},
                    "0003-follow-a.patch": {"0.0.2": "conflict", "0.0.3": "conflict"},
                },
            }
        )
    )
    docs = load_patch_docs(world["patches"])
    common = dict(
        pin_version="0.0.1",
        pin_tag="v0.0.1",
        pin_commit=None,
        out_dir=world["root"] / "split",
        reports_dir=world["root"] / "reports",
        log=lambda s: None,
        fetch_release=fetch_release,
        rebase_report=report,
    )
    res = sp.split(world["target"], docs, base="auto", only=["change-a", "follow-a"], **common)  # type: ignore[arg-type]
    assert [(r.unit.name, r.base, r.ok) for r in res] == [
        ("change-a", "release v0.0.2", True),
        ("follow-a", "pin 0.0.1", True),  # its dependency chain conflicts on 0.0.2
    ]
    assert asked == ["0.0.2"]
    t = world["target"]
    assert (
        git(t, "rev-parse", "nvfp4-marlin/change-a~1").strip()
        == git(rel, "rev-parse", "v0.0.2").strip()
    )
    assert "value_20 = 2000" in git(t, "show", "nvfp4-marlin/change-a:python/pkg/a.py")


def test_cli_clones_the_materialized_pin_when_repo_is_missing(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fp4series import rebase_check

    root = world["root"]
    _write_pin_lock(root)
    monkeypatch.setenv("FP4SERIES_ROOT", str(root))
    monkeypatch.setattr(
        rebase_check,
        "prepare_release",
        lambda lock, version, work, cache: rebase_check.Target(version, world["pin"], "v0.0.1"),
    )
    parser = argparse.ArgumentParser()
    sp.register(parser.add_subparsers())
    fresh = root / "fresh" / "repo"
    args = parser.parse_args(
        ["split", str(fresh), "--patches-dir", str(world["patches"]), "--patches", "other-b"]
    )
    assert args.func(args) == 0
    assert subjects(fresh, "nvfp4-marlin/other-b") == ["[Quant] Other b"]


# --- hostile names: nothing outside the split's out dir is ever removed ----------------------


def _canary(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "keep.txt").write_text("the user's\n")
    return where


@pytest.mark.parametrize("value", ["../../canary", "ABS", "sub/dir", ".."])
def test_group_that_is_not_a_plain_name_is_refused(world: dict[str, Path], value: str) -> None:
    canary = _canary(world["root"] / "canary")  # what out/worktrees/../../canary resolves to
    if value == "ABS":
        value = str(canary)
    for name in ("0005-grp-one.patch", "0006-grp-two.patch"):
        path = world["patches"] / name
        path.write_text(path.read_text().replace("Group: grp", f"Group: {value}"))
    with pytest.raises(SeriesError, match=r"0005-grp-one\.patch: Group: .* not a plain name"):
        run_split(world)
    assert (canary / "keep.txt").read_text() == "the user's\n"
    assert not (world["root"] / "split" / "worktrees").exists()  # refused before any branch


def test_worktrees_link_leading_out_of_the_out_dir_is_refused(world: dict[str, Path]) -> None:
    outside = _canary(world["root"] / "elsewhere" / "change-a")
    (world["root"] / "split").mkdir()
    (world["root"] / "split" / "worktrees").symlink_to(outside.parent)
    with pytest.raises(SeriesError, match="does not lie inside"):
        run_split(world)
    assert (outside / "keep.txt").read_text() == "the user's\n"
