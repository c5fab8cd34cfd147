# Sourced by scripts/main.sh and scripts/test.sh: takes a leading `--line VERSION` off the
# arguments and sets LINE_ARGS (for fp4series commands), LINE_WORK (the line's scratch dir) and
# LINE_PY (its test venv's python). The pin's line: .work, .work/venv; a line on VERSION:
# .work/lines/VERSION, .work/lines/VERSION/venv (see src/fp4series/line.py).
# Usage: ROOT=... ; . "$ROOT/scripts/lib/line.sh" ; set -- "${REST[@]}"
LINE_ARGS=()
LINE_WORK="$ROOT/.work"
REST=("$@")
if [ "${1:-}" = "--line" ]; then
  if [ -z "${2:-}" ]; then
    echo "error: --line needs a VERSION (e.g. --line 0.5.23)" >&2
    exit 2
  fi
  case "$2" in
    */* | .* | *" "*)
      echo "error: --line $2 is not a release version" >&2
      exit 2
      ;;
  esac
  LINE_ARGS=(--line "$2")
  LINE_WORK="$ROOT/.work/lines/$2"
  REST=("${@:3}")
fi
LINE_PY="$LINE_WORK/venv/bin/python"
