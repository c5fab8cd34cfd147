"""Exit-status policies, and the committed baseline a fresh matrix is compared with."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp4series.errors import SeriesError
from fp4series.judging.matrix import Matrix
from fp4series.judging.verdict import FAILS

POLICIES = ("newest", "any", "baseline", "report")


def regenerate_command(json_path: str, md_path: str) -> str:
    """The commands that rewrite and commit the baseline (printed when it is stale)."""
    return (
        f"bash scripts/rebase-check.sh --policy report --json {json_path} --md {md_path}"
        f" && git add {json_path} {md_path}"
        " && git commit -m 'Rebase check: regenerate the verdict matrix'"
    )


def load_baseline(path: Path, patches: Sequence[str], regen: str = "") -> dict[str, Any]:
    """The committed matrix, checked to be usable as a baseline for PATCHES (the series)."""
    hint = f"regenerate and commit it: {regen}" if regen else "regenerate it (--policy report)"
    if not path.is_file():
        raise SeriesError(f"baseline {path} does not exist", hint=hint)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SeriesError(f"baseline {path} is not readable JSON: {exc}", hint=hint) from exc
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("releases"), list)
        or not isinstance(data.get("patches"), list)
        or not isinstance(data.get("verdicts"), dict)
    ):
        raise SeriesError(f"baseline {path} lacks `releases`, `patches` or `verdicts`", hint=hint)
    if data["patches"] != list(patches):
        old, new = data["patches"], list(patches)
        diff = [f"-{x}" for x in old if x not in new] + [f"+{x}" for x in new if x not in old]
        what = ", ".join(diff) if diff else "same patches, other order"
        raise SeriesError(
            f"baseline {path} was made for another series than patches/series ({what})",
            hint=hint,
        )
    return data


def _baseline_cell(data: dict[str, Any], patch: str, release: str) -> str:
    if release not in data["releases"]:
        return "(release not in matrix)"
    v = data["verdicts"].get(patch, {}).get(release)
    if v is None:
        return "(not checked)"
    if v == "moved":
        moved = data.get("details", {}).get(patch, {}).get(release, {}).get("moved_verdict")
        return f"moved->{moved}" if moved else v
    return str(v)


def _fresh_cell(m: Matrix, patch: str, release: str) -> str:
    if release not in m.releases:
        return "(release not in matrix)"
    v = m.verdict(patch, release)
    if v is None:
        return "(not checked)"
    if v.verdict == "moved":
        return f"moved->{v.moved_verdict}" if v.moved_verdict else v.verdict
    return v.verdict


def baseline_changes(m: Matrix, data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(patch, release, old, new) for every cell where M differs from the baseline DATA."""
    releases = list(dict.fromkeys([*m.releases, *data["releases"]]))
    patches = list(dict.fromkeys([*m.patches, *data["patches"]]))
    out: list[tuple[str, str, str, str]] = []
    for p in patches:
        for r in releases:
            old, new = _baseline_cell(data, p, r), _fresh_cell(m, p, r)
            if old != new:
                out.append((p, r, old, new))
    return out


def apply_policy(
    m: Matrix, policy: str, baseline: dict[str, Any] | None = None
) -> tuple[int, list[str]]:
    """Exit status and the reasons, per the documented policy."""
    if policy not in POLICIES:
        raise SeriesError(f"unknown policy {policy!r}", hint=f"use one of: {', '.join(POLICIES)}")
    failures: list[str] = []
    if policy == "baseline":
        if baseline is None:
            raise SeriesError("policy baseline needs the committed matrix", hint="pass --baseline")
        failures = [f"{p} on {r}: {o} -> {n}" for p, r, o, n in baseline_changes(m, baseline)]
        return (1 if failures else 0), failures
    if policy == "report" or not m.releases:
        return 0, failures
    releases = m.releases if policy == "any" else m.releases[-1:]
    for rel in releases:
        if rel in m.errors or rel not in m.results:
            failures.append(f"{rel}: not checked ({m.errors.get(rel, 'no result')})")
            continue
        for p in m.patches:
            v = m.results[rel][p].verdict
            if v.effective in FAILS:
                what = v.verdict if v.verdict == v.effective else f"moved, then {v.effective}"
                failures.append(f"{p} on {rel}: {what}: {v.evidence}")
    return (1 if failures else 0), failures
