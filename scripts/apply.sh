#!/usr/bin/env bash
# Apply patches/series to a checkout of the pin: scripts/apply.sh [--check] [--allow-base-mismatch] CHECKOUT
# Never resets or cleans the checkout: one run at a time (.git/fp4series-apply.lock); the branch
# moves only if nothing changed meanwhile, else the result waits on refs/fp4series/applied/<branch>;
# after a kill, run it again. --help for details.
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec "$PY" -m fp4series apply "$@"
