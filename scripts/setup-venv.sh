#!/usr/bin/env bash
# Create or refresh a line's CPU test venv: .work/venv from requirements/ (the pin's line), or
# with --line VERSION .work/lines/VERSION/venv from requirements/VERSION/; fp4series is
# importable in both. Stdlib-only bootstrap, so it runs on a machine that has nothing but
# python3.11 and pip. Re-runs are instant while the requirement files are unchanged (hash stamp).
#   scripts/setup-venv.sh [--line VERSION]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP4SERIES_PYTHON:-$(command -v python3.11 || command -v python3)}"
cd "$ROOT"
. "$ROOT/scripts/lib/sigint.sh"
PYTHONPATH="$ROOT/src" exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series.commands.venv venv --python "$PY" "$@"
