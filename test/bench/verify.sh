#!/usr/bin/env bash
# Passthrough verification and passthrough-with-duplicates benchmarks
# (issue 7, items 3 and 8). Needs root and /dev/fuse. Prints Markdown for
# docs/bench.md ("Passthrough verification and duplicates (issue 7)").
#
#   bash test/bench/verify.sh
#   RUNS=5 WORK=/var/tmp/kylix-vbench SIZE=1073741824 bash test/bench/verify.sh
#
# Every figure is the median of RUNS runs of readbench's sequential 1 MiB
# reads (the open is inside the timed part). "cold": page cache dropped
# before the run; "warm": the bytes are in the page cache.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
WORK=${WORK:-/var/tmp/kylix-vbench}
SIZE=${SIZE:-1073741824}

[ "$(id -u)" = 0 ] || { echo "verify.sh: needs root (FUSE mount)"; exit 1; }
make -s build
mkdir -p "$WORK"
cp bin/kylix "$WORK/kylix"
K=$WORK/kylix
RB=$WORK/readbench
go build -o "$RB" ./test/bench/readbench

DATA=$WORK/data MNT=$WORK/mnt
NODE=
stop_node() { if [ -n "$NODE" ]; then kill "$NODE" 2>/dev/null || true; wait "$NODE" 2>/dev/null || true; NODE=; fi; }
start_node() { # [flags]
	"$K" serve --data "$DATA" --mount "$MNT" "$@" >>"$WORK/node.log" 2>&1 &
	NODE=$!
	for _ in $(seq 200); do [ -S "$DATA/kylix.sock" ] && grep -q " $MNT " /proc/self/mountinfo && "$K" node --data "$DATA" >/dev/null 2>&1 && return 0; sleep 0.05; done
	cat "$WORK/node.log"; exit 1
}
trap stop_node EXIT
gbps() { grep -o "GBps=[0-9.]*" | cut -d= -f2; }
med() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { echo "scale=2; $1 / $2" | bc; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

rm -rf "$DATA" "$WORK/src" && mkdir -p "$WORK/src"
echo "generating data in $WORK ..." >&2
"$RB" gen "$WORK/src/big.bin" "$SIZE" 1
"$RB" stgen "$WORK/src/dup.safetensors" "$SIZE" 10 0 2
"$RB" stgen "$WORK/src/base.safetensors" "$SIZE" 0 0 3
"$RB" stgen "$WORK/src/ft.safetensors" "$SIZE" 0 10 3
for f in big.bin dup.safetensors base.safetensors ft.safetensors; do
	"$K" import --data "$DATA" "$WORK/src/$f" "$f" >/dev/null
done
field() { "$K" stat --data "$DATA" --json "$1" | sed -n "s/.*\"$2\": \"\(.*\)\".*/\1/p"; }
PACK=$(field big.bin passthrough_pack)
DUPPACK=$(field dup.safetensors passthrough_pack)
[ -n "$PACK" ] && [ -n "$DUPPACK" ] || { echo "no passthrough pack for big.bin or dup.safetensors"; exit 1; }
[ -z "$(field ft.safetensors whole_file_pack)" ] || { echo "the fine-tune has a whole-file pack"; exit 1; }
dupdisk=$(( $(stat -c %b "$DUPPACK") * 512 ))
dupsize=$(stat -c %s "$WORK/src/dup.safetensors")

echo "measuring the pack check ..." >&2
: >"$WORK/cc"; : >"$WORK/cn"; : >"$WORK/wc"; : >"$WORK/wn"; : >"$WORK/cp"; : >"$WORK/wp"
for _ in $(seq "$RUNS"); do
	# Removing the record of checked packs is what a reboot does to it.
	stop_node; rm -f "$DATA/verified-packs.json"; start_node; drop
	"$RB" seq "$MNT/big.bin" | gbps >>"$WORK/cc"   # cold, first open: hashed whole first
	drop
	"$RB" seq "$MNT/big.bin" | gbps >>"$WORK/cn"   # cold, checked before: no hash
	stop_node; rm -f "$DATA/verified-packs.json"; start_node
	"$RB" seq "$MNT/big.bin" | gbps >>"$WORK/wc"   # warm, first open after a start
	"$RB" seq "$MNT/big.bin" | gbps >>"$WORK/wn"   # warm, checked before
	drop
	"$RB" seq "$PACK" | gbps >>"$WORK/cp"          # the pack itself, cold
	"$RB" seq "$PACK" | gbps >>"$WORK/wp"          # and warm
done
cc=$(med <"$WORK/cc") cn=$(med <"$WORK/cn") wc=$(med <"$WORK/wc") wn=$(med <"$WORK/wn") cp=$(med <"$WORK/cp") wp=$(med <"$WORK/wp")

echo "measuring duplicates ..." >&2
cat "$MNT/dup.safetensors" "$DUPPACK" "$MNT/ft.safetensors" >/dev/null
"$RB" extents "$MNT/ft.safetensors" >/dev/null
dpath=$(python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], "user.kylix.path").decode())' "$MNT/dup.safetensors")
: >"$WORK/dm"; : >"$WORK/dp"; : >"$WORK/fm"; : >"$WORK/fe"
for _ in $(seq "$RUNS"); do
	"$RB" seq "$MNT/dup.safetensors" | gbps >>"$WORK/dm"
	"$RB" seq "$DUPPACK" | gbps >>"$WORK/dp"
	"$RB" seq "$MNT/ft.safetensors" | gbps >>"$WORK/fm"
	"$RB" extents "$MNT/ft.safetensors" | gbps >>"$WORK/fe"
