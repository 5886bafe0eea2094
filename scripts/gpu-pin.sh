#!/usr/bin/env bash
# Pins on the GPU machine (issue 8, docs/design/pin.md): GPU fill of a
# pinned warm model against an unpinned warm model, through the node's
# client socket. Run ON the GPU machine from the repository root after
# `make gpu-build` (static binaries in .gpu/); no Go needed. With the device
# tool: run(command="bash scripts/gpu-pin.sh", carry=[".gpu"]).
#
# 1. Two demo models of SIZE (default 8GiB) with different seeds, imported;
#    a node with a client socket.
# 2. `kylix warm` both (page cache), `kylix pin` one; `kylix node`,
#    `kylix stat` show the pin, resident bytes, and (after the first fill)
#    the bytes registered with the GPU.
# 3. A Python client (torch) fills every shard of each model whole into one
#    GPU buffer per shard (op FILL), REPS times (default 5), alternating;
#    the first fill of each is checked bitwise against the file read from
#    the mount. Prints GB/s (10^9) per pass and the medians, and the IO each
#    fill took: "page cache (pinned, verified)" for the pinned model (its
#    chunks hashed when pinned; docs/design/pin.md).
# 4. unpin: the model's fills go back to the copying path.
# Ends with "PIN GPU PASSED" (every byte right, the pinned model's fills took
# the pinned path, the unpinned one's did not) or "PIN GPU FAILED". The
# GB/s are printed either way; the goal (issue 8) is >= 40 GB/s pinned.
set -uo pipefail
out=${OUT:-/tmp/kylix-pin-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
size=${SIZE:-8GiB}
reps=${REPS:-5}
step() { echo; echo "== $*"; }
die() { echo "FAILED: $*"; echo; echo "PIN GPU FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
command -v python3 >/dev/null || die "python3 not found"
python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"; print("torch", torch.__version__, torch.cuda.get_device_name(0))' \
  || die "python3 with torch (CUDA) is needed"
step "machine"; nvidia-smi -L 2>/dev/null; uname -r; nproc; free -g | head -2

work=$(mktemp -d /var/tmp/kylix-pin.XXXX)
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

step "two demo models ($size each) and a node"
for m in pinned unpinned; do
  seed=1; [ $m = unpinned ] && seed=2
  $k demo-model --size "$size" --seed $seed "$work/src-$m" | tail -1 || die "demo-model"
  $k import "$work/src-$m/base" models/$m | tail -1 || die "import"
  rm -rf "$work/src-$m"
done
mkdir -p "$mnt"
setsid $k serve --mount "$mnt" --client-socket "$sock" --pin-budget 75% > "$out/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -S "$sock" ] && [ -f "$mnt/models/pinned/config.json" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$out/serve.log"; die "the node did not come up (no client socket $sock)"; }

step "warm both, pin one"
$k warm models/pinned || die "warm"
$k warm models/unpinned || die "warm"
$k pin models/pinned || die "pin"
$k node | sed -n '/^pins:/,$p'
shard=$(ls "$mnt/models/pinned" | grep safetensors$ | head -1)
$k stat models/pinned/"$shard" | grep -E '^(size|pinned|resident):'
$k stat models/unpinned/"$shard" | grep -E '^(size|pinned|resident):'

cat > "$out/pinfill.py" <<'PY'
"""FILL every shard of two models whole into GPU buffers; GB/s per pass."""
import os, socket, statistics, struct, sys, time, torch
MAGIC, VERSION, OP_FILL = 0x4B594C43, 1, 2
HDR = struct.Struct("<IHHII"); FILL = struct.Struct("<II64sQQQII")
sock, mnt, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
expect = sys.argv[4] if len(sys.argv) > 4 else "pinned"  # "none": after unpin
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(sock); seq = 0

def ipc(t):
    info = t.untyped_storage()._share_cuda_()
    h = bytes(info[1])
    raw = h[2:] if len(h) == 66 and h[1:2] == b"c" else h
    assert len(raw) == 64, f"unknown IPC handle format ({len(h)} bytes)"
    return raw, int(info[3])

def fill(fd, buf, n):
    global seq
    seq += 1
    raw, off = ipc(buf)
    body = FILL.pack(0, 0, raw, off, 0, n, 0, 0)
    socket.send_fds(s, [HDR.pack(MAGIC, VERSION, OP_FILL, seq, len(body)) + body], [fd])
    d = s.recv(1 << 16)
    status, mlen = struct.unpack_from("<iI", d, 16)
    if status != 0:
        raise RuntimeError(f"FILL: {status}: {d[24:24 + mlen].decode(errors='replace')}")
    f = d[24 + mlen:]
    nb, = struct.unpack_from("<Q", f)
    io = f[48:80].split(b"\0")[0].decode()
    return nb, io

models = {m: sorted(os.path.join(mnt, "models", m, f) for f in os.listdir(os.path.join(mnt, "models", m)) if f.endswith(".safetensors")) for m in ("pinned", "unpinned")}
bufs = {p: torch.empty(os.path.getsize(p), dtype=torch.uint8, device="cuda:0") for fs in models.values() for p in fs}
torch.cuda.synchronize()
# The first fill makes the node's loader (CUDA context, buffers, and the
# registration of the pinned memory): timed apart.
fd = os.open(models["unpinned"][0], os.O_RDONLY)
t0 = time.perf_counter(); fill(fd, bufs[models["unpinned"][0]], 4096); print(f"first fill (loader setup, pin registration): {time.perf_counter() - t0:.2f} s")
os.close(fd)
ok, ios, rates = True, {m: set() for m in models}, {m: [] for m in models}
for r in range(reps):
    for m, files in models.items():
        total, t0 = 0, time.perf_counter()
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                nb, io = fill(fd, bufs[p], os.path.getsize(p))
            finally:
                os.close(fd)
            total += nb; ios[m].add(io)
        torch.cuda.synchronize()
        el = time.perf_counter() - t0
        rates[m].append(total / el / 1e9)
        print(f"pass {r + 1} {m:8s}: {total / 1e9:.2f} GB in {el:.3f} s = {total / el / 1e9:.1f} GB/s  io: {', '.join(sorted(ios[m]))}", flush=True)
        if r == 0:
            for p in files:
                with open(p, "rb") as f:
                    want = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).to("cuda:0")
                if not torch.equal(bufs[p], want):
                    print(f"BYTES DIFFER: {p}"); ok = False
                del want
