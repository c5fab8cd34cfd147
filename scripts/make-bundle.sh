#!/usr/bin/env bash
# Make a bundle for `scripts/gpu-proof.sh --bundle` on a GPU host without network: the patched
# and the pin's trees, sgl_kernel, the wheels the host lacks, optionally upstream 0.5.23's tree
# (--with-upstream 0.5.23) and JIT modules prebuilt here (--prebuild sm_90), sha256-checked.
#   scripts/make-bundle.sh [--part-size 60M] [--with-upstream VERSION] [--prebuild ARCH] OUT
#   scripts/make-bundle.sh --line VERSION [--part-size 40M] OUT   (a maintained line's bundle:
#       its tree, the bare release's differing files, its wheels, the conformance wheel)
# Needs the trees of `python -m fp4series prepare-checkout` (scripts/main.sh makes them) and
# PyPI (or --offline with the wheels in .work/cache/bundle). --help lists every option.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
[ -x "$ROOT/.work/venv/bin/python" ] && PY="$ROOT/.work/venv/bin/python"
exec "$PY" "$ROOT/scripts/device/bundle.py" "$@"
