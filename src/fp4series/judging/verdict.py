"""The verdict model: what a patch is on one tree (Verdict) and in series order (PatchResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fp4series.judging.symbols import (
    SymbolHit,
)

VERDICTS = (
    "clean",
    "offset",
    "three-way",
    "conflict",
    "upstream",
    "partly-upstream",
    "moved",
    "deleted",
)
APPLIES = ("clean", "offset", "three-way")
FAILS = ("conflict", "deleted")
CODES = {
    "clean": "C",
    "offset": "O",
    "three-way": "3W",
    "conflict": "X",
    "upstream": "U",
    "partly-upstream": "P",
    "moved": "M",
    "deleted": "D",
}


@dataclass
class Verdict:
    verdict: str
    evidence: str = ""
    offsets: dict[str, list[int]] = field(default_factory=dict)
    hunks: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    moved_to: dict[str, str] = field(default_factory=dict)
    moved_verdict: str | None = None
    missing_files: list[str] = field(default_factory=list)
    not_judged: list[dict[str, Any]] = field(default_factory=list)  # files of failed creators
    symbols: list[SymbolHit] = field(default_factory=list)
    symbol_source: str = ""
    apply_text: str | None = None  # the (possibly path-rewritten) patch that applies
    three_way: bool = False

    @property
    def effective(self) -> str:
        """The verdict that counts for the policy: moved patches count as their re-judged one."""
        if self.verdict == "moved":
            return self.moved_verdict or "moved"
        return self.verdict

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"verdict": self.verdict}
        if self.moved_to:
            d["moved_to"] = self.moved_to
            d["moved_verdict"] = self.moved_verdict
        if self.evidence:
            d["evidence"] = self.evidence
        if self.offsets:
            d["offsets"] = self.offsets
        if self.conflicts:
            d["conflicts"] = self.conflicts
        if self.hunks and self.effective not in ("clean", "offset"):
            d["hunks"] = self.hunks
        if self.missing_files:
            d["missing_files"] = self.missing_files
        if self.not_judged:
            d["not_judged"] = self.not_judged
        if self.symbols:
            d["symbols"] = {
                "source": self.symbol_source,
                "checked": [s.as_dict() for s in self.symbols],
            }
        return d


@dataclass
class PatchResult:
    verdict: Verdict
    alone: Verdict
    in_series: Verdict | None
    judged: str  # "in-series" (prerequisites applied) or "partial-series" (some did not)
    prerequisites: list[str]
    failed_prerequisites: list[str] = field(default_factory=list)
    stacked: list[str] = field(default_factory=list)  # earlier patches applied under it

    def as_dict(self) -> dict[str, Any]:
        d = self.verdict.as_dict()
        d["judged"] = self.judged
        if self.prerequisites:
            d["prerequisites"] = self.prerequisites
        if self.failed_prerequisites:
            d["prerequisites_not_applied"] = self.failed_prerequisites
            d["judged_on"] = ["release", *self.stacked]
        if self.in_series is not None and self.in_series is not self.verdict:
            d["in_series"] = self.in_series.verdict
        if self.alone is not self.verdict:
            d["alone"] = self.alone.verdict
        return d
