#!/usr/bin/env bash
# Read throughput of a deduplicated, multi-extent file (a fine-tune sharing
# most chunks with its base) served by the node (issue 7, the chunk-access
# seam). Needs root and /dev/fuse. Prints one Markdown table.
#
#   bash test/bench/dedup.sh
#   RUNS=5 WORK=/var/tmp/kylix-dedup DEDUP=1073741824 bash test/bench/dedup.sh
#
# warm: the file's pages are in the FUSE file's own page cache (what a second
# reader of a file sees). O_DIRECT: every 1 MiB read reaches the node, which
# reads through the store's chunk cache and verifies, so this row is the one
# that measures the node's read path. extents: the same bytes read straight
# from the packs through the layout ioctl (no FUSE), for the ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
WORK=${WORK:-/var/tmp/kylix-dedup}
DEDUP=${DEDUP:-1073741824}

[ "$(id -u)" = 0 ] || { echo "dedup.sh: needs root (FUSE mount)"; exit 1; }
make -s build
mkdir -p "$WORK"
cp bin/kylix "$WORK/kylix"
K=$WORK/kylix
RB=$WORK/readbench
go build -ldflags=-checklinkname=0 -o "$RB" ./test/bench/readbench
DATA=$WORK/data MNT=$WORK/mnt
NODE=
stop_node() { if [ -n "$NODE" ]; then kill "$NODE" 2>/dev/null || true; wait "$NODE" 2>/dev/null || true; NODE=; fi; }
trap 'stop_node; rm -rf "$WORK"' EXIT
rm -rf "$DATA" "$WORK/src" && mkdir -p "$WORK/src"
"$RB" gen "$WORK/src/a.bin" "$DEDUP" 2
"$RB" mutate "$WORK/src/a.bin" "$WORK/src/b.bin" $((256 << 20)) $((8 << 20)) 3
"$K" serve --data "$DATA" --mount "$MNT" >"$WORK/node.log" 2>&1 &
NODE=$!
for _ in $(seq 200); do [ -S "$DATA/kylix.sock" ] && grep -q " $MNT " /proc/self/mountinfo && "$K" node --data "$DATA" >/dev/null 2>&1 && break; sleep 0.05; done
"$K" import --data "$DATA" "$WORK/src/a.bin" a.bin >/dev/null
"$K" import --data "$DATA" "$WORK/src/b.bin" b.bin >/dev/null
rm -rf "$WORK/src"
cat "$MNT/b.bin" >/dev/null; "$RB" extents "$MNT/b.bin" >/dev/null
BEXT=$("$RB" extents "$MNT/b.bin" | grep -o 'extents=[0-9]* packs=[0-9]*')
median() { # FIELD CMD...
	local field=$1; shift
	for _ in $(seq "$RUNS"); do "$@" | grep -o "$field=[0-9.]*" | cut -d= -f2; done | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
ext=$(median GBps "$RB" extents "$MNT/b.bin")
warm=$(median GBps "$RB" seq "$MNT/b.bin")
direct=$(READBENCH_DIRECT=1 median GBps "$RB" seq "$MNT/b.bin")
echo "| deduplicated $((DEDUP >> 20)) MiB file ($BEXT), 1 MiB reads | GB/s, median of $RUNS |"
echo "|---|---|"
echo "| warm, through the mount | $warm |"
echo "| O_DIRECT through the mount (every read served by the node) | $direct |"
echo "| its extents read from the packs (layout ioctl, no FUSE) | $ext |"
