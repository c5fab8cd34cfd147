#!/usr/bin/env bash
# Lint patches/*.patch and patches/series (also the pre-commit hook): scripts/lint-patches.sh [FILES]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec "$PY" -m fp4series lint "$@"
