"""Every check of the patch linter, one at a time: a fixture that passes it and one, as close
to it as can be, that fails it with the check's own words (as Yocto's patchtest does).

Each row edits the synthetic series (_fakepin: two exported patches): PASS is an edit the check
accepts (often the boundary: 72 characters, a known Upstream-Status form), FAIL one it refuses.
The passing fixture must lint clean as a whole; the failing one must say MESSAGE, and nothing
else but what the same fault means to the checks ALSO names (a line listed twice is also out
of its place). The two checks that need more than the series have their own modules, with
passing and failing fixtures too: blob ids replayed on the pin (test_blobs.py) and the
Upstream-Status cross-check against the rebase-check matrix (test_lint_status.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from _fakepin import P1, P2, Env

from fp4series.lint import lint_paths
from fp4series.series import SERIES_FILE

Edit = Callable[[Env], None]


def text_edit(name: str, change: Callable[[str], str]) -> Edit:
    """An edit of file NAME of the series directory, by CHANGE of its text."""

    def edit(env: Env) -> None:
        path = env.patches / name
        path.write_text(change(path.read_text()) if path.exists() else change(""))

    return edit


def rewrite(name: str, old: str, new: str) -> Edit:
    """Patch NAME with OLD (which must be there) replaced by NEW, once."""

    def change(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return text_edit(name, change)


def regex(name: str, pattern: str, new: str) -> Edit:
    def change(text: str) -> str:
        text, n = re.subn(pattern, new, text, count=1, flags=re.M)
        assert n == 1, pattern
        return text

    return text_edit(name, change)


def series(text: str) -> Edit:
    return text_edit(SERIES_FILE, lambda _old: text)


def both(*edits: Edit) -> Edit:
    def edit(env: Env) -> None:
        for one in edits:
            one(env)

    return edit


def nothing(env: Env) -> None:
    """The series as exported: passes every check."""


SUBJECT = "[Quant] Return two and add new module"
STATUS = "Upstream-Status: Pending"
TESTS = "Tests: tests/test_fake.py::test_one"
DEPENDS = "Depends-On: 0001-change-value-ten.patch"
PID = "a" * 40


@dataclass(frozen=True)
class Check:
    name: str
    passing: Edit
    failing: Edit
    message: str
    also: tuple[str, ...] = ()


CHECKS = [
    Check(
        "from-line",
        nothing,
        regex(P2, r" Mon Sep 17 00:00:00 2001$", " Tue Dec 2 10:00:00 2026"),
        "first line is not 'From <40 zeros> Mon Sep 17 ...'",
    ),
    Check(
        "subject-patch-prefix",
        nothing,
        rewrite(P2, f"Subject: [PATCH] {SUBJECT}", f"Subject: {SUBJECT}"),
        "subject must start with '[PATCH] '",
    ),
    Check(
        "subject-length",
        rewrite(P2, SUBJECT, "[Quant] " + "x" * 64),  # 72 characters
        rewrite(P2, SUBJECT, "[Quant] " + "x" * 65),
        "subject is 73 chars, at most 72",
    ),
    Check(
        "subject-summary",
        rewrite(P2, SUBJECT, "[Quant] Two"),
        rewrite(P2, SUBJECT, "[Quant]"),
        "subject has no summary after its [Area] prefix",
    ),
    Check(
        "subject-period",
        rewrite(P2, SUBJECT, "[Quant] Return 2.0 and add a module"),
        rewrite(P2, SUBJECT, SUBJECT + "."),
        "subject ends with a period",
    ),
    *(
        Check(
            f"section-{section.rstrip(':').lower().replace(' ', '-')}",
            nothing,
            rewrite(P2, f"\n{section}\n", f"\n{section.rstrip(':')}\n"),
            f"body has no '{section}' section (a line of its own)",
        )
        for section in ("Why:", "What:", "How verified:")
    ),
    Check(
        "section-empty",
        rewrite(P2, "Why:\nBecause the test needs a reason.\n", "Why:\nA reason.\n"),
        rewrite(P2, "Why:\nBecause the test needs a reason.\n", "Why:\n\n"),
        "'Why:' section is empty",
    ),
    Check(
        "upstream-status-present",
        nothing,
        rewrite(P2, f"{STATUS}\n", ""),
        "no 'Upstream-Status:' trailer in the last paragraph of the message",
    ),
    Check(
        "upstream-status-form",
        rewrite(P2, STATUS, "Upstream-Status: Submitted [sgl-project/sglang#1234]"),
        rewrite(P2, STATUS, "Upstream-Status: Submitted"),
        "Upstream-Status 'Submitted' is not one of",
    ),
    Check(
        "upstream-status-backport-names-where",
        rewrite(P2, STATUS, "Upstream-Status: Backport [0.5.13]"),
        rewrite(P2, STATUS, "Upstream-Status: Backport [soon]"),
        "Backport [commit or version] must name where upstream has it",
    ),
    Check(
        "backport-adapted-lists-differences",
        both(
            rewrite(P2, STATUS, "Upstream-Status: Backport [0.5.13, adapted]"),
            rewrite(
                P2,
                "\nUpstream-Status:",
                "\nDifferences from upstream:\n- pads N\n\nUpstream-Status:",
            ),
        ),
        rewrite(P2, STATUS, "Upstream-Status: Backport [0.5.13, adapted]"),
        "an adapted Backport must list every difference from upstream",
    ),
    Check(
        "tests-present",
        nothing,
        rewrite(P2, f"{TESTS}\n", ""),
        "no 'Tests:' trailer naming the tests that prove the patch",
    ),
    Check(
        "tests-exist",
        rewrite(P2, TESTS, f"{TESTS}, gpu:tests/test_fake.py"),
        rewrite(P2, TESTS, "Tests: tests/test_missing.py"),
        "Tests: tests/test_missing.py does not exist",
    ),
    Check(
        "tests-inside-the-project",
        nothing,
        rewrite(P2, TESTS, "Tests: ../outside/test_x.py"),
        "must be a path inside the project (relative, no '..')",
    ),
    Check(
        "group-plain-name",
        rewrite(P2, DEPENDS, f"{DEPENDS}\nGroup: fp4-marlin"),
        rewrite(P2, DEPENDS, f"{DEPENDS}\nGroup: foo.lock"),
        "Group: 'foo.lock' is not a plain name",
    ),
    Check(
        "rebased-from-form",
        rewrite(P2, DEPENDS, f"{DEPENDS}\nRebased-From: 0004-marlin-utils-fp4.patch {PID}"),
        rewrite(P2, DEPENDS, f"{DEPENDS}\nRebased-From: 0004-marlin-utils-fp4.patch"),
        "Rebased-From: '0004-marlin-utils-fp4.patch' has 1 field(s), not 2",
    ),
    Check(
        "depends-on-earlier",
        nothing,
        rewrite(P2, DEPENDS, "Depends-On: 0003-later.patch"),
        "Depends-On: 0003-later.patch is not an earlier patch in the series",
    ),
    Check(
        "trailing-whitespace",
        rewrite(P2, " value_27 = 27\n", " value_27 = 27 \n"),  # context: not the patch's own
        rewrite(P2, "+    return 2\n", "+    return 2 \n"),
        "trailing whitespace added in python/sglang/srt/b.py",
    ),
    Check(
        "end-marker",
        nothing,
        regex(P2, r"^-- \n.*\n", "-- \n2.39.5\n"),
        "without its end marker ('-- ' then 'fp4series')",
    ),
    Check(
        "series-listed",
        nothing,
        series(f"{P1}\n"),
        f"{P2} exists but is not listed in series",
    ),
    Check(
        "series-once",
        series(f"# the series\n{P1}\n\n{P2}\n"),
        series(f"{P1}\n{P2}\n{P1}\n"),
        f"{P1} is listed twice",
        also=(f"{P1}: number 0001 but position 3",),
    ),
    Check(
        "series-order",
        nothing,
        series(f"{P2}\n{P1}\n"),
        f"{P2}: number 0002 but position 1 in series",
        also=(f"{P1}: number 0001 but position 2", f"Depends-On: {P1} is not an earlier patch"),
    ),
    Check(
        "series-plain-names",
        nothing,
        series(f"{P1}\n../patches/{P2}\n"),
        "is not a plain file name",
        also=(f"{P2} exists but is not listed in series",),
    ),
]


def lint(env: Env) -> list[str]:
    return [str(p) for p in lint_paths([], root=env.root, patches_dir=env.patches)]


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_the_passing_fixture_lints_clean(env: Env, check: Check) -> None:
    check.passing(env)
    assert lint(env) == []


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_the_failing_fixture_says_what_is_wrong_and_nothing_else(env: Env, check: Check) -> None:
    check.failing(env)
    problems = lint(env)
    said = [p for p in problems if check.message in p]
    assert said, "\n".join(problems)
    others = [p for p in problems if not any(m in p for m in (check.message, *check.also))]
    assert not others, "\n".join(others)
    assert all(any(m in p for p in problems) for m in check.also), "\n".join(problems)


def test_every_check_of_the_linter_has_a_row() -> None:
    """A new say.append(...) in lint.py needs its row here (by its words)."""
    source = (Path(__file__).resolve().parents[2] / "src/fp4series/lint.py").read_text()
    checks = len(re.findall(r"say\.append\(", source))
    per_patch = [c for c in CHECKS if not c.name.startswith(("series-", "section-"))]
    sections = [c for c in CHECKS if c.name.startswith("section-")]
    assert checks <= len(per_patch) + len(sections), (checks, len(CHECKS))