done
dm=$(med <"$WORK/dm") dp=$(med <"$WORK/dp") fm=$(med <"$WORK/fm") fe=$(med <"$WORK/fe")
# Ratios are the median of the per-run ratios (each run reads both sides
# back to back), which load from other processes skews less than a ratio
# of medians.
pratio() { paste "$1" "$2" | awk '{printf "%.2f\n", $1 / $2}' | med; }
rdup=$(pratio "$WORK/dm" "$WORK/dp") rft=$(pratio "$WORK/fm" "$WORK/fe")
FEXT=$("$RB" extents "$MNT/ft.safetensors" | grep -o 'extents=[0-9]* packs=[0-9]*')
# The same file served by the node, as it was before (duplicates deduplicated
# made it multi-extent, so the node served it).
stop_node; start_node --no-passthrough
cat "$MNT/dup.safetensors" >/dev/null
: >"$WORK/dn"
for _ in $(seq "$RUNS"); do "$RB" seq "$MNT/dup.safetensors" | gbps >>"$WORK/dn"; done
dn=$(med <"$WORK/dn")
stop_node

cat <<EOF2
Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, kernel $(uname -r), $(df -T "$WORK" | awk 'NR==2 {print $2}') on $(df "$WORK" | awk 'NR==2 {print $1}'); shared with other work while it ran.
Command: \`bash test/bench/verify.sh\` (RUNS=$RUNS, median of $RUNS runs; SIZE=$SIZE), $(date -u +%Y-%m-%d).

Pack check before the first passthrough open (open + sequential 1 MiB reads of the whole $((SIZE >> 20)) MiB file through the mount):

| | first open after a boot (pack hashed whole, then read) | later open, or after a restart within the boot (pack checked before) | the pack file read directly |
|---|---|---|---|
| cold (page cache dropped) | $cc GB/s | $cn GB/s | $cp GB/s |
| warm | $wc GB/s | $wn GB/s | $wp GB/s |

Passthrough with duplicates (warm):

| file | through the mount | its backing file(s) directly | ratio (goal; median of per-run ratios) |
|---|---|---|---|
| safetensors, 4 MiB tensors, 10% of them copies of one (user.kylix.path: $dpath) | $dm GB/s | $dp GB/s (its pack) | ${rdup}x (>= 0.9x) |
| same file served by the node (\`--no-passthrough\`; how it was served before) | $dn GB/s | $dp GB/s | $(ratio "$dn" "$dp")x |
| fine-tune: 10% of the tensors changed, deduplicated ($FEXT) | $fm GB/s | $fe GB/s (its extents from the packs) | ${rft}x (>= 0.8x) |

Byte cost of the duplicates stored in place: the file is $dupsize bytes; its pack uses $dupdisk bytes on disk (the duplicated tensors, $(( dupsize / 10 >> 20 )) MiB, are stored a second time).
EOF2
