"""kylix.kv: the node's KV-cache store (docs/design/kv.md) from Python.

    from kylix.kv import KVStore, key
    kv = KVStore("/mnt/kylix")             # the node found from its mount
    kv.block_size                          # every block is exactly this long
    stored = kv.put(keys, tensors)         # [True/False]: False = refused for room
    hits = kv.get(keys, out=tensors)       # [True/False]: True = out[i] was filled
    kv.contains(keys)                      # ["memory" | "disk" | "member" | None]
    kv.stats(); kv.clear()

Keys are 32-byte values the caller computes (a hash of the token prefix:
key(*parts) gives one). Blocks are kept per uid: another local user cannot
see or read yours. Tensors (or writable bytes-like objects for out) must be
contiguous and exactly block_size bytes. Host blocks travel through one
memfd buffer shared with the node (SCM_RIGHTS): one copy on each side, none
through the socket. CUDA tensors are read and filled by the node itself,
by CUDA IPC (one request per allocation, each block at its offset in it),
as kylix.torch's node fill does: no copy here. That path has run against
the node on the stub CUDA driver of the tests, not yet on a GPU.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import struct
import threading

from . import _node

__all__ = ["KVStore", "key", "KVError"]

DEVICE_HOST = 0xFFFFFFFF
MAX_KEYS = 2048
# The largest buffer one request uses: puts and gets of more are split.
MAX_BATCH_BYTES = 256 << 20
TIERS = {0: None, 1: "memory", 2: "disk", 3: "member"}

KVError = _node.NodeError


def key(*parts) -> bytes:
    """A 32-byte key from parts (bytes, str or int): BLAKE2b-256 of their
    length-prefixed encodings, so ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.blake2b(digest_size=32, person=b"kylix-kv-key")
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes(8, "little", signed=True)
        elif isinstance(p, str):
            p = p.encode()
        p = bytes(p)
        h.update(struct.pack("<Q", len(p)) + p)
    return h.digest()


def _socket_of(mount_point: str) -> str:
    fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        pr = _node.probe(fd)
    finally:
        os.close(fd)
    if pr is None:
        raise KVError(errno.ENODEV, f"{mount_point} is not a Kylix mount (KYLIX_IOC_PROBE unanswered)")
    if not pr[2]:
        raise KVError(errno.ENODEV, f"the node of {mount_point} has no client socket (kylix serve --client-socket)")
    return pr[2]


def _keys(keys) -> list:
    out = []
    for k in keys:
        k = bytes(k)
        if len(k) != 32:
            raise ValueError(f"a KV key is 32 bytes, got {len(k)} (kylix.kv.key(...) makes one)")
        out.append(k)
    return out


def _is_cuda(obj) -> bool:
    dev = getattr(obj, "device", None)
    return getattr(dev, "type", None) == "cuda"


def _cuda_ipc(t):
    """(device index, 64-byte IPC handle, allocation base, allocation
    size) of CUDA tensor t, from the driver (kylix._node.ipc_handle, as
    kylix.torch's fill)."""
    import torch
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(dev):
        handle, base, size = _node.ipc_handle(t.data_ptr())
    return dev, handle, base, size


def _cuda_sync(dev: int):
    """Waits for the work queued on device dev (the tensors' writers before
    a put, their readers before a get overwrites them)."""
    import torch
    torch.cuda.synchronize(dev)


def _check_cuda(t, block_size: int):
    if not t.is_contiguous():
        raise ValueError("a KV block tensor must be contiguous")
    n = t.numel() * t.element_size()
    if n != block_size:
        raise ValueError(f"a KV block is {block_size} bytes, this tensor has {n}")


