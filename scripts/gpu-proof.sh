#!/usr/bin/env bash
# One command on your own CUDA GPU: builds the JIT variants (patched, the pin's templates for
# the repro, compute_75 PTX when the series enables SM75), runs tests/gpu and the benchmark,
# and writes reports/h200/{numerics,turing_ptx,bench}.json + bench.md + bench.png.
# Needs: the SGLang python environment (torch, sgl_kernel, apache-tvm-ffi, nvcc, ninja) and
#   the patched tree (python -m fp4series prepare-checkout -> .work/checkout/python) or
#   FP4SERIES_PATCHED_TREE; the pin tree (.work/upstream/v0.5.11/python) or FP4SERIES_PIN_TREE;
#   optional FP4SERIES_UPSTREAM_TREE (0.5.23's python dir) for the upstream column;
#   FP4SERIES_REPORT_DIR to write elsewhere than reports/h200.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
rc=0
"$PY" scripts/device/device_run.py local "$@" || rc=$?
echo "reports written to ${FP4SERIES_REPORT_DIR:-reports/h200}/ (check: python -m fp4series check-reports)"
exit $rc
