#!/usr/bin/env bash
# Regenerate patches/ from the commits on top of the pin: scripts/export.sh CHECKOUT [--base REV]
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series export "$@"
