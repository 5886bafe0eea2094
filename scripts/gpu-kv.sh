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
#    tensors vs a pinned host-to-device copy of the same bytes (torch), put
#    from CUDA tensors vs a device-to-pinned copy.
# Ends with "KV GPU PASSED" or "KV GPU FAILED". Not yet run by its author
# (no GPU there): the first run is the lead's.
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
setsid $k serve --mount "$mnt" --client-socket "$sock" --kv-block 2MiB --kv-mem "${KV_MEM:-8GiB}" --kv-disk "${KV_DISK:-16GiB}" > "$out/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -S "$sock" ] && mountpoint -q "$mnt" && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$out/serve.log"; die "the node did not come up"; }

PYTHONPATH=$PWD/contrib/python MNT=$mnt N=${N:-1024} REPS=${REPS:-3} python3 - <<'PY' || die "the client failed"
import os, statistics, time, torch
from kylix.kv import KVStore, key
kv = KVStore(os.environ["MNT"]); n = int(os.environ["N"]); reps = int(os.environ["REPS"])
bs = kv.block_size; assert bs == 2 << 20, bs
dev = torch.device("cuda:0")
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
p = timed(lambda: put(keys, src))
d2h = timed(lambda: pinned.copy_(src, non_blocking=True))
print(f"get host tier -> GPU {g:.2f} GB/s; pinned H2D {h2d:.2f} GB/s ({g / h2d:.2f}x)")
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
PY
$k kv stats
echo; echo "KV GPU PASSED"
