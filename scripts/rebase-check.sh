#!/usr/bin/env bash
# Verdict of every patch against every newer upstream release (upstream.lock targets):
#   scripts/rebase-check.sh [--releases V ...] [--json OUT] [--md OUT]
#                           [--policy newest|any|baseline|report] [--baseline JSON]
# Exit 1 only per the policy:
#   newest (default)  a patch that is not upstream conflicts/is deleted on the newest release
#   any               the same on any release checked
#   baseline (CI)     the verdicts differ from the committed matrix (--baseline, default
#                     reports/rebase-check.json), or it is missing / made for another series
#   report            never fails; regenerate the baseline with
#                     --policy report --json reports/rebase-check.json --md reports/rebase-check.md
# `scripts/rebase-check.sh --help` prints the full description.
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series rebase-check "$@"
