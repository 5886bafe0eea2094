#!/usr/bin/env bash
# One page-cache policy on the GPU machine (docs/design/gpuio.md, docs/bench.md
# "One page-cache policy"): cold and repeated kylix load, --io direct vs auto.
# Run from the repository root after make gpu-build, carrying .gpu.
set -u
k=$PWD/.gpu/kylix
D=${D:-/tmp/kylix-cachepolicy}; M=$D.model
rm -rf "$D" "$M"
nvidia-smi -L
t0=$(date +%s)
$k demo-model --size "${SIZE:-8GiB}" "$M" >/dev/null || exit 1
$k import --data "$D" "$M/base" models/m >/dev/null || exit 1
rm -rf "$M"
echo "setup $(( $(date +%s) - t0 )) s"; grep MemAvailable /proc/meminfo
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
one() { $k load --data "$D" --device cuda:0 --io "$1" --json models/m | python3 -c 'import json,sys; r=json.load(sys.stdin); print(sys.argv[1], sys.argv[2], "%.2f GB/s" % r["gb_per_s"], r["files"][0]["io"], "|", r.get("cache_policy",""))' "$1" "$2"; }
for round in 1 2 3; do
  for mode in direct auto; do
    drop; one "$mode" cold; one "$mode" repeat1; one "$mode" repeat2
  done
done
echo "-- pinned H2D limit"
python3 - <<'PY'
import torch, time
n = 4 << 30
h = torch.empty(n, dtype=torch.uint8).pin_memory(); d = torch.empty(n, dtype=torch.uint8, device="cuda")
for _ in range(2): d.copy_(h, non_blocking=True); torch.cuda.synchronize()
ts = []
for _ in range(5):
    t = time.perf_counter(); d.copy_(h, non_blocking=True); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
ts.sort(); print("pinned H2D %.1f GB/s (median of 5, 4 GiB)" % (n / ts[2] / 1e9))
PY
rm -rf "$D"
