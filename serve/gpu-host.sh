#!/usr/bin/env bash
# The end-to-end run on an offline CUDA host, in one command (serve/README.md section 3).
# Run from the repository root, with .work/ holding what was made on a connected machine:
#   .work/wheelhouse/part-*/   the wheelhouse (scripts/make-wheelhouse.sh --split-mb N)
#   .work/build/sglang-*.whl   the patched pin (python -m fp4series build ... --compile-targets none)
#   .work/cache/wheels/sglang-0.5.11-*.whl   the bare pin (the negative control)
#   .work/revision.json        the series revision the reports record
# Each step is skipped when its result is there, so running it again resumes:
#   1. installs the wheelhouse into .work/gpu-site (pip --target; the image's python3 is a venv)
#   2. unpacks the patched and the bare pin's python trees
#   3. starts the Marlin JIT builds in the background (scripts/gpu-proof.sh --build-only)
#   4. makes the checkpoints (serve/make_checkpoints.py: the three trained models, then the
#      speed models dense-large and moe-large with their FP8 twins), in the background
#   5. the GPU numerics of fused shards (stage fused_shards), then the e2e stage (serve/e2e.py)
#      until --deadline: the gated units while the speed models are made, then the rest;
#      e2e.json / e2e.md / numerics.json land in --out.
# --parallel (a host with 2 GPUs): the e2e stage also serves the checkpoints across both GPUs
# (serve/e2e.py --parallel: tp 2, and ep 2 for the MoE); refused up front on fewer GPUs.
# --speed MODELS (e.g. dense-large,moe-large): only those speed models' units (NVFP4 beside bf16
# and FP8): their checkpoints alone, no trained models, no fused_shards; the report holds those
# units (the others pending), so give it an --out of its own. dense-8b (Llama-3.1-8B's 32
# layers; its five checkpoints take 34 GiB of disk) runs only when named here.
# JIT modules prebuilt on a connected machine (scripts/make-bundle.sh --prebuild sm_90 --stages
# e2e: the bundle's prebuilt/ folder) are loaded instead of compiled when FP4SERIES_PREBUILT_DIR
# names that folder.
# NVLink multicast stays off in everything this starts.
#   serve/gpu-host.sh [--deadline SECONDS] [--out DIR] [--prepare-only] [--parallel]
#                     [--speed MODELS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEADLINE=0 OUT_DIR=.work/gpu-host-out PREPARE_ONLY=0 PARALLEL=0 SPEED=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deadline) DEADLINE="$2"; shift 2 ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    --parallel) PARALLEL=1; shift ;;
    --speed) SPEED="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -n "$SPEED" ]; then
  if ! [[ $SPEED =~ ^(dense-large|moe-large|dense-8b)(,(dense-large|moe-large|dense-8b)){0,2}$ ]]
  then
    echo "error: --speed '$SPEED': give dense-large, moe-large, dense-8b or several," \
      "comma-separated" >&2
    exit 2
  fi
  SPEED=$(echo "$SPEED" | tr , '\n' | sort -u | paste -sd, -)  # one marker per set of models
  if [ "$PARALLEL" = 1 ]; then
    echo "error: --speed and --parallel: the parallel units need the trained models' one-GPU" \
      "units; run them apart" >&2
    exit 2
  fi
fi
T0=$SECONDS
step() { echo "==> [gpu-host +$((SECONDS - T0))s] $*"; }
export PYTHONUNBUFFERED=1
# NVLink multicast off for every process started from here (serve/e2e.py sets it for its
# workers too): on a shared host it can take the GPUs down.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ "$PARALLEL" = 1 ]; then
  GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$GPUS" -lt 2 ]; then
    echo "error: --parallel needs a CUDA host with 2 GPUs; torch.cuda.device_count() is $GPUS" \
      "here (leave --parallel out for the one-GPU run)" >&2
    exit 2
  fi
  export FP4SERIES_E2E_ARGS="${FP4SERIES_E2E_ARGS:-} --parallel"
fi
SITE=$PWD/.work/gpu-site
mkdir -p "$OUT_DIR" .work/logs

if [ ! -f "$SITE/.installed" ]; then
  step "install the wheelhouse into .work/gpu-site"
  python3 serve/make_wheelhouse.py --join .work/wheelhouse
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
    --find-links .work/wheelhouse --require-hashes -r serve/wheelhouse.lock
  touch "$SITE/.installed"
