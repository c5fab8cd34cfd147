"""Fixes of issue 20 the series does not have yet; the tests that need them are strict xfails.

Issue 20: NVFP4 through Marlin must be right for every checkpoint layout and every
tensor/expert-parallel rank. Each entry of ``PENDING`` names one fix. Every test that needs it
carries ``marks(name)``: a strict xfail, so the suite stays green until the fix lands and goes
red (XPASS) the moment the fix makes the test pass. When a fix lands, delete its entry here:
its tests then run as ordinary tests (and the README's tensor-parallel table drops its
"pending" notes: ``python -m fp4series readme``).

Pure Python (pytest is imported only by ``marks``): ``fp4series readme`` loads this file.
"""

from __future__ import annotations

import os
from typing import Any

# FP4SERIES_ISSUE20_LANDED=fix,fix (or "all"): run those fixes' tests as ordinary tests without
# editing PENDING, to see them fail today or to check a fix before removing its entry.
LANDED_ENV = "FP4SERIES_ISSUE20_LANDED"

PENDING: dict[str, str] = {
    "prefused-scales": (
        "a checkpoint storing qkv_proj / gate_up_proj fused, with one global scale and one "
        "input scale, fills every shard's slot (today only slot 0, the rest stay torch.empty)"
    ),
    "scale-sentinel": (
        "a per-shard / per-expert scale that no loader wrote is refused after loading, naming "
        "the layer and the shard (today its torch.empty memory is used)"
    ),
    "moe-padding": (
        "an expert intermediate that misses Marlin's tile (Qwen3-30B-A3B at --tp 8: 96 per "
        "rank) is zero-padded once at load and served (today refused)"
    ),
    "expert-map": (
        "with --ep > 1 the Marlin MoE paths (ModelOpt and compressed-tensors NVFP4) hand the "
        "dispatcher's expert_map to fused_marlin_moe (today None: local experts are run as if "
        "every routed id were local)"
    ),
    "moe-runner-flag": (
        "NVFP4 MoE follows --moe-runner-backend as upstream 0.5.13 does (auto: Marlin below "
        "SM100; marlin: Marlin on any GPU; a native runner below SM100 refused), not "
        "--fp4-gemm-backend"
    ),
}


def pending(fix: str) -> bool:
    """Whether FIX is still missing from the series."""
    if fix not in KNOWN:
        raise KeyError(f"unknown issue-20 fix {fix!r}; known: {sorted(KNOWN)}")
    landed = {f.strip() for f in os.environ.get(LANDED_ENV, "").split(",") if f.strip()}
    return fix in PENDING and fix not in landed and "all" not in landed


def marks(fix: str) -> list[Any]:
    """``pytest.param(..., marks=marks("expert-map"))``: a strict xfail while FIX is pending."""
    if not pending(fix):
        return []
    import pytest

    return [pytest.mark.xfail(strict=True, reason=f"issue 20 ({fix}): {PENDING[fix]}")]


# Every fix this file has ever named (an entry removed from PENDING stays valid here).
KNOWN = frozenset(
    {"prefused-scales", "scale-sentinel", "moe-padding", "expert-map", "moe-runner-flag"}
)
