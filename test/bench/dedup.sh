#!/usr/bin/env bash
# Read throughput of a deduplicated, multi-extent file (a fine-tune sharing
# most chunks with its base) served by the node (issue 7, the chunk-access
# seam). Needs root and /dev/fuse. Prints one Markdown table.
#
#   bash test/bench/dedup.sh
#   RUNS=5 WORK=/var/tmp/kylix-dedup DEDUP=1073741824 bash test/bench/dedup.sh
#   BASELINE=/path/to/older/kylix bash test/bench/dedup.sh   # A/B comparison
#
# warm: the file's pages are in the FUSE file's own page cache (what a second
# reader of a file sees). O_DIRECT: every 1 MiB read reaches the node, which
# reads through the store's chunk cache and verifies, so this row is the one
# that measures the node's read path. extents: the same bytes read straight
# from the packs through the layout ioctl (no FUSE), for the ratio.
#
# With BASELINE, each binary serves its own copy of the same data, and every
# round measures both, one after the other (a node started, the file read
# once to warm it, then each measurement once), so that load from other
# processes on a shared machine falls on both alike.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
WORK=${WORK:-/var/tmp/kylix-dedup}
DEDUP=${DEDUP:-1073741824}

[ "$(id -u)" = 0 ] || { echo "dedup.sh: needs root (FUSE mount)"; exit 1; }
make -s build
mkdir -p "$WORK"
cp bin/kylix "$WORK/kylix-new"
NAMES=new
if [ -n "${BASELINE:-}" ]; then cp "$BASELINE" "$WORK/kylix-baseline"; NAMES="baseline new"; fi
RB=$WORK/readbench
go build -o "$RB" ./test/bench/readbench
NODE=
stop_node() { if [ -n "$NODE" ]; then kill "$NODE" 2>/dev/null || true; wait "$NODE" 2>/dev/null || true; NODE=; fi; }
start_node() { # NAME
	local k=$WORK/kylix-$1 d=$WORK/data-$1 m=$WORK/mnt-$1
	"$k" serve --data "$d" --mount "$m" >"$WORK/node-$1.log" 2>&1 &
	NODE=$!
	for _ in $(seq 400); do [ -S "$d/kylix.sock" ] && grep -q " $m " /proc/self/mountinfo && "$k" node --data "$d" >/dev/null 2>&1 && return 0; sleep 0.05; done
	cat "$WORK/node-$1.log"; exit 1
}
trap 'stop_node; rm -rf "$WORK"' EXIT
rm -rf "$WORK"/data-* "$WORK/src" && mkdir -p "$WORK/src"
"$RB" gen "$WORK/src/a.bin" "$DEDUP" 2
"$RB" mutate "$WORK/src/a.bin" "$WORK/src/b.bin" $((256 << 20)) $((8 << 20)) 3
for n in $NAMES; do
	start_node "$n"
	"$WORK/kylix-$n" import --data "$WORK/data-$n" "$WORK/src/a.bin" a.bin >/dev/null
	"$WORK/kylix-$n" import --data "$WORK/data-$n" "$WORK/src/b.bin" b.bin >/dev/null
	stop_node
done
rm -rf "$WORK/src"
field() { grep -o "$1=[0-9.]*" | cut -d= -f2; }
for _ in $(seq "$RUNS"); do
	for n in $NAMES; do
		m=$WORK/mnt-$n
		start_node "$n"
		cat "$m/b.bin" >/dev/null
		"$RB" extents "$m/b.bin" | tee "$WORK/ext-line" | field GBps >>"$WORK/$n.ext"
		"$RB" seq "$m/b.bin" | field GBps >>"$WORK/$n.warm"
		READBENCH_DIRECT=1 "$RB" seq "$m/b.bin" | field GBps >>"$WORK/$n.direct"
		stop_node
	done
done
med() { sort -g "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
all() { sort -g "$1" | paste -sd' ' | sed 's/ /, /g'; }
BEXT=$(grep -o 'extents=[0-9]* packs=[0-9]*' "$WORK/ext-line")
echo "deduplicated $((DEDUP >> 20)) MiB file ($BEXT), 1 MiB reads, GB/s: median of $RUNS (all runs)"
echo
echo "| binary | warm, through the mount | O_DIRECT through the mount (every read served by the node) | its extents from the packs (layout ioctl, no FUSE) |"
echo "|---|---|---|---|"
for n in $NAMES; do
	echo "| $n | **$(med "$WORK/$n.warm")** ($(all "$WORK/$n.warm")) | **$(med "$WORK/$n.direct")** ($(all "$WORK/$n.direct")) | $(med "$WORK/$n.ext") ($(all "$WORK/$n.ext")) |"
done
