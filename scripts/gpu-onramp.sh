#!/usr/bin/env bash
# GPU fill into the caller's memory through the node's client socket (issue
# 8, docs/design/client.md). Run ON the GPU machine from the repository root
# after `make gpu-build` (static binaries in .gpu/); no Go needed. With the
# device tool: run(command="bash scripts/gpu-onramp.sh", carry=[".gpu"]).
#
# 1. Starts a node on a demo model (kylix demo-model, SIZE default 2GiB).
# 2. A Python client (torch, SOCK_SEQPACKET, socket.send_fds) fills torch
#    tensors with op FILL and compares them bitwise with
#    safetensors.torch.load_file(device="cuda:0"): one FILL per tensor for
#    the first file (tensors of the caching allocator share segments, so the
#    IPC handle's offset matters), one FILL per file into one buffer for the
#    rest; plus refusals (out-of-bounds dst -> EFAULT, range past the file
#    -> EINVAL) after which the node still serves.
# 3. Aggregate GB/s of 1, 2, 4 and 8 concurrent client processes, warm.
# 4. kylix node shows the GPU memory held; after --gpu-idle the context is
#    given back.
# Ends with "ONRAMP GPU PASSED" or "ONRAMP GPU FAILED".
set -uo pipefail
out=${OUT:-/tmp/kylix-onramp-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
size=${SIZE:-2GiB}
idle=${GPU_IDLE:-5s}
fail=0
step() { echo; echo "== $*"; }
die() { echo "FAILED: $*"; echo; echo "ONRAMP GPU FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
command -v python3 >/dev/null || die "python3 not found"
python3 -c 'import torch, safetensors; assert torch.cuda.is_available(), "torch sees no GPU"; print("torch", torch.__version__, "safetensors", safetensors.__version__, torch.cuda.get_device_name(0))' \
  || die "python3 with torch (CUDA) and safetensors is needed"
step "machine"; nvidia-smi -L 2>/dev/null; uname -r

work=$(mktemp -d /var/tmp/kylix-onramp.XXXX)
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

step "demo model ($size) and node"
$k demo-model --size "$size" "$work/src" | tail -2 || die "demo-model"
$k import "$work/src/base" models/base | tail -1 || die "import"
mkdir -p "$mnt"
setsid $k serve --mount "$mnt" --client-socket "$sock" --gpu-idle "$idle" > "$out/serve.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do [ -S "$sock" ] && [ -f "$mnt/models/base/config.json" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$out/serve.log"; die "the node did not come up (no client socket $sock)"; }
cat "$out/serve.log"
ls -l "$mnt/models/base"

cat > "$out/client.py" <<'PY'
"""A minimal client of the node's client socket (clientproto v1) for torch."""
import ctypes, errno, json, os, socket, struct, sys, time
import torch

MAGIC, VERSION, OP_FILL, OP_STAT = 0x4B594C43, 1, 2, 3
HDR = struct.Struct("<IHHII")
FILL_FIXED = struct.Struct("<II64sQQQII")

class FillError(Exception):
    def __init__(self, status, msg):
        super().__init__(f"status {status} ({errno.errorcode.get(-status, '?')}): {msg}")
        self.status = status

class Client:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.s.connect(path)
        self.seq = 0

    def call(self, op, body, fd):
        self.seq += 1
        socket.send_fds(self.s, [HDR.pack(MAGIC, VERSION, op, self.seq, len(body)) + body], [fd])
        data = self.s.recv(1 << 16)
        magic, ver, rop, seq, blen = HDR.unpack_from(data)
        if magic != MAGIC or ver != VERSION or rop != op | 0x8000 or seq != self.seq or blen != len(data) - 16:
            raise RuntimeError(f"bad reply header {magic:#x} {ver} {rop:#x} {seq} {blen} ({len(data)} bytes)")
        status, mlen = struct.unpack_from("<iI", data, 16)
        msg = data[24:24 + mlen].decode(errors="replace")
        return status, msg, data[24 + mlen:]

    def fill(self, fd, handle, device, dst_off, file_off, length, flags=0):
        body = FILL_FIXED.pack(device, flags, handle, dst_off, file_off, length, 0, 0)
        status, msg, f = self.call(OP_FILL, body, fd)
        if status != 0:
            raise FillError(status, msg)
        nbytes, nanos = struct.unpack_from("<QQ", f)
        names = [f[16 + 32 * i:48 + 32 * i].split(b"\0")[0].decode() for i in range(3)]
        return {"bytes": nbytes, "nanos": nanos, "path": names[0], "io": names[1], "verified": names[2]}

_cuda = None
def alloc_range(ptr):
    """(base, size) of the allocation holding ptr, from the driver."""
    global _cuda
    if _cuda is None:
        _cuda = ctypes.CDLL("libcuda.so.1")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    r = _cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if r != 0:
        raise RuntimeError(f"cuMemGetAddressRange: {r}")
    return base.value, size.value

def ipc_of(t):
    """(64-byte cudaIpcMemHandle_t, offset of t's first byte in the allocation)."""
    st = t.untyped_storage()
    info = st._share_cuda_()
    h, off = bytes(info[1]), int(info[3])
    if len(h) == 66 and h[1:2] == b"c":      # torch >= 2.2: version byte, type 'c', then the handle
        raw = h[2:]
    elif len(h) == 64:                         # older torch: the handle itself
        raw = h
    elif len(h) >= 2 and h[1:2] == b"e":
        raise RuntimeError("expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) have no legacy IPC handle; unset it")
    else:
        raise RuntimeError(f"unknown _share_cuda_ handle format: {len(h)} bytes, {h[:4]!r}")
    tor = off + t.storage_offset() * t.element_size()
    # Cross-check torch's offset with the driver's view of the allocation.
    try:
        base, size = alloc_range(st.data_ptr())
    except Exception as e:
        print(f"warning: cannot ask the driver for the allocation ({e}); using torch's offset {tor}", file=sys.stderr)
        return raw, tor, None
    drv = st.data_ptr() - base + t.storage_offset() * t.element_size()
    if drv != tor:
        print(f"warning: torch says offset {tor}, the driver {drv}; using the driver's", file=sys.stderr)
    return raw, drv, size

def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return 8 + n, h

DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}

