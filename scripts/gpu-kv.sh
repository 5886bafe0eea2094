#!/usr/bin/env bash
# The KV-cache store with CUDA tensors (issue 21, docs/design/kv.md). Run ON
# the GPU machine from the repository root after `make gpu-build` (static
# binaries in .gpu/); no Go needed. With the device tool:
#   run(command="bash scripts/gpu-kv.sh", carry=[".gpu"])
#
# 1. Starts a node with --kv-block 2MiB, a host tier of KV_MEM (default
#    8GiB) and a disk tier of KV_DISK (default 16GiB).
# 2. kylix.kv puts N (default 1024) blocks of 2 MiB from CUDA tensors (the
#    node reads them by CUDA IPC), gets them back into other CUDA tensors
#    and compares them bitwise on the GPU, from the host tier; then clears
#    memory by putting another set, and gets the first set back from disk.
# 3. Times (medians of REPS, default 3): get from the host tier into CUDA
#    tensors vs a pinned host-to-device copy of the same bytes (torch), as
#    one copy and as one copy per 2 MiB block on four streams; put from
#    CUDA tensors vs a device-to-pinned copy.
# 4. The disk tier, cold (DISK_REPS times, default REPS): stops the node (its blocks stay on
#    disk), drops the page cache, starts it again, page-locks the host tier
#    with a first get of a missing key, then times the get of the first set
#    (every block from disk, verified, byte-equal on the GPU) against
#    `kylix bench-read` (O_DIRECT, io_uring) of the same block files after
#    another cache drop. Root (drop_caches).
# The node logs at debug level: its "kv: get into GPU memory" lines give
# the time to hold the blocks, issue the copies and wait for them.
# Ends with "KV GPU PASSED" or "KV GPU FAILED".
set -uo pipefail
out=${OUT:-/tmp/kylix-kv-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
die() { echo "FAILED: $*"; echo; echo "KV GPU FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"' || die "python3 with torch (CUDA) is needed"
nvidia-smi -L 2>/dev/null; uname -r

work=$(mktemp -d /var/tmp/kylix-kv.XXXX)
export KYLIX_DATA=$work/data
mnt=$work/mnt; sock=$work/client.sock
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
mkdir -p "$mnt"
start_node() {
  rm -f "$sock"
  setsid $k serve --log-level debug --mount "$mnt" --client-socket "$sock" --kv-block 2MiB --kv-mem "${KV_MEM:-8GiB}" --kv-disk "${KV_DISK:-16GiB}" >> "$out/serve.log" 2>&1 &
  node=$!
  for _ in $(seq 1 300); do [ -S "$sock" ] && mountpoint -q "$mnt" && break; sleep 0.1; done
  [ -S "$sock" ] || { cat "$out/serve.log"; die "the node did not come up"; }
}
stop_node() { # SIGTERM: the node writes what is queued for the disk tier first
  kill -TERM "$node"; for _ in $(seq 1 600); do kill -0 "$node" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$node" 2>/dev/null && die "the node did not stop within 60 s"
  for _ in $(seq 1 100); do mountpoint -q "$mnt" || break; sleep 0.1; done
  node=
}
start_node

export OUT_FILES=$work/files
PYTHONPATH=$PWD/contrib/python MNT=$mnt N=${N:-1024} REPS=${REPS:-3} python3 - <<'PY' || die "the client failed"
import os, statistics, time, torch
from kylix.kv import KVStore, key
kv = KVStore(os.environ["MNT"]); n = int(os.environ["N"]); reps = int(os.environ["REPS"])
bs = kv.block_size; assert bs == 2 << 20, bs
dev = torch.device("cuda:0")
torch.manual_seed(21)  # the disk phase below makes the same blocks again
src = torch.randint(0, 256, (n, bs), dtype=torch.uint8, device=dev)  # one allocation, n blocks
keys = [key("gpu-kv", i) for i in range(n)]
def put(ks, t):
    deadline = time.monotonic() + 300  # refused for room: the disk writer catches up
    while time.monotonic() < deadline:
        ok = kv.put(ks, [t[i] for i in range(len(ks))])
        if all(ok): return
        left = [i for i, o in enumerate(ok) if not o]
        ks, t = [ks[i] for i in left], t[left]
        time.sleep(0.05)
    raise SystemExit("puts kept being refused for room for 5 minutes")
put(keys, src)
dst = torch.zeros_like(src)
hits = kv.get(keys, out=[dst[i] for i in range(n)])
assert all(hits), f"{hits.count(False)} misses from the host tier"
assert torch.equal(src, dst), "host tier: the blocks read back differ"
print("host tier: byte-equal on the GPU", flush=True)
tiers = kv.contains(keys); print("tiers:", {t: tiers.count(t) for t in set(tiers)})
# Time: get from the host tier vs pinned H2D; put vs D2H to pinned.
pinned = torch.empty((n, bs), dtype=torch.uint8, pin_memory=True)
def timed(f):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return n * bs / statistics.median(ts) / 1e9
g = timed(lambda: kv.get(keys, out=[dst[i] for i in range(n)]))
h2d = timed(lambda: dst.copy_(pinned, non_blocking=True))
streams = [torch.cuda.Stream() for _ in range(4)]
def per_block():
    for i in range(n):
        with torch.cuda.stream(streams[i % 4]):
            dst[i].copy_(pinned[i], non_blocking=True)
    for st in streams: st.synchronize()
h2d_blocks = timed(per_block)
p = timed(lambda: put(keys, src))
d2h = timed(lambda: pinned.copy_(src, non_blocking=True))
print(f"get host tier -> GPU {g:.2f} GB/s; pinned H2D {h2d:.2f} GB/s ({g / h2d:.2f}x); pinned H2D block by block on 4 streams {h2d_blocks:.2f} GB/s ({g / h2d_blocks:.2f}x)")
print(f"put GPU -> host tier {p:.2f} GB/s; D2H to pinned {d2h:.2f} GB/s ({p / d2h:.2f}x)")
# Disk tier: push the first set out of memory with a second one, read it back.
mem_blocks = kv.stats()["mem_budget"] // bs
other = [key("gpu-kv-other", i) for i in range(mem_blocks)]
for i in range(0, len(other), n):
    put(other[i:i + n], src[:len(other[i:i + n])])
dst.zero_()
tiers = kv.contains(keys); print("after the second set:", {t: tiers.count(t) for t in set(tiers)})
hits = kv.get(keys, out=[dst[i] for i in range(n)])
got = [i for i, h in enumerate(hits) if h]
assert torch.equal(src[got], dst[got]), "disk tier: the blocks read back differ"
print(f"disk tier: {len(got)} of {n} back, byte-equal on the GPU")
ns = os.getuid()
with open(os.environ["OUT_FILES"], "w") as f:
    for k in keys:
        f.write(os.path.join(os.environ["KYLIX_DATA"], "kv", f"{ns:08x}", k.hex() + ".kvb") + "\n")
PY
$k kv stats
grep -c 'kv: get into GPU memory' "$out/serve.log" | sed 's/^/debug lines: /'
grep 'kv: get into GPU memory' "$out/serve.log" | tail -3

# The disk tier, cold, against O_DIRECT of the same files.
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
for r in $(seq 1 "${DISK_REPS:-${REPS:-3}}"); do
  stop_node; drop; start_node
  PYTHONPATH=$PWD/contrib/python MNT=$mnt N=${N:-1024} python3 - <<'PY' || die "the client failed (disk tier)"
import os, time, torch
from kylix.kv import KVStore, key
kv = KVStore(os.environ["MNT"]); n = int(os.environ["N"]); bs = kv.block_size
dev = torch.device("cuda:0")
torch.manual_seed(21)
src = torch.randint(0, 256, (n, bs), dtype=torch.uint8, device=dev)
keys = [key("gpu-kv", i) for i in range(n)]
dst = torch.zeros_like(src)
assert kv.get([key("gpu-kv-absent")], out=[dst[0]]) == [False]  # page-locks the host tier
tiers = kv.contains(keys)
assert tiers.count("disk") == n, {t: tiers.count(t) for t in set(tiers)}
torch.cuda.synchronize(); t0 = time.perf_counter()
hits = kv.get(keys, out=[dst[i] for i in range(n)])
torch.cuda.synchronize(); dt = time.perf_counter() - t0
assert all(hits), f"{hits.count(False)} misses from the disk tier"
assert torch.equal(src, dst), "disk tier (cold): the blocks read back differ"
print(f"  get disk tier (cold) -> GPU {n * bs / dt / 1e9:.2f} GB/s, byte-equal")
PY
  drop
  $k bench-read --json $(cat "$OUT_FILES") | python3 -c 'import json,sys; d=json.load(sys.stdin); print("  raw O_DIRECT of the same block files", round(d["gb_per_s"],2), "GB/s")'
done
echo; echo "KV GPU PASSED"
