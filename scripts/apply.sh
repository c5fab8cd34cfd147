#!/usr/bin/env bash
# Apply patches/series to a checkout of the pin: scripts/apply.sh [--check] [--allow-base-mismatch] CHECKOUT
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec "$PY" -m fp4series apply "$@"
