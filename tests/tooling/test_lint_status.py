"""Upstream-Status in the DEP-3/Yocto vocabulary, Rebased-From:, and the cross-check of each
patch's header against the newest verdict of a rebase-check matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fakepin import P2, Env

from fp4series import cli
from fp4series.errors import SeriesError
from fp4series.lint import Problem, lint_paths, rebased_from_problem, status_problem
from fp4series.patchid import patch_identity, stable_patch_id

P1 = "0001-change-value-ten.patch"
PID = "3f2c" + "0" * 36


def _rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _status(env: Env, name: str, value: str) -> int:
    """Set NAME's Upstream-Status to VALUE; the 1-based line of the trailer."""
    path = env.patches / name
    _rewrite(path, "Upstream-Status: Pending", f"Upstream-Status: {value}")
    return path.read_text().split("\n").index(f"Upstream-Status: {value}") + 1


def run_lint(env: Env, **kw: object) -> tuple[list[str], list[str], list[str]]:
    notes: list[str] = []
    warnings: list[Problem] = []
    found = lint_paths(
        [], root=env.root, patches_dir=env.patches, notes=notes, warnings=warnings, **kw
    )  # type: ignore[arg-type]
    return [str(p) for p in found], [str(w) for w in warnings], notes


# --- the vocabulary ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "Pending",
        "Submitted [https://github.com/sgl-project/sglang/pull/26001]",
        "Submitted [sgl-project/sglang#26001]",
        "Backport [0.5.13]",
        "Backport [v0.5.13.post1]",
        "Backport [3f2c9ab]",
        "Backport [sgl-project/sglang#25655]",
        "Backport [0.5.13, sgl-project/sglang#25655]",
        "Denied",
        "Inappropriate [downstream packaging only]",
        "Inactive-Upstream",
        "Inactive-Upstream [lastcommit: 2024-01-01, lastrelease: 1.2]",
    ],
)
def test_allowed_upstream_status_values(env: Env, value: str) -> None:
    assert status_problem(value) is None
    _status(env, P1, value)
    assert run_lint(env)[0] == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("Maybe", "is not one of: Pending | Submitted [url] | Backport [commit or version] | "
                  "Denied | Inappropriate [reason] | Inactive-Upstream"),
        ("pending", "is not one of"),
        ("Accepted", "is not one of"),
        ("Submitted", "for Submitted write Submitted [url]"),
        ("Submitted []", "for Submitted write Submitted [url]"),
        ("Submitted [soon]", "Submitted [url] must say where it was submitted"),
        ("Backport", "for Backport write Backport [commit or version]"),
        ("Backport [someday]", "Backport [commit or version] must name where upstream has it"),
        ("Inappropriate", "for Inappropriate write Inappropriate [reason]"),
        ("Denied [no]", "for Denied write Denied, alone"),
        ("Pending [x]", "for Pending write Pending, alone"),
    ],
)  # fmt: skip
def test_bad_upstream_status_names_patch_line_and_forms(env: Env, value: str, says: str) -> None:
    line = _status(env, P2, value)
    (problem,) = run_lint(env)[0]
    assert problem.startswith(
        f"patches/{P2}:{line}: Upstream-Status {value!r}"
    ) or problem.startswith(f"{env.patches / P2}:{line}: Upstream-Status {value!r}")
    assert says in problem


def test_adapted_backport_lists_its_differences(env: Env) -> None:
    """'Backport [where, adapted]' needs a 'Differences from upstream' list; a list needs
    'adapted'; each problem names the patch and the status line."""
    path = env.patches / P1
    line = _status(env, P1, "Backport [sgl-project/sglang#25655, adapted]")
    (problem,) = run_lint(env)[0]
    assert f"{P1}:{line}: " in problem and "must list every difference" in problem, problem
    differences = "Differences from upstream (#25655):\n- validates its input\n\nHow verified:"
    _rewrite(path, "How verified:", differences)
    assert run_lint(env)[0] == []
    _rewrite(path, "Backport [sgl-project/sglang#25655, adapted]", "Backport [0.5.13]")
    (problem,) = run_lint(env)[0]
    assert "the status must say so: 'Backport [<where>, adapted]'" in problem, problem
    _rewrite(path, "- validates its input\n", "")  # a heading without items is no list
    _rewrite(path, "Backport [0.5.13]", "Backport [0.5.13, adapted]")
    (problem,) = run_lint(env)[0]
    assert "must list every difference" in problem, problem


