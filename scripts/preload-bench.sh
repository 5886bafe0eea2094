#!/usr/bin/env bash
# CPU benchmark of the LD_PRELOAD shim (docs/design/preload.md,
# docs/bench.md "LD_PRELOAD shim"): warm sequential reads (4 MiB
# readinto, page cache) of a file through the shim, through FUSE, and of
# its backing file (the source on the same disk), for a contiguous file
# and a deduplicated fine-tune shard; median of REPEATS runs each. Then
# how much of the fine-tune's mmap the shim maps vs copies.
# Needs root and /dev/fuse, bin/kylix and bin/libkylix_preload.so (make build).
# Usage: scripts/preload-bench.sh [SIZE_MIB (512)] [REPEATS (5)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-512}
REPEATS=${2:-5}
BIN=$PWD/bin
SHIM=$BIN/libkylix_preload.so
[ -x "$BIN/kylix" ] && [ -f "$SHIM" ] || { echo "run make build first" >&2; exit 1; }
tmp=$(mktemp -d /tmp/preload-bench.XXXXXX)
node=""
cleanup() {
  [ -n "$node" ] && kill "$node" 2>/dev/null && wait "$node" 2>/dev/null || true
  grep -q " $tmp/mnt " /proc/self/mountinfo && umount -l "$tmp/mnt" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/src" "$tmp/mnt"
head -c $((SIZE << 20)) /dev/urandom > "$tmp/src/contiguous.bin"
"$BIN/kylix" demo-model --size "${SIZE}MiB" "$tmp/model" >/dev/null
cp -r "$tmp/model/base" "$tmp/model/finetuned" "$tmp/src/"
"$BIN/kylix" import --data "$tmp/data" "$tmp/src" m >/dev/null
"$BIN/kylix" serve --data "$tmp/data" --mount "$tmp/mnt" --client-socket "$tmp/client.sock" >"$tmp/node.log" 2>&1 &
node=$!
for _ in $(seq 300); do [ -S "$tmp/client.sock" ] && [ -e "$tmp/mnt/m/contiguous.bin" ] && break; sleep 0.1; done
ft=$(cd "$tmp/src" && ls -S finetuned/*.safetensors | head -1)

read_py='import sys, time
buf = bytearray(4 << 20); n = 0
t = time.perf_counter()
with open(sys.argv[1], "rb", buffering=0) as f:
    while True:
        k = f.readinto(buf)
        if not k: break
        n += k
print(n / (time.perf_counter() - t) / 1e9)'
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rate() { # rate LABEL FILE [LD_PRELOAD]
  local r=()
  for _ in $(seq "$REPEATS"); do r+=("$(LD_PRELOAD=${3:-} /usr/bin/python3 -c "$read_py" "$2")"); done
  printf '%s\n' "${r[@]}" | median
}
echo "machine: $(nproc) cores, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "file sizes: contiguous $(stat -c %s "$tmp/src/contiguous.bin") B, fine-tune shard $ft $(stat -c %s "$tmp/src/$ft") B; $REPEATS runs, warm, median GB/s"
# "backing": the import's source file on the same disk; "pack": the
# contiguous file's own pack file (what the shim reads), by root.
pack=$("$BIN/kylix" stat --data "$tmp/data" --json m/contiguous.bin | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["extents"][0]["pack_path"])')
printf '%-34s %8s %8s %8s %8s %10s\n' file backing pack fuse shim shim/back
for f in contiguous.bin "$ft"; do
  p=-; [ "$f" = contiguous.bin ] && p=$pack
  for _ in 1 2; do   # warm the page cache: source, pack, mount, shim
    cat "$tmp/src/$f" "$tmp/mnt/m/$f" >/dev/null; [ "$p" = - ] || cat "$p" >/dev/null
    LD_PRELOAD=$SHIM cat "$tmp/mnt/m/$f" >/dev/null
  done
  b=$(rate x "$tmp/src/$f"); k=-; [ "$p" = - ] || k=$(printf %.2f "$(rate x "$p")")
  u=$(rate x "$tmp/mnt/m/$f"); s=$(rate x "$tmp/mnt/m/$f" "$SHIM")
  printf '%-34s %8.2f %8s %8.2f %8.2f %9.2fx\n' "${f##*/}" "$b" "$k" "$u" "$s" "$(echo "$s / $b" | bc -l)"
done
echo "mmap composition (python mmap of every fine-tune and base shard under the shim):"
for d in base finetuned; do
  for f in "$tmp/mnt/m/$d"/*.safetensors; do
    KYLIX_PRELOAD_STATS=$tmp/st.json LD_PRELOAD=$SHIM /usr/bin/python3 -c 'import mmap, sys
f = open(sys.argv[1], "rb"); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); m[-1]; m.close()' "$f"
    echo "  $d/${f##*/}: $(cat "$tmp/st.json")"
    rm -f "$tmp/st.json"
  done
done
