#!/usr/bin/env bash
# Verdict of every patch against every newer upstream release (upstream.lock targets):
#   scripts/rebase-check.sh [--releases V ...] [--json OUT] [--md OUT] [--policy newest|any|report]
# Exit 1 only per the policy (default "newest": a patch that is not upstream stops applying on the
# newest release); --policy report never fails. See `python -m fp4series rebase-check --help`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP4SERIES_PYTHON:-$ROOT/.work/venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fp4series rebase-check "$@"
