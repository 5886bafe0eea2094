#!/usr/bin/env bash
# The storage-to-GPU benchmark, run ON the GPU machine after `make gpu-build`
# (device tool: run(command="bash scripts/gpu-bench.sh", carry=[".gpu"])).
# One run measures side by side, cold (page cache dropped) and warm:
#   the disk's raw parallel O_DIRECT bandwidth (kylix bench-read, io_uring, depth 32)
#   kylix load (path auto) and safetensors.torch.load_file(device="cuda:0")
#   the pinned host-to-device bandwidth (torch, 1 GiB, events)
# Results: a table at the end and JSON lines in $OUT/bench.jsonl.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
size=${SIZE:-8GiB}; reps=${REPS:-3}; wreps=${WREPS:-5}
out=${OUT:-/tmp/kylix-bench-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
work=${WORK:-/var/tmp/kylix-bench}
export KYLIX_DATA=$work/data
j=$out/bench.jsonl; : > "$j"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# kload LABEL STATE RUN ARGS...: kylix load --json (several passes with --repeat), one record per pass
kload() {
  local label=$1 state=$2 run=$3; shift 3
  $k load --json --device cuda:0 "$@" models/big > "$out/kload.json" || { echo "kylix load $* failed"; return; }
  python3 - "$out/kload.json" "$label" "$state" "$run" >> "$j" <<'PY'
import json, sys
text = open(sys.argv[1]).read(); dec = json.JSONDecoder(); i = 0; n = 0
while i < len(text):
    while i < len(text) and text[i].isspace(): i += 1
    if i >= len(text): break
    d, i = dec.raw_decode(text, i); n += 1
    label = sys.argv[2] if n == 1 else sys.argv[2] + "-pass2+"
    r = {"gb_per_s": d["gb_per_s"], "seconds": d["seconds"], "bytes": d["bytes"], "path": d["data_path"],
         "io": sorted({f["io"] for f in d["files"]}), "verified_on": sorted({f.get("verified_on", "") for f in d["files"]})}
    print(json.dumps({"what": label, "state": sys.argv[3], "run": int(sys.argv[4]) * 10 + n, "r": r}))
PY
}
rec() { echo "{\"what\":\"$1\",\"state\":\"$2\",\"run\":$3,\"r\":$(echo "$4" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))')}" >> "$j"; }
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
$k doctor > "$out/doctor.txt"; tail -12 "$out/doctor.txt"
if [ ! -d "$work/src/base" ]; then
  t0=$SECONDS; $k demo-model --size "$size" "$work/src" | head -1
  $k import "$work/src/base" models/big | head -2
  echo "setup took $((SECONDS - t0)) s"
fi
packs=$(for f in $($k ls --json models/big | python3 -c 'import json,sys; [print(e["name"]) for e in json.load(sys.stdin) if e["name"].endswith(".safetensors")]'); do
  $k stat --json "models/big/$f" | python3 -c 'import json,sys; [print(e["pack_path"]) for e in json.load(sys.stdin)["extents"]]'; done | sort -u)
srcs=$(ls $work/src/base/*.safetensors)
echo "packs: $(echo $packs | wc -w), sources: $(echo $srcs | wc -w)"
cat > "$out/h2d.py" <<'PY'
import json, statistics, torch
x = torch.empty(1 << 30, dtype=torch.uint8).pin_memory(); y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
r = []
for i in range(12):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); y.copy_(x, non_blocking=True); b.record(); b.synchronize()
    if i >= 2: r.append((1 << 30) / (a.elapsed_time(b) / 1e3) / 1e9)
print(json.dumps({"gb_per_s": statistics.median(r)}))
PY
for i in $(seq 1 $reps); do
  drop; r=$($k bench-read --json $packs); rec raw-odirect cold $i "$r"
  drop; kload kylix cold $i
  drop; r=$(python3 "$here/st_load.py" $srcs); rec safetensors cold $i "$r"
  echo "cold run $i done"
done
echo "BLAKE3 on all cores (in memory):"; ./.gpu/chunkstore.test -test.run '^$' -test.bench SumParallel -test.benchtime 2s | grep Sum
cat $packs > /dev/null; cat $srcs > /dev/null
for i in 1 2; do r=$(python3 "$out/h2d.py"); rec pinned-h2d warm $i "$r"; done
for i in $(seq 1 $wreps); do
  kload kylix warm $i --repeat 2
  kload kylix-mapped warm $i --io mapped --repeat 3
done
r=$(python3 "$out/h2d.py"); rec pinned-h2d warm 3 "$r"
kload kylix-cpuverify warm 1 --verify-on cpu
kload kylix-noverify warm 1 --no-verify
for i in $(seq 1 3); do r=$(python3 "$here/st_load.py" $srcs); rec safetensors warm $i "$r"; done
python3 - "$j" <<'PY'
import json, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line); rows.setdefault((d["what"], d["state"]), []).append(d["r"])
med = {k: st.median(r["gb_per_s"] for r in v) for k, v in rows.items()}
print("\n| what | state | runs | median GB/s | all runs | path |")
print("|---|---|---|---|---|---|")
for (w, s), v in rows.items():
    runs = ", ".join("%.2f" % r["gb_per_s"] for r in v)
    print("| %s | %s | %d | %.2f | %s | %s %s |" % (w, s, len(v), med[(w, s)], runs, v[0].get("path", ""), v[0].get("io", "")))
raw, h2d = med.get(("raw-odirect","cold")), med.get(("pinned-h2d","warm"))
kc, kw = med.get(("kylix","cold")), med.get(("kylix","warm"))
print(f"\ncold: kylix / raw O_DIRECT = {kc/raw:.3f}  (goal >= 0.9); safetensors / raw = {med[('safetensors','cold')]/raw:.3f}")
print(f"warm: kylix = {kw:.1f} GB/s (goal >= 40), kylix / pinned H2D ({h2d:.1f}) = {kw/h2d:.3f} (goal >= 0.75); safetensors warm {med[('safetensors','warm')]:.2f} GB/s")
k2 = med.get(("kylix-mapped-pass2+", "warm"))
if k2: print(f"warm, --io mapped, pack mapping already registered (passes 2+ in one process): {k2:.1f} GB/s = {k2/h2d:.3f} of pinned H2D")
PY
echo; echo "== through the mount: safetensors.load_file, mount vs local disk"; bash scripts/gpu-bench-mount.sh