fi
export PYTHONPATH=$SITE
if [ ! -f .work/checkout/python/sglang/srt/layers/quantization/marlin_utils_fp4.py ]; then
  step "unpack the patched pin and the bare pin"
  python3 -m zipfile -e "$(ls -t .work/build/sglang-*.whl | head -1)" .work/checkout/python
  python3 -m zipfile -e "$(ls .work/cache/wheels/sglang-0.5.11-*.whl | head -1)" \
    .work/upstream/v0.5.11/python
fi
FP4SERIES_SERIES_REVISION="$(cat .work/revision.json)"
export FP4SERIES_SERIES_REVISION
if [ ! -f .work/logs/builds.started ]; then
  step "Marlin JIT builds (background; e2e waits for them)"
  touch .work/logs/builds.started
  setsid scripts/gpu-proof.sh --stages fused_shards,e2e --build-only --deadline 1800 \
    > .work/logs/builds.log 2>&1 < /dev/null &
fi
CKPT=.work/checkpoints/full
MADE=$CKPT/made-large  # the speed models' marker (--speed: of those asked for)
if [ -n "$SPEED" ]; then
  MADE="$CKPT/made-speed-${SPEED//,/+}"
  # a full run made dense-large and moe-large already (not dense-8b)
  [[ $SPEED != *dense-8b* && -f $CKPT/made-large ]] && MADE="$CKPT/made-large"
fi
if [ ! -f "$MADE" ] && ! pgrep -f serve/make_checkpoints.py >/dev/null; then
  step "checkpoints (background; log .work/logs/checkpoints.log)"
  if [ -n "$SPEED" ]; then
    MAKE="python3 serve/make_checkpoints.py --models $SPEED"
  else
    MAKE="{ [ -f $CKPT/made-trained ] || { python3 serve/make_checkpoints.py; \
      touch $CKPT/made-trained; }; }; python3 serve/make_checkpoints.py \
      --models dense-large,moe-large"
  fi
  setsid bash -c "set -e; $MAKE; touch $MADE" >> .work/logs/checkpoints.log 2>&1 < /dev/null &
  sleep 2
fi
[ "$PREPARE_ONLY" = 1 ] && { step "prepared (builds and checkpoints go on)"; exit 0; }

left() { [ "$DEADLINE" = 0 ] && echo 100000 || echo $((DEADLINE - (SECONDS - T0))); }
wait_for_checkpoints() {  # MARKER WHAT: until the checkpoint maker has written MARKER
  while [ ! -f "$1" ]; do
    if pgrep -f serve/make_checkpoints.py >/dev/null; then
      [ "$(left)" -lt 60 ] && { step "deadline: $2 still being made"; exit 3; }
      sleep 5
    else
      step "$2 failed: tail of .work/logs/checkpoints.log"
      tail -20 .work/logs/checkpoints.log
      exit 1
    fi
  done
}
if [ -z "$SPEED" ]; then  # the trained models (the speed models may still be in the making)
  wait_for_checkpoints "$CKPT/made-trained" "the trained models' checkpoints"
fi
while pgrep -f "gpu_proof.py --stages fused_shards,e2e --build-only" >/dev/null; do
  [ "$(left)" -lt 60 ] && { step "deadline: the Marlin builds are still running"; exit 3; }
  sleep 5  # the stages below reuse those builds instead of starting their own
done
if [ -z "$SPEED" ] && [ ! -f "$OUT_DIR/fused_shards/numerics.json" ]; then
  step "stage fused_shards"
  scripts/gpu-proof.sh --stages fused_shards --deadline "$(left)" --out "$OUT_DIR/fused_shards" || true
fi
if [ -z "$SPEED" ] && [ ! -f "$MADE" ]; then  # the gated units first, while the speed models are made
  # (the parallel units wait too: the checkpoint maker uses GPU 0, and a tensor-parallel engine
  # refuses GPUs whose free memory differs by more than 10 %)
  step "stage e2e without the speed models (their checkpoints are still being made)"
  FP4SERIES_E2E_ARGS="${FP4SERIES_E2E_ARGS:-} --only negative,case,unquantized,http" \
    scripts/gpu-proof.sh --stages e2e --deadline "$(left)" --out "$OUT_DIR" || true
fi
wait_for_checkpoints "$MADE" "the speed models' checkpoints"
if [ -n "$SPEED" ]; then
  ONLY=$(echo "$SPEED" | sed 's#\([^,]*\)#speed/\1#g')
  export FP4SERIES_E2E_ARGS="${FP4SERIES_E2E_ARGS:-} --speed-models $SPEED --only $ONLY"
fi
step "stage e2e (resumes what an earlier run finished)"
scripts/gpu-proof.sh --stages e2e --deadline "$(left)" --out "$OUT_DIR"
