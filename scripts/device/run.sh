#!/usr/bin/env bash
# GPU-machine side of the proof (the lead's device calls). PHASE: build | test | prebuilt.
#   build:    unpack .carry to /tmp/fp4proof, install wheels, build all JIT variants in parallel.
#   test:     pytest tests/gpu + bench; reports copied flat into $OUT.
#   prebuilt: JIT modules come prebuilt from the carry (prebuild.py); numerics + repro +
#             tracing, compute_75, benchmark (FP4SERIES_STAGES) under FP4SERIES_BUDGET_S.
# Needs a carry from scripts/device/pack.sh (--split: .carry-numerics / .carry-bench; name it
# in the call's carry list and in FP4SERIES_CARRY). reports/h200/README.md has the calls.
set -uo pipefail
cd "$(dirname "$0")/../.."
PHASE="${1:?usage: scripts/device/run.sh build|test|prebuilt}"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
export PYTHONUNBUFFERED=1
if [ "$PHASE" = prebuilt ]; then
  exec python3 scripts/device/prebuilt_run.py
fi
exec python3 scripts/device/device_run.py "$PHASE" --carry .carry ${OUT:+--out "$OUT"}