for m in models:
    print(f"median {m:8s}: {statistics.median(rates[m]):.1f} GB/s over {reps} passes (min {min(rates[m]):.1f}, max {max(rates[m]):.1f})")
if expect == "pinned" and not ios["pinned"] <= {"page cache (pinned, verified)", "page cache (pinned)"}:
    print(f"the pinned model's fills took {ios['pinned']}, not only the pinned pages"); ok = False
for m in (("unpinned",) if expect == "pinned" else models):
    if any("pinned" in io for io in ios[m]):
        print(f"{m}: fills took {ios[m]}, but nothing is pinned"); ok = False
sys.exit(0 if ok else 1)
PY

step "GPU fill: pinned vs unpinned, both warm ($reps passes)"
fail=0
PYTHONUNBUFFERED=1 python3 "$out/pinfill.py" "$sock" "$mnt" "$reps" | tee "$out/pinfill.txt" || fail=1
$k node | sed -n '/^gpu:/,$p'

step "unpin: fills copy again"
$k unpin models/pinned || fail=1
$k node | sed -n '/^pins:/,$p'
PYTHONUNBUFFERED=1 python3 "$out/pinfill.py" "$sock" "$mnt" 1 none || fail=1
echo
[ $fail = 0 ] && echo "PIN GPU PASSED" || echo "PIN GPU FAILED"
