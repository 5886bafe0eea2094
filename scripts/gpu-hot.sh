#!/usr/bin/env bash
# Warm loads into fresh processes with and without hot files (issue 22,
# item 1; docs/design/pin.md, "Hot files"), side by side with the pinned
# host-to-device limit, in one run. Run ON the GPU machine from the
# repository root after `make gpu-build` here (static binaries in .gpu/);
# no Go needed. With the device tool:
#   run(command="bash scripts/gpu-hot.sh", carry=[".gpu"])
# A demo model of SIZE (default 8GiB) is imported. Then, for a node started
# with --hot-budget 0 (before hot files) and one with the default budget:
# the model is read into the page cache, loaded once (with hot files this
# load makes the files hot; the script waits until kylix node lists them
# all), and then REPS times (default 5) each: `kylix load --device cuda:0`
# (a fresh loader in the node) and kylix.torch.load_file in a fresh Python
# process (GPU fills through the client socket); then the same after kylix
# pin (loads skip hashing what was verified when pinned). Medians; every hot load is
# checked byte for byte once (kylix load --check). Ends with "HOT GPU
# PASSED" or "HOT GPU FAILED".
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/kylix-hot-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
size=${SIZE:-8GiB}
reps=${REPS:-5}
die() { echo "FAILED: $*"; echo; echo "HOT GPU FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
python3 -c 'import torch; assert torch.cuda.is_available()' || die "python3 with torch (CUDA) is needed"
nvidia-smi -L 2>/dev/null

work=$(mktemp -d /var/tmp/kylix-hot.XXXX)
export KYLIX_DATA=$work/data
mnt=$work/mnt
sock=$work/client.sock
. scripts/lib/node.sh
trap 'stop_node; rm -rf "$work"' EXIT

$k demo-model --size "$size" "$work/src" | tail -1 || die "demo-model"
$k import "$work/src/base" models/base | tail -1 || die "import"
mkdir -p "$mnt"

start() { # extra serve flags: the mount and the client socket both up
  start_node "$mnt/models/base/config.json" --client-socket "$sock" "$@"
  for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || die "no client socket at $sock"
  cat "$mnt"/models/base/*.safetensors > /dev/null # warm, and the first opens' pack checks
}
gbps() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.2f %s" % (r["gb_per_s"], ";".join(sorted({f["io"] for f in r["files"]}))))' "$1"; }
torch_load() { # one fresh process: GB/s of kylix.torch.load_file of every shard
  python3 - "$mnt"/models/base/*.safetensors <<'PY'
import sys, time, torch
sys.path.insert(0, "contrib/python")
import kylix.torch as kt
torch.empty(1, device="cuda:0"); torch.cuda.synchronize()
t = time.perf_counter(); n = 0
for f in sys.argv[1:]:
    for v in kt.load_file(f, device="cuda:0").values():
        n += v.numel() * v.element_size()
torch.cuda.synchronize()
info = kt.last_load_info()
print("%.2f %s" % (n / (time.perf_counter() - t) / 1e9, (info.get("node_path") or {}).get("io", "not a node fill: %s" % info.get("node_error"))))
PY
}
run_set() { # name
  local name=$1
  : > "$out/$name-load.txt"; : > "$out/$name-torch.txt"
  for i in $(seq 1 "$reps"); do
    $k load --device cuda:0 --json models/base > "$out/$name-l$i.json" || die "kylix load ($name)"
    gbps "$out/$name-l$i.json" | tee -a "$out/$name-load.txt"
    torch_load | tee -a "$out/$name-torch.txt" || die "kylix.torch.load_file ($name)"
  done
}

echo "== before: --hot-budget 0"
start --hot-budget 0
$k load --device cuda:0 --json models/base > /dev/null || die "first load"
run_set off
stop_node

echo "== hot files (default --hot-budget)"
start
$k load --device cuda:0 --json models/base > "$out/first.json" || die "first load"
echo "first load: $(gbps "$out/first.json")"
nfiles=$(ls "$mnt"/models/base/*.safetensors | wc -l)
for _ in $(seq 1 600); do
  n=$($k node --json | python3 -c 'import json,sys; print(sum(f["path"].endswith(".safetensors") for f in json.load(sys.stdin)["pins"]["hot"]["files"]))')
  [ "$n" -ge "$nfiles" ] && break; sleep 0.1
done
$k node | sed -n '/^pins:/,$p'
[ "$n" -ge "$nfiles" ] || die "the node made $n of $nfiles shards hot"
$k load --device cuda:0 --check --json models/base > "$out/check.json" || die "load --check"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert all(f.get("checked") for f in r["files"]), "not every file compared"' "$out/check.json" || die "--check"
run_set hot
grep -q pinned "$out/hot-load.txt" || die "the hot loads did not copy from registered pages"

echo "== pinned (kylix pin: verified when pinned, loads skip hashing)"
$k pin models/base | tail -2 || die "pin"
run_set pin

bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$out/check.json")
python3 - "$bytes" "$reps" "$out" <<'PY' || die "summary"
import statistics, sys, time, torch
n, reps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
x = torch.empty(n, dtype=torch.uint8).pin_memory(); y = torch.empty(n, dtype=torch.uint8, device="cuda:0")
y.copy_(x, non_blocking=True); torch.cuda.synchronize()
ts = []
for _ in range(reps):
    t = time.perf_counter(); y.copy_(x, non_blocking=True); torch.cuda.synchronize(); ts.append(n / (time.perf_counter() - t) / 1e9)
h2d = statistics.median(ts)
def med(name):
    v = [float(l.split()[0]) for l in open(f"{out}/{name}.txt") if l.strip()]
    return statistics.median(v), ", ".join("%.2f" % x for x in v)
print(f"pinned H2D {h2d:.2f} GB/s ({', '.join('%.2f' % t for t in ts)})")
for what in ("load", "torch"):
    off, offs = med(f"off-{what}"); hot, hots = med(f"hot-{what}"); pin, pins = med(f"pin-{what}")
    label = "kylix load" if what == "load" else "kylix.torch.load_file, fresh process"
    print(f"{label}: before {off:.2f} GB/s ({offs}) = {off/h2d:.2f}x; hot {hot:.2f} GB/s ({hots}) = {hot/h2d:.2f}x pinned H2D ({hot/off:.2f}x before); pinned {pin:.2f} GB/s ({pins}) = {pin/h2d:.2f}x")
PY
echo; echo "HOT GPU PASSED"
