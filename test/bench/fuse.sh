#!/usr/bin/env bash
# FUSE mount benchmarks (issue 3), measured side by side in one run.
# Needs root and /dev/fuse. Results go to stdout as Markdown for
# docs/bench.md ("FUSE mount (issue 3)").
#
#   bash test/bench/fuse.sh            # everything (about 10 minutes)
#   RUNS=5 WORK=/var/tmp/kylix-bench BIG=2147483648 bash test/bench/fuse.sh
#
# Every figure is the median of RUNS runs; "warm" means the bytes are in the
# page cache for both sides (the backing pack and, for daemon-served files,
# the FUSE file's own cache).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
WORK=${WORK:-/var/tmp/kylix-bench}
BIG=${BIG:-2147483648}             # the contiguous file (2 GiB)
DEDUP=${DEDUP:-1073741824}         # the deduplicated file (1 GiB)
SMALL=${SMALL:-10000}              # small files of 4-64 KiB
TREE=${TREE:-100000}               # entries for ls -lR
MILLION=${MILLION:-1000000}        # files for the memory figure

[ "$(id -u)" = 0 ] || { echo "fuse.sh: needs root (FUSE mount)"; exit 1; }
make -s build
mkdir -p "$WORK"
cp bin/kylix "$WORK/kylix" # a rebuild during the run does not change what runs
K=$WORK/kylix
RB=$WORK/readbench
go build -o "$RB" ./test/bench/readbench

DATA=$WORK/data MNT=$WORK/mnt
NODE=
stop_node() { if [ -n "$NODE" ]; then kill "$NODE" 2>/dev/null || true; wait "$NODE" 2>/dev/null || true; NODE=; fi; }
start_node() { # DATA MNT [flags]
	local d=$1 m=$2; shift 2
	"$K" serve --data "$d" --mount "$m" "$@" >"$WORK/node.log" 2>&1 &
	NODE=$!
	for _ in $(seq 200); do [ -S "$d/kylix.sock" ] && grep -q " $m " /proc/self/mountinfo && "$K" node --data "$d" >/dev/null 2>&1 && return 0; sleep 0.05; done
	cat "$WORK/node.log"; exit 1
}
trap stop_node EXIT

# median of the NAME=VALUE field in the output of RUNS runs of a command
median() { # FIELD CMD...
	local field=$1; shift
	for _ in $(seq "$RUNS"); do "$@" | grep -o "$field=[0-9.]*" | cut -d= -f2; done | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "seconds=$(echo "$e - $s" | bc)"; }
ratio() { echo "scale=2; $1 / $2" | bc; }
# cold: empty the page cache first (both sides of a comparison alike)
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; "$@"; }

rm -rf "$DATA" "$WORK/src" "$WORK/tree" && mkdir -p "$WORK/src"
echo "generating data in $WORK ..." >&2
"$RB" gen "$WORK/src/big.bin" "$BIG" 1
"$RB" gen "$WORK/src/a.bin" "$DEDUP" 2
"$RB" mutate "$WORK/src/a.bin" "$WORK/src/b.bin" $((256 << 20)) $((8 << 20)) 3
"$RB" small "$WORK/src/small" "$SMALL" 4
"$RB" mkns "$DATA" "$TREE" 1000 >/dev/null   # bench/: TREE files for ls -lR
mkdir -p "$WORK/tree"; for d in $(seq 0 $(( (TREE - 1) / 1000 ))); do mkdir -p "$WORK/tree/d$d"; (cd "$WORK/tree/d$d" && seq 0 999 | sed 's/^/f/' | xargs touch); done

start_node "$DATA" "$MNT"
"$K" import --data "$DATA" "$WORK/src/big.bin" big.bin >/dev/null
"$K" import --data "$DATA" "$WORK/src/a.bin" a.bin >/dev/null
"$K" import --data "$DATA" "$WORK/src/b.bin" b.bin >/dev/null
"$K" import --data "$DATA" "$WORK/src/small" small >/dev/null
PACK=$("$K" stat --data "$DATA" --json big.bin | sed -n 's/.*"whole_file_pack": "\(.*\)".*/\1/p')
[ -n "$PACK" ] || { echo "big.bin has no whole-file pack"; exit 1; }

# Warm everything once.
cat "$PACK" "$MNT/big.bin" "$MNT/a.bin" "$MNT/b.bin" >/dev/null
"$RB" extents "$MNT/b.bin" >/dev/null; "$RB" tree "$MNT/small" >/dev/null; "$RB" tree "$WORK/src/small" >/dev/null

