"""Patch linter (also the pre-commit hook): form, message sections, trailers, whitespace, series,
that every patch is whole (its end marker; its blob ids, replayed on the pin's files), and that
its Upstream-Status agrees with the latest rebase-check verdict.

Messages read `patches/0003-x.patch:12: what is wrong`, one per problem, exit 1 if any;
warnings (`warning: patches/...:12: ...`) and notes (what was skipped) go to stderr and do not
fail. The linter refuses whatever apply or split would refuse (series entries and Group: values
that are not plain names, patches that do not parse).

Upstream-Status (DEP-3 / Yocto vocabulary): `Pending`, `Submitted [url]` (a URL or
owner/repo#N), `Backport [commit or version]` (naming a commit id, a release, owner/repo#N or a
URL), `Denied`, `Inappropriate [reason]`, `Inactive-Upstream` (optionally with Yocto's
`[lastcommit: ..., lastrelease: ...]`). `Backport [where, adapted]` takes upstream's change with
differences, which the message lists as `- ` items under a paragraph starting `Differences from
upstream`; a plain Backport may not have that paragraph.
`Rebased-From: <source patch file name> <patch-id>`, where present (a line's patch made from a
patch of its source line), must name an NNNN-stem.patch file and a 40-hex `git patch-id --stable`.

Cross-check with the rebase check (``--matrix FILE``, default reports/rebase-check.json; absent:
skipped with a note; ``--no-matrix``): on the newest release the matrix checked, a patch whose
effective verdict (``moved`` counts as its re-judged verdict) is ``upstream`` must say
`Backport [...]` where it landed, or be dropped: anything else is a problem. ``partly-upstream``
is a warning (it must be shrunk on a line on that release), not a problem: the pin's line is
kept as it is for its users and legitimately carries patches upstream later took in part, so
a problem would fail every lint of the pin's series until it is abandoned. The cross-check is
skipped with a note when the matrix was made for another series (other patch names or order,
the rule of rebase-check's baseline policy; or, where the matrix stores them, a `patch_ids` /
`patch_sha256` entry that differs: that patch was edited since) or when a patch is not in it.

The blob check needs the pin's blobs: a git repo holding the lock's pin tag, by default
<root>/.work/upstream/<tag> (made by scripts/main.sh or scripts/fetch-upstream.sh). Without it
the check is skipped with a note on stderr (the pre-commit hook runs offline); `--blobs` makes a
missing pin an error, which is how CI runs it after scripts/main.sh.

Public API (stable):
    lint_patch(path, *, root, series_names=None) -> list[Problem]
    lint_series(patches_dir) -> list[Problem]
    lint_blobs(patches_dir, pin_repo, rev) -> (list[Problem], list[str] notes)
    lint_paths(paths, *, root, patches_dir, pin=None, require_pin=False, notes=None,
               matrix=None, cross_check_matrix=True, warnings=None) -> list[Problem]
        what the CLI runs; notes (a list) receives what was skipped, warnings (a list of
        Problem) what does not fail; MATRIX: the rebase-check JSON (default
        <root>/reports/rebase-check.json)
    cross_check(patches, matrix_data, *, series_names, shown) -> MatrixCheck
        (problems, warnings, notes); load_matrix(path) -> dict; matrix_release(data) -> str|None
        (the newest release checked); effective_verdict(data, patch, release) -> str|None
    status_problem(value) -> str|None; rebased_from_problem(value) -> str|None
    Problem(path, line, message); str(problem) is the one-line form above
    UPSTREAM_STATUS   regex of allowed Upstream-Status values; STATUS_FORMS their spelling
CLI: lint [FILES...] [--line VERSION] [--pin REPO] [--blobs] [--matrix FILE | --no-matrix]
     (no FILES: every patch of the line plus its series file; FILES from several lines are
     linted per line; an upstream.lock among FILES is validated too)
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4series import paths
from fp4series.errors import SeriesError
from fp4series.lock import load_lock
from fp4series.patch import END_MARKER, Patch, parse_patch
from fp4series.patchid import PATCH_ID, stable_patch_id
from fp4series.series import SERIES_FILE, load_series, read_series_names, series_problems

SUBJECT_MAX = 72
SECTIONS = ("Why:", "What:", "How verified:")
# DEP-3 / Yocto Upstream-Status vocabulary (docs.yoctoproject.org, "Patch Upstream Status").
_BRACKET = r"\[\S(?:[^\]]*\S)?\]"
UPSTREAM_STATUS = re.compile(
    rf"^(Pending|Submitted {_BRACKET}|Backport {_BRACKET}|Denied|Inappropriate {_BRACKET}"
    rf"|Inactive-Upstream(?: {_BRACKET})?)$"
)
STATUS_FORMS = (
    "Pending | Submitted [url] | Backport [commit or version] | Denied | "
    "Inappropriate [reason] | Inactive-Upstream"
)
# where a change was submitted or landed: a URL, owner/repo#N or #N, a commit, a version
_URL = re.compile(r"^https?://\S+$")
_REF = re.compile(r"^(?:[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)?#\d+$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_VERSION = re.compile(r"^v?\d+(?:\.\d+)+(?:(?:\.post|\.dev|rc|a|b)\d+)?$")
TEST_PREFIXES = ("gpu:", "bench:")
# the paragraph an adapted Backport lists its differences from upstream under
DIFFERENCES = "Differences from upstream"
WHITESPACE_CHECKED = (".py", ".pyi", ".h", ".cuh", ".cu", ".cc", ".cpp", ".c", ".hpp", ".toml")
_NAME = re.compile(r"^\d{4}-[a-z0-9][a-z0-9.-]*\.patch$")
_FROM_LINE = re.compile(r"^From [0-9a-f]{40} Mon Sep 17 00:00:00 2001$")


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.message}"
            if self.line
            else f"{self.path}: {self.message}"
        )


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _line_of(lines: list[str], prefix: str, start: int = 0) -> int:
    for i in range(start, len(lines)):
        if lines[i].startswith(prefix):
            return i + 1
    return 0


def _check_message(patch: Patch, lines: list[str], say: list[tuple[int, str]]) -> None:
    subj_line = _line_of(lines, "Subject:")
    if len(patch.subject) > SUBJECT_MAX:
        say.append((subj_line, f"subject is {len(patch.subject)} chars, at most {SUBJECT_MAX}"))
    if not re.sub(r"^(\[[^\]]+\]\s*)+", "", patch.subject).strip():
        say.append((subj_line, "subject has no summary after its [Area] prefix"))
    if patch.subject.endswith("."):
        say.append((subj_line, "subject ends with a period"))
    body_start = _line_of(lines, "", 1)
    message_lines = patch.message.splitlines()
    for section in SECTIONS:
        idx = next((i for i, ln in enumerate(message_lines) if ln.strip() == section), None)
        if idx is None:
            say.append((body_start, f"body has no '{section}' section (a line of its own)"))
            continue
        rest = message_lines[idx + 1 :]
        content = []
        for ln in rest:
            if ln.strip() in SECTIONS or not ln.strip():
                break
            content.append(ln)
        if not content:
            say.append((body_start + idx + 1, f"'{section}' section is empty"))


def _bracket(value: str) -> str:
    return value[value.index("[") + 1 : -1].strip()


def status_problem(status: str) -> str | None:
    """Why STATUS is not an Upstream-Status of the DEP-3/Yocto vocabulary, or None."""
    value = status.strip()
    if not UPSTREAM_STATUS.match(value):
        keyword = value.split(" ", 1)[0].split("[", 1)[0]
        need = {
            "Submitted": "Submitted [url] (where it was submitted: a PR URL or owner/repo#N)",
            "Backport": "Backport [commit or version] (where upstream has it)",
            "Inappropriate": "Inappropriate [reason] (why it is not for upstream)",
            "Pending": "Pending, alone",
            "Denied": "Denied, alone (say why in the message)",
            "Inactive-Upstream": "Inactive-Upstream (or with [lastcommit: ..., lastrelease: ...])",
        }.get(keyword)
        form = f"; for {keyword} write {need}" if need else ""
        return f"Upstream-Status {status!r} is not one of: {STATUS_FORMS}{form}"
    if value.startswith("Submitted"):
        where = _bracket(value)
        if not (_URL.match(where) or _REF.match(where)):
            return (
                f"Upstream-Status {status!r}: Submitted [url] must say where it was submitted "
                "(a URL, or owner/repo#N for a pull request)"
            )
    if value.startswith("Backport"):
        tokens = [t for t in re.split(r"[,\s]+", _bracket(value)) if t]
        if not any(_URL.match(t) or _REF.match(t) or _COMMIT.match(t) or _VERSION.match(t)
                   for t in tokens):  # fmt: skip
            return (
                f"Upstream-Status {status!r}: Backport [commit or version] must name where "
                "upstream has it (a commit id, a release such as 0.5.13, owner/repo#N or a URL)"
            )
    return None


def adapted_problem(status: str, lines: list[str]) -> str | None:
    """Why a Backport's 'adapted' marker and its differences section disagree, or None.

    ``Backport [where, adapted]`` says the patch takes upstream's change with differences;
    the message must then list them under a paragraph starting ``Differences from
    upstream`` with at least one ``- `` item. A plain Backport may not carry such a list:
    a patch that differs from upstream must say so in its status.
    """
    if not status.strip().startswith("Backport"):
        return None
    adapted = "adapted" in [t for t in re.split(r"[,\s]+", _bracket(status.strip())) if t]
    end = _line_of(lines, "diff --git ") or len(lines)
    head = lines[:end]
    start = next((i for i, ln in enumerate(head) if ln.startswith(DIFFERENCES)), None)
    items = 0
    if start is not None:
        for ln in head[start + 1 :]:
            if not ln.strip():
                break
            items += ln.startswith("- ")
    if adapted and not items:
        return (
            f"Upstream-Status {status.strip()!r}: an adapted Backport must list every difference "
            f"from upstream in the message, as '- ' items under a paragraph starting "
            f"'{DIFFERENCES}'"
        )
    if not adapted and start is not None:
        return (
            f"Upstream-Status {status.strip()!r}: the message lists differences from upstream "
            f"(line {start + 1}), so the status must say so: 'Backport [<where>, adapted]'"
        )
    return None


def rebased_from_problem(value: str) -> str | None:
    """Why a Rebased-From: value is not '<source patch file name> <stable patch-id>'."""
    words = value.split()
    form = (
        "it must be 'Rebased-From: <source patch file name> <stable patch-id>', e.g. "
        "'Rebased-From: 0004-marlin-utils-fp4.patch <40 hex of git patch-id --stable>'"
    )
    if "," in value:
        return f"Rebased-From: given more than once ({value!r}); a patch has one source: {form}"
    if len(words) != 2:
        return f"Rebased-From: {value!r} has {len(words)} field(s), not 2: {form}"
    name, pid = words
    if not _NAME.match(name):
        return (
            f"Rebased-From: {name!r} does not look like a patch file name (NNNN-stem.patch): {form}"
        )
    if not PATCH_ID.match(pid):
        return f"Rebased-From: {pid!r} is not a stable patch-id (40 lower-case hex): {form}"
    return None


def _check_trailers(
    patch: Patch, lines: list[str], root: Path, names: list[str] | None, say: list[tuple[int, str]]
) -> None:
    end = _line_of(lines, "diff --git ") or len(lines)
    status = patch.upstream_status
    status_line = _line_of(lines, "Upstream-Status:")
    if status is None:
        say.append((end, "no 'Upstream-Status:' trailer in the last paragraph of the message"))
    else:
        bad = status_problem(status) or adapted_problem(status, lines)
        if bad:
            say.append((status_line, bad))
    tests_line = _line_of(lines, "Tests:")
    if not patch.tests():
        say.append((tests_line or end, "no 'Tests:' trailer naming the tests that prove the patch"))
    for test in patch.tests():
        target = test
        for prefix in TEST_PREFIXES:
            if target.startswith(prefix):
                target = target[len(prefix) :]
        file_part = target.split("::", 1)[0]
        if file_part.startswith("/") or ".." in file_part.split("/"):
            say.append(
                (tests_line, f"Tests: {test} must be a path inside the project (relative, no '..')")
            )
        elif not file_part or not (root / file_part).exists():
            say.append(
                (tests_line, f"Tests: {test} does not exist (looked for {root / file_part})")
            )
    group = patch.trailers.get("Group")
    if group is not None:
        bad = paths.name_problem(group.strip()) or paths.ref_name_problem(group.strip())
        if bad:
            say.append(
                (
                    _line_of(lines, "Group:"),
                    f"Group: {group!r} is not a plain name ({bad}); it names a branch and a "
                    "directory of scripts/split.sh",
                )
            )
    rebased = patch.trailers.get("Rebased-From")
    if rebased is not None:
        bad = rebased_from_problem(rebased)
        if bad:
            say.append((_line_of(lines, "Rebased-From:"), bad))
    if names is not None:
        dep_line = _line_of(lines, "Depends-On:")
        earlier = names[: names.index(patch.name)] if patch.name in names else names
        for dep in patch.depends_on:
            if dep not in earlier:
                say.append((dep_line, f"Depends-On: {dep} is not an earlier patch in the series"))


def _check_whitespace(patch: Patch, say: list[tuple[int, str]]) -> None:
    for hunk in patch.hunks:
        if not hunk.file.endswith(WHITESPACE_CHECKED):
            continue
        for i, line in enumerate(hunk.lines):
            if line.startswith("+") and line[1:] != line[1:].rstrip(" \t"):
                say.append((hunk.line_no + 1 + i, f"trailing whitespace added in {hunk.file}"))


def lint_patch(path: Path, *, root: Path, series_names: list[str] | None = None) -> list[Problem]:
    shown = _display(path)
    if not _NAME.match(path.name):
        name_problem = [Problem(shown, 0, "file name must look like NNNN-lower-case-stem.patch")]
    else:
        name_problem = []
    try:
        patch = parse_patch(path)
    except SeriesError as exc:
        text = str(exc)
        m = re.match(rf"^{re.escape(str(path))}(?::(\d+))?: (.*)$", text, re.S)
        line, msg = (int(m.group(1) or 0), m.group(2)) if m else (0, text)
        return [*name_problem, Problem(shown, line, msg)]
    lines = patch.text.split("\n")
    say: list[tuple[int, str]] = []
    if not _FROM_LINE.match(lines[0]):
        say.append(
            (1, "first line is not 'From <40 zeros> Mon Sep 17 ...' (export with --zero-commit)")
        )
    if not re.search(r"^Subject: \[PATCH\] ", patch.text, re.M):
        say.append((_line_of(lines, "Subject:"), "subject must start with '[PATCH] '"))
    _check_message(patch, lines, say)
    _check_trailers(patch, lines, root, series_names, say)
    _check_whitespace(patch, say)
    if patch.signature != END_MARKER:
        last = patch.hunks[-1] if patch.hunks else None
        after = f" after hunk {last.header!r} of {last.file} (line {last.line_no})" if last else ""
        say.append(
            (
                len(patch.text.rstrip("\n").split("\n")),
                f"the patch ends{after} without its end marker ('-- ' then {END_MARKER!r}): it "
                "was cut short there, or not written by scripts/export.sh",
            )
        )
    # a number other than the position is a series problem (series_problems), as for apply
    return name_problem + [Problem(shown, ln, msg) for ln, msg in say]


def lint_series(patches_dir: Path) -> list[Problem]:
    shown = _display(patches_dir / SERIES_FILE)
    return [Problem(shown, line, msg) for line, msg in series_problems(patches_dir)]


def lint_blobs(patches_dir: Path, pin_repo: Path, rev: str) -> tuple[list[Problem], list[str]]:
    """Replay the series on the pin's blobs (blobs.check_series_blobs): every post-image id must
    come out of its hunks, every pre-image must be what the pin plus earlier patches hold."""
    from git import GitCommandError, InvalidGitRepositoryError, NoSuchPathError, Repo

    from fp4series.blobs import check_series_blobs

    try:
        patches = load_series(patches_dir)
    except SeriesError:
        return [], ["blob check skipped: the series does not load (see the problems above)"]
    try:
        repo = Repo(pin_repo)
        repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}")
    except (InvalidGitRepositoryError, NoSuchPathError, GitCommandError):
        raise SeriesError(
            f"{pin_repo} is not a git repo holding the pin {rev}, so the blob check cannot run",
            hint="pass --pin with a checkout that has the pin's tag, or materialize it: "
            f"scripts/fetch-upstream.sh {pin_repo}",
        ) from None
    result = check_series_blobs(patches, repo, rev)
    by_name = {patch.name: patch.path for patch in patches}
    problems = [Problem(_display(by_name[b.patch]), b.line, b.message) for b in result.problems]
    notes = [f"blob check: {why}" for why in result.skipped]
    return problems, notes


# ---------------------------------------------------------------------------------------------
# headers against the rebase-check matrix

DEFAULT_MATRIX = Path("reports") / "rebase-check.json"
_EVIDENCE_MAX = 200


def load_matrix(path: Path) -> dict[str, Any]:
    """The rebase-check JSON at PATH with its shape checked (``releases``, ``patches``,
    ``verdicts``; see rebase/matrix.py); SeriesError when it is missing or unusable."""
    hint = (
        "regenerate it: scripts/rebase-check.sh --policy report --json reports/rebase-check.json "
        "--md reports/rebase-check.md (or lint with --no-matrix)"
    )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SeriesError(f"rebase-check matrix {path} does not exist", hint=hint) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SeriesError(
            f"rebase-check matrix {path} is not readable JSON: {exc}", hint=hint
        ) from exc
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("releases"), list)
        or not isinstance(data.get("patches"), list)
        or not isinstance(data.get("verdicts"), dict)
    ):
        raise SeriesError(
            f"rebase-check matrix {path} lacks `releases`, `patches` or `verdicts`", hint=hint
        )
    return data


def matrix_release(data: dict[str, Any]) -> str | None:
    """The newest release of the matrix that was checked (one that failed to fetch or judge, in
    ``errors`` or without any verdict, is passed over), or None."""
    errors = data.get("errors") or {}
    for rel in reversed(data["releases"]):
        if rel in errors:
            continue
        if any(isinstance(v, dict) and rel in v for v in data["verdicts"].values()):
            return str(rel)
    return None


def effective_verdict(data: dict[str, Any], patch: str, release: str) -> str | None:
    """The verdict of PATCH on RELEASE, a ``moved`` one replaced by its re-judged verdict."""
    verdict = (data["verdicts"].get(patch) or {}).get(release)
    if verdict == "moved":
        detail = ((data.get("details") or {}).get(patch) or {}).get(release) or {}
        return detail.get("moved_verdict") or verdict
    return verdict


def _evidence(data: dict[str, Any], patch: str, release: str) -> str:
    detail = ((data.get("details") or {}).get(patch) or {}).get(release) or {}
    text = " ".join(str(detail.get("evidence", "")).split())
    return text if len(text) <= _EVIDENCE_MAX else text[: _EVIDENCE_MAX - 3] + "..."


def _upstream_since(data: dict[str, Any], patch: str, release: str) -> str:
    """The first release of the run of ``upstream`` verdicts that ends at RELEASE."""
    rels = [r for r in data["releases"] if r in (data["verdicts"].get(patch) or {})]
    since = release
    for rel in reversed(rels[: rels.index(release) + 1] if release in rels else []):
        if effective_verdict(data, patch, rel) != "upstream":
            break
        since = rel
    return since


def matrix_mismatch(data: dict[str, Any], series_names: list[str]) -> str | None:
    """Why DATA was made for another series than SERIES_NAMES (the rule of
    rebase.policy.load_baseline: the same patch names in the same order), or None."""
    old, new = [str(x) for x in data["patches"]], list(series_names)
    if old == new:
        return None
    diff = [f"-{x}" for x in old if x not in new] + [f"+{x}" for x in new if x not in old]
    return ", ".join(diff) if diff else "same patches, other order"


def _stored_identity_mismatch(data: dict[str, Any], patch: Patch) -> str | None:
    """Why PATCH differs from the version the matrix judged, when the matrix stores ids
    (``patch_ids``: stable patch-id per name, ``patch_sha256``: sha256 per name)."""
    ids = data.get("patch_ids")
    if isinstance(ids, dict) and isinstance(ids.get(patch.name), str):
        now = stable_patch_id(patch.text)
        if now != ids[patch.name]:
            return f"its patch-id is {now}, the matrix judged {ids[patch.name]}"
    sums = data.get("patch_sha256")
    if isinstance(sums, dict) and isinstance(sums.get(patch.name), str):
        now = hashlib.sha256(patch.path.read_bytes()).hexdigest()
        if now != sums[patch.name]:
            return f"its sha256 is {now[:12]}..., the matrix judged {sums[patch.name][:12]}..."
    return None


@dataclass
class MatrixCheck:
    """What the cross-check found: PROBLEMS fail the lint, WARNINGS do not, NOTES say what was
    not checked."""

    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def cross_check(
    patches: list[Patch],
    data: dict[str, Any],
    *,
    series_names: list[str],
    shown: str,
    lines: frozenset[str] = frozenset(),
) -> MatrixCheck:
    """Each patch's Upstream-Status against its effective verdict on the newest release the
    matrix DATA (shown as SHOWN) checked:

    - ``upstream``: the status must be ``Backport [...]`` naming where it landed, or the patch
      is dropped; anything else (Pending, Submitted, ...) is a problem;
    - ``partly-upstream``: a warning: upstream has part of it, so a line on that release must
      carry only the remainder (the pin's own line cannot shrink, which is why it is no problem);
      a note instead when LINES (the versions of the maintained lines) has that release: the
      line made by the rebase carries it shrunk or dropped;
    - skipped with a note: the matrix was made for another series (other patch names or order,
      as rebase-check's baseline policy decides; or a stored patch-id / sha256 that differs:
      that patch was edited since), the patch is not in it, or no release was checked.
    """
    out = MatrixCheck()
    other = matrix_mismatch(data, series_names)
    if other is not None:
        out.notes.append(
            f"Upstream-Status cross-check skipped: {shown} was made for another series ({other})"
        )
        return out
    release = matrix_release(data)
    if release is None:
        out.notes.append(f"Upstream-Status cross-check skipped: {shown} checked no release")
        return out
    carried: list[str] = []
    for patch in patches:
        where = _display(patch.path)
        if patch.name not in data["patches"]:
            out.notes.append(f"Upstream-Status cross-check of {patch.name} skipped: not in {shown}")
            continue
        changed = _stored_identity_mismatch(data, patch)
        if changed:
            out.notes.append(
                f"Upstream-Status cross-check of {patch.name} skipped: edited since {shown} "
                f"was made ({changed}); regenerate the matrix"
            )
            continue
        verdict = effective_verdict(data, patch.name, release)
        if verdict is None:
            out.notes.append(
                f"Upstream-Status cross-check of {patch.name} skipped: no verdict on {release} "
                f"in {shown}"
            )
            continue
        status = (patch.upstream_status or "").strip()
        line = _line_of(patch.text.split("\n"), "Upstream-Status:")
        evidence = _evidence(data, patch.name, release)
        because = f" ({evidence})" if evidence else ""
        if verdict == "upstream" and not status.startswith("Backport"):
            since = _upstream_since(data, patch.name, release)
            out.problems.append(
                Problem(
                    where,
                    line,
                    f"Upstream-Status {status or '(none)'!r} but the rebase check ({shown}) "
                    f"judges it `upstream` on {release} (since {since}){because}: a patch "
                    "upstream has cannot stay Pending/Submitted; write 'Upstream-Status: "
                    f"Backport [<commit, PR or release: {since}>]' naming where it landed, or "
                    "drop it from the series",
                )
            )
        elif verdict == "partly-upstream" and release in lines:
            carried.append(patch.name.split("-", 1)[0])
        elif verdict == "partly-upstream":
            out.warnings.append(
                Problem(
                    where,
                    line,
                    f"partly upstream on {release} per {shown}{because}: a line on {release} "
                    "or later must carry it shrunk to what upstream still lacks",
                )
            )
    if carried:
        out.notes.append(
            f"partly upstream on {release} per {shown}: {', '.join(carried)}; the {release} line "
            f"(patches/{release}) carries what upstream still lacks"
        )
    return out


def _pin_location(root: Path, pin: Path | None, line: str | None) -> tuple[Path, str] | None:
    """(repo, tag) of the release LINE applies to (None: the pin's line), to check blobs
    against; None when the lock cannot say."""
    from fp4series.line import resolve_line

    try:
        found = resolve_line(line, root=root)
    except SeriesError:
        return None
    return (pin or found.upstream_dir), found.tag


def _cross_check_paths(
    targets: list[Path], names: list[str], root: Path, matrix: Path | None, notes: list[str]
) -> MatrixCheck:
    path = matrix if matrix is not None else root / DEFAULT_MATRIX
    shown = _display(path)
    if matrix is None and not path.exists():
        return MatrixCheck(notes=[f"Upstream-Status cross-check skipped: no matrix at {shown}"])
    try:
        data = load_matrix(path)
    except SeriesError as exc:
        if matrix is not None:
            raise
        return MatrixCheck(problems=[Problem(shown, 0, str(exc))])
    patches: list[Patch] = []
    for target in targets:
        try:
            patches.append(parse_patch(target))
        except SeriesError:
            continue  # lint_patch reported it
    try:
        lines = frozenset(ln.version for ln in load_lock(root / "upstream.lock").lines)
    except SeriesError:
        lines = frozenset()
    return cross_check(patches, data, series_names=names, shown=shown, lines=lines)


def lint_paths(
    files: list[Path],
    *,
    root: Path,
    patches_dir: Path,
    pin: Path | None = None,
    require_pin: bool = False,
    notes: list[str] | None = None,
    line: str | None = None,
    matrix: Path | None = None,
    cross_check_matrix: bool = True,
    warnings: list[Problem] | None = None,
) -> list[Problem]:
    """Lint the given patch files (all of PATCHES_DIR when none), its series consistency and,
    where the base release's blobs are at hand (PIN, else the materialized release of LINE:
    <root>/.work/upstream/<tag> for the pin's line), the blob ids.
    What was not checked is appended to NOTES; REQUIRE_PIN makes a missing pin an error.

    The patches' Upstream-Status is cross-checked against the rebase-check MATRIX (default
    <root>/reports/rebase-check.json, skipped with a note when absent; a MATRIX given that
    cannot be read is a SeriesError); CROSS_CHECK_MATRIX=False skips it. Findings that do not
    fail the lint (partly-upstream) are appended to WARNINGS."""
    targets = [f for f in files if f.suffix == ".patch"]
    if not files:
        targets = sorted(patches_dir.glob("*.patch"))
    problems = lint_series(patches_dir)
    for lock_file in [f for f in files if f.name == "upstream.lock"]:
        try:
            load_lock(lock_file)
        except SeriesError as exc:
            problems.append(Problem(_display(lock_file), 0, str(exc).split(": ", 1)[-1]))
    names = read_series_names(patches_dir)
    for path in targets:
        problems += lint_patch(path, root=root, series_names=names)
    notes = notes if notes is not None else []
    warnings = warnings if warnings is not None else []
    if cross_check_matrix and targets:
        found = _cross_check_paths(targets, names, root, matrix, notes)
        problems += found.problems
        warnings += found.warnings
        notes += found.notes
    where = _pin_location(root, pin, line)
    if where is None and require_pin:
        raise SeriesError(
            f"{root / 'upstream.lock'} does not name a pin, so the blob check cannot run",
            hint="fix upstream.lock (scripts/lint-patches.sh upstream.lock says what is wrong)",
        )
    if where is None:
        lock_file = root / "upstream.lock"
        checked = {f.resolve() for f in files if f.name == "upstream.lock"}
        try:
            load_lock(lock_file)
            why = "it names no release for this line"
        except SeriesError as exc:  # apply and split refuse such a lock: so does the linter
            why = str(exc).split(": ", 1)[-1]
            if lock_file.resolve() not in checked and lock_file.exists():
                problems.append(Problem(_display(lock_file), 0, why))
        notes.append(f"blob check skipped: {lock_file} cannot say where the pin is ({why})")
    elif not (where[0] / ".git").exists() and not require_pin and pin is None:
        version = f" --version {line}" if line else ""
        notes.append(
            f"blob check skipped: {where[1]} is not materialized at {where[0]}; run "
            f"scripts/fetch-upstream.sh {where[0]}{version} (or scripts/main.sh), or pass --pin "
            f"with a checkout that has tag {where[1]}"
        )
    else:
        found, skipped = lint_blobs(patches_dir, where[0], where[1])
        problems += found
        notes += skipped
    return problems


def line_matrix(line: str | None, root: Path, notes: list[str]) -> tuple[Path | None, bool]:
    """(matrix, cross-check?) for LINE: a maintained line is checked against its own
    rebase-check matrix (against newer releases), skipped with a note while it has none."""
    from fp4series.line import resolve_line

    if line is None:
        return None, True
    try:
        matrix = resolve_line(line, root=root).rebase_matrix
    except SeriesError as exc:  # patches/<V>/ of a line the lock does not list (yet)
        notes.append(f"Upstream-Status cross-check skipped for patches/{line}: {exc}")
        return None, False
    if matrix.is_file():
        return matrix, True
    notes.append(
        f"Upstream-Status cross-check skipped for the {line} line: no matrix at "
        f"{_display(matrix)} (no newer release judged yet)"
    )
    return None, False
