#!/usr/bin/env bash
# Lint patches/*.patch and patches/series (also the pre-commit hook): scripts/lint-patches.sh [FILES]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP4SERIES_PYTHON:-$ROOT/.work/venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fp4series lint "$@"
