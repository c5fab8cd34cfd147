#!/usr/bin/env bash
# Materialize the pinned upstream (or --version V) as a git repo: scripts/fetch-upstream.sh DEST [--version V]
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series fetch-upstream "$@"