def test_rebased_from_names_a_patch_file_and_a_patch_id(env: Env) -> None:
    assert rebased_from_problem(f"0004-marlin-utils-fp4.patch {PID}") is None
    path = env.patches / P1
    good = f"Rebased-From: 0004-marlin-utils-fp4.patch {PID}"
    _rewrite(path, "Upstream-Status: Pending\n", f"Upstream-Status: Pending\n{good}\n")
    assert run_lint(env)[0] == []
    for bad, says in [
        ("0004-marlin-utils-fp4.patch", "has 1 field(s), not 2"),
        (f"marlin-utils-fp4.patch {PID}", "does not look like a patch file name"),
        (f"../0004-x.patch {PID}", "does not look like a patch file name"),
        ("0004-marlin-utils-fp4.patch 3f2c9ab", "is not a stable patch-id (40 lower-case hex)"),
        (f"0004-marlin-utils-fp4.patch {PID.upper()}", "is not a stable patch-id"),
    ]:
        text = path.read_text()
        start = text.index("Rebased-From: ")
        end = text.index("\n", start)
        path.write_text(text[:start] + f"Rebased-From: {bad}" + text[end:])
        line = path.read_text().split("\n").index(f"Rebased-From: {bad}") + 1
        (problem,) = run_lint(env)[0]
        assert f"{P1}:{line}: Rebased-From: " in problem and says in problem, problem
        assert "<source patch file name> <stable patch-id>" in problem
    _rewrite(path, f"Rebased-From: {bad}", f"{good}\n{good}")
    (problem,) = run_lint(env)[0]
    assert "given more than once" in problem


def test_patch_identity_is_git_patch_id_stable(env: Env) -> None:
    ident = patch_identity(env.patches / P1)
    assert ident.name == P1 and len(ident.sha256) == 64 and len(ident.patch_id or "") == 40
    reworded = (env.patches / P1).read_text().replace("Because the test", "As the test")
    assert stable_patch_id(reworded) == ident.patch_id  # the message is not part of it


# --- the cross-check against the matrix -------------------------------------------------------


def write_matrix(env: Env, verdicts: dict[str, dict[str, str]], **extra: object) -> Path:
    releases = ["0.5.12", "0.5.13", "0.5.23"]
    data = {
        "pin": "0.5.11",
        "releases": releases,
        "patches": [P1, P2],
        "verdicts": verdicts,
        "details": {
            P1: {r: {"verdict": v, "evidence": f"evidence {P1} {r}"} for r, v in
                 verdicts.get(P1, {}).items()},
            P2: {r: {"verdict": v, "evidence": f"evidence {P2} {r}", "moved_verdict":
                     "partly-upstream"} for r, v in verdicts.get(P2, {}).items()},
        },
        "errors": {},
        **extra,
    }  # fmt: skip
    path = env.root / "reports" / "rebase-check.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


UPSTREAM_P1 = {
    P1: {"0.5.12": "conflict", "0.5.13": "upstream", "0.5.23": "upstream"},
    P2: {"0.5.12": "clean", "0.5.13": "clean", "0.5.23": "moved"},
}


def test_a_patch_judged_upstream_cannot_stay_pending(env: Env) -> None:
    write_matrix(env, UPSTREAM_P1)
    problems, warnings, notes = run_lint(env)
    line = (env.patches / P1).read_text().split("\n").index("Upstream-Status: Pending") + 1
    (problem,) = problems
    assert f"{P1}:{line}: Upstream-Status 'Pending' but the rebase check" in problem
    assert "reports/rebase-check.json" in problem
    assert f"judges it `upstream` on 0.5.23 (since 0.5.13) (evidence {P1} 0.5.23)" in problem
    assert "Backport [<commit, PR or release: 0.5.13>]" in problem and "or drop it" in problem
    # moved -> partly-upstream: a warning that it must be shrunk, not a problem
    (warning,) = warnings
    assert f"{P2}:" in warning and "partly upstream on 0.5.23" in warning
    assert "shrunk to what upstream still lacks" in warning
    assert not [n for n in notes if "cross-check" in n]


