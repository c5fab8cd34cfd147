#!/usr/bin/env bash
# Lint patches/*.patch and patches/series (also the pre-commit hook): scripts/lint-patches.sh [FILES]
#   [--pin REPO] [--blobs] [--matrix FILE | --no-matrix]: Upstream-Status is cross-checked
#   against the rebase-check matrix (default reports/rebase-check.json; a line's:
#   reports/<V>/rebase-check.json). --line V lints patches/V against release V's blobs.
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series lint "$@"
