#!/usr/bin/env bash
# What a test run must not leave behind: entries in /tmp, FUSE mounts (also
# stale ones, whose node died: they answer ENOTCONN, so `mountpoint -q` and
# stat do not see a mount, but /proc/self/mountinfo still lists them),
# client sockets and other files in the nodes' runtime directory /run/kylix,
# and kylix or test processes. .ci/run saves the state before `make test`
# and compares after:
#   bash scripts/leak-check.sh state > FILE     (FILE outside /tmp)
#   bash scripts/leak-check.sh compare FILE     (exit 1, listing what is new)
set -euo pipefail

state() {
  local e
  for e in /tmp/* /tmp/.[!.]* /tmp/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    echo "tmp     $e"
  done
  # mountinfo: field 5 is the mount point; the file system type follows
  # the " - " separator.
  local m fstype why
  while read -r m fstype; do
    m=$(printf '%b' "$m") # mountinfo writes a space as \040
    # statfs always asks the node (a stat may be answered from the
    # kernel's attribute cache); a stuck node would hang it: 5 s at most.
    if why=$(timeout 5 stat -f "$m" 2>&1 >/dev/null); then
      echo "mount   $m ($fstype)"
    elif [ -z "$why" ]; then
      echo "mount   $m ($fstype, not answering)"
    else
      echo "mount   $m ($fstype, stale: ${why##*: }; umount -l it)"
    fi
  done < <(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i+1) ~ /^fuse/) print $5, $(i+1); break } }' /proc/self/mountinfo)
  for e in /run/kylix/* /run/kylix/.[!.]*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    if [ -S "$e" ]; then echo "socket  $e"; else echo "run     $e"; fi
  done
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
  echo "leak check: nothing left in /tmp or /run/kylix, no FUSE mount (live or stale), no kylix or test process"
  ;;
*) echo "usage: $0 state | compare FILE" >&2; exit 2 ;;
esac
