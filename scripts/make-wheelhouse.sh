#!/usr/bin/env bash
# Build the offline wheelhouse for a CUDA host (see serve/make_wheelhouse.py --help).
# Usage: scripts/make-wheelhouse.sh [--out DIR] [--split-mb N] [--extra requirements/checkpoints.txt]
# --help prints the options without making the test venv (which the build itself needs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
for arg in "$@"; do
  if [ "$arg" = "-h" ] || [ "$arg" = "--help" ]; then
    . "$ROOT/scripts/lib/python.sh"
    exec "$PY" serve/make_wheelhouse.py --help
  fi
done
"$ROOT/scripts/setup-venv.sh" >&2
exec "$ROOT/.work/venv/bin/python" serve/make_wheelhouse.py "$@"