def _span(obj, block_size: int, writable: bool):
    """(address, keepalive) of a tensor or bytes-like object of exactly
    block_size bytes in host memory."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):  # a torch tensor
        if obj.device.type != "cpu":
            raise KVError(errno.EOPNOTSUPP, f"KV blocks on {obj.device} are not supported: use CPU or CUDA tensors")
        if not obj.is_contiguous():
            raise ValueError("a KV block tensor must be contiguous")
        n = obj.numel() * obj.element_size()
        if n != block_size:
            raise ValueError(f"a KV block is {block_size} bytes, this tensor has {n}")
        return obj.data_ptr(), obj
    mv = memoryview(obj).cast("B")
    if mv.nbytes != block_size:
        raise ValueError(f"a KV block is {block_size} bytes, this buffer has {mv.nbytes}")
    if writable and mv.readonly:
        raise ValueError("get(out=...) needs writable buffers")
    if mv.readonly:  # bytes: its own buffer, kept alive by the returned object
        b = mv.tobytes() if not isinstance(obj, bytes) else obj
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value, b
    return ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv


class KVStore:
    """The KV store of the node serving mount_point (found by
    KYLIX_IOC_PROBE on the mount, as kylix.torch finds it). One connection;
    calls are serialised. Close it (or use it as a context manager).

    The node keeps the CUDA allocations that puts and gets name mapped
    (up to eight) until the store is closed, so later requests pay no IPC
    open: memory given back to the driver meanwhile (torch.cuda.empty_cache)
    stays allocated until then. Close the store before freeing its
    tensors' memory for good."""

    def __init__(self, mount_point: str, socket_path: str | None = None):
        self._client = _node.NodeClient(socket_path or _socket_of(mount_point))
        self._mu = threading.Lock()
        self._fd, self._mm, self._cbuf, self._size = -1, None, None, 0
        try:
            self.block_size = self.stats()["block_size"]
        except BaseException:
            self.close()
            raise
        self._batch = max(1, min(MAX_KEYS, MAX_BATCH_BYTES // self.block_size))

    def close(self):
        with self._mu:
            self._unmap()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _unmap(self):
        self._cbuf = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def _buffer(self, n: int) -> int:
        """The address of a memfd buffer of at least n bytes (s._mu held)."""
        if n > self._size:
            self._unmap()
            if self._fd < 0:
                self._fd = os.memfd_create("kylix-kv", os.MFD_CLOEXEC)
            os.ftruncate(self._fd, n)
            self._mm = mmap.mmap(self._fd, n)
            self._cbuf = (ctypes.c_char * n).from_buffer(self._mm)
            self._size = n
        return ctypes.addressof(self._cbuf)

    def _blocks_body(self, keys) -> bytes:
        return struct.pack("<IIIIQ", DEVICE_HOST, 0, len(keys), 0, 0) + b"".join(keys)

    def _cuda_requests(self, keys, tensors, idx):
        """[(device, body, [index])]: the blocks of CUDA tensors tensors[i]
        (i in idx), one request per allocation and at most MAX_KEYS keys."""
        groups = {}
        # One IPC handle per allocation, not per tensor: the blocks of a
        # KV cache are views of a few large tensors, and asking the driver
        # for a handle per block (cuIpcGetMemHandle, under a device
        # switch) cost as much as copying the 2 MiB. A tensor is matched
        # to an allocation already seen by its address alone (the last
        # one first: blocks come in runs), with no torch storage object
        # made per tensor.
        ranges = []  # (device, base, end, handle)
        last = None
        for i in idx:
            t = tensors[i]
            _check_cuda(t, self.block_size)
            p, dev = t.data_ptr(), t.get_device()
            if last is None or last[0] != dev or not last[1] <= p < last[2]:
                last = next((r for r in ranges if r[0] == dev and r[1] <= p < r[2]), None)
                if last is None:
                    d, handle, base, size = _cuda_ipc(t)
                    last = (d, base, base + size, handle)
                    ranges.append(last)
            dev, base, _end, handle = last
            g = groups.setdefault((dev, base), (handle, []))
            g[1].append((i, p - base))
        out = []
        for (dev, _base), (handle, items) in groups.items():
            for j in range(0, len(items), MAX_KEYS):
                part = items[j:j + MAX_KEYS]
                body = struct.pack("<IIIIQ", dev, 0, len(part), 0, 0) + handle
                body += b"".join(keys[i] + struct.pack("<Q", off) for i, off in part)
                out.append((dev, body, [i for i, _ in part]))
        for dev in {d for d, _, _ in out}:
            _cuda_sync(dev)
        return out

    def _put_status(self, rest, n) -> list:
        got, _bs = struct.unpack_from("<II", rest, 0) if len(rest) >= 8 else (None, None)
        if got != n or len(rest) != 8 + 4 * n:
            raise KVError(errno.EPROTO, "KV_PUT reply does not match the request")
        out = []
        for st in struct.unpack_from(f"<{n}i", rest, 8):
            if st not in (0, -errno.ENOSPC):
                raise KVError(-st, f"node: KV put: {os.strerror(-st)}")
            out.append(st == 0)
        return out

    def put(self, keys, tensors) -> list:
        """Puts tensors[i] under keys[i]; [True if stored, False if refused
        for room (the host tier is full of blocks not yet on disk: retry
        later or recompute)]. Other refusals raise KVError."""
        keys = _keys(keys)
        tensors = list(tensors)
        if len(keys) != len(tensors):
            raise ValueError(f"{len(keys)} keys for {len(tensors)} tensors")
        bs, out = self.block_size, [False] * len(keys)
        gpu = [i for i, t in enumerate(tensors) if _is_cuda(t)]
        host = [i for i, t in enumerate(tensors) if not _is_cuda(t)]
        spans = {i: _span(tensors[i], bs, False) for i in host}
        with self._mu:
            for dev, body, idx in self._cuda_requests(keys, tensors, gpu):
                for i, ok in zip(idx, self._put_status(self._client._call(_node.OP_KV_PUT, body, None), len(idx))):
                    out[i] = ok
            for j0 in range(0, len(host), self._batch):
                idx = host[j0:j0 + self._batch]
                base = self._buffer(len(idx) * bs)
                for j, i in enumerate(idx):
                    ctypes.memmove(base + j * bs, spans[i][0], bs)
                rest = self._client._call(_node.OP_KV_PUT, self._blocks_body([keys[i] for i in idx]), self._fd)
                for i, ok in zip(idx, self._put_status(rest, len(idx))):
                    out[i] = ok
        return out

    def get(self, keys, out) -> list:
        """Fills out[i] with the block of keys[i] where the node has it;
        [True where filled]. A miss leaves out[i] as it was."""
        keys = _keys(keys)
        out = list(out)
        if len(keys) != len(out):
            raise ValueError(f"{len(keys)} keys for {len(out)} outputs")
        bs, hits = self.block_size, [False] * len(keys)
        gpu = [i for i, t in enumerate(out) if _is_cuda(t)]
        host = [i for i, t in enumerate(out) if not _is_cuda(t)]
        spans = {i: _span(out[i], bs, True) for i in host}
        with self._mu:
            for dev, body, idx in self._cuda_requests(keys, out, gpu):
                for i, t in zip(idx, self._tiers(_node.OP_KV_GET, body, None, len(idx))):
                    hits[i] = bool(t)
            for j0 in range(0, len(host), self._batch):
                idx = host[j0:j0 + self._batch]
                base = self._buffer(len(idx) * bs)
                tiers = self._tiers(_node.OP_KV_GET, self._blocks_body([keys[i] for i in idx]), self._fd, len(idx))
                for j, (i, t) in enumerate(zip(idx, tiers)):
                    if t:
                        ctypes.memmove(spans[i][0], base + j * bs, bs)
                    hits[i] = bool(t)
        return hits

    def contains(self, keys) -> list:
        """Where each key's block is: "memory", "disk", "member" (another
        member of the cluster keeps it) or None."""
        keys, res = _keys(keys), []
        with self._mu:
            for i in range(0, len(keys), MAX_KEYS):
                part = keys[i:i + MAX_KEYS]
                body = struct.pack("<II", len(part), 0) + b"".join(part)
                res += [TIERS.get(t, "unknown") for t in self._tiers(_node.OP_KV_CONTAINS, body, None, len(part))]
        return res

    def _tiers(self, op, body, fd, n):
        rest = self._client._call(op, body, fd)
        if len(rest) < 8:
            raise KVError(errno.EPROTO, "KV reply too short")
        got, _bs = struct.unpack_from("<II", rest, 0)
        if got != n or len(rest) != 8 + n:
            raise KVError(errno.EPROTO, "KV reply does not match the request")
        return rest[8:]

    _STATS = ("block_size", "flags", "mem_budget", "mem_bytes", "disk_budget", "disk_bytes",
              "my_mem_blocks", "my_disk_blocks", "cleared")

    def _stats_op(self, op) -> dict:
        rest = self._client._call(op, b"", None)
        if len(rest) != 64:
            raise KVError(errno.EPROTO, "KV_STATS reply of the wrong size")
        d = dict(zip(self._STATS, struct.unpack("<IIQQQQQQQ", rest)))
        d["disk_tier"] = bool(d.pop("flags") & 1)
        return d

    def stats(self) -> dict:
        """The store's block size and budgets, the bytes held (all users),
        and this uid's blocks per tier."""
        d = self._stats_op(_node.OP_KV_STATS)
        d.pop("cleared")
        return d

    def clear(self) -> int:
        """Drops this uid's blocks (memory and disk); returns how many."""
        return self._stats_op(_node.OP_KV_CLEAR)["cleared"]
