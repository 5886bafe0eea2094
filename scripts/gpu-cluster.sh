#!/usr/bin/env bash
# GPU loads on a cluster member that stores only part of a model (issue 9):
# the chunks stored on the other member are fetched inside the GPU pipeline
# (docs/design/gpuio.md, "Chunks stored elsewhere"). Run ON the GPU machine
# from the repository root after `make gpu-build` (static binaries in .gpu/);
# no Go needed. With the device tool:
#   run(command="bash scripts/gpu-cluster.sh", carry=[".gpu"]).
#
# 1. Two nodes on loopback (127.0.0.2, 127.0.0.3), one copy of each chunk
#    (--replicas 1), a demo model (SIZE, default 1GiB) imported on A: B
#    stores only the chunks it owns.
# 2. kylix load --device cuda:0 --check on B: every byte placed on the GPU,
#    copied back and compared; the chunks fetched during the load counted.
#    Then the next load on B: the chunks the first fetched were kept in B's
#    peer cache, so it reads them there (counted as "local copy").
# 3. The Python package's load_file through B's mount, whose node fills the
#    GPU (client socket op FILL): bitwise equal to safetensors' load of the
#    source files, and the bytes came from the node's fill.
# 4. The bytes B fetched stay out of its packs (kylix stat: local bytes as
#    before).
# Ends with "CLUSTER GPU PASSED" or "CLUSTER GPU FAILED".
set -uo pipefail
out=${OUT:-/tmp/kylix-cluster-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
size=${SIZE:-1GiB}
fail=0
step() { echo; echo "== $*"; }
die() { echo "FAILED: $*"; echo; echo "CLUSTER GPU FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
# DEVICE=host NO_TORCH=1 runs steps 1, 2 and 4 on a machine without a GPU
# (a check of this script).
dev=${DEVICE:-cuda:0}
[ -n "${NO_TORCH:-}" ] || python3 -c 'import torch, safetensors; assert torch.cuda.is_available()' \
  || die "python3 with torch (CUDA) and safetensors is needed"

work=$(mktemp -d /var/tmp/kylix-cluster.XXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  umount -l "$work/a/mnt" "$work/b/mnt" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
$k cluster-key > "$work/key" && chmod 600 "$work/key" || die "cluster-key"

# start NAME IP [JOIN]: a member with its own data, mount and client socket.
start() {
  local d=$work/$1
  mkdir -p "$d/data" "$d/mnt"
  local join=()
  [ -n "${3:-}" ] && join=(--join "$3")
  setsid $k serve --data "$d/data" --mount "$d/mnt" --client-socket "$d/client.sock" \
    --listen "$2:7946" --node-name "$1" --cluster-key "$work/key" --replicas 1 "${join[@]}" \
    > "$out/serve-$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do [ -S "$d/client.sock" ] && break; sleep 0.1; done
  [ -S "$d/client.sock" ] || { cat "$out/serve-$1.log"; die "node $1 did not come up"; }
}

step "two members, one copy of each chunk; a $size model imported on A"
start a 127.0.0.2
start b 127.0.0.3 127.0.0.2:7946
$k demo-model --size "$size" "$work/src" | tail -1 || die "demo-model"
$k import --data "$work/a/data" "$work/src/base" models/base | tail -1 || die "import on A"
for _ in $(seq 1 600); do [ -f "$work/b/mnt/models/base/config.json" ] && break; sleep 0.1; done
[ -f "$work/b/mnt/models/base/config.json" ] || die "the model never appeared in B's mount"
$k peers --data "$work/b/data"
# b_local: B's local bytes and the model's size, over the model's files.
b_local() {
  for f in "$work/src/base"/*; do
    $k stat --data "$work/b/data" --json "models/base/$(basename "$f")"
  done | python3 -c '
import json, sys
dec, s, objs = json.JSONDecoder(), sys.stdin.read(), []
i = 0
while i < len(s):
    if s[i].isspace():
        i += 1; continue
    o, i = dec.raw_decode(s, i); objs.append(o)
print(sum(o.get("local_bytes", 0) for o in objs), sum(o["size"] for o in objs))'
}
# Placement settles: B pulls the chunks it owns. Wait until two looks a
# second apart agree.
prev=
for _ in $(seq 1 120); do
  cur=$(b_local)
  [ -n "$prev" ] && [ "$cur" = "$prev" ] && break
  prev=$cur; sleep 1
done
echo "B stores (local bytes, size): $cur"
read -r local0 total <<< "$cur"
[ "${local0:-0}" -lt "${total:-0}" ] || die "B stores the whole model: nothing to fetch"

step "kylix load --device $dev --check on B"
$k load --data "$work/b/data" --device "$dev" --check --json models/base > "$out/load.json" 2> "$out/load.err" \
  || { cat "$out/load.err"; fail=1; }
python3 - "$out/load.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
print("device", r["device"], "path", r["data_path"], "bytes", r["bytes"], "GB/s %.2f" % r["gb_per_s"],
      "fetched chunks", r["fetched_chunks"], "fetched bytes", r["fetched_bytes"])
for f in r["files"]:
    print("  %-40s %s, %s, checked %s" % (f["path"], f["io"], f.get("verified_on", "NOT verified"), f.get("checked", False)))
ok = r["fetched_chunks"] > 0 and all(f.get("checked") for f in r["files"])
print("load on B:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY

step "the next load on B: the chunks fetched by the first were kept (peer cache), so it reads them here"
# Wait for the writers behind the first load (kylix peers: the cache's chunks).
for _ in $(seq 1 300); do
  n=$($k peers --data "$work/b/data" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["swarm"]["cache"]["chunks"])')
  kept=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kept_chunks"])' "$out/load.json")
  [ "$n" -ge "$kept" ] && break; sleep 0.1
done
$k load --data "$work/b/data" --device "$dev" --check --json models/base > "$out/load2.json" 2> "$out/load2.err" \
  || { cat "$out/load2.err"; fail=1; }
python3 - "$out/load.json" "$out/load2.json" <<'PY' || fail=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print("first load:  %.2f GB/s, %d chunks fetched, %d kept, %d not kept" % (a["gb_per_s"], a["fetched_chunks"], a.get("kept_chunks", 0), a.get("not_kept_chunks", 0)))
print("second load: %.2f GB/s, %d chunks from the copy, %d fetched" % (b["gb_per_s"], b.get("local_copy_chunks", 0), b["fetched_chunks"]))
# The first load's --check read back through the store, which keeps what
# it fetches too: the copy may hold more than the load kept.
local = b.get("local_copy_chunks", 0)
ok = local >= a.get("kept_chunks", 0) > 0 and local + b["fetched_chunks"] == a["fetched_chunks"] and all(f.get("checked") for f in b["files"])
print("next load on B:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY

step "the Python package through B's mount (node fill), against safetensors"
[ -n "${NO_TORCH:-}" ] || PYTHONPATH=$PWD/contrib/python KYLIX_CLIENT_SOCKET="$work/b/client.sock" python3 - "$work/src/base" "$work/b/mnt/models/base" <<'PY' || fail=1
import glob, os, sys
import torch
import safetensors.torch as st
import kylix.torch as kt
src, mnt = sys.argv[1], sys.argv[2]
ok = True
for p in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
    want = st.load_file(p, device="cuda:0")
    got = kt.load_file(os.path.join(mnt, os.path.basename(p)), device="cuda:0")
    info = kt.last_load_info()
    same = set(got) == set(want) and all(torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)) for k in want)
    filled = info.get("bytes", {}).get("node-fill", 0)
    print(os.path.basename(p), "equal" if same else "DIFFERENT", "node-fill bytes", filled,
          {k: v for k, v in info.items() if k not in ("path", "bytes")})
    ok &= same and filled > 0
print("node fill on B:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY

step "what B fetched is not in its packs"
read -r after _ <<< "$(b_local)"
echo "B's local bytes: before $local0, after $after"
[ "$after" = "$local0" ] || { echo "B's packs changed during the loads"; fail=1; }

step "result"; if [ $fail = 0 ]; then echo "CLUSTER GPU PASSED"; else echo "CLUSTER GPU FAILED"; fi
exit $fail
