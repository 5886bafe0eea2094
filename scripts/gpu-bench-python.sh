#!/usr/bin/env bash
# kylix.torch.load_file (node GPU fill through the client socket) vs
# safetensors.torch.load_file, both reading the same files through the mount,
# plus the raw O_DIRECT bandwidth of the packs, cold and warm, side by side in
# one run (issue 8). Run ON the GPU machine from the repository root after
# `make build gpu-build`; carry bin and .gpu. Results: stdout.
set -uo pipefail
export PYTHONUNBUFFERED=1
k=$PWD/.gpu/kylix
size=${SIZE:-4GiB}; reps=${REPS:-3}
work=$(mktemp -d /var/tmp/kylix-pybench.XXXX)
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$work"' EXIT
export KYLIX_DATA=$work/data
$k demo-model --size "$size" "$work/src" >/dev/null
$k import "$work/src/base" m | tail -1
setsid $k serve --mount "$work/mnt" --client-socket "$work/client.sock" > "$work/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -f "$work/mnt/m/config.json" ] && break; sleep 0.1; done
[ -f "$work/mnt/m/config.json" ] || { cat "$work/serve.log"; exit 1; }
files=$(ls "$work"/mnt/m/*.safetensors)
packs=$(for f in $files; do $k stat --json "m/$(basename "$f")" | python3 -c 'import json,sys; [print(e["pack_path"]) for e in json.load(sys.stdin)["extents"]]'; done | sort -u)
# First opens pay the pack check once (docs/design/verification.md); do it
# before timing, as a node that has served the model before would have.
cat $files > /dev/null
if [ -n "${WARM_ONLY:-}" ]; then
  echo "== warm"; python3 contrib/python/bench_load.py --device cuda:0 --repeat $reps $files; exit
fi
echo "== raw O_DIRECT of the packs (kylix bench-read), cold"
for i in $(seq 1 $reps); do sync; echo 3 > /proc/sys/vm/drop_caches; $k bench-read --json $packs | python3 -c 'import json,sys; d=json.load(sys.stdin); print("  raw O_DIRECT", round(d["gb_per_s"],2), "GB/s")'; done
echo "== cold"
python3 contrib/python/bench_load.py --device cuda:0 --repeat $reps --cold $files
echo "== warm"
python3 contrib/python/bench_load.py --device cuda:0 --repeat $reps --tp 2 $files
echo "== pinned H2D"
python3 -c '
import torch, statistics
x = torch.empty(1 << 30, dtype=torch.uint8).pin_memory(); y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
r = []
for i in range(8):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); y.copy_(x, non_blocking=True); b.record(); b.synchronize()
    if i >= 2: r.append((1 << 30) / (a.elapsed_time(b) / 1e3) / 1e9)
print("  pinned H2D", round(statistics.median(r), 1), "GB/s")'