def test_partly_upstream_is_a_note_once_a_line_on_that_release_carries_it(env: Env) -> None:
    from fp4series.lint import cross_check
    from fp4series.patch import parse_patch

    data = json.loads(write_matrix(env, UPSTREAM_P1).read_text())
    patch = parse_patch(env.patches / P2)
    names = [P1, P2]
    alone = cross_check([patch], data, series_names=names, shown="m.json")
    carried = cross_check(
        [patch], data, series_names=names, shown="m.json", lines=frozenset({"0.5.23"})
    )
    assert len(alone.warnings) == 1 and not alone.problems
    assert not carried.warnings and not carried.problems
    (note,) = [n for n in carried.notes if "carries" in n]
    assert note.startswith("partly upstream on 0.5.23 per m.json: 0002;")
    assert "the 0.5.23 line (patches/0.5.23) carries what upstream still lacks" in note


@pytest.mark.parametrize("value", ["Submitted [sgl-project/sglang#26001]", "Denied"])
def test_only_backport_fits_an_upstream_verdict(env: Env, value: str) -> None:
    write_matrix(env, UPSTREAM_P1)
    _status(env, P1, value)
    (problem,) = run_lint(env)[0]
    assert f"Upstream-Status {value!r} but the rebase check" in problem


def test_backport_naming_where_it_landed_passes(env: Env) -> None:
    write_matrix(env, UPSTREAM_P1)
    _status(env, P1, "Backport [0.5.13]")
    problems, warnings, _ = run_lint(env)
    assert problems == [] and len(warnings) == 1


def test_newest_release_that_was_checked_decides(env: Env) -> None:
    verdicts = {
        P1: {"0.5.12": "upstream", "0.5.13": "upstream"},
        P2: {"0.5.12": "clean", "0.5.13": "clean"},
    }
    write_matrix(env, verdicts, errors={"0.5.23": "fetch/materialize failed: offline"})
    (problem,) = run_lint(env)[0]
    assert "`upstream` on 0.5.13 (since 0.5.12)" in problem


def test_matrix_made_for_another_series_is_skipped_with_a_note(env: Env) -> None:
    path = write_matrix(env, UPSTREAM_P1)
    data = json.loads(path.read_text())
    data["patches"] = [P1, "0002-something-else.patch"]
    path.write_text(json.dumps(data))
    problems, warnings, notes = run_lint(env)
    assert problems == [] and warnings == []
    (note,) = [n for n in notes if "cross-check" in n]
    assert "was made for another series" in note
    assert f"-0002-something-else.patch, +{P2}" in note
    data["patches"] = [P2, P1]
    path.write_text(json.dumps(data))
    assert "same patches, other order" in " ".join(run_lint(env)[2])


def test_a_patch_edited_since_the_matrix_is_skipped_with_a_note(env: Env) -> None:
    ids = {P1: stable_patch_id((env.patches / P1).read_text()), P2: "f" * 40}
    write_matrix(env, {**UPSTREAM_P1, P2: {"0.5.23": "upstream"}}, patch_ids=ids)
    problems, warnings, notes = run_lint(env)
    assert len(problems) == 1 and P1 in problems[0]  # P1 is the judged version: checked
    (note,) = [n for n in notes if "cross-check" in n]
    assert f"cross-check of {P2} skipped: edited since" in note and "f" * 40 in note


def test_default_matrix_absent_is_a_note_given_one_missing_an_error(env: Env) -> None:
    problems, _, notes = run_lint(env)
    assert problems == []
    assert any("cross-check skipped: no matrix at" in n for n in notes)
    with pytest.raises(SeriesError, match="does not exist"):
        run_lint(env, matrix=env.root / "nope.json")
    bad = env.root / "reports" / "rebase-check.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    (problem,) = run_lint(env)[0]
    assert "rebase-check.json" in problem and "not readable JSON" in problem
    assert run_lint(env, cross_check_matrix=False)[0] == []


def test_cli_matrix_options_and_warnings(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = write_matrix(env, UPSTREAM_P1).rename(env.root / "m.json")
    argv = ["lint", "--patches-dir", str(env.patches), "--root", str(env.root)]
    assert cli.main(argv) == 0  # default matrix absent: a note
    assert "cross-check skipped: no matrix" in capsys.readouterr().err
    assert cli.main([*argv, "--matrix", str(elsewhere)]) == 1
    out = capsys.readouterr()
    assert "judges it `upstream` on 0.5.23" in out.out
    assert f"warning: {env.patches / P2}" in out.err or f"warning: patches/{P2}" in out.err
    assert cli.main([*argv, "--matrix", str(elsewhere), "--no-matrix"]) == 0
    assert cli.main([*argv, "--matrix", str(env.root / "absent.json")]) != 0
