#!/usr/bin/env bash
# Apply patches/series to a checkout of the pin: scripts/apply.sh [--check] [--allow-base-mismatch] CHECKOUT
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP4SERIES_PYTHON:-$ROOT/.work/venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fp4series apply "$@"
