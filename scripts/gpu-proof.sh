#!/usr/bin/env bash
# The GPU proof on a CUDA host: builds the JIT modules it needs (in parallel), runs the GPU
# stages (tests/gpu numerics and the unpatched repro, upstream's conformance tests, the
# compute_75 PTX path, the benchmark; e2e: real checkpoints through SGLang's engine, not a
# default stage) and writes their reports (default reports/h200/).
#   scripts/gpu-proof.sh [--line VERSION] [--stages numerics,compute75,bench] [--out DIR]
#                        [--bundle PATH] [--kernel-set full|fp4] [--dry-run]
# Without --bundle it needs SGLang's runtime here (torch, sgl_kernel, apache-tvm-ffi, nvcc,
# ninja) and the trees of `python -m fp4series prepare-checkout`; with --bundle (from
# scripts/make-bundle.sh) only python, torch, triton, pytest, nvcc and ninja. --line VERSION: a
# maintained line's stages on its tree, its bare release as the repro (reports/h200/VERSION);
# --dry-run: everything but building and running, on a machine without a GPU.
# --help lists every option; scripts/device/gpu_proof.py says how it works.
set -euo pipefail
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" "$(dirname "$0")/device/gpu_proof.py" "$@"