def as_tensor(buf, s, e, m):
    """Tensor m of a file's data section in buf (a copy where the offset does not suit the dtype)."""
    v = buf[s:e]
    try:
        return v.view(DT[m["dtype"]]).reshape(m["shape"])
    except RuntimeError:
        return v.clone().view(DT[m["dtype"]]).reshape(m["shape"])

def fill_file(c, path, per_tensor=False, device=0, build=True):
    """Tensors of one safetensors file filled by the node; returns (dict, bytes, info)."""
    base, h = header(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        out, info, n = {}, None, 0
        if per_tensor:
            for name, m in h.items():
                s, e = m["data_offsets"]
                t = torch.empty(m["shape"], dtype=DT[m["dtype"]], device=f"cuda:{device}")
                if e > s:
                    raw, off, _ = ipc_of(t)
                    info = c.fill(fd, raw, device, off, base + s, e - s)
                    n += info["bytes"]
                out[name] = t
        else:
            end = max([m["data_offsets"][1] for m in h.values()] + [0])
            buf = torch.empty(end, dtype=torch.uint8, device=f"cuda:{device}")
            raw, off, _ = ipc_of(buf)
            info = c.fill(fd, raw, device, off, base, end)
            n = info["bytes"]
            if not build:
                out["__buffer__"] = buf
            for name, m in (h.items() if build else ()):
                s, e = m["data_offsets"]
                out[name] = as_tensor(buf, s, e, m)
        torch.cuda.synchronize()
        return out, n, info
    finally:
        os.close(fd)
PY

step "correctness: FILL into torch tensors vs safetensors.torch.load_file(device=cuda:0)"
PYTHONUNBUFFERED=1 python3 - "$sock" "$out" "$mnt"/models/base/*.safetensors <<'PY' || fail=1
import sys, os, errno, torch
sys.path.insert(0, sys.argv[2]); from client import *
from safetensors.torch import load_file
sock, files = sys.argv[1], sys.argv[3:]
c = Client(sock); bad = 0; nt = 0
for i, f in enumerate(files):
    got, n, info = fill_file(c, f, per_tensor=(i == 0))
    want = load_file(f, device="cuda:0")
    if set(got) != set(want):
        print("tensor names differ in", f); bad += 1
    for k, v in want.items():
        nt += 1
        g = got[k]
        if g.shape != v.shape or g.dtype != v.dtype or not torch.equal(g.contiguous().reshape(-1).view(torch.uint8), v.contiguous().reshape(-1).view(torch.uint8)):
            print("MISMATCH", os.path.basename(f), k); bad += 1
    print(f"{os.path.basename(f)}: {len(want)} tensors, {n} bytes, {'one FILL per tensor' if i == 0 else 'one FILL'}; last: {info}")
print(f"{nt} tensors compared, {bad} mismatches")
# Refusals: the node checks the allocation, not the caller's word.
fd = os.open(files[0], os.O_RDONLY)
t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
raw, off, size = ipc_of(t)
past = (size - 100) if size else (1 << 50)
for what, args, want in [("dst past the allocation", (raw, 0, past, 0, 4096), errno.EFAULT),
                         ("range past the file", (raw, 0, off, os.path.getsize(files[0]) - 10, 4096), errno.EINVAL),
                         ("garbage IPC handle", (b"\x07" * 64, 0, 0, 0, 4096), errno.EINVAL),
                         ("no such device", (raw, 99, off, 0, 4096), errno.ENODEV)]:
    try:
        c.fill(fd, *args); print("NOT REFUSED:", what); bad += 1
    except FillError as e:
        ok = e.status == -want
        print(("refused as expected: " if ok else "WRONG ERRNO: ") + what + ": " + str(e)); bad += 0 if ok else 1
got, n, info = fill_file(c, files[0])
print("still serving after the refusals:", n, "bytes;", info)
sys.exit(1 if bad else 0)
PY

step "kylix node (a context held)"
$k node | tee "$out/node1.txt"
grep -q "CUDA context held" "$out/node1.txt" || { echo "kylix node does not report the held context"; fail=1; }

step "aggregate GB/s, warm: 1, 2, 4, 8 concurrent client processes"
cat "$mnt"/models/base/*.safetensors > /dev/null
cat > "$out/bench.py" <<'PY'
import sys, os, time, json, multiprocessing as mp
def worker(sock, outdir, files, barrier, q, rank):
    try:
        sys.path.insert(0, outdir)
        import torch
        from client import Client, fill_file
        torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
        c = Client(sock)
        for f in files:  # warm this process's allocations and the node's loader
            fill_file(c, f, build=False)
    except Exception as e:
        barrier.abort(); q.put(("error", rank, repr(e))); raise
    try:
        barrier.wait()
    except Exception:
        q.put(("error", rank, "another client failed")); return
    try:
        t0 = time.time(); n = 0; paths = set()
        for f in files:
            d, b, info = fill_file(c, f, build=False)
            n += b; paths.add((info["path"], info["io"], info["verified"])); del d
        q.put((t0, time.time(), n, sorted(paths)))
    except Exception as e:
        q.put(("error", rank, repr(e))); raise
if __name__ == "__main__":
    sock, outdir, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    mp.set_start_method("spawn")
    for k in (1, 2, 4, 8):
        b = mp.Barrier(k); q = mp.Queue()
        ps = [mp.Process(target=worker, args=(sock, outdir, files, b, q, r)) for r in range(k)]
        [p.start() for p in ps]
        rs = [q.get(timeout=600) for _ in ps]
        [p.join() for p in ps]
        errs = [r for r in rs if r[0] == "error"]
        if errs or any(p.exitcode != 0 for p in ps):
            print(f"{k} clients: a client failed: {errs}"); sys.exit(1)
        t0 = min(r[0] for r in rs); t1 = max(r[1] for r in rs); n = sum(r[2] for r in rs)
        per = [r[2] / (r[1] - r[0]) / 1e9 for r in rs]
        print(json.dumps({"clients": k, "bytes": n, "seconds": round(t1 - t0, 3), "aggregate_gb_per_s": round(n / (t1 - t0) / 1e9, 2),
                          "per_client_gb_per_s": [round(x, 2) for x in per], "paths": rs[0][3]}))
PY
PYTHONUNBUFFERED=1 python3 "$out/bench.py" "$sock" "$out" "$mnt"/models/base/*.safetensors | tee "$out/bench.jsonl" || fail=1

step "kylix node after the benchmark"
$k node | tee "$out/node2.txt"

step "idle release (--gpu-idle $idle)"
released=0
for _ in $(seq 1 300); do
  if $k node | grep -q "no CUDA context held"; then released=1; break; fi
  sleep 0.2
done
$k node | grep -E "^(clients|gpu):"
[ $released = 1 ] || { echo "the node still holds a CUDA context after the idle time"; fail=1; }
grep -E "GPU fill" "$out/serve.log" | tail -4

kill -0 "$node" 2>/dev/null || { echo "the node died"; cat "$out/serve.log"; fail=1; }
step "result"; if [ $fail = 0 ]; then echo "ONRAMP GPU PASSED"; else tail -20 "$out/serve.log"; echo "ONRAMP GPU FAILED"; fi
exit $fail
