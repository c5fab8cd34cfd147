"""The matrix: every patch judged against every materialized release."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fp4series import gitops
from fp4series.errors import SeriesError
from fp4series.judging.repo import JudgeRepo
from fp4series.judging.stack import check_tree
from fp4series.judging.verdict import PatchResult, Verdict
from fp4series.overlap import derived_dependencies
from fp4series.patch import Patch
from fp4series.upstream import Target


@dataclass
class Matrix:
    releases: list[str]
    patches: list[str]
    results: dict[str, dict[str, PatchResult]]  # release -> patch -> result
    errors: dict[str, str]
    timings: dict[str, float]
    pin: str

    def verdict(self, patch: str, release: str) -> Verdict | None:
        r = self.results.get(release, {}).get(patch)
        return r.verdict if r else None

    def to_json(self, policy: str, exit_status: int, failures: list[str]) -> dict[str, Any]:
        return {
            "pin": self.pin,
            "releases": self.releases,
            "patches": self.patches,
            "verdicts": {
                p: {
                    r: self.results[r][p].verdict.verdict
                    for r in self.releases
                    if r in self.results
                }
                for p in self.patches
            },
            "details": {
                p: {r: self.results[r][p].as_dict() for r in self.releases if r in self.results}
                for p in self.patches
            },
            "errors": self.errors,
            "timings_s": {k: round(v, 2) for k, v in self.timings.items()},
            "policy": {"name": policy, "exit_status": exit_status, "failures": failures},
        }


def run_matrix(
    repo: JudgeRepo,
    docs: Sequence[Patch],
    pin: Target,
    targets: Sequence[Target | tuple[str, str]],
    *,
    log: Callable[[str], None] | None = None,
) -> Matrix:
    """Judge every patch against every target; a target given as (version, error) is skipped."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    repo.borrow(pin.repo)
    pin_tree = repo.tree(_resolve(pin))
    deps = derived_dependencies(docs)
    m = Matrix([], [d.name for d in docs], {}, {}, {}, pin.version)
    for i, t in enumerate(targets, 1):
        version = t.version if isinstance(t, Target) else t[0]
        m.releases.append(version)
        start = time.monotonic()
        if not isinstance(t, Target):
            m.errors[version] = t[1]
            log(f"[{i}/{len(targets)}] {version}: not checked: {t[1]}")
            continue
        try:
            repo.borrow(t.repo)
            tree = repo.tree(_resolve(t))
            m.results[version] = check_tree(repo, docs, tree, pin_tree, deps)
            repo.forget([pin_tree])
        except SeriesError as exc:
            m.errors[version] = str(exc)
            log(f"[{i}/{len(targets)}] {version}: failed: {exc}")
            continue
        took = time.monotonic() - start
        m.timings[version] = took
        counts: dict[str, int] = {}
        for r in m.results[version].values():
            counts[r.verdict.verdict] = counts.get(r.verdict.verdict, 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        log(
            f"[{i}/{len(targets)}] {version}: {len(docs)} patches judged in {took:.1f}s ({summary})"
        )
    return m


def _resolve(t: Target) -> str:
    """The commit of T in its repo, as an object id the judge repo can read via alternates."""
    commit = gitops.rev(t.repo, f"{t.rev}^{{commit}}")
    if commit is None:
        raise SeriesError(
            f"{t.repo} has no revision {t.rev}", hint=f"delete {t.repo} so it is materialized again"
        )
    return commit
