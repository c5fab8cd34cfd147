#!/usr/bin/env bash
# Build a patched checkout: repack the line's release wheel (the pin's by default) with its
# python/sglang changes into .work/build/ (a line: .work/lines/VERSION/build/), install it into
# the line's test venv (made or refreshed first), compile-check the Marlin JIT modules with nvcc.
# Usage: scripts/build.sh [--line VERSION] CHECKOUT [--compile-targets gptq_marlin:bf16:sm_90,...|none]
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$#" -lt 1 ]; then
  echo "usage: scripts/build.sh [--line VERSION] CHECKOUT [options]   (see: scripts/build.sh --help)" >&2
  exit 2
fi
. "$ROOT/scripts/lib/python.sh"
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series build "$@"
