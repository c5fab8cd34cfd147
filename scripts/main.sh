#!/usr/bin/env bash
# The README's main job, on a fresh machine or a warm one:
#   venv -> materialize the pin (.work/upstream/v0.5.11, sha256-verified) -> .work/checkout
#   (clone + apply patches/series) -> build (wheel, install, nvcc compile check) -> test.
# With --line VERSION the same for that series line: .work/upstream/VERSION, patches/VERSION,
# .work/lines/VERSION/{venv,checkout,build}, tests/sglang-VERSION.
#   scripts/main.sh [--line VERSION] [pytest args for scripts/test.sh]
# Each stage is cached (venv by requirements hash, checkout by series hash, compiles by
# source hash), so a warm run only re-tests. Exit code: first failing stage's, else 0.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. "$ROOT/scripts/lib/line.sh"
set -- "${REST[@]+"${REST[@]}"}"
T0=$SECONDS
stage() { echo "==> [main +$((SECONDS - T0))s] $*"; }

# git am/commit need an identity; a bare CI machine has none (authors come from the patches).
if ! git config user.email >/dev/null 2>&1; then
  export GIT_COMMITTER_NAME="${GIT_COMMITTER_NAME:-fp4series pipeline}"
  export GIT_COMMITTER_EMAIL="${GIT_COMMITTER_EMAIL:-pipeline@fp4series.invalid}"
  export GIT_AUTHOR_NAME="${GIT_AUTHOR_NAME:-fp4series pipeline}"
  export GIT_AUTHOR_EMAIL="${GIT_AUTHOR_EMAIL:-pipeline@fp4series.invalid}"
fi

stage "venv (${LINE_WORK#"$ROOT/"}/venv)"
ours scripts/setup-venv.sh ${LINE_ARGS[@]+"${LINE_ARGS[@]}"}

stage "release + checkout + apply (.work/upstream, ${LINE_WORK#"$ROOT/"}/checkout)"
ours ${PY_START[@]+"${PY_START[@]}"} "$LINE_PY" -m fp4series prepare-checkout ${LINE_ARGS[@]+"${LINE_ARGS[@]}"}

stage "build"
ours ${PY_START[@]+"${PY_START[@]}"} "$LINE_PY" -m fp4series build ${LINE_ARGS[@]+"${LINE_ARGS[@]}"} "$LINE_WORK/checkout"

stage "test (ours scripts/test.sh ${LINE_ARGS[*]-})"
ours scripts/test.sh ${LINE_ARGS[@]+"${LINE_ARGS[@]}"} "$@"
stage "done: main job passed in $((SECONDS - T0))s"
