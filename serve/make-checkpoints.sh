#!/usr/bin/env bash
# Make the serving checkpoints (see serve/make_checkpoints.py --help): trains small models and
# writes bf16, compressed-tensors NVFP4, ModelOpt NVFP4 and dequantized references under
# .work/checkpoints/. The producers live in .work/ckpt-venv, layered over PYTHON's packages.
# Usage: serve/make-checkpoints.sh [--tiny] [--models dense,dense-bias,moe] [--steps N]
#        serve/make-checkpoints.sh [--tiny] --models dense-large,moe-large   (speed models, FP8 too)
# Env: PYTHON  interpreter whose packages the venv sees (default .work/venv/bin/python)
#      PIP_ARGS extra pip arguments (e.g. --no-index --find-links WHEELHOUSE on an offline host)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.work/venv/bin/python}"
VENV="$ROOT/.work/ckpt-venv"
if [ ! -x "$PYTHON" ]; then
  echo "error: $PYTHON not found: run scripts/setup-venv.sh, or set PYTHON" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; sys.exit(0)'
  base="$("$PYTHON" -c 'import sys; print(sys.base_prefix)')/bin/python3"
  "$base" -m venv "$VENV"
fi
# make PYTHON's packages visible behind the venv's own (a .pth line is appended to sys.path)
"$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-base-packages.pth"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q --disable-pip-version-check ${PIP_ARGS:-} \
  -r "$ROOT/requirements/checkpoints.txt"
exec "$VENV/bin/python" "$ROOT/serve/make_checkpoints.py" "$@"
