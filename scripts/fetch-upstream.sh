#!/usr/bin/env bash
# Materialize the pinned upstream (or --version V) as a git repo: scripts/fetch-upstream.sh DEST [--version V]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FP4SERIES_PYTHON:-$ROOT/.work/venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fp4series fetch-upstream "$@"
