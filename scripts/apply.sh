#!/usr/bin/env bash
# Apply patches/series to a checkout of the pin: scripts/apply.sh [--check] [--allow-base-mismatch] CHECKOUT
# Never resets or cleans the checkout: one run at a time (.git/fp4series-apply.lock); the branch
# moves only if nothing changed meanwhile, else the result waits on refs/fp4series/applied/<branch>;
# a kill mid-move is settled by its guard (or: scripts/apply.sh --recover CHECKOUT). --help.
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series apply "$@"
