#!/usr/bin/env bash
# Create or refresh .work/venv: the pinned CPU test dependencies (requirements/) + fp4series.
# Stdlib-only bootstrap, so it runs on a machine that has nothing but python3.11 and pip.
# Re-runs are instant while requirements/*.txt are unchanged (hash stamp in the venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP4SERIES_PYTHON:-$(command -v python3.11 || command -v python3)}"
cd "$ROOT"
PYTHONPATH="$ROOT/src" exec "$PY" -m fp4series.build venv --python "$PY"
