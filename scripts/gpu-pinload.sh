#!/usr/bin/env bash
# kylix load of a pinned model through the node, against the same load
# unpinned (warm page cache) and a pinned host-to-device copy (issue 22,
# item 1; docs/design/gpuio.md, "kylix load of pinned models"). Run ON the
# GPU machine from the repository root after `make gpu-build` (static
# binaries in .gpu/); no Go needed. With the device tool:
#   run(command="bash scripts/gpu-pinload.sh", carry=[".gpu"])
# A demo model of SIZE (default 4GiB) is imported and served; then, side by
# side, REPS (default 3) loads each: `kylix load --device cuda:0` of the
# warm, unpinned model (each a fresh loader in the node), the same after
# `kylix pin` (copies from the pinned, registered pages), and torch's
# pinned H2D copy of as many bytes. The first pinned load checks every byte
# (--check). Ends with "PINLOAD GPU PASSED" or "PINLOAD GPU FAILED".
set -uo pipefail
out=${OUT:-/tmp/kylix-pinload-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
size=${SIZE:-4GiB}
reps=${REPS:-3}
die() { echo "FAILED: $*"; echo; echo "PINLOAD GPU FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
python3 -c 'import torch; assert torch.cuda.is_available()' || die "python3 with torch (CUDA) is needed"
nvidia-smi -L 2>/dev/null

work=$(mktemp -d /var/tmp/kylix-pinload.XXXX)
export KYLIX_DATA=$work/data
mnt=$work/mnt
node=
cleanup() {
  if [ -n "$node" ] && kill -0 "$node" 2>/dev/null; then
    kill -TERM "$node"; for _ in $(seq 1 100); do kill -0 "$node" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$node" 2>/dev/null
  fi
  umount -l "$mnt" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

$k demo-model --size "$size" "$work/src" | tail -1 || die "demo-model"
$k import "$work/src/base" models/base | tail -1 || die "import"
mkdir -p "$mnt"
setsid $k serve --mount "$mnt" --gpu-idle 120s --pin-budget 50% > "$out/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -f "$mnt/models/base/config.json" ] && break; sleep 0.1; done
[ -f "$mnt/models/base/config.json" ] || { cat "$out/serve.log"; die "the node did not come up"; }
$k warm models/base | tail -1 || die "warm"

gbps() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.2f %s" % (r["gb_per_s"], ";".join(sorted({f["io"] for f in r["files"]}))))' "$1"; }
: > "$out/unpinned.txt"; : > "$out/pinned.txt"
for i in $(seq 1 "$reps"); do
  $k load --device cuda:0 --json models/base > "$out/u$i.json" || die "load"
  gbps "$out/u$i.json" | tee -a "$out/unpinned.txt"
done
$k pin models/base | tail -2 || die "pin"
$k load --device cuda:0 --check --json models/base > "$out/check.json" || die "load --check of the pinned model"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert all(f.get("checked") for f in r["files"]), "not every file compared"' "$out/check.json" || die "--check"
for i in $(seq 1 "$reps"); do
  $k load --device cuda:0 --json models/base > "$out/p$i.json" || die "load"
  gbps "$out/p$i.json" | tee -a "$out/pinned.txt"
done
bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$out/p1.json")
python3 - "$bytes" "$reps" "$out/unpinned.txt" "$out/pinned.txt" <<'PY' || die "summary"
import statistics, sys, time, torch
n, reps = int(sys.argv[1]), int(sys.argv[2])
x = torch.empty(n, dtype=torch.uint8).pin_memory(); y = torch.empty(n, dtype=torch.uint8, device="cuda:0")
y.copy_(x, non_blocking=True); torch.cuda.synchronize()
ts = []
for _ in range(reps):
    t = time.perf_counter(); y.copy_(x, non_blocking=True); torch.cuda.synchronize(); ts.append(n / (time.perf_counter() - t) / 1e9)
h2d = statistics.median(ts)
med = lambda p: statistics.median(float(l.split()[0]) for l in open(p) if l.strip())
u, p = med(sys.argv[3]), med(sys.argv[4])
print(f"pinned H2D {h2d:.2f} GB/s ({', '.join('%.2f' % t for t in ts)})")
print(f"kylix load, warm, unpinned {u:.2f} GB/s = {u/h2d:.2f}x pinned H2D")
print(f"kylix load, pinned {p:.2f} GB/s = {p/h2d:.2f}x pinned H2D ({p/u:.2f}x unpinned)")
PY
grep -q pinned "$out/pinned.txt" || die "the pinned loads did not copy from pinned pages"
echo; echo "PINLOAD GPU PASSED"
