# Sourced by scripts/*.sh: sets PY (the python that runs fp4series) and PYTHONPATH.
#   FP4SERIES_PYTHON set -> that interpreter (a path or a command name); an error if it is not
#                           an executable, never a silent fallback
#   .work/venv           -> the full test environment (scripts/main.sh, scripts/setup-venv.sh)
#   otherwise            -> .work/tooling-venv: gitpython only (requirements/scripts.txt), made
#                           on first use in seconds from PyPI and remade when the requirements
#                           change (hash stamp), so a fresh clone runs these scripts without
#                           the 5 GB test environment
# Usage: ROOT=... ; . "$ROOT/scripts/lib/python.sh" ; exec ${PY_START[@]+"${PY_START[@]}"} "$PY" ...
# (PY_START and the INT trap: lib/sigint.sh, sourced here)
. "$ROOT/scripts/lib/sigint.sh"
fp4series_die() {
  echo "error: $1" >&2
  echo "  what to do: $2" >&2
  exit 2
}

if [ -n "${FP4SERIES_PYTHON:-}" ]; then
  PY="$(command -v -- "$FP4SERIES_PYTHON" || true)"
  if [ -z "$PY" ] || [ -d "$PY" ] || [ ! -x "$PY" ]; then
    fp4series_die "FP4SERIES_PYTHON=$FP4SERIES_PYTHON is not an executable python" \
      "point it at an existing interpreter, or unset it to use .work/venv or .work/tooling-venv"
  fi
elif [ -x "$ROOT/.work/venv/bin/python" ]; then
  PY="$ROOT/.work/venv/bin/python"
else
  BOOT="$(command -v python3.11 || command -v python3 || true)"
  if [ -z "$BOOT" ] || ! "$BOOT" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    fp4series_die "no python 3.11 found (python3.11 or python3 on PATH)" \
      "install python 3.11, or set FP4SERIES_PYTHON to one that has gitpython"
  fi
  rc=0
  FP4SERIES_OURS_RUNNING=1
  PYTHONPATH="$ROOT/src" ${PY_START[@]+"${PY_START[@]}"} "$BOOT" -m fp4series.commands.venv tooling-venv >&2 || rc=$?
  FP4SERIES_OURS_RUNNING=
  [ "$rc" -ne 130 ] || exit 130
  [ "$rc" -eq 0 ] || fp4series_die "could not create $ROOT/.work/tooling-venv (see above)" \
    "check the network to PyPI and run it again, or set FP4SERIES_PYTHON"
  PY="$ROOT/.work/tooling-venv/bin/python"
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
