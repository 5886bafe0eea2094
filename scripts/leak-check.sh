#!/usr/bin/env bash
# What a test run must not leave behind: entries in /tmp, FUSE mounts, and
# kylix or test processes. .ci/run saves the state before `make test` and
# compares after:
#   bash scripts/leak-check.sh state > FILE     (FILE outside /tmp)
#   bash scripts/leak-check.sh compare FILE     (exit 1, listing what is new)
set -euo pipefail

state() {
  local e
  for e in /tmp/* /tmp/.[!.]* /tmp/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    echo "tmp     $e"
  done
  awk '$3 ~ /^fuse/ { print "mount   " $2 " (" $3 ")" }' /proc/mounts
  # Processes by pid and name: kylix (bin/kylix, the test's build of it)
  # and Go test binaries (NAME.test), which also run as kylix in cmd/kylix.
  ps -eo pid=,comm= | awk -v self=$$ '$1 != self && ($2 ~ /kylix/ || $2 ~ /\.test$/) { print "process " $1 " " $2 }'
}

case "${1:-}" in
state) state | sort ;;
compare)
  [ -f "${2:-}" ] || { echo "usage: $0 compare FILE (written by: $0 state)" >&2; exit 2; }
  new=$(comm -13 "$2" <(state | sort))
  if [ -n "$new" ]; then
    echo "leak check: FAIL: the tests left these behind:" >&2
    echo "$new" | sed 's/^/  /' >&2
    exit 1
  fi
  echo "leak check: nothing left in /tmp, no FUSE mount, no kylix or test process"
  ;;
*) echo "usage: $0 state | compare FILE" >&2; exit 2 ;;
esac
