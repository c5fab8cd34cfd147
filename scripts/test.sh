#!/usr/bin/env bash
# The README's test command: tests/tooling, tests/sglang, tests/gpu (skip without CUDA) against
# the built tree in .work/venv, `fp4series check-reports` when it exists, and "each prefix
# passes its tests" on worktrees of .work/checkout. With arguments, it is one targeted pytest
# run instead (e.g. scripts/test.sh tests/sglang/test_x.py -k bf16).
# Needs a build first (scripts/main.sh does it all). Exits non-zero on any failure, and on a
# run that collected no test at all.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.work/venv/bin/python"
if [ ! -x "$PY" ]; then
  echo "error: $PY does not exist" >&2
  echo "  what to do: run scripts/main.sh (or scripts/build.sh .work/checkout) first" >&2
  exit 1
fi
cd "$ROOT"
exec "$PY" -m fp4series test -- "$@"
