#!/usr/bin/env bash
# GPU-machine side of the proof (the lead's device calls). PHASE: build | test | prebuilt.
#   build:    unpack .carry to /tmp/fp4proof, install wheels, build all JIT variants in parallel.
#   test:     pytest tests/gpu + bench; reports copied flat into $OUT.
#   prebuilt: ONE short call: JIT modules come prebuilt from .carry/prebuilt (prebuild.py);
#             numerics, repro, tracing, compute_75, short bench under FP4SERIES_BUDGET_S (240).
# Needs .carry/ from scripts/device/pack.sh (name it in the call's carry list).
set -uo pipefail
cd "$(dirname "$0")/../.."
PHASE="${1:?usage: scripts/device/run.sh build|test|prebuilt}"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
export PYTHONUNBUFFERED=1
if [ "$PHASE" = prebuilt ]; then
  exec python3 scripts/device/prebuilt_run.py
fi
exec python3 scripts/device/device_run.py "$PHASE" --carry .carry ${OUT:+--out "$OUT"}
