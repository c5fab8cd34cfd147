#!/usr/bin/env bash
# Lint patches/*.patch and patches/series (also the pre-commit hook): scripts/lint-patches.sh [FILES]
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec "$PY" -m fp4series lint "$@"
