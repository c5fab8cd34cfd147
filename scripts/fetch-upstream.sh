#!/usr/bin/env bash
# Materialize the pinned upstream (or --version V) as a git repo: scripts/fetch-upstream.sh DEST [--version V]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec "$PY" -m fp4series fetch-upstream "$@"
