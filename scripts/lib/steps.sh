# Sourced by .ci/run: step timing and CI's time budget.
#   ci TEXT      starts a step (the one before ends and prints its time)
#   ci_last TEXT ends the last step and prints TEXT (no step of its own)
#   at exit      a table of every step's time and the total; past FP4SERIES_CI_BUDGET_S
#                (default 3600 s; CI's limit is 90 minutes) a warning names the 3 slowest
# Needs T0 (the start, in $SECONDS) set by the caller; the exit code is kept.
CI_BUDGET_S="${FP4SERIES_CI_BUDGET_S:-3600}"
CI_LIMIT_S=5400
STEP_NAMES=()
STEP_SECS=()
STEP_T=$SECONDS
step_end() {
  if [ "${#STEP_NAMES[@]}" -gt "${#STEP_SECS[@]}" ]; then
    STEP_SECS+=($((SECONDS - STEP_T)))
    echo "==> [ci +$((SECONDS - T0))s] ${STEP_SECS[-1]}s: ${STEP_NAMES[-1]}"
  fi
}
# ci TEXT: a new step (the one before ends here)
ci() {
  step_end
  STEP_NAMES+=("$*")
  STEP_T=$SECONDS
  echo "==> [ci +$((SECONDS - T0))s] $*"
}
ci_last() {
  step_end
  echo "==> [ci +$((SECONDS - T0))s] $*"
}
ci_summary() {
  local rc=$? total=$((SECONDS - T0)) i
  step_end
  echo "==> [ci] step times (exit $rc):"
  for i in "${!STEP_SECS[@]}"; do
    printf '  %6ss  %s\n' "${STEP_SECS[$i]}" "${STEP_NAMES[$i]}"
  done
  printf '  %6ss  total (%s min; budget %s min, limit %s min)\n' "$total" "$((total / 60))" \
    "$((CI_BUDGET_S / 60))" "$((CI_LIMIT_S / 60))"
  if [ "$total" -gt "$CI_BUDGET_S" ]; then
    echo "warning: CI took $((total / 60)) min, past its $((CI_BUDGET_S / 60))-minute budget" \
      "(the limit is $((CI_LIMIT_S / 60))). Slowest steps:" >&2
    for i in "${!STEP_SECS[@]}"; do
      printf "%ss  %s\n" "${STEP_SECS[$i]}" "${STEP_NAMES[$i]}"
    done | sort -rn | head -3 | sed 's/^/  /' >&2
    echo "  make the slowest step cheaper before adding work (README, CI)." >&2
  fi
}
trap ci_summary EXIT
