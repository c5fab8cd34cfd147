#!/usr/bin/env bash
# Regenerate patches/ from the commits on top of the pin: scripts/export.sh CHECKOUT [--base REV]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP4SERIES_PYTHON:-$ROOT/.work/venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fp4series export "$@"
