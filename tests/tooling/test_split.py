"""Split on a synthetic pin: branch contents (patch + deps only), groups, tests, PR description."""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import textwrap
from pathlib import Path

import _fakepin as fakepin
import pytest

from fp4series import split as sp
from fp4series.commands import split as split_command
from fp4series.errors import SeriesError
from fp4series.series import load_series

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


def run_split(
    world: dict[str, Path], base_override: str = "pin", rel: Path | None = None, **kw: object
) -> list[sp.SplitResult]:
    docs = load_series(world["patches"])
    kw.setdefault("log", lambda s: None)
    return sp.split(
        world["target"],
        docs,
        base=base_override,
        fetch_release=(lambda version: rel) if rel else None,
        pin_version="0.0.1",
        pin_tag="v0.0.1",
        pin_commit=None,
        out_dir=world["root"] / "split",
        reports_dir=world["root"] / "reports",
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
    assert (
        "- depends on #<PR of `nvfp4-marlin/change-a`>: edits next to lines it adds in "
        "`python/pkg/a.py`" in md
    )
    assert "Depends-On" not in md and "follow-a" not in md
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
    assert "FAIL, 3 passed, 1 failed" in md
    assert "gpu:" not in md  # GPU evidence comes from the reports, not the patch's entries


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
        "## Speed Tests and Profiling",
        "## Checklist",
    ]
    assert "Why Change a: a fact." in md
    assert "What Change a changes." in md
    assert "- `python/pkg/a.py`: +1 −1" in md
    assert "| modelopt-dense | patched | 2 | 3.10e-03 | dtype=fp16, m=33" in md
    assert "| ct-moe | unpatched | 1 | 6.70e-01 |" in md
    assert "does not touch a kernel or a GEMM path" in md  # a.py is no GEMM path
    unit = results[0].unit
    unit.members[0].trailers["Tests"] += ", bench:bench/bench_fp4.py"  # declares a benchmark
    bench = "\n".join(sp.bench_evidence(unit, reports / "bench.json"))
    assert "| 4096x4096 | 1 | 10.0 | 1.50 | 0.80 | 0.40 | 1.10 |" in bench
    # no test in upstream's tree on the branch: the box stays empty; nothing of this project
    assert "- [ ] Add unit tests" in md
    assert "- [x] Provide accuracy and speed benchmark results" in md
    assert sp.description_problems(md) == ([], [])
    assert "ran the tests." not in md  # How verified: speaks of this project's test run
    assert "Upstream status" not in md and "Upstream-Status" not in md


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
    split_command.register(parser.add_subparsers())
    args = parser.parse_args(
        ["split", str(world["target"]), "--patches-dir", str(world["patches"]), "--only", "grp"]
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
            load_series(world["patches"]),
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
    docs = load_series(world["patches"])
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
    from fp4series import upstream

    root = world["root"]
    _write_pin_lock(root)
    monkeypatch.setenv("FP4SERIES_ROOT", str(root))
    monkeypatch.setattr(
        upstream,
        "prepare_release",
        lambda lock, version, work, cache: upstream.Target(version, world["pin"], "v0.0.1"),
    )
    parser = argparse.ArgumentParser()
    split_command.register(parser.add_subparsers())
    fresh = root / "fresh" / "repo"
    args = parser.parse_args(
        ["split", str(fresh), "--patches-dir", str(world["patches"]), "--only", "other-b"]
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


# --- a line's series on its own (newer) base; clean commits; the record and the range-diff ----

REL_A = A_PY.replace("value_17 = 17\n", "value_17 = 17  # 0.0.2\n") + "NEW_IN_002 = True\n"


def _release(root: Path, version: str, files: dict[str, str]) -> Path:
    """A materialized release: a one-commit repo (no shared history) tagged v<version>."""
    rel = root / f"rel-{version}"
    rel.mkdir()
    git(rel, "init", "-q", "-b", "main", ".")
    for path, text in files.items():
        write(rel, path, text)
    git(rel, "add", "-A")
    git(rel, "commit", "-qm", f"sglang {version}")
    git(rel, "tag", f"v{version}")
    return rel


def _line_series(root: Path, rel: Path, version: str) -> Path:
    """patches/<version>: two patches made on the release (the second with every trailer)."""
    work = root / f"line-work-{version}"
    git(root, "clone", "-q", str(rel), str(work))
    commit(
        work,
        "Line change a",
        "Upstream-Status: Pending\nTests: tests/test_line.py::test_a\n"
        f"Rebased-From: 0001-change-a.patch {'a' * 40}",
        {"python/pkg/a.py": REL_A.replace("value_5 = 5\n", "value_5 = 555\n")},
    )
    commit(
        work,
        "Line other b",
        "Upstream-Status: Pending\nTests: tests/test_line.py::test_b,\n  gpu:tests/gpu/x.py\n"
        "Provides: B\nDepends-On: 0001-line-change-a.patch\nGroup: line-b\n"
        f"Rebased-From: 0002-other-b.patch {'b' * 40}\n"
        "Signed-off-by: Author One <a@example.com>",
        {"python/pkg/b.py": "B = 22\n"},
    )
    out = root / "patches" / version
    git(work, "format-patch", "-q", "--full-index", "-o", str(out), f"v{version}..HEAD")
    names = []
    for i, (p, stem) in enumerate(zip(sorted(out.glob("*.patch")), ["line-change-a",
                                                                     "line-other-b"],
                                      strict=True), 1):  # fmt: skip
        p.rename(out / f"{i:04d}-{stem}.patch")
        names.append(f"{i:04d}-{stem}.patch")
    (out / "series").write_text("\n".join(names) + "\n")
    return out


@pytest.fixture()
def line(world: dict[str, Path]) -> dict[str, Path]:
    root = world["root"]
    rel = _release(
        root,
        "0.0.2",
        {"python/pkg/__init__.py": "", "python/pkg/a.py": REL_A, "python/pkg/b.py": "B = 1\n",
         **CI_REGISTER},
    )  # fmt: skip
    project = root / "project"
    write(
        project,
        "tests/test_line.py",
        "import pkg.a\nimport pkg.b\n\n\ndef test_a():\n    assert pkg.a.value_5 == 555\n"
        "    assert pkg.a.NEW_IN_002\n\n\ndef test_b():\n    assert pkg.b.B == 22\n",
    )
    return {**world, "rel": rel, "line": _line_series(root, rel, "0.0.2"), "project": project}


# SGLang's CI registration module, as the placed tests import it
CI_REGISTER = {
    "python/sglang/__init__.py": "",
    "python/sglang/test/__init__.py": "",
    "python/sglang/test/ci/__init__.py": "",
    "python/sglang/test/ci/ci_register.py": "def register_cpu_ci(*args, **kw):\n    return None\n",
}


def split_line(line: dict[str, Path], **kw: object) -> list[sp.SplitResult]:
    common: dict[str, object] = dict(
        base="0.0.2",
        series_base="0.0.2",
        pin_version="0.0.1",
        pin_tag="v0.0.1",
        pin_commit=None,
        out_dir=line["root"] / "split-line",
        reports_dir=line["root"] / "reports",
        fetch_release=lambda version: line["rel"],
        log=lambda s: None,
    )
    common.update(kw)
    docs = load_series(kw.pop("patches_dir", line["line"]))  # type: ignore[arg-type]
    common.pop("patches_dir", None)
    return sp.split(line["target"], docs, **common)  # type: ignore[arg-type]


def test_line_on_its_own_newer_base_applies_exactly_and_runs_its_tests(
    line: dict[str, Path],
) -> None:
    runner = sp.pytest_runner(sys.executable, line["project"])
    results = split_line(line, runner=runner)
    assert [(r.unit.branch, r.ok, r.base, r.applied) for r in results] == [
        ("nvfp4-marlin/line-change-a", True, "release v0.0.2", "exact"),
        ("nvfp4-marlin/line-b", True, "release v0.0.2", "exact"),
    ]
    t = line["target"]
    rel_commit = git(line["rel"], "rev-parse", "v0.0.2").strip()
    assert git(t, "rev-parse", "nvfp4-marlin/line-change-a~1").strip() == rel_commit
    assert git(t, "rev-parse", "nvfp4-marlin/line-b~2").strip() == rel_commit
    a, b = results
    assert a.tests is not None and (a.tests.passed, a.tests.failed) == (1, 0), a.tests.tail
    assert b.tests is not None and (b.tests.passed, b.tests.ok) == (1, True), b.tests.tail
    assert b.skipped_tests == ["gpu:tests/gpu/x.py"]
    md = b.description.read_text()  # type: ignore[union-attr]
    assert [ln for ln in md.splitlines() if ln.startswith("## ")] == [
        "## Motivation",
        "## Modifications",
        "## Accuracy Tests",
        "## Speed Tests and Profiling",
        "## Checklist",
    ]
    assert "Why Line other b: a fact." in md and "What Line other b changes." in md
    assert "pass, 1 passed, 0 failed" in md and "on release v0.0.2" in md
    assert "Not applicable: this change does not touch a kernel" in md
    assert "- depends on #<PR of `nvfp4-marlin/line-change-a`>" in md  # merge first


def test_own_base_never_falls_back_to_three_way(world: dict[str, Path]) -> None:
    """The pin's series needs a 3-way merge on 0.0.2 (a context line changed there): allowed
    on a foreign base, refused on the series' own base."""
    rel = _release(
        world["root"],
        "0.0.2",
        {"python/pkg/__init__.py": "", "python/pkg/a.py": REL_A, "python/pkg/b.py": "B = 1\n"},
    )
    docs = load_series(world["patches"])
    common = dict(
        base="0.0.2",
        pin_version="0.0.1",
        pin_tag="v0.0.1",
        pin_commit=None,
        reports_dir=world["root"] / "reports",
        fetch_release=lambda version: rel,
        log=lambda s: None,
        only=["change-a"],
    )
    (res,) = sp.split(world["target"], docs, out_dir=world["root"] / "s1", **common)  # type: ignore[arg-type]
    assert (res.ok, res.applied) == (True, "three-way"), res.error
    assert "value_20 = 2000" in git(
        world["target"], "show", "nvfp4-marlin/change-a:python/pkg/a.py"
    )
    (res,) = sp.split(
        world["target"], docs, out_dir=world["root"] / "s2", series_base="0.0.2", **common
    )  # type: ignore[arg-type]
    assert not res.ok and res.applied == "" and "Patch failed at 0001" in res.error, res.error
    # a failed split leaves the branch as it was (here: the three-way one of the first split)
    assert "value_20 = 2000" in git(
        world["target"], "show", "nvfp4-marlin/change-a:python/pkg/a.py"
    )


def test_branch_commits_carry_no_internal_trailers(line: dict[str, Path]) -> None:
    before = {p.name: p.read_bytes() for p in line["line"].iterdir()}
    split_line(line)
    t = line["target"]
    msg = git(t, "log", "-1", "--format=%B", "nvfp4-marlin/line-b")
    for key in sp.INTERNAL_TRAILERS:
        assert f"{key}:" not in msg, msg
    assert "gpu:tests/gpu/x.py" not in msg  # the continuation line went with Tests:
    assert msg.rstrip("\n").endswith("ran the tests.\n\nSigned-off-by: Author One <a@example.com>")
    assert msg.startswith("[Quant] Line other b\n\nWhy:\nWhy Line other b: a fact.")
    first = git(t, "log", "-1", "--format=%B", "nvfp4-marlin/line-change-a")
    assert first.rstrip("\n").endswith("How verified:\nran the tests.")  # trailer paragraph gone
    assert git(t, "log", "-1", "--format=%an <%ae>", "nvfp4-marlin/line-b").strip() == (
        "Author One <a@example.com>"
    )
    assert {p.name: p.read_bytes() for p in line["line"].iterdir()} == before  # series as is
    split_line(line, keep_trailers=True, out_dir=line["root"] / "kept")
    kept = git(t, "log", "-1", "--format=%B", "nvfp4-marlin/line-b")
    assert "Upstream-Status: Pending" in kept and "Rebased-From: 0002-other-b.patch" in kept


def test_strip_trailers_keeps_a_message_without_trailers() -> None:
    text = "From 0 Mon\nSubject: [PATCH] x\n\nWhy:\nNo trailers: here. Really\n\ndiff --git a b\n"
    assert sp.strip_trailers(text) == text
    with_t = text.replace("Really\n", "Really\n\nTests: t.py\nFixes: #1\n")
    assert sp.strip_trailers(with_t) == text.replace("Really\n", "Really\n\nFixes: #1\n")


def test_record_then_range_diff_after_an_edit_then_unchanged(world: dict[str, Path]) -> None:
    out = world["root"] / "split"
    t = world["target"]
    first = run_split(world)
    record = json.loads((out / "split-record.json").read_text())
    assert record["schema"] == 1 and record["repo"] == str(t)
    entries = {e["branch"]: e for e in record["branches"]}
    assert list(entries) == [r.unit.branch for r in first]
    e = entries["nvfp4-marlin/needs-b"]
    pin_commit = git(t, "rev-parse", "v0.0.1").strip()
    assert e["base"] == {"label": "pin 0.0.1", "version": "0.0.1", "tag": "v0.0.1",
                         "commit": pin_commit}  # fmt: skip
    assert [(p["name"], p["role"]) for p in e["patches"]] == [
        ("0002-other-b.patch", "dependency"),
        ("0004-needs-b.patch", "member"),
    ]
    from fp4series.patchid import patch_identity

    ident = patch_identity(world["patches"] / "0004-needs-b.patch")
    assert e["patches"][1]["sha256"] == ident.sha256
    assert e["patches"][1]["patch_id"] == ident.patch_id and len(ident.patch_id or "") == 40
    assert e["head"] == git(t, "rev-parse", "nvfp4-marlin/needs-b").strip()
    assert e["applied"] == "exact" and e["trailers"] == "stripped" and e["when"].endswith("Z")
    assert all(r.change.startswith("new") for r in first)
    assert not list(out.glob("*.range-diff.txt"))
    old_head = e["head"]

    # edit patch 2 (other-b): its branch and needs-b (which carries it) change, nothing else
    path = world["patches"] / "0002-other-b.patch"
    path.write_text(path.read_text().replace("+B = 2\n", "+B = 3\n"))
    logged: list[str] = []
    docs = load_series(world["patches"])
    second = sp.split(
        t,
        docs,
        base="pin",
        pin_version="0.0.1",
        pin_tag="v0.0.1",
        pin_commit=None,
        out_dir=out,
        reports_dir=world["root"] / "reports",
        log=logged.append,
    )
    change = {r.unit.name: r.change for r in second}
    assert change["other-b"].startswith("changed since the split of ")
    assert change["other-b"].endswith(": 1 commit(s) changed, 0 added, 0 removed")
    assert change["needs-b"].endswith(": 1 commit(s) changed, 0 added, 0 removed")
    for name in ("change-a", "follow-a", "grp"):
        assert change[name].startswith("unchanged since the split of "), change[name]
    rd = (out / "needs-b.range-diff.txt").read_text()
    assert "-+B = 2" in rd and "++B = 3" in rd  # the change, as a diff of the diffs
    assert re.search(r"1: +\w+ ! 1: +\w+ \[Quant\] Other b", rd), rd
    assert re.search(r"2: +\w+ = 2: +\w+ \[Quant\] Needs b", rd), rd
    assert "++B = 3" in "\n".join(logged)  # printed too, since it changed
    assert (out / "grp.range-diff.txt").is_file()
    # the old commits stay reachable on split's own refs
    prev_ref = "refs/fp4series/split/needs-b/previous"
    assert git(t, "rev-parse", prev_ref).strip() == old_head
    assert git(t, "show", f"{prev_ref}~1:python/pkg/b.py") == "B = 2\n"
    new_head = git(t, "rev-parse", "nvfp4-marlin/needs-b").strip()
    assert git(t, "rev-parse", "refs/fp4series/split/needs-b/head").strip() == new_head
    record = json.loads((out / "split-record.json").read_text())
    entries = {e["unit"]: e for e in record["branches"]}
    assert entries["needs-b"]["range_diff"] == "needs-b.range-diff.txt"
    assert entries["needs-b"]["change"] == change["needs-b"]

    # an unchanged re-split: same commits (committer date = author date), reported unchanged
    third = run_split(world, only=["needs-b"])
    assert third[0].change.startswith("unchanged since the split of ")
    assert git(t, "rev-parse", "nvfp4-marlin/needs-b").strip() == new_head
    record = json.loads((out / "split-record.json").read_text())
    assert len(record["branches"]) == 5  # the units not re-split keep their entries


def test_a_base_change_is_a_change_even_with_equal_commits(world: dict[str, Path]) -> None:
    run_split(world, only=["other-b"])
    rel = _release(world["root"], "0.0.2", {"python/pkg/b.py": "B = 1\n"})
    (res,) = run_split(world, only=["other-b"], base_override="0.0.2", rel=rel)
    assert res.ok and res.change.endswith("; base pin 0.0.1 -> release v0.0.2"), res.change
    assert "0 commit(s) changed" in res.change


def test_cli_line_combination_patches_dir_and_base(
    line: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the lead's --line 0.0.2 maps to: --patches-dir patches/0.0.2 --base 0.0.2 (plus
    --series-base 0.0.2 and the line's python): branches on the materialized v0.0.2, exact."""
    from fp4series import upstream

    root = line["root"]
    _write_pin_lock(root)
    write(root, "tests/test_line.py", (line["project"] / "tests/test_line.py").read_text())
    monkeypatch.setenv("FP4SERIES_ROOT", str(root))
    asked: list[str] = []

    def prepare(lock: object, version: str, work: Path, cache: Path) -> upstream.Target:
        asked.append(version)
        return upstream.Target(version, line["rel"], f"v{version}")

    monkeypatch.setattr(upstream, "prepare_release", prepare)
    parser = argparse.ArgumentParser()
    split_command.register(parser.add_subparsers())
    out = root / "cli-split"
    fresh = root / "fresh-line-repo"  # absent: a clone of the materialized base is made
    argv = ["split", str(fresh), "--patches-dir", str(root / "patches" / "0.0.2"),
            "--base", "0.0.2", "--series-base", "0.0.2", "--run-tests",
            "--python", sys.executable, "--out-dir", str(out)]  # fmt: skip
    args = parser.parse_args(argv)
    assert args.func(args) == 0, capsys.readouterr()
    text = capsys.readouterr().out
    assert "cloned from the materialized release 0.0.2" in text
    assert asked == ["0.0.2"]
    summary = json.loads((out / "summary.json").read_text())
    assert [(x["branch"], x["applied"], x["tests"]["ok"]) for x in summary] == [
        ("nvfp4-marlin/line-change-a", "exact", True),
        ("nvfp4-marlin/line-b", "exact", True),
    ]
    record = json.loads((out / "split-record.json").read_text())
    assert record["series_base"] == "0.0.2"
    assert {e["base"]["tag"] for e in record["branches"]} == {"v0.0.2"}
    assert f"Record: {out / 'split-record.json'}" in text
    args = parser.parse_args(argv)  # again: both unchanged
    assert args.func(args) == 0
    assert capsys.readouterr().out.count("unchanged since the split of") == 2


def test_auto_base_falls_back_to_the_series_own_release(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from fp4series.split import auto_base

    unit = SimpleNamespace(patches=[SimpleNamespace(name="0001-a.patch")])
    missing = tmp_path / "none.json"
    assert auto_base(unit, missing) == "pin"  # type: ignore[arg-type]
    assert auto_base(unit, missing, "0.5.23") == "0.5.23"  # type: ignore[arg-type]
    matrix = tmp_path / "m.json"
    verdicts = {"0001-a.patch": {"0.5.24": "clean", "0.5.25": "conflict"}}
    matrix.write_text(json.dumps({"releases": ["0.5.24", "0.5.25"], "verdicts": verdicts}))
    assert auto_base(unit, matrix, "0.5.23") == "0.5.24"  # type: ignore[arg-type]
    matrix.write_text(json.dumps({"releases": ["0.5.24"], "verdicts": {}}))
    assert auto_base(unit, matrix, "0.5.23") == "0.5.23"  # type: ignore[arg-type]


# --- tests in upstream's tree; descriptions addressed to upstream (issue 22) ------------------


def test_the_branch_commit_carries_its_test_in_upstreams_tree_and_it_runs_there(
    line: dict[str, Path],
) -> None:
    runner = sp.pytest_runner(sys.executable, line["project"])
    results = split_line(line, runner=runner, project=line["project"])
    b = results[1]
    dest = f"{sp.UPSTREAM_TEST_DIR}/test_line.py"
    assert b.placed_tests == [dest]
    t = line["target"]
    # in the member's own commit, beside the fix
    show = git(t, "show", "--stat", "--format=%s", "nvfp4-marlin/line-b")
    assert "[Quant] Line other b" in show and dest in show and "python/pkg/b.py" in show
    placed = git(t, "show", f"nvfp4-marlin/line-b:{dest}")
    assert 'register_cpu_ci(est_time=60, suite="base-a-test-cpu")' in placed
    assert 'if __name__ == "__main__":' in placed
    # run in the branch's tree, at its upstream path
    assert b.tests is not None and b.tests.ok and b.tests.passed == 1, b.tests.tail
    assert any(dest + "::test_b" in c for c in b.tests.command)
    md = b.description.read_text()  # type: ignore[union-attr]
    assert f"python3 -m pytest -q {dest}::test_b" in md
    assert "- [x] Add unit tests" in md and f"- `{dest}` (new)" in md
    assert sp.description_problems(md)[0] == []
    # the committer date stays the author date: a re-split gives the same head
    again = split_line(line, runner=runner, project=line["project"])
    assert again[1].head == b.head


def test_upstream_tests_trailer_names_the_upstream_path(line: dict[str, Path]) -> None:
    p = line["line"] / "0002-line-other-b.patch"
    p.write_text(
        p.read_text().replace(
            "Group: line-b\n",
            "Group: line-b\nUpstream-Tests: tests/test_line.py=test/registered/quant/test_b.py\n",
        )
    )
    results = split_line(line, project=line["project"])
    assert results[1].placed_tests == ["test/registered/quant/test_b.py"]
    assert "Upstream-Tests" not in git(
        line["target"], "log", "-1", "--format=%B", "nvfp4-marlin/line-b"
    )


def test_description_check_names_this_project_and_its_machines() -> None:
    hard, soft = sp.description_problems(
        "Built with fp4series.\nOn the shared 2-core CPU machine.\n"
        "See tests/sglang-0.5.23/test_x.py and .work/venv.\nthe series on v0.5.11 does it.\n"
        "Not yet re-measured on a GPU.\nThe helper cannot run on SM70.\n"
        "The downstream layers read it.\nThese are downstream tests.\n"
    )
    assert [h.split(":")[0] for h in hard] == ["line 1", "line 2", "line 3"]
    assert [w.split(":")[0] for w in soft] == ["line 4", "line 5", "line 8"]


def test_a_description_naming_this_project_fails_the_split(world: dict[str, Path]) -> None:
    p = world["patches"] / "0002-other-b.patch"
    p.write_text(p.read_text().replace("Why Other b: a fact.", "Why Other b: fp4series needs it."))
    before = git(world["target"], "for-each-ref")
    results = run_split(world)
    (bad,) = [r for r in results if not r.ok]
    assert bad.unit.name == "other-b" and "speaks of this project" in bad.error
    assert "names this project" in bad.error
    assert git(world["target"], "for-each-ref") == before  # all or nothing


def test_a_report_command_of_this_project_is_not_quoted(world: dict[str, Path]) -> None:
    reports = world["root"] / "reports"
    reports.mkdir()
    case = {"path": "modelopt-dense", "dtype": "fp16", "m": 1, "n": 64, "k": 64, "rel_l2": 3e-4}
    head = {"device": "NVIDIA H200", "date": "2026-12-01T11:53:33+00:00", "cases": [case]}
    own = {**head, "command": "scripts/gpu-proof.sh --bundle bundle --stages numerics"}
    (reports / "numerics.json").write_text(json.dumps(own))
    logs: list[str] = []
    (r,) = run_split(world, only=["change-a"], log=logs.append)
    md = r.description.read_text()  # type: ignore[union-attr]
    assert "gpu-proof" not in md
    assert (
        "GPU accuracy, NVIDIA H200, 2026-12-01, measured by a GPU harness kept outside this PR "
        "that drives these SGLang layers:" in md
    )
    assert r.ok and any("record one a reviewer can run" in w for w in r.warnings), r.warnings
    assert any("record one a reviewer can run" in ln for ln in logs)
    runnable = {**head, "command": "python3 -m pytest -q test/registered/quant/test_x.py"}
    (reports / "numerics.json").write_text(json.dumps(runnable))
    (r,) = run_split(world, only=["change-a"])
    md = r.description.read_text()  # type: ignore[union-attr]
    assert "made by `python3 -m pytest -q test/registered/quant/test_x.py`" in md


def test_a_placed_test_that_names_this_project_is_named_for_its_author(
    line: dict[str, Path],
) -> None:
    t = line["project"] / "tests/test_line.py"
    t.write_text(t.read_text() + "\n# run it with .work/venv (fp4series)\n")
    logs: list[str] = []
    results = split_line(line, project=line["project"], log=logs.append)
    b = results[1]
    assert b.ok  # the test is the project's to reword; the description stays clean
    dest = f"{sp.UPSTREAM_TEST_DIR}/test_line.py"
    assert any(dest in w and "reword it in the test" in w for w in b.warnings), b.warnings
    assert any("reword it in the test" in ln for ln in logs)


def test_without_a_git_identity_the_committer_is_the_author_not_this_tooling(
    line: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fakepin.isolate_git(monkeypatch, tmp_path, identity=False)
    split_line(line, project=line["project"])
    t = line["target"]
    for branch in ("nvfp4-marlin/line-change-a", "nvfp4-marlin/line-b"):
        who = git(t, "log", "-1", "--format=%an <%ae>|%cn <%ce>", branch).strip()
        assert who == "Author One <a@example.com>|Author One <a@example.com>", who


def test_support_files_are_the_conftest_and_the_sibling_modules_imported(tmp_path: Path) -> None:
    d = tmp_path / "tests" / "sglang-9.9"
    write(d, "conftest.py", 'import importlib\nimportlib.import_module("_types_99")\n')
    write(d, "_types_99.py", "")
    write(d, "_helpers.py", "import torch\n")
    write(d, "test_matrix.py", "from _helpers import x\n")
    write(d, "test_unrelated.py", "")
    write(d, "test_fused.py", "import pytest\nfrom test_matrix import build\n")
    got = sp._support_files(tmp_path, d / "test_fused.py")
    assert sorted(p.name for p in got) == [
        "_helpers.py",
        "_types_99.py",
        "conftest.py",
        "test_matrix.py",
    ]


@pytest.mark.parametrize(
    "source",
    [
        '"""Doc."""\n\nfrom __future__ import annotations\n\nfrom x import y  # noqa\n',
        "import pytest\n\n\ndef test_a():\n    pass\n",
        "def test_b():\n    pass\n",
    ],
)
def test_a_placed_test_gets_the_ci_entry_and_stays_valid_python(source: str) -> None:
    text = sp.runnable_by_upstream_ci(source)
    compile(text, "placed.py", "exec")  # a __future__ import still comes first
    assert text.startswith(source.rstrip("\n"))
    assert "register_cpu_ci(" in text and 'if __name__ == "__main__":' in text
    assert len(re.findall(r"^import pytest", text, re.M)) == 1
    assert sp.runnable_by_upstream_ci(text) == text  # registered already: unchanged


def test_a_failed_split_leaves_no_release_tag_it_fetched(world: dict[str, Path]) -> None:
    rel = _release(
        world["root"],
        "0.0.2",
        {"python/pkg/__init__.py": "", "python/pkg/a.py": REL_A, "python/pkg/b.py": "B = 1\n"},
    )
    before = git(world["target"], "for-each-ref")
    logs: list[str] = []
    (res,) = run_split(world, "0.0.2", rel, only=["change-a"], series_base="0.0.2", log=logs.append)
    assert not res.ok  # exact only on its own base, and a context line changed in 0.0.2
    assert git(world["target"], "for-each-ref") == before  # no branch, no tag v0.0.2
    assert any("refs/tags/v0.0.2: fetched by this split, removed again" in ln for ln in logs)


def test_speed_section_says_no_kernel_changed_only_when_none_did(tmp_path: Path) -> None:
    """A patch on a GEMM path that edits no kernel source has no speed change to report (and
    the checklist may say so); one that edits a kernel needs the benchmark."""
    import types

    def unit(*files: str) -> sp.Unit:
        member = types.SimpleNamespace(files=list(files), tests=lambda: [])
        return types.SimpleNamespace(members=[member])  # type: ignore[return-value]

    python_only = unit("python/sglang/srt/layers/quantization/marlin_utils_fp4.py")
    kernel = unit(
        "python/sglang/srt/layers/quantization/marlin_utils_fp4.py",
        "python/sglang/jit_kernel/csrc/gemm/marlin/marlin_template.h",
    )
    assert not sp.changes_kernels(python_only) and sp.changes_kernels(kernel)
    assert sp.bench_evidence(python_only, tmp_path / "bench.json") == [sp.NO_KERNEL_CHANGE]
    assert sp.bench_evidence(kernel, tmp_path / "bench.json") == [
        "No GPU benchmark results for this change on this base yet."
    ]


def test_a_kernel_change_quotes_the_turing_ptx_run(tmp_path: Path) -> None:
    """turing_ptx.json (the kernels as compute_75 PTX) is quoted for a change to kernel sources,
    labelled as that run."""
    import types

    case = {"path": "modelopt-dense", "dtype": "float16", "m": 1, "n": 64, "k": 64}
    (tmp_path / "turing_ptx.json").write_text(
        json.dumps({"device": "NVIDIA H200", "date": "2026-12-03", "cases": [
            {**case, "templates": "patched", "arch": "compute_75", "rel_l2": 3.6e-4}
        ]})
    )  # fmt: skip
    member = types.SimpleNamespace(
        files=["python/sglang/jit_kernel/csrc/gemm/marlin/marlin_template.h"], tests=lambda: []
    )
    unit = types.SimpleNamespace(members=[member])
    got = sp.numerics_evidence(unit, tmp_path / "turing_ptx.json", what=sp.TURING_PTX)  # type: ignore[arg-type]
    assert got[0].startswith("GPU accuracy, the same check with the Marlin kernels built as ")
    assert (
        "compute_75 PTX only" in got[0] and "| modelopt-dense | patched | 1 | 3.60e-04 |" in got[-1]
    )
