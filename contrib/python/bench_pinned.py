#!/usr/bin/env python3
"""The baseline a competent Python programmer would write without Kylix, for
docs/bench.md: THREADS threads, each with two 16 MiB pinned buffers and its
own CUDA stream, preads (O_DIRECT cold, page cache warm) of 16 MiB pieces of the file's data section
into one buffer while the other is copied to the GPU asynchronously; one GPU
buffer per file, tensors returned as views of it (as kylix.torch's node fill
returns them). No verification. Falls back to buffered reads where the file
system refuses O_DIRECT, and says so in the result.

    load_file(path, device) -> ({name: tensor}, {"o_direct": bool})
"""
import os
import threading

import torch

from kylix.safetensors import parse_fd
from kylix.torch import torch_dtype

PIECE = 16 << 20
ALIGN = 4096
THREADS = 8


def load_file(path, device="cuda:0", threads=THREADS, direct=True):
    """direct: O_DIRECT reads (what a cold load wants); False reads through
    the page cache (what a warm one wants: O_DIRECT would go to the disk)."""
    dev = torch.device(device)
    fd0 = os.open(path, os.O_RDONLY)
    try:
        h = parse_fd(fd0)
        size = os.fstat(fd0).st_size
    finally:
        os.close(fd0)
    fd = -1
    if direct:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            direct = False
    if fd < 0:
        fd = os.open(path, os.O_RDONLY)
    start, end = h.data_start, size
    big = torch.empty(max(end - start, 1), dtype=torch.uint8, device=dev)
    pieces = list(range(start, end, PIECE))
    err = []

    def worker(k):
        try:
            stream = torch.cuda.Stream(device=dev)
            bufs = [torch.empty(PIECE + 2 * ALIGN, dtype=torch.uint8).pin_memory() for _ in range(2)]
            events = [None, None]
            for i, off in enumerate(pieces[k::threads]):
                b = i & 1
                if events[b] is not None:
                    events[b].synchronize()
                n = min(PIECE, end - off)
                lo = off - off % ALIGN  # O_DIRECT: aligned offset, length and address
                ln = -(-(off + n - lo) // ALIGN) * ALIGN
                mv = memoryview(bufs[b].numpy()).cast("B")
                got = 0
                while got < ln:
                    r = os.preadv(fd, [mv[got:ln]], lo + got)
                    if r <= 0:
                        break
                    got += r
                if got < off + n - lo:
                    raise EOFError(f"{path}: short read at {lo + got}")
                with torch.cuda.stream(stream):
                    big[off - start:off - start + n].copy_(bufs[b][off - lo:off - lo + n], non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                events[b] = ev
            stream.synchronize()
        except BaseException as e:  # reported to the caller
            err.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.close(fd)
    if err:
        raise err[0]
    out = {}
    for name, t in h.tensors.items():
        out[name] = big[t.begin:t.begin + t.nbytes].view(torch_dtype(t.dtype)).view(t.shape)
    return out, {"o_direct": direct}
