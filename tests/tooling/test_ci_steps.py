"""CI's step times and budget check (scripts/lib/steps.sh, sourced by .ci/run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """set -euo pipefail
T0=$SECONDS
. scripts/lib/steps.sh
ci "venv"
SECONDS=$((SECONDS + 700))
ci "main job"
SECONDS=$((SECONDS + 2500))
ci "split"
[ "${FAIL:-0}" = 1 ] && exit 3
ci_last "passed"
"""


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, check=False)  # fmt: skip


def test_every_step_is_timed_and_the_total_is_inside_the_budget() -> None:
    proc = run({"FP4SERIES_CI_BUDGET_S": "3600"})
    assert proc.returncode == 0, proc.stderr
    assert "s: venv" in proc.stdout and "s: main job" in proc.stdout
    table = proc.stdout.split("step times (exit 0):")[1]
    assert [ln.split("s  ", 1)[1] for ln in table.strip().splitlines()[:3]] == [
        "venv", "main job", "split",
    ]  # fmt: skip
    assert "passed" not in table and "budget 60 min, limit 90 min" in table
    assert "warning" not in proc.stderr


def test_past_the_budget_it_warns_with_the_slowest_steps_and_keeps_the_exit_code() -> None:
    proc = run({"FP4SERIES_CI_BUDGET_S": "3000", "FAIL": "1"})
    assert proc.returncode == 3
    assert "step times (exit 3)" in proc.stdout
    assert "warning: CI took 53 min, past its 50-minute budget (the limit is 90)" in proc.stderr
    slowest = proc.stderr.split("Slowest steps:")[1].strip().splitlines()
    assert slowest[0].strip().endswith("s  main job") and slowest[1].strip().endswith("s  venv")