BEXT=$("$RB" extents "$MNT/b.bin" | grep -o 'extents=[0-9]* packs=[0-9]*' | sed 's/extents=\([0-9]*\) packs=\([0-9]*\)/\1 extents in \2 packs/')
echo "measuring ..." >&2
pack=$(median GBps "$RB" seq "$PACK")
pt=$(median GBps "$RB" seq "$MNT/big.bin")
bigdirect=$(READBENCH_DIRECT=1 median GBps "$RB" seq "$MNT/big.bin")
ext=$(median GBps "$RB" extents "$MNT/b.bin")
dd=$(median GBps "$RB" seq "$MNT/b.bin")
dddirect=$(READBENCH_DIRECT=1 median GBps "$RB" seq "$MNT/b.bin")
# Cold runs alternate between the two sides, so that load from other
# processes on the machine falls on both alike.
med() { sort -g "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cold_pair() { # FIELD "CMD A" "CMD B" -> median A, median B
	: >"$WORK/pa"; : >"$WORK/pb"
	for _ in $(seq "$RUNS"); do
		cold $2 | grep -o "$1=[0-9.]*" | cut -d= -f2 >>"$WORK/pa"
		cold $3 | grep -o "$1=[0-9.]*" | cut -d= -f2 >>"$WORK/pb"
	done
	echo "$(med "$WORK/pa") $(med "$WORK/pb")"
}
read -r cpack cpt < <(cold_pair GBps "$RB seq $PACK" "$RB seq $MNT/big.bin")
read -r cext cdd < <(cold_pair GBps "$RB extents $MNT/b.bin" "$RB seq $MNT/b.bin")
sm_ext4=$(median files_per_s "$RB" tree "$WORK/src/small")
sm_mnt=$(median files_per_s "$RB" tree "$MNT/small")
sm_ext4_gb=$(median GBps "$RB" tree "$WORK/src/small")
sm_mnt_gb=$(median GBps "$RB" tree "$MNT/small")
ls_first=$(secs ls -lR "$MNT/bench" | cut -d= -f2)
ls_mnt=$(median seconds secs ls -lR "$MNT/bench")
ls_ext4=$(median seconds secs ls -lR "$WORK/tree")
find_mnt=$(median seconds secs find "$MNT/bench")
find_ext4=$(median seconds secs find "$WORK/tree")
# Small files on the first access after a node start (kernel caches of the
# mount empty, packs in the page cache).
: >"$WORK/first.txt"
for _ in $(seq "$RUNS"); do
	stop_node; start_node "$DATA" "$MNT"
	"$RB" tree "$MNT/small" | grep -o "files_per_s=[0-9.]*" | cut -d= -f2 >>"$WORK/first.txt"
done
sm_first=$(sort -g "$WORK/first.txt" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
# The daemon path for the contiguous file (passthrough off), O_DIRECT.
stop_node; start_node "$DATA" "$MNT" --no-passthrough
cat "$MNT/big.bin" >/dev/null
nopt=$(median GBps "$RB" seq "$MNT/big.bin")
stop_node

# Node memory per file: a namespace of MILLION files, idle and after every
# file was looked up (find), with the Go heap collected.
MD=$WORK/mdata MM=$WORK/mmnt
rm -rf "$MD"; "$RB" mkns "$MD" "$MILLION" 1000 >/dev/null
start_node "$MD" "$MM"
mem() { "$K" node --data "$MD" --gc --json | grep -o "\"$1\": [0-9]*" | grep -o '[0-9]*$'; }
heap0=$(mem heap_bytes); rss0=$(mem rss_bytes)
find "$MM" -type f | wc -l >/dev/null
heap1=$(mem heap_bytes); rss1=$(mem rss_bytes)
sync; echo 2 >/proc/sys/vm/drop_caches; sleep 2
heap2=$(mem heap_bytes); rss2=$(mem rss_bytes)
stop_node

cat <<EOF2
Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, kernel $(uname -r), $(df -T "$WORK" | awk 'NR==2 {print $2}') on $(df "$WORK" | awk 'NR==2 {print $1}').
Command: \`bash test/bench/fuse.sh\` (RUNS=$RUNS; median of $RUNS runs; warm page cache on both sides unless said otherwise), $(date -u +%Y-%m-%d).

| benchmark | through the mount | direct | ratio (goal) |
|---|---|---|---|
| contiguous $((BIG >> 20)) MiB file, sequential 1 MiB reads (passthrough) | $pt GB/s | $pack GB/s (its pack file) | $(ratio "$pt" "$pack")x (>= 0.9x) |
| same, cold (page cache dropped before each run) | $cpt GB/s | $cpack GB/s | $(ratio "$cpt" "$cpack")x (>= 0.9x) |
| same file, served by the node (\`--no-passthrough\`, warm FUSE cache) | $nopt GB/s | $pack GB/s | $(ratio "$nopt" "$pack")x |
| same file, O_DIRECT through the mount (every read reaches the node) | $bigdirect GB/s | $pack GB/s | $(ratio "$bigdirect" "$pack")x |
| deduplicated $((DEDUP >> 20)) MiB file, $BEXT, 1 MiB reads | $dd GB/s | $ext GB/s (its extents from the packs) | $(ratio "$dd" "$ext")x (>= 0.6x) |
| same, cold (page cache dropped before each run) | $cdd GB/s | $cext GB/s | $(ratio "$cdd" "$cext")x (>= 0.6x) |
| same file, O_DIRECT through the mount (every read reaches the node) | $dddirect GB/s | $ext GB/s | $(ratio "$dddirect" "$ext")x |
| $SMALL small files (4-64 KiB), open+read+close, warm | $sm_mnt files/s ($sm_mnt_gb GB/s) | $sm_ext4 files/s ($sm_ext4_gb GB/s) on ext4 | $(ratio "$sm_mnt" "$sm_ext4")x |
| same, first access after a node start | $sm_first files/s | $sm_ext4 files/s | $(ratio "$sm_first" "$sm_ext4")x |
| \`ls -lR\` over $TREE entries (first run after start: ${ls_first}s) | ${ls_mnt}s | ${ls_ext4}s on ext4 | |
| \`find\` over the same | ${find_mnt}s | ${find_ext4}s on ext4 | |

Node memory, namespace of $MILLION files (Go heap after a GC / resident set):

| state | heap | RSS | per file |
|---|---|---|---|
| idle, nothing looked up | $((heap0 >> 20)) MiB | $((rss0 >> 20)) MiB | $(( heap0 / MILLION )) B |
| after \`find\` (every file known to the kernel) | $((heap1 >> 20)) MiB | $((rss1 >> 20)) MiB | $(( (heap1 - heap0) / MILLION )) B heap, $(( (rss1 - rss0) / MILLION )) B RSS |
| after the kernel forgot them (drop_caches) | $((heap2 >> 20)) MiB | $((rss2 >> 20)) MiB | $(( (heap2 - heap0) / MILLION )) B |
EOF2
