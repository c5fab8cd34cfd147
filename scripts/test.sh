#!/usr/bin/env bash
# The README's test command: tests/tooling, tests/sglang, tests/serve, tests/gpu (skip without
# CUDA) against the built tree in .work/venv, `fp4series check-reports`, and "each prefix passes
# its tests" on worktrees of .work/checkout. With --line VERSION the same for that series line
# (tests/sglang-VERSION, .work/lines/VERSION/). With further arguments, it is one targeted pytest
# run instead (e.g. scripts/test.sh tests/sglang/test_x.py -k bf16).
#   scripts/test.sh [--line VERSION] [pytest args]
# Needs a build first (scripts/main.sh does it all). Exits non-zero on any failure, and on a
# run that collected no test at all.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/line.sh"
set -- "${REST[@]+"${REST[@]}"}"
if [ ! -x "$LINE_PY" ]; then
  echo "error: $LINE_PY does not exist" >&2
  echo "  what to do: run scripts/main.sh ${LINE_ARGS[*]-} first" >&2
  exit 1
fi
cd "$ROOT"
exec ${PY_START[@]+"${PY_START[@]}"} "$LINE_PY" -m fp4series test ${LINE_ARGS[@]+"${LINE_ARGS[@]}"} -- "$@"
