#!/usr/bin/env bash
# Rebase the series onto a newer upstream release, as a maintained line in patches/<VERSION>/:
#   scripts/rebase.sh --to VERSION [--line SOURCE] [--out DIR] [--lock FILE] [--force]
#   scripts/rebase.sh --continue [--drop REASON] [--force]   after resolving a conflict
#   scripts/rebase.sh --abort                                 removes .work/rebase/<V> only
#   scripts/rebase.sh --status
#   scripts/rebase.sh --to VERSION --check    reproduce the committed line in scratch, compare
# Drops what upstream has (patches/<V>/dropped says where), shrinks what it partly has, replays
# the rest with 3-way merges, stops at a conflict in .work/rebase/<V>/checkout; at the end
# exports, lints and records the line in upstream.lock ([[lines]]). Exit 1: stopped or refused.
# `scripts/rebase.sh --help` prints the full description.
# Python: $FP4SERIES_PYTHON, else .work/venv, else .work/tooling-venv (first use; lib/python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/python.sh"
exec ${PY_START[@]+"${PY_START[@]}"} "$PY" -m fp4series rebase "$@"
