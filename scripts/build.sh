#!/usr/bin/env bash
# Build a patched checkout: repack the pinned wheel with its python/sglang changes into
# .work/build/, install it into .work/venv, compile-check the Marlin JIT modules with nvcc.
# Usage: scripts/build.sh CHECKOUT [--compile-targets gptq_marlin:bf16:sm_90,...|none] [...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$#" -lt 1 ]; then
  echo "usage: scripts/build.sh CHECKOUT [options]   (see: scripts/build.sh --help)" >&2
  exit 2
fi
"$ROOT/scripts/setup-venv.sh" >&2
exec "$ROOT/.work/venv/bin/python" -m fp4series build "$@"
