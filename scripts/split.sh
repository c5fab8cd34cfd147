#!/usr/bin/env bash
# One upstream PR branch per patch (or Group:) in REPO, with its tests and a PR description:
#   scripts/split.sh REPO [--base pin|VERSION|auto] [--only P ...] [--run-tests]
#     [--python PY] [--patches-dir DIR] [--series-base VERSION] [--reports-dir DIR]
#     [--keep-trailers] [--out-dir DIR] [--force NAME ...]
# Each branch's commit holds the fix and its CPU tests in upstream's test tree; OUT-DIR/<unit>.md
# is its PR description. Writes OUT-DIR/split-record.json and, for a branch split before,
# OUT-DIR/<unit>.range-diff.txt. All or nothing; a branch or out-dir file that is not split's is
# refused unless --force NAME names it (the old one is kept aside and named).
# Never pushes: prints the `git push` / `gh pr create` commands. `scripts/split.sh --overlap`
# prints which lines two patches both touch instead (python -m fp4series overlap).
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
if [ "${1:-}" = "--overlap" ]; then
  shift
  exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series overlap "$@"
fi
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series split "$@"
