#!/usr/bin/env bash
# Push on import through the CLI (docs/bench.md, "Push on import (peers)"):
# the time until `kylix import` of a SIZE_MIB random file returns on a
# member of three real `kylix serve` processes (R = 2, loopback
# 127.0.0.76-78: the chunks are streamed to their owners while the import
# reads), vs the same import into a store with no node running. A fresh
# file each time; the two interleaved, COUNT rounds (default 3); medians.
# Needs bin/kylix (make build), root and FUSE.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${COUNT:-3}
size=${SIZE_MIB:-256}
k=$PWD/bin/kylix
out=$(mktemp -d /var/tmp/kylix-push-bench.XXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	for m in "$out"/m*/mnt; do umount -l "$m" 2>/dev/null || true; done
	rm -rf "$out"
}
trap cleanup EXIT
$k cluster-key > "$out/key"
chmod 600 "$out/key"
first=""
for i in 0 1 2; do
	ip=127.0.0.7$((6 + i))
	d=$out/m$i
	mkdir -p "$d/data" "$d/mnt"
	port=$((47600 + i))
	args=(serve --data "$d/data" --mount "$d/mnt" --listen "$ip:$port" --cluster-key "$out/key" --node-name "$ip")
	[ -n "$first" ] && args+=(--join "$first")
	$k "${args[@]}" > "$d/log" 2>&1 &
	pids+=($!)
	[ -z "$first" ] && first=$ip:$port
	for _ in $(seq 200); do [ -S "$d/data/kylix.sock" ] && break; sleep 0.1; done
done
alive() { $k peers --data "$out/m$1/data" --json | python3 -c 'import json,sys; print(sum(m["state"]=="alive" for m in json.load(sys.stdin)["members"]))'; }
for _ in $(seq 750); do
	[ "$(alive 0)" = 3 ] && [ "$(alive 1)" = 3 ] && [ "$(alive 2)" = 3 ] && break
	sleep 0.1
done
[ "$(alive 0)" = 3 ] || { echo "the members did not see each other"; cat "$out"/m*/log; exit 1; }
mkdir -m 700 "$out/alone"
: > "$out/times"
for r in $(seq "$count"); do
	for mode in cluster alone; do
		head -c "${size}M" /dev/urandom > "$out/src.bin"
		data=$out/m0/data
		[ $mode = alone ] && data=$out/alone
		s=$(date +%s.%N)
		$k import --data "$data" "$out/src.bin" "b/$r.bin" > /dev/null 2> "$out/err"
		e=$(date +%s.%N)
		if [ -s "$out/err" ]; then echo "stderr of the import: $(cat "$out/err")"; fi
		echo "$mode $(python3 -c "print(f'{$e-$s:.2f}')")" | tee -a "$out/times"
	done
done
$k stat --data "$out/m0/data" "b/$count.bin" | grep -E 'replicas|under-replicated'
python3 - "$out/times" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    m, s = line.split()
    t.setdefault(m, []).append(float(s))
for m, v in t.items():
    print(f"{m}: median {statistics.median(v):.2f} s of {', '.join(f'{x:.2f}' for x in v)}")
PY
