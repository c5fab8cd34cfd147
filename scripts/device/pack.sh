#!/usr/bin/env bash
# Build .carry/ (ignored by git) for the GPU machine: patched sglang tree, the pin's jit_kernel
# sources, the 0.5.23 subset, an sgl_kernel subset, cp312 wheels. Checks the 64 MiB limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
[ -x .work/venv/bin/python ] && PY=.work/venv/bin/python
exec "$PY" scripts/device/pack.py "$@"
