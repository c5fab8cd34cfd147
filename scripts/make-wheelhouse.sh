#!/usr/bin/env bash
# Build the offline wheelhouse for a CUDA host (see serve/make_wheelhouse.py --help).
# Usage: scripts/make-wheelhouse.sh [--out DIR] [--split-mb N] [--extra requirements/checkpoints.txt]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup-venv.sh" >&2
cd "$ROOT"
exec "$ROOT/.work/venv/bin/python" serve/make_wheelhouse.py "$@"
