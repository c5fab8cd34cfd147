# Sourced first by scripts/*.sh (after ROOT): Ctrl-C at any moment is one line and exit status
# 130, never a traceback.
#   - the shell's own steps: the INT trap prints the line; it stays quiet when a command of ours
#     (`ours CMD...`) was stopped by it, as that one said its own line and exited 130;
#   - python: "${PY_START[@]}" starts it with SIGINT blocked (GNU env --block-signal), so that a
#     Ctrl-C during the interpreter's own start-up waits until fp4series can catch it
#     (src/fp4series/errors.py, release_sigint). Where env cannot block a signal, PY_START is
#     empty and such an early Ctrl-C may still print Python's traceback.
# Not covered: a Ctrl-C before bash has read this file (bash then exits 130 without a word).
fp4series_interrupted() {
  local status=$?  # a command of ours that reported the Ctrl-C exited 130
  if [ -z "${FP4SERIES_OURS_RUNNING:-}" ] || [ "$status" -ne 130 ]; then
    echo "error: interrupted; nothing more was run" >&2
    echo "  what to do: run the same command again" >&2
  fi
  exit 130
}
trap fp4series_interrupted INT
# ours CMD...: run a command of this project (it reports a Ctrl-C itself); keeps set -e's exit.
ours() {
  local rc=0
  FP4SERIES_OURS_RUNNING=1
  "$@" || rc=$?
  FP4SERIES_OURS_RUNNING=
  return "$rc"
}
PY_START=()
if env --block-signal=INT true >/dev/null 2>&1; then
  PY_START=(env --block-signal=INT FP4SERIES_SIGINT_BLOCKED=1)
fi
