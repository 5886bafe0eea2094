"""Drop-in safetensors loading for torch: load_file and safe_open with the
API of safetensors.torch, bitwise equal results, plus a tensor-parallel form.

How bytes travel (reported per load by last_load_info()):
  - "pread":     os.preadv straight into the tensor's own memory (no copy);
  - "libkylix-pack", "libkylix-fuse": kylix_pread of libkylix, straight into
                 the tensor's memory; "pack" bytes came from pack fds the node
                 handed out, "fuse" bytes through the mount;
  - "node-fill": device="cuda:N" on a Kylix mount whose node answers op FILL:
                 the GPU tensor is allocated here and the node fills it;
  - "pinned":    device="cuda:N" otherwise: read into pinned host memory as
                 above, then copied to the GPU.
The plain path is always there, so every load is correct without libkylix
and without a node.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Optional

import torch

from . import _lib, _node, split as _split
from .safetensors import Header, TensorInfo, parse_fd

__all__ = ["load_file", "safe_open", "last_load_info", "tensor_plan"]

_DTYPE_ATTRS = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16",
    "I32": "int32", "U32": "uint32", "F32": "float32", "F64": "float64", "I64": "int64", "U64": "uint64",
}

PIECE = 64 << 20  # largest single read: big enough for full speed, small enough to spread over threads
PARALLEL_MIN = 32 << 20  # below this a load stays on the calling thread
HOST_BATCH = 1 << 30  # pinned staging per round for the cuda fallback
# A dim>0 split reads one run per row when the run is at least this long, else
# the whole row block and narrows in memory (see docs/design/python.md: figures).
STRIDED_MIN_RUN = int(os.environ.get("KYLIX_STRIDED_MIN_RUN", 1024))


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, _DTYPE_ATTRS[name], None)
    if dt is None:
        raise TypeError(f"safetensors dtype {name} has no torch dtype in torch {torch.__version__}")
    return dt


# ---------------------------------------------------------------- load info

_info_lock = threading.Lock()
_last_info: dict = {}


def last_load_info() -> dict:
    """What the last load_file (or safe_open session) in this process did:
    {"path", "device", "tensors", "bytes": {path_name: n}, "seconds",
     "libkylix": why it was or was not used, "node": probe result or None,
     "node_error": why a node fill was not used (if it was tried)}."""
    with _info_lock:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in _last_info.items()}


def _publish(info: dict):
    global _last_info
    with _info_lock:
        _last_info = info


# ---------------------------------------------------------------- plans

class _Plan:
    """How to get one tensor (or its rank's slice): the shape of the result and
    the (file_offset, length, dst_offset) runs that fill its contiguous buffer.
    If narrow is set, the runs fill a larger block (shape block_shape) that is
    narrowed to (dim, start, length) afterwards."""

    __slots__ = ("name", "dtype", "shape", "runs", "nbytes", "block_shape", "narrow")

    def __init__(self, name, dtype, shape, runs, nbytes, block_shape=None, narrow=None):
        self.name, self.dtype, self.shape, self.runs, self.nbytes = name, dtype, shape, runs, nbytes
        self.block_shape, self.narrow = block_shape, narrow


def tensor_plan(t: TensorInfo, dim: Optional[int], start: int = 0, end: Optional[int] = None,
                strided_min_run: Optional[int] = None, strided_runs: bool = False) -> _Plan:
    """The reads for t[..., start:end (along dim), ...]; dim None = all of t.
    strided_runs (for the node's FILL): a share split along a later
    dimension is one strided run (file_offset, length, dst_offset, rows,
    pitch) rather than a run per row or its rows' whole block."""
    if dim is None or (start == 0 and (end is None or end == t.shape[dim])):
        return _Plan(t.name, t.dtype, t.shape, [(t.offset, t.nbytes, 0)] if t.nbytes else [], t.nbytes)
    shape = list(t.shape)
    n = shape[dim]
    end = n if end is None else end
    inner = t.itemsize * math.prod(shape[dim + 1:])
    outer = math.prod(shape[:dim])
    run = (end - start) * inner
    shape[dim] = end - start
    nbytes = outer * run
    if nbytes == 0:
        return _Plan(t.name, t.dtype, tuple(shape), [], 0)
    if outer == 1 or dim == 0:
        return _Plan(t.name, t.dtype, tuple(shape), [(t.offset + start * inner, nbytes, 0)], nbytes)
    row = n * inner
    if strided_runs:
        return _Plan(t.name, t.dtype, tuple(shape), [(t.offset + start * inner, run, 0, outer, row)], nbytes)
    smr = STRIDED_MIN_RUN if strided_min_run is None else strided_min_run
    if run >= smr:
        runs = [(t.offset + i * row + start * inner, run, i * run) for i in range(outer)]
        return _Plan(t.name, t.dtype, tuple(shape), runs, nbytes)
    # Short runs: one read of the rows' whole block, then narrow in memory.
    return _Plan(t.name, t.dtype, tuple(shape), [(t.offset, t.nbytes, 0)], t.nbytes,
                 block_shape=t.shape, narrow=(dim, start, end - start))


def _rank_plans(h: Header, names, tp_rank, tp_size, split, strided_min_run=None, strided_runs=False):
    plans = []
    for name in names:
        t = h.tensors[name]
        dim = None
        if tp_size is not None and tp_size > 1:
            dim = _split.split_dim(name, len(t.shape), split)
        if dim is None:
            plans.append(tensor_plan(t, None))
        else:
            s, e = _split.chunk_range(t.shape[dim], tp_rank, tp_size)
            plans.append(tensor_plan(t, dim, s, e, strided_min_run, strided_runs))
    return plans


# ---------------------------------------------------------------- readers

class _Source:
    """An open safetensors file: its header and a way to read ranges into memory."""

    def __init__(self, path, use_lib: Optional[bool] = None):
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.header = parse_fd(self.fd)
        except BaseException:
            os.close(self.fd)
            raise
        self.lib = None
        self.lib_why = "not asked for" if use_lib is False else _lib.why()
        if use_lib is not False and _lib.lib() is not None:
            try:
                self.lib = _lib.LibFile(self.path)
            except OSError as e:
                self.lib_why = f"kylix_open failed, reading with pread: {e}"
        self.stats = {}
        self._mu = threading.Lock()

    def close(self):
        if self.lib is not None:
            self.lib.close()
            self.lib = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def count(self, path, n):
        with self._mu:
            self.stats[path] = self.stats.get(path, 0) + n

    def read_into(self, addr: int, n: int, off: int):
        """Reads file bytes [off, off+n) to host address addr: a single read
        into the destination, looping only on short reads."""
        if n == 0:
            return
        if self.lib is not None:
            for path, k in self.lib.pread_into(addr, n, off).items():
                if k:
                    self.count("libkylix-" + path, k)
            return
        mv = memoryview((ctypes.c_char * n).from_address(addr)).cast("B")
        got = 0
        while got < n:
            k = os.preadv(self.fd, [mv[got:]], off + got)
            if k == 0:
                raise EOFError(f"{self.path}: file ended at {off + got}, {n - got} bytes short")
            got += k
        self.count("pread", n)


def _default_threads():
    return max(1, min(16, 2 * (os.cpu_count() or 1)))


def _run(jobs, threads):
    """jobs: callables. Runs them on a pool when there are several."""
    if threads <= 1 or len(jobs) <= 1:
        for j in jobs:
            j()
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kylix-read") as ex:
        for f in [ex.submit(j) for j in jobs]:
            f.result()


def _host_jobs(src: _Source, plan: _Plan, base_addr: int):
    """Read jobs filling a host buffer at base_addr: big runs split into
    PIECE-sized reads, small runs (strided rows) grouped into ~PIECE jobs."""
    jobs, group, gsize = [], [], 0
    for off, ln, dst in plan.runs:
        if ln >= PIECE:
            for p in range(0, ln, PIECE):
                k = min(PIECE, ln - p)
                jobs.append(lambda a=base_addr + dst + p, k=k, o=off + p: src.read_into(a, k, o))
            continue
        group.append((base_addr + dst, ln, off))
        gsize += ln
        if gsize >= PIECE:
            jobs.append(lambda g=group: [src.read_into(a, k, o) for a, k, o in g])
            group, gsize = [], 0
    if group:
        jobs.append(lambda g=group: [src.read_into(a, k, o) for a, k, o in g])
    return jobs


def _finish(plan: _Plan, buf: torch.Tensor) -> torch.Tensor:
    if plan.narrow is None:
        return buf
    d, s, n = plan.narrow
    return buf.narrow(d, s, n).contiguous()


def _alloc(plan: _Plan, device, pin=False) -> torch.Tensor:
    shape = plan.block_shape if plan.narrow is not None else plan.shape
    return torch.empty(shape, dtype=torch_dtype(plan.dtype), device=device, pin_memory=pin)


def _load_host(src: _Source, plans, threads, pin=False):
    out, jobs, total = {}, [], 0
    for p in plans:
        buf = _alloc(p, "cpu", pin)
        out[p.name] = (p, buf)
        jobs += _host_jobs(src, p, buf.data_ptr())
        total += sum(r[1] for r in p.runs)
    _run(jobs, threads if total >= PARALLEL_MIN else 1)
    return {name: _finish(p, buf) for name, (p, buf) in out.items()}


def _load_cuda_pinned(src: _Source, plans, device, threads):
    """Fallback for a GPU device: pinned host reads, then copies, in batches
    of about HOST_BATCH so the pinned memory held stays bounded."""
    out, batch, size = {}, [], 0

    def flush():
        host = _load_host(src, batch, threads, pin=torch.cuda.is_available())
        for name, t in host.items():
            out[name] = t.to(device, non_blocking=True)
        torch.cuda.synchronize(device)
        src.count("pinned", sum(t.numel() * t.element_size() for t in host.values()))

    for p in plans:
        batch.append(p)
        size += p.nbytes
        if size >= HOST_BATCH:
            flush()
            batch, size = [], 0
    if batch:
        flush()
    return out


def _load_cuda_node(src: _Source, plans, device: torch.device, sock_path: str, flags=0):
    """Allocates one GPU buffer for all the tensors and asks the node to fill
    it (op FILL): one IPC handle and few requests. Measured on the H200
    (docs/bench.md): a buffer per tensor meant a handle to open and a request
    per cudaMalloc segment, and ran at 6.4 GB/s warm where one request per
    file into one buffer ran at 28. The tensors returned are views of that
    buffer (as fastsafetensors' are): its memory is freed when the last of
    them is. The handle comes from the driver (cuIpcGetMemHandle), not
    torch's _share_cuda_: see kylix._node.ipc_handle for why."""
    layout, total = [], 0
    for p in plans:
        layout.append((p, total))
        total += -(-p.nbytes // _NODE_ALIGN) * _NODE_ALIGN
    big = torch.empty(max(total, 1), dtype=torch.uint8, device=device)
    bufs, ranges = {}, []
    for p, off in layout:
        shape = p.block_shape if p.narrow is not None else p.shape
        bufs[p.name] = (p, big[off:off + p.nbytes].view(torch_dtype(p.dtype)).view(shape))
        ranges.extend((r[0], r[1], off + r[2]) + tuple(r[3:]) for r in p.runs)
    torch.cuda.synchronize(device)  # allocations are stream-ordered; nothing may be pending
    last = None
    if ranges:
        with torch.cuda.device(device):
            handle, base, _size = _node.ipc_handle(big.data_ptr())
        shift = big.data_ptr() - base
        client = _node.NodeClient(sock_path)
        try:
            strided = any(len(r) == 5 for r in ranges)
            step = _node.MAX_STRIDED_RANGES if strided else _node.MAX_RANGES
            for i in range(0, len(ranges), step):
                part = [(r[0], r[1], shift + r[2]) + tuple(r[3:]) for r in ranges[i:i + step]]
                last = client.fill(src.fd, device.index or 0, handle, part, flags)
                src.count("node-fill", sum(r[1] * (r[3] if len(r) == 5 else 1) for r in part))
        finally:
            client.close()
    return {name: _finish(p, buf) for name, (p, buf) in bufs.items()}, last


# Tensors in the node-fill buffer start at multiples of this (every dtype's
# size divides it; 256 is what cudaMalloc gives).
_NODE_ALIGN = 256


def _load(src: _Source, plans, device, threads, info, node_plans=None):
    dev = torch.device(device)
    if dev.type == "cpu":
        return _load_host(src, plans, threads)
    if dev.type != "cuda":
        t = _load_host(src, plans, threads)
        return {k: v.to(dev) for k, v in t.items()}
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    pr = None
    try:
        pr = _node.probe(src.fd)
    except OSError as e:
        info["node_error"] = f"probe: {e}"
    info["node"] = pr
    if pr is not None and pr[2] and not os.environ.get("KYLIX_NO_NODE"):
        try:
            out, res = _load_cuda_node(src, node_plans() if node_plans else plans, dev, pr[2])
            if res is not None:
                info["node_path"] = {"path": res.path, "io": res.io, "verified": res.verified}
            return out
        except (OSError, RuntimeError) as e:
            # Correctness first: any failure of the fast path (no GPU in the node,
            # ENODEV, a refused handle) falls back to reading here, from scratch.
            info["node_error"] = str(e)
            src.stats.pop("node-fill", None)
    elif pr is None:
        info.setdefault("node_error", "not a Kylix mount (KYLIX_IOC_PROBE unanswered)")
    return _load_cuda_pinned(src, plans, dev, threads)


# ---------------------------------------------------------------- public API

def load_file(filename, device="cpu", *, tp_rank: Optional[int] = None, tp_size: Optional[int] = None,
              split: Optional[Mapping[str, Optional[int]]] = None, threads: Optional[int] = None,
              use_lib: Optional[bool] = None) -> dict:
    """Like safetensors.torch.load_file: {name: tensor}, names sorted, each
    tensor bitwise equal. With tp_rank/tp_size, each tensor that the split
    rules (kylix.split) split is full.chunk(tp_size, dim)[tp_rank], and only
    those bytes are read; the rest is whole. On a GPU through the node
    (node-fill), a share split along a later dimension is read from the
    rank's layout as one run when `kylix layout --tp-size N` stored one
    (last_load_info()["node_path"]["io"] then says "rank layout")."""
    if (tp_rank is None) != (tp_size is None):
        raise ValueError("give both tp_rank and tp_size, or neither")
    if tp_size is not None:
        _split.chunk_range(0, tp_rank, tp_size)  # validates
    if isinstance(device, int):
        device = f"cuda:{device}"
    t0 = time.perf_counter()
    src = _Source(filename, use_lib)
    info = {"path": src.path, "device": str(device), "libkylix": src.lib_why}
    try:
        names = sorted(src.header.tensors)
        plans = _rank_plans(src.header, names, tp_rank, tp_size, split)
        # The node fill takes a share split along a later dimension as one
        # strided range (rows, pitch): the node places only the share's
        # bytes (one range per row ran at 0.1 GB/s on the H200, and reading
        # the rows' whole block placed 0.66 of the model per rank of 2:
        # docs/bench.md).
        node_plans = lambda: _rank_plans(src.header, names, tp_rank, tp_size, split, strided_runs=True)
        out = _load(src, plans, device, threads or _default_threads(), info, node_plans)
    finally:
        src.close()
    info.update(tensors=len(names), bytes=dict(src.stats), seconds=time.perf_counter() - t0)
    _publish(info)
    return {n: out[n] for n in names}


class _Slice:
    """safe_open(...).get_slice(name): shape and dtype without reading, and
    __getitem__ reading only the rows (along dim 0) the index touches."""

    def __init__(self, f: "safe_open", t: TensorInfo):
        self._f, self._t = f, t

    def get_shape(self):
        return list(self._t.shape)

    def get_dtype(self):
        return self._t.dtype

    def __len__(self):
        return self._t.shape[0] if self._t.shape else 0

    def __getitem__(self, idx):
        t = self._t
        if not isinstance(idx, tuple):
            idx = (idx,)
        if not t.shape:
            return self._f._read([tensor_plan(t, None)])[t.name][idx]
        first = idx[0] if idx else slice(None)
        if first is Ellipsis:
            first = slice(None)
        if isinstance(first, int):
            n = t.shape[0]
            i = first + n if first < 0 else first
            if not 0 <= i < n:
                raise IndexError(f"index {first} is out of bounds for dimension 0 with size {n}")
            block = self._f._read([tensor_plan(t, 0, i, i + 1)])[t.name]
            return block[(0,) + idx[1:]]
        if isinstance(first, slice):
            s, e, step = first.indices(t.shape[0])
            if step > 0 and e > s:
                block = self._f._read([tensor_plan(t, 0, s, e)])[t.name]
                return block[(slice(0, e - s, step),) + idx[1:]]
        full = self._f._read([tensor_plan(t, None)])[t.name]
        return full[idx]


class safe_open:
    """safetensors.safe_open for framework="pt": keys(), get_tensor(),
    get_slice(), metadata(); usable as a context manager."""

    def __init__(self, filename, framework="pt", device="cpu", *, use_lib: Optional[bool] = None):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError(f"framework {framework!r}: kylix.torch.safe_open serves \"pt\" only")
        if isinstance(device, int):
            device = f"cuda:{device}"
        self._device = device
        self._src = _Source(filename, use_lib)
        self._info = {"path": self._src.path, "device": str(device), "libkylix": self._src.lib_why}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self._src is not None:
            self._info.update(bytes=dict(self._src.stats))
            _publish(self._info)
            self._src.close()
            self._src = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _hdr(self) -> Header:
        if self._src is None:
            raise RuntimeError("file is closed")
        return self._src.header

    def keys(self):
        return sorted(self._hdr().tensors)

    def offset_keys(self):
        h = self._hdr()
        return [n for n in h.tensors]  # file order

    def metadata(self):
        m = self._hdr().metadata
        return dict(m) if m is not None else None

    def _read(self, plans):
        return _load(self._src, plans, self._device, _default_threads(), self._info)

    def get_tensor(self, name: str) -> torch.Tensor:
        h = self._hdr()
        if name not in h.tensors:
            raise KeyError(f"File does not contain tensor {name}")
        return self._read([tensor_plan(h.tensors[name], None)])[name]

    def get_slice(self, name: str) -> _Slice:
        h = self._hdr()
        if name not in h.tensors:
            raise KeyError(f"File does not contain tensor {name}")
        return _Slice(self, h.tensors[name])
