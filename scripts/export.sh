#!/usr/bin/env bash
# Regenerate patches/ from the commits on top of the pin: scripts/export.sh CHECKOUT [--base REV]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec "$PY" -m fp4series export "$@"
