#!/usr/bin/env bash
# make test: runs the test steps in order (make STEP each), stopping at the
# first that fails, as make would, and ends with a summary: which steps ran
# and passed, which failed, which did not run, and the lines in their output
# that say something was skipped, each once, with its reason.
#
#   bash scripts/make-test.sh STEP...      (the Makefile's test target)
#
# The steps' output goes through as it comes; it is also kept in a file
# under the repository (not /tmp, which the leak check watches), removed at
# the end.
set -uo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
log=$(mktemp -p "$PWD" .make-test.XXXXXX)
trap 'rm -f "$log" "$log".*' EXIT
# Where a passing Go test may say what it skipped (go test shows nothing of
# a passing test): TestTour's skipped steps.
export KYLIX_TEST_SKIPLOG=$log.skips
passed=() failed="" notrun=()
start=$SECONDS
for step in "$@"; do
  if [ -n "$failed" ]; then
    notrun+=("$step")
    continue
  fi
  echo "== make $step"
  t0=$SECONDS
  "$make" --no-print-directory "$step" 2>&1 | tee "$log.step"
  rc=${PIPESTATUS[0]}
  # A skip, as the steps word them: "skip: ...", "...; skipped ...",
  # "skipped: ...", unittest's "(skipped=N)", the tour's "tour: skipped: ...".
  grep -E -i '(^|[^a-z])skip(ped)?([^a-z]|$)' "$log.step" | grep -v -E '^\s*(=== RUN|--- SKIP)' |
    sed "s/^/  $step: /" >>"$log"
  if [ -s "$KYLIX_TEST_SKIPLOG" ]; then
    sed "s/^/  $step: /" "$KYLIX_TEST_SKIPLOG" >>"$log"
    : >"$KYLIX_TEST_SKIPLOG"
  fi
  if [ "$rc" = 0 ]; then
    passed+=("$step ($((SECONDS - t0)) s)")
  else
    failed="$step (exit $rc)"
  fi
done
echo
ran=${#passed[@]}
[ -z "$failed" ] || ran=$((ran + 1))
echo "== make test: $ran of $# steps ran in $((SECONDS - start)) s"
echo "   passed:  ${passed[*]:-none}" | sed 's/) /), /g'
[ -z "$failed" ] || echo "   FAILED:  $failed"
[ ${#notrun[@]} = 0 ] || echo "   not run: ${notrun[*]}"
if [ -s "$log" ]; then
  echo "   skipped inside the steps (each line once; Go tests' own skips: go test -v ... | grep -- '--- SKIP'):"
  awk '!seen[$0]++' "$log"
else
  echo "   skipped inside the steps: nothing said so"
fi
if [ -n "$failed" ]; then
  echo "make test: FAIL"
  exit 1
fi
echo "make test: PASS"
