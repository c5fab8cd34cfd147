# Sourced by scripts/main.sh and scripts/test.sh: takes a leading `--line VERSION` off the
# arguments and sets LINE_ARGS (for fp4series commands), LINE_WORK (the line's scratch dir) and
# LINE_PY (its test venv's python), as src/fp4series/line.py resolves them from upstream.lock:
# the pin's line (also `--line <pin version>`): .work, .work/venv; a line on VERSION:
# .work/lines/VERSION, .work/lines/VERSION/venv. An unknown VERSION is an error naming the lines.
# Usage: ROOT=... ; . "$ROOT/scripts/lib/line.sh" ; set -- "${REST[@]}"
. "$ROOT/scripts/lib/sigint.sh"
LINE_ARGS=()
LINE_WORK="$ROOT/.work"
REST=("$@")
if [ "${1:-}" = "--line" ]; then
  if [ -z "${2:-}" ]; then
    echo "error: --line needs a VERSION (e.g. --line 0.5.23)" >&2
    exit 2
  fi
  LINE_BOOT="$(command -v python3.11 || command -v python3)"
  FP4SERIES_OURS_RUNNING=1
  LINE_WORK="$(PYTHONPATH="$ROOT/src" ${PY_START[@]+"${PY_START[@]}"} "$LINE_BOOT" -m fp4series.line work "$2")" || {
    rc=$?
    [ "$rc" -eq 130 ] || rc=2
    exit "$rc"
  }
  FP4SERIES_OURS_RUNNING=
  LINE_ARGS=(--line "$2")
  REST=("${@:3}")
fi
LINE_PY="$LINE_WORK/venv/bin/python"
