"""The client side of the node's socket, for op FILL (ONRAMP section B),
in plain Python: KYLIX_IOC_PROBE on the open file says whether it is on a
Kylix mount and where the node listens; op FILL sends the CUDA IPC handle of
our own allocation and the file ranges, plus the file's fd as the credential
(SCM_RIGHTS); the node writes the bytes into our GPU memory and verifies them.
No libkylix needed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import threading

LAYOUT_MAGIC = 0x4B594C58  # "KYLX"
CLIENT_MAGIC = 0x4B594C43  # "KYLC"
PROTO_VERSION = 1
OP_PACKS, OP_FILL, OP_STAT = 1, 2, 3
OP_KV_PUT, OP_KV_GET, OP_KV_CONTAINS, OP_KV_STATS, OP_KV_CLEAR = 4, 5, 6, 7, 8  # kylix.kv
MAX_RANGES = 4096
MAX_STRIDED_RANGES = 2048
FILL_STRIDED = 4

_IOC_READ = 2
PROBE_SIZE = 256


def _ior(typ: int, nr: int, size: int) -> int:
    return (_IOC_READ << 30) | (size << 16) | (typ << 8) | nr


KYLIX_IOC_PROBE = _ior(ord("K"), 3, PROBE_SIZE)


def probe(fd: int):
    """(version, node_pid, client_socket) if fd is on a Kylix mount, else None."""
    buf = bytearray(PROBE_SIZE)
    try:
        fcntl.ioctl(fd, KYLIX_IOC_PROBE, buf, True)
    except OSError as e:
        if e.errno in (errno.ENOTTY, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES):
            return None
        raise
    magic, version, pid = struct.unpack_from("<IIQ", buf, 0)
    if magic != LAYOUT_MAGIC:
        return None
    sock = bytes(buf[16:256]).split(b"\0", 1)[0].decode("utf-8", "replace")
    return version, pid, sock


class NodeError(OSError):
    pass


class FillResult:
    def __init__(self, nbytes, nanos, path, io, verified):
        self.bytes, self.nanos, self.path, self.io, self.verified = nbytes, nanos, path, io, verified


class NodeClient:
    """One SEQPACKET connection; requests are serialised (one in flight)."""

    def __init__(self, sock_path: str):
        self._s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._s.connect(sock_path)
        self._seq = 0
        self._mu = threading.Lock()

    def close(self):
        self._s.close()

    def _call(self, op: int, body: bytes, fd) -> bytes:
        """fd: the one descriptor the request carries, or None (KV ops
        without a buffer)."""
        with self._mu:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            seq = self._seq
            hdr = struct.pack("<IHHII", CLIENT_MAGIC, PROTO_VERSION, op, seq, len(body))
            if fd is None:
                self._s.send(hdr + body)
            else:
                socket.send_fds(self._s, [hdr + body], [fd])
            msg, fds, _flags, _addr = socket.recv_fds(self._s, 1 << 20, 64)
        for f in fds:  # FILL and STAT send none; close any we did not ask for
            os.close(f)
        if len(msg) < 24:
            raise NodeError(errno.EPROTO, f"node reply of {len(msg)} bytes is too short")
        magic, ver, rop, rseq, blen = struct.unpack_from("<IHHII", msg, 0)
        if magic != CLIENT_MAGIC or rop != (op | 0x8000) or rseq != seq or blen != len(msg) - 16:
            raise NodeError(errno.EPROTO, "node reply header does not match the request")
        status, mlen = struct.unpack_from("<iI", msg, 16)
        text = msg[24:24 + mlen].decode("utf-8", "replace")
        if status < 0:
            raise NodeError(-status, f"node: {text or os.strerror(-status)}")
        return msg[24 + mlen:]

    def fill(self, fd: int, device: int, ipc_handle: bytes, ranges, flags: int = 0) -> FillResult:
        """ranges: [(file_offset, length, dst_offset)] into the allocation
        whose IPC handle is given (at most MAX_RANGES); or, strided,
        (file_offset, length, dst_offset, rows, pitch): rows rows of length
        bytes, pitch apart in the file, packed densely at dst_offset (at
        most MAX_STRIDED_RANGES; sent with FILL_STRIDED)."""
        if len(ipc_handle) != 64:
            raise ValueError(f"CUDA IPC handle is {len(ipc_handle)} bytes, want 64")
        strided = any(len(r) == 5 for r in ranges)
        limit = MAX_STRIDED_RANGES if strided else MAX_RANGES
        if not 0 < len(ranges) <= limit:
            raise ValueError(f"{len(ranges)} ranges; 1..{limit} per request")
        if strided:
            flags |= FILL_STRIDED
        body = struct.pack("<II64sQQQII", device, flags, ipc_handle, 0, 0, 0, len(ranges), 0)
        if strided:
            body += b"".join(struct.pack("<QQQQQ", *(tuple(r) + (1, 0))[:5]) for r in ranges)
        else:
            body += b"".join(struct.pack("<QQQ", fo, ln, do) for fo, ln, do in ranges)
        rest = self._call(OP_FILL, body, fd)
        if len(rest) < 16 + 96:
            raise NodeError(errno.EPROTO, "FILL reply too short")
        nb, ns, p, io, v = struct.unpack_from("<QQ32s32s32s", rest, 0)
        z = lambda b: b.split(b"\0", 1)[0].decode("utf-8", "replace")
        return FillResult(nb, ns, z(p), z(io), z(v))


# ---- CUDA IPC handles of our own allocations, through the driver API.
#
# Not torch's UntypedStorage._share_cuda_() (torch 2.x returns (device, handle,
# size, offset, ref_counter_handle, ref_counter_offset, event_handle,
# event_sync_required)): sharing that way creates torch's IPC reference counter
# and expects a torch consumer to release it; the node is not one, so every
# shared block would sit in torch's IPC "limbo" after the tensor is freed, a
# GPU memory leak the size of the model. cuIpcGetMemHandle on the allocation
# that holds the tensor gives the same handle without that bookkeeping.

_cuda = None
_cuda_lock = threading.Lock()


def _libcuda():
    global _cuda
    with _cuda_lock:
        if _cuda is None:
            import ctypes
            L = ctypes.CDLL("libcuda.so.1")
            L.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                                  ctypes.c_uint64]
            L.cuMemGetAddressRange_v2.restype = ctypes.c_int
            L.cuIpcGetMemHandle.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
            L.cuIpcGetMemHandle.restype = ctypes.c_int
            _cuda = L
        return _cuda


def ipc_handle(ptr: int):
    """(64-byte CUipcMemHandle, allocation base, allocation size) of the CUDA
    allocation holding device pointer ptr. The caller's CUDA context must be
    current (torch's is, after any CUDA tensor was made on this thread)."""
    import ctypes
    L = _libcuda()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = L.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr)
    if rc != 0:
        raise OSError(errno.EINVAL, f"cuMemGetAddressRange failed: CUresult {rc}")
    h = ctypes.create_string_buffer(64)
    rc = L.cuIpcGetMemHandle(h, base.value)
    if rc != 0:
        raise OSError(errno.EINVAL, f"cuIpcGetMemHandle failed: CUresult {rc}")
    return h.raw, base.value, size.value
