"""kylix.data: data sets over a Kylix directory, for torch.utils.data.

Two views of the same bytes, yielding the same samples:

- Samples(DIR): map-style (torch.utils.data.Dataset). The files below DIR,
  grouped as WebDataset groups them: one sample per key (the path up to the
  first dot of the base name), a dict {"__key__": key, EXT: bytes, ...}.
  One open and read per file: simple, random access, and the slow way for
  millions of small files.
- Shards(DIR): iterable (torch.utils.data.IterableDataset) over tar shards,
  such as those `kylix shards SRC DIR` makes (shard-*.tar plus index.json)
  or any WebDataset-style tar files. Each shard is read front to back in
  large reads (read_size, default 8 MiB), so a sample costs no lookup of
  its own.

Sharing and shuffling (Shards): the shards are the unit of work. Each epoch
the list of shards is permuted with a generator seeded by (seed, epoch),
the same in every process, and rank r of world_size w, worker i of n takes
every (w*n)-th shard starting at r*n+i. So every sample is read exactly
once per epoch across all ranks and workers, and the order is the same for
the same (seed, epoch, world_size, workers). A rank or worker may get one
shard more than another (or none when there are fewer shards than
readers): the share is exact, not padded as DistributedSampler pads.
shuffle_buffer > 0 also shuffles samples within a reader's stream (as
WebDataset's shuffle does), seeded by (seed, epoch, rank, worker).

Errors: a sample that cannot be read (the node answers EIO for a chunk
that fails its hash; a shard that is truncated or has a bad header) raises
SampleError naming the shard, the member and the offset. With
on_error="skip" the whole sample is left out and the error kept in
`errors` (of the
process that met it: a DataLoader worker's count stays in the worker), and
reading goes on with the next member when the tar structure allows it. No
sample ever carries wrong bytes: bytes come only from successful reads.

batch=N makes Shards yield lists of N samples (the last may be shorter),
so a DataLoader worker hands over one list at a time (batch_size=None).
columns=True (with batch=N) makes each batch one dict instead:
{"__key__": [key, ...], EXT: Column, ...}, a Column holding the field's
bytes of every sample end to end in one uint8 tensor plus int64 offsets
(col[i] is sample i's bytes as a tensor view; a sample without the field
has a zero-length entry and col.present says which have it). One copy of
each byte (window -> column), no object per sample but its key, and
nothing for default_convert, pin_memory or a worker's pickle to walk.
transform is refused with columns (map the batches instead); a
shuffle_buffer shuffles samples before they are put into columns.

Tar headers are parsed by libkylix's kylix_tar_scan (C) where libkylix
loads, else by the same rules in Python; Shards.scanner says which
("libkylix" or "python", and scanner_why why), scanner="python" or
"libkylix" asks for one. Headers the scanner does not take (PAX, GNU long
names, anything but the plain ustar form) go to the Python parser, one by
one, in both cases: the samples are the same either way.

Reads ahead (readahead=True, the default): one thread per iterator reads
the next window of the shard into a second buffer, and a second one opens
the next shard, while the caller's thread takes the current window
(os.preadv and os.open release the GIL); started at the first read,
stopped when the iterator ends or is closed or collected. A window read
ahead is used only when it is exactly the read the reader would make
then, so the samples and errors are those of readahead=False (reads in
the caller's thread). Shards.readahead says which mode runs.

to_device(batches, device) moves batches (tensors, or dicts/lists/tuples
of them) to a device, staging through pinned memory with copies on a
side stream prefetch batches ahead, so the copy overlaps the consumer.
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import random
import tarfile
import threading
import warnings
import zlib
from typing import Callable, Iterator, Optional

try:
    import torch
    from torch.utils.data import Dataset as _Dataset, IterableDataset as _IterableDataset
except ImportError:  # the readers work without torch; DataLoader needs it
    torch = None
    _Dataset = _IterableDataset = object

try:  # libkylix's tar scanner (kylix_tar_scan); the reader works without it
    import ctypes as _ctypes
    from . import _lib
except ImportError:
    _ctypes = _lib = None

__all__ = ["Column", "SampleError", "Samples", "Shards", "sample_key", "to_device"]

BLOCK = 512


class SampleError(OSError):
    """A sample that could not be read: where, and why (errno, message)."""

    def __init__(self, err: int, where: str, why: str):
        super().__init__(err, f"{where}: {why}")
        self.where = where


def sample_key(name: str) -> tuple[str, str]:
    """(key, extension) of a member name, as WebDataset splits it:
    "a/0001.seg.png" -> ("a/0001", "seg.png")."""
    d, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not stem:  # ".hidden": no key of its own before the dot
        stem, ext = base, ""
    return (d + "/" + stem if d else stem), ext


def _reader_place(rank, world_size):
    """(rank, world, worker, workers) of this process."""
    if rank is None or world_size is None:
        r, w = 0, 1
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    wid, nw = 0, 1
    if torch is not None:
        info = torch.utils.data.get_worker_info()
        if info is not None:
            wid, nw = info.id, info.num_workers
    return rank, world_size, wid, nw


class _ErrorPolicy:
    def __init__(self, on_error):
        if on_error not in ("raise", "skip") and not callable(on_error):
            raise ValueError(f"on_error={on_error!r}: give 'raise', 'skip' or a callable")
        self.on_error = on_error
        self.errors: list[SampleError] = []

    def handle(self, e: SampleError):
        self.errors.append(e)
        if self.on_error == "raise":
            raise e
        if callable(self.on_error):
            self.on_error(e)  # raises to stop
            return
        warnings.warn(f"kylix.data: skipped {e}", RuntimeWarning, stacklevel=3)


class Samples(_Dataset):
    """Map-style data set of the files below root, one sample per key."""

    def __init__(self, root: str, *, transform: Optional[Callable] = None, on_error="raise"):
        self.root = os.path.abspath(root)
        groups: dict[str, list[tuple[str, str]]] = {}
        for d, dirs, files in os.walk(self.root):
            dirs.sort()
            for f in sorted(files):
                p = os.path.join(d, f)
                if not os.path.isfile(p) or os.path.islink(p):
                    continue
                rel = os.path.relpath(p, self.root).replace(os.sep, "/")
                key, ext = sample_key(rel)
                groups.setdefault(key, []).append((ext, rel))
        self.keys = sorted(groups)
        self._members = groups
        self.transform = transform
        self._policy = _ErrorPolicy(on_error)

    @property
    def errors(self):
        return self._policy.errors

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        key = self.keys[i]
        s = {"__key__": key}
        for ext, rel in self._members[key]:
            try:
                with open(os.path.join(self.root, rel), "rb", buffering=0) as f:
                    s[ext] = f.read()
            except OSError as e:
                err = SampleError(e.errno or errno.EIO, f"{self.root}/{rel}", e.strerror or str(e))
                self._policy.handle(err)
                return None  # skipped: collate must drop None (see skip_none)
        return self.transform(s) if self.transform else s


def skip_none(batch):
    """A collate_fn for Samples(on_error="skip"): drops skipped samples,
    then collates the rest as torch's default does."""
    from torch.utils.data import default_collate
    return default_collate([s for s in batch if s is not None])


class _Ahead:
    """A helper thread of one pass over shards (one Shards iterator): it
    runs one job at a time (the read of the next window, or the open of
    the next shard) while the caller's thread takes the current window;
    os.preadv and os.open release the GIL. Started at its first job,
    stopped by close() (the pass's end, or the iterator closed or
    collected). It holds no reference to the iterator, so a dropped
    iterator is collected and closes it."""

    def __init__(self, name: str):
        self.name = name
        self._cv = threading.Condition(threading.Lock())
        self._job = None
        self._busy = False
        self._res = None
        self._stop = False
        self._thread = None

    def submit(self, job):
        """Runs job() on the thread; wait() returns (result, exception)."""
        with self._cv:
            assert not self._busy
            if self._thread is None:
                t = threading.Thread(target=self._run, name=self.name, daemon=True)
                t.start()  # raises where no thread can start: the caller reads inline
                self._thread = t
            self._job, self._busy, self._res = job, True, None
            self._cv.notify()
            # Until the thread has taken the job: waiting here hands it the
            # GIL now, where it would otherwise wait for this thread to be
            # made to drop it (sys.getswitchinterval(), 5 ms: longer than
            # the read of a window) before it could start the read.
            while self._job is not None:
                self._cv.wait()

    def busy(self) -> bool:
        return self._busy

    def wait(self):
        with self._cv:
            while self._busy:
                self._cv.wait()
            res, self._res = self._res, None
            return res

    def _run(self):
        cv = self._cv
        while True:
            with cv:
                while self._job is None and not self._stop:
                    cv.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
                cv.notify_all()
            try:
                res = (job(), None)
            except BaseException as e:  # handed to the caller's thread
                res = (None, e)
            del job
            with cv:
                self._res, self._busy = res, False
                cv.notify_all()

    def close(self):
        """Waits for the job in flight, then stops the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join()


def _read_into(fd: int, buf: Optional[bytearray], off: int, want: int):
    """(buffer, bytes read): want bytes of fd at off read into buf (a new
    buffer if buf is None or too small), as _Window.fill reads them: a
    read that fails or ends early stops there."""
    if buf is None or len(buf) < want:
        buf = bytearray(want)  # zeroed once, then reused
    mv = memoryview(buf)
    got = 0
    try:
        while got < want:
            try:
                k = os.preadv(fd, [mv[got:want]], off + got)
            except OSError:
                break
            if k == 0:
                break
            got += k
    finally:
        mv.release()
    return buf, got


def _no_thread(what: str, e: BaseException):
    warnings.warn(f"kylix.data: no thread for {what} ({e}); this pass reads in the caller's thread",
                  RuntimeWarning, stacklevel=3)


class _Window:
    """Reads files front to back in large reads into one buffer (it never
    moves while it is the window: a scanner in C reads it by address),
    handing out byte ranges; one window serves every file of a pass
    (open(), close_file()), so its buffers are reused from file to file.

    A large read that fails part way (the kernel returns what it read,
    then the next read fails: a chunk the node refused) leaves the rest of
    that range to exact reads of each range asked for, so an error is
    charged to the member whose bytes hold it, and the members around it
    still read.

    Readahead (ahead and opener, two _Ahead threads): a second buffer,
    filled on the reader thread with the window the caller will ask for
    next (prefetch(off)), or with the first window of the next file
    (prefetch_file(path)), while the caller takes the current one; and
    the next file opened on the opener thread (open_ahead(path)) while
    this one is read. fill() swaps a window read ahead in only when it is
    exactly the read fill() would make (same file, offset and length), so
    the bytes, the short read after a failure and exact_until are those
    of a read made then; one not asked for is dropped, its errors with
    it. At most one window and one file ahead: two buffers, two files.

    The window is buf[0:n], bytes off .. off + n of the file; view is a
    memoryview of buf. Slices of view must be dropped before the next
    fill (the buffer is read into again: at once without readahead, at the
    next prefetch with it)."""

    def __init__(self, read_size: int, readahead: bool = False):
        self.read_size = read_size
        self.ahead = _Ahead("kylix.data readahead") if readahead else None
        self.opener = _Ahead("kylix.data open-ahead") if readahead else None
        self.path, self.fd, self.size = None, -1, 0
        self.off, self.n = 0, 0
        self.buf = bytearray()
        self.view = memoryview(self.buf)
        self.addr = 0
        self.other = None  # the second buffer (readahead), when not in flight
        self.pending = None  # (path, fd, off, want) of the read in flight
        self.opening = None  # the path the opener opens
        self.opened = None  # (path, fd, size) opened ahead, not yet open()ed
        self.exact_until = 0
        self.direct = None  # an O_DIRECT descriptor, opened at the first error

    def _take_opened(self, block: bool):
        """Moves the opener's finished job into opened."""
        if self.opening is None or (not block and self.opener.busy()):
            return
        path, self.opening = self.opening, None
        res, exc = self.opener.wait()
        if exc is None:
            self.opened = (path, res[0], res[1])
        # An open that failed ahead is made again by open(), which raises.

    def open_ahead(self, path: str):
        """Starts opening path on the opener thread (open() takes it)."""
        if self.opener is None or self.opening is not None or self.opened is not None:
            return

        def job():
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                return fd, os.fstat(fd).st_size
            except BaseException:
                os.close(fd)
                raise

        try:
            self.opener.submit(job)
        except RuntimeError as e:  # no thread: open inline, and say so
            _no_thread("open-ahead", e)
            self.opener = None
            return
        self.opening = path

    def open(self, path: str) -> int:
        """Makes path the window's file (opened ahead by open_ahead, its
        first window read ahead by prefetch_file, where they were);
        returns its size."""
        self.close_file()
        if self.opening == path:
            self._take_opened(True)
        o = self.opened
        if o is not None and o[0] == path:
            self.opened = None
            self.path, self.fd, self.size = o
            return self.size
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
        except BaseException:
            os.close(fd)
            raise
        self.path, self.fd, self.size = path, fd, size
        return size

    def close_file(self):
        self._drop_pending(self.fd)  # a read of this file: done before its fd closes
        if self.direct is not None:
            if self.direct >= 0:
                os.close(self.direct)
            self.direct = None
        if self.fd >= 0:
            os.close(self.fd)
        self.path, self.fd, self.size = None, -1, 0
        self.off, self.n, self.exact_until = 0, 0, 0

    def close(self):
        """Closes the file and the one opened ahead, drops what was read
        ahead and stops the threads."""
        try:
            self.close_file()
            self._drop_pending()
            if self.opener is not None:
                self._take_opened(True)
            if self.opened is not None:
                os.close(self.opened[1])
                self.opened = None
        finally:
            for t in (self.ahead, self.opener):
                if t is not None:
                    t.close()
            self.view.release()
            self.other = None

    def _drop_pending(self, fd: Optional[int] = None):
        """Waits for the read in flight (of fd, if given) and drops it."""
        p = self.pending
        if p is None or (fd is not None and p[1] != fd):
            return
        self.pending = None
        res, exc = self.ahead.wait()
        if exc is None:
            self.other = res[0]

    def _address(self):
        if _ctypes is None or not len(self.buf):
            self.addr = 0
            return
        c = _ctypes.c_char.from_buffer(self.buf)
        self.addr = _ctypes.addressof(c)
        del c

    def _swap(self, buf: bytearray, off: int, want: int, got: int):
        """buf, read ahead, becomes the window; the window's buffer the
        spare one."""
        self.view.release()
        self.other = self.buf if len(self.buf) else None
        self.buf = buf
        self.view = memoryview(buf)
        self._address()
        self.off, self.n = off, got
        if got < want:
            self.exact_until = off + want

    def _read_ahead(self, path: str, fd: int, off: int, want: int):
        buf, self.other = self.other, None
        try:
            self.ahead.submit(lambda: _read_into(fd, buf, off, want))
        except RuntimeError as e:  # no thread: read inline from now on, and say so
            _no_thread("readahead", e)
            self.ahead, self.other = None, buf
            return
        self.pending = (path, fd, off, want)

    def prefetch(self, off: int):
        """Starts reading the window fill(off) will read, on the reader
        thread, into the spare buffer (nothing without readahead, while
        a read is in flight, at the end of the file, or where exact reads
        are due)."""
        if self.ahead is None or self.pending is not None or off >= self.size or off < self.exact_until:
            return
        self._read_ahead(self.path, self.fd, off, min(self.read_size, self.size - off))

    def prefetch_file(self, path: str):
        """Starts reading the first window of path, the next file, if the
        opener has opened it (no waiting here)."""
        if self.ahead is None or self.pending is not None:
            return
        self._take_opened(False)
        o = self.opened
        if o is None or o[0] != path or o[2] <= 0:
            return
        self._read_ahead(path, o[1], 0, min(self.read_size, o[2]))

    def fill(self, off: int, want: int = 0) -> int:
        """Reads the window at off: want bytes (default read_size; fewer
        at the end of the file). A read that fails part way keeps what
        came before it and leaves the rest of the range to exact reads
        (exact_until). Returns the bytes now in the window."""
        want = min(max(want, self.read_size), self.size - off)
        p = self.pending
        if p is not None and p[1] == self.fd:
            self.pending = None
            res, exc = self.ahead.wait()
            if exc is not None:
                raise exc  # not an OSError (_read_into keeps those): a bug or MemoryError
            buf, got = res
            if p[0] == self.path and p[2] == off and p[3] == want:
                self._swap(buf, off, want, got)
                return got
            self.other = buf
        if len(self.buf) < want:
            if self.other is not None and len(self.other) >= want:
                buf, self.other = self.other, self.buf  # the spare one is large enough
            else:
                buf = bytearray(want)  # zeroed once, then reused
            self.view.release()
            self.buf = buf
            self.view = memoryview(self.buf)
            self._address()
        self.off, self.n = off, 0
        got = _read_into(self.fd, self.buf, off, want)[1]
        self.n = got
        if got < want:
            self.exact_until = off + want
        return got

    def _read(self, off: int, n: int) -> bytes:
        """n bytes at off (fewer at the end of the file), read into a new
        buffer; a read that fails is asked again exactly (_direct), which
        raises for a range that fails."""
        buf = bytearray(n)
        mv = memoryview(buf)
        got = 0
        try:
            while got < n:
                try:
                    k = os.preadv(self.fd, [mv[got:]], off + got)
                except OSError:
                    return self._direct(off, n)
                if k == 0:
                    break
                got += k
        finally:
            mv.release()
        if got < n:
            del buf[got:]
        return bytes(buf)

    def _direct(self, off: int, n: int) -> bytes:
        """The range read with O_DIRECT, so the file system is asked for
        exactly these bytes: through the page cache a read asks for whole
        pages, and a tar member's last page also holds the next header,
        so one refused chunk would take its neighbours with it. Raises
        the error of the range itself."""
        if self.direct is None:
            try:
                self.direct = os.open(self.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError:
                self.direct = -1
        if self.direct < 0:
            return os.pread(self.fd, n, off)  # raises for this range
        lo = off // 4096 * 4096
        hi = min(self.size, off + n)
        m = mmap.mmap(-1, (hi - lo + 4095) // 4096 * 4096)  # page-aligned
        try:
            got = os.preadv(self.direct, [m], lo)
            return bytes(m[off - lo:min(got, hi - lo)])
        except OSError:
            # The pages around the range hold the bad chunk: ask for the
            # range alone (FUSE passes unaligned direct reads through).
            got = os.preadv(self.direct, [memoryview(m)[:hi - off]], off)
            return bytes(m[:got])
        finally:
            m.close()

    def get(self, off: int, n: int) -> bytes:
        """n bytes at off (fewer only at the end of the file)."""
        end = min(off + n, self.size)
        if self.off <= off and end <= self.off + self.n:
            return bytes(self.view[off - self.off:end - self.off])
        if off < self.exact_until:
            return self._read(off, end - off)  # raises for this range
        if self.fill(off, n) < end - off:
            return self._read(off, end - off)  # raises for this range
        return bytes(self.view[:end - off])


def _ustar(blk: bytes):
    """(name, size, type) of a plain ustar header whose checksum holds, or
    None for anything else (tarfile.TarInfo.frombuf then parses it, and
    refuses what is not a header): the common case without tarfile's
    cost of about 25 us a header. Every header kylix_tar_scan takes, this
    takes too, with the same name, size and type."""
    if blk[257:263] != b"ustar\0" and blk[257:265] != b"ustar  \0":
        return None
    try:
        if blk[124] == 0x80:  # base-256, as kylix_tar_scan reads it
            size = int.from_bytes(blk[125:136], "big")
        else:
            size = int(blk[124:136].rstrip(b"\0 ") or b"0", 8)
        chk = int(blk[148:156].rstrip(b"\0 "), 8)
    except ValueError:
        return None
    # The checksum is the sum of the header's bytes with its own field
    # counted as spaces: adler32's low half is 1 + that sum mod 65521 (in
    # C, where sum() in Python took a quarter of the reader's time), and
    # the ustar magic above already matched.
    if (zlib.adler32(blk) & 0xFFFF) != (1 + chk - 8 * 32 + sum(blk[148:156])) % 65521:
        return None
    name = blk[0:100].split(b"\0", 1)[0]
    prefix = blk[345:500].split(b"\0", 1)[0] if blk[257:263] == b"ustar\0" else b""
    if prefix:
        name = prefix + b"/" + name
    t = blk[156:157]
    return name.decode("utf-8", "surrogateescape"), size, (t if t != b"\0" else tarfile.AREGTYPE)


def _pax(data: bytes) -> dict:
    out, i = {}, 0
    while i < len(data):
        sp = data.index(b" ", i)
        n = int(data[i:sp])
        k, _, v = data[sp + 1:i + n - 1].partition(b"=")
        out[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
        i += n
    return out


_ZERO = bytes(BLOCK)
_META = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME)
# Why a scan of a window stopped (kylix.h's KYLIX_TAR_*).
_MORE, _FULL, _END, _OTHER = 0, 1, 2, 3


def _scan_python(w: _Window, off: int):
    """The plain ustar headers of the window from off, in Python: what
    kylix_tar_scan returns, as (entries, stop, next offset); entries are
    (key, extension, start, end) of the regular members, start and end
    within w.view. Stops where kylix_tar_scan stops (a header it does not
    take, _ustar does not take either, or is a PAX or long-name header)."""
    view, base, end = w.view, w.off, w.n
    pos = off - base
    entries = []
    while True:
        if end - pos < BLOCK:
            return entries, _MORE, base + pos
        blk = bytes(view[pos:pos + BLOCK])
        if blk == _ZERO:
            return entries, _END, base + pos
        hdr = _ustar(blk)
        if hdr is None or hdr[2] in _META:
            return entries, _OTHER, base + pos
        name, size, t = hdr
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        if end - pos - BLOCK < padded:
            return entries, _MORE, base + pos
        if t == tarfile.REGTYPE or t == tarfile.AREGTYPE:
            key, ext = sample_key(name)
            entries.append((key, ext, pos + BLOCK, pos + BLOCK + size))
        pos += BLOCK + padded


class _ScanC:
    """kylix_tar_scan over a window (libkylix, kylix.h): the same entries
    as _scan_python, the headers parsed in C; Python builds one key string
    per sample (not per member) and one extension string per member."""

    MAX = 8192  # members per call (a window of 8 MiB holds at most 16 384)

    def __init__(self, fn):
        self.fn = fn
        self.out = (_ctypes.c_uint64 * (_lib.TAR_FIELDS * self.MAX))()
        self.q = memoryview(self.out).cast("B").cast("Q")
        self.n, self.next = _ctypes.c_size_t(), _ctypes.c_uint64()
        self.n_ref, self.next_ref = _ctypes.byref(self.n), _ctypes.byref(self.next)

    def __call__(self, w: _Window, off: int):
        pos = off - w.off
        rc = self.fn(w.addr + pos, w.n - pos, off, self.out, self.MAX, self.n_ref, self.next_ref)
        if rc < 0:
            raise OSError(-rc, f"kylix_tar_scan: {_lib.strerror(rc)}")
        F = _lib.TAR_FIELDS
        m = self.q[:self.n.value * F].tolist()
        if not m:
            return [], rc, self.next.value
        # Fields (kylix.h, _lib.TAR_*): header_offset 0, size 2, name_len
        # 4, prefix_len 5, key_len 6, type 7, flags 8; a column each.
        base = w.off
        hs = [h - base for h in m[0::F]]
        types = m[7::F]
        if types.count(48) + types.count(0) != len(types):  # not only regular files ('0', NUL)
            keep = [i for i, t in enumerate(types) if t == 48 or t == 0]
            cols = [[c[i] for i in keep] for c in (hs, m[2::F], m[4::F], m[5::F], m[6::F], m[8::F])]
        else:
            cols = (hs, m[2::F], m[4::F], m[5::F], m[6::F], m[8::F])
        hs, sizes, nls, pls, kls, flags = cols
        buf = w.buf
        key = None
        keys = []
        for h, kl, pl, f in zip(hs, kls, pls, flags):
            if not f & 1:  # not KYLIX_TAR_SAME_KEY: a new key
                if pl:
                    key = (buf[h + 345:h + 345 + pl] + b"/" + buf[h:h + kl]).decode("utf-8", "surrogateescape")
                else:
                    key = buf[h:h + kl].decode("utf-8", "surrogateescape")
            keys.append(key)
        exts = [buf[h + kl + 1:h + nl].decode("utf-8", "surrogateescape") if kl < nl else ""
                for h, kl, nl in zip(hs, kls, nls)]
        starts = [h + BLOCK for h in hs]
        return list(zip(keys, exts, starts, [a + n for a, n in zip(starts, sizes)])), rc, self.next.value


def _tar_runs(path: str, read_size: int, policy: _ErrorPolicy, scan, w: Optional[_Window] = None,
              next_path: Optional[str] = None) -> Iterator[tuple]:
    """The regular members of the tar file at path, in order, as runs
    (src, entries): entries a list of (key, extension, start, end), the
    member's bytes being src[start:end]. src is the window's memoryview
    (valid until the next run is asked for: copy what must outlive it) or
    a member's own bytes; start = -1 for a member whose read failed and
    that policy let pass (its sample must be left out).

    scan (_scan_python or a _ScanC) takes the plain ustar headers of each
    window; the headers it stops at (PAX, GNU long names, anything not
    plain, members larger than the window, the end of a truncated file)
    are read here one by one, as before there was a scanner. ustar, PAX
    ('x', 'g') and GNU long names ('L') are understood; other member types
    are passed over.

    w: the pass's window (its buffers and reader thread, kept from file to
    file; by default one of this call's, without readahead). With
    readahead, the window that starts at the header a scan stopped at is
    read ahead before the scan's members are handed out, and once the
    window reaches the end of the file, next_path (the file read after
    this one) is opened and its first window read ahead."""
    own = w is None
    if own:
        w = _Window(read_size)
    try:
        if next_path is not None:
            w.open_ahead(next_path)  # the first file: at the same time as this open
        size = w.open(path)
        if next_path is not None:
            w.open_ahead(next_path)
        off, pax, longname, again = 0, {}, None, False
        while off + BLOCK <= size:
            if not pax and longname is None:
                inwin = w.off <= off and off + BLOCK <= w.off + w.n
                if (again or not inwin) and off >= w.exact_until:
                    w.fill(off)
                    inwin = off + BLOCK <= w.off + w.n
                elif again:
                    inwin = False  # the window cannot start here: read exactly, below
                again = False
                if inwin:
                    entries, stop, off = scan(w, off)
                    if w.ahead is not None:
                        if next_path is not None and w.off + w.n >= size:
                            w.prefetch_file(next_path)
                        elif stop == _MORE and w.off != off:
                            w.prefetch(off)  # the window the loop fills next
                    if entries:
                        yield w.view, entries
                    if stop == _END:
                        return
                    if stop == _FULL:
                        continue
                    if stop == _MORE and w.off != off:
                        again = True  # the next window starts at this header
                        continue
                    # A header the scanner does not take, or a member that
                    # does not fit a window starting at its header: below.
            where = f"{path} at offset {off}"
            try:
                blk = w.get(off, BLOCK)
            except OSError as e:
                policy.handle(SampleError(e.errno or errno.EIO, where, f"tar header unreadable ({e.strerror}); the rest of this shard is lost"))
                return
            if blk == _ZERO:
                return  # the trailer
            hdr = _ustar(blk)
            if hdr is None:  # not plain ustar: tarfile's parser decides
                try:
                    ti = tarfile.TarInfo.frombuf(blk, "utf-8", "surrogateescape")
                except tarfile.HeaderError as e:
                    policy.handle(SampleError(errno.EBADMSG, where, f"not a tar header ({e}); the rest of this shard is lost"))
                    return
                hdr = (ti.name, ti.size, ti.type)
            hname, hsize, htype = hdr
            n = int(pax.get("size", hsize))
            data_off = off + BLOCK
            nxt = data_off + (n + BLOCK - 1) // BLOCK * BLOCK
            name = pax.get("path", longname or hname)
            if nxt > size:
                policy.handle(SampleError(errno.EBADMSG, f"{path}: member {name!r}", f"truncated: the member needs {nxt} bytes, the shard has {size}"))
                return
            if htype in _META:
                try:
                    meta = w.get(data_off, n)
                except OSError as e:
                    policy.handle(SampleError(e.errno or errno.EIO, where, f"tar extended header unreadable ({e.strerror}); the rest of this shard is lost"))
                    return
                if htype == tarfile.XHDTYPE:
                    pax = _pax(meta)
                elif htype == tarfile.GNUTYPE_LONGNAME:
                    longname = meta.rstrip(b"\0").decode("utf-8", "surrogateescape")
                off = nxt
                continue
            pax, longname = {}, None
            off = nxt
            if htype not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                continue
            key, ext = sample_key(name)
            try:
                data = w.get(data_off, n)
            except OSError as e:
                policy.handle(SampleError(e.errno or errno.EIO, f"{path}: member {name!r} at offset {data_off}", e.strerror or str(e)))
                yield None, [(key, ext, -1, -1)]  # skipped: the caller drops the member's sample
                continue
            yield data, [(key, ext, 0, len(data))]
        if off < size:
            policy.handle(SampleError(errno.EBADMSG, f"{path} at offset {off}", f"truncated: {size - off} bytes where a tar header or trailer belongs"))
    finally:
        if own:
            w.close()
        else:
            w.close_file()


def _scanner(choice: str):
    """(name, scan function or None for Python's, why) for Shards' scanner
    argument: "auto" takes libkylix's kylix_tar_scan where it loads."""
    if choice not in ("auto", "libkylix", "python"):
        raise ValueError(f"scanner={choice!r}: give 'auto', 'libkylix' or 'python'")
    if choice == "python":
        return "python", None, "scanner='python' was asked for"
    fn = _lib.tar_scan() if _lib is not None else None
    why = _lib.tar_scan_why() if _lib is not None else "kylix._lib is not importable (ctypes)"
    if fn is None:
        if choice == "libkylix":
            raise RuntimeError(f"scanner='libkylix': kylix_tar_scan is not available: {why}")
        return "python", None, why
    return "libkylix", fn, why


def read_tar(path: str, *, read_size: int = 8 << 20, policy: Optional[_ErrorPolicy] = None,
             scanner: str = "auto", readahead: bool = False) -> Iterator[tuple[str, str, Optional[bytes]]]:
    """(key, extension, bytes) of each regular member of the tar file at
    path, in order (see _tar_runs). Errors go to policy (default: raise
    SampleError); a member policy skips comes with bytes None. readahead:
    read the next window on a thread (as Shards does by default)."""
    policy = policy or _ErrorPolicy("raise")
    name, fn, _ = _scanner(scanner)
    scan = _ScanC(fn) if fn is not None else _scan_python
    w = _Window(read_size, readahead)
    try:
        for src, entries in _tar_runs(path, read_size, policy, scan, w):
            for key, ext, a, b in entries:
                yield key, ext, (bytes(src[a:b]) if a >= 0 else None)
    finally:
        w.close()


class Column:
    """One field of a columnar batch (Shards(batch=N, columns=True)): the
    field's bytes for every sample of the batch end to end in ONE uint8
    tensor, data, and int64 offsets (one more than the samples): sample i's
    bytes are data[offsets[i]:offsets[i + 1]].

    col[i] is that range as a tensor (a view, no copy), col.bytes(i) as
    bytes, col.tolist() all of them as bytes, len(col) the samples. A
    sample without this field has a zero-length entry, and present says
    which samples have it: None when all do (the usual case), else a bool
    tensor (so an empty file and a missing one can be told apart).

    For torch it is one object holding tensors: DataLoader's default_convert
    leaves it as it is, its pin_memory (and pin_memory=True) pins the
    tensors, a DataLoader worker sends it as its two or three tensors (no
    pickle per sample), col.to(device) and kylix.data.to_device move them."""

    __slots__ = ("data", "offsets", "present", "_bounds")

    def __init__(self, data, offsets, present=None):
        self.data, self.offsets, self.present = data, offsets, present
        self._bounds = None

    def __len__(self):
        return self.offsets.numel() - 1

    def _b(self):
        if self._bounds is None:
            self._bounds = self.offsets.tolist()
        return self._bounds

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        b = self._b()
        n = len(b) - 1
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} of a column of {n}")
        return self.data[b[i]:b[i + 1]]

    def __iter__(self):
        b = self._b()
        return (self.data[b[i]:b[i + 1]] for i in range(len(b) - 1))

    def bytes(self, i) -> bytes:
        """Sample i's bytes, copied into a bytes object."""
        t = self[i]
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.numel():
            return b""
        return _ctypes.string_at(t.data_ptr(), t.numel()) if t.is_contiguous() else bytes(t.tolist())

    def tolist(self) -> list:
        """Every sample's bytes, as bytes objects."""
        return [self.bytes(i) for i in range(len(self))]

    def _apply(self, fn):
        return Column(fn(self.data), fn(self.offsets), None if self.present is None else fn(self.present))

    def to(self, *args, **kwargs):
        return self._apply(lambda t: t.to(*args, **kwargs))

    def pin_memory(self, device=None):
        return self._apply(lambda t: t.pin_memory() if device is None else t.pin_memory(device))

    def __reduce__(self):
        return (Column, (self.data, self.offsets, self.present))

    def __repr__(self):
        return f"Column({len(self)} samples, {self.data.numel()} bytes{'' if self.present is None else ', some missing'})"


def _u8(buf):
    return torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)


def _build_columns(keys: list, fields: list) -> dict:
    """The columnar batch of samples whose fields (ext -> bytes-like) are
    fields[i] and keys keys[i]."""
    out = {"__key__": keys}
    names = dict.fromkeys(fields[0])
    for f in fields:
        if f.keys() != names.keys():
            names.update(dict.fromkeys(f))
    for e in names:
        try:
            pieces = [f[e] for f in fields]
            present = None
        except KeyError:
            pieces = [f.get(e, b"") for f in fields]
            present = torch.tensor([e in f for f in fields], dtype=torch.bool)
        offs = [0]
        offs.extend(itertools.accumulate(map(len, pieces)))
        out[e] = Column(_u8(bytearray().join(pieces)), torch.tensor(offs, dtype=torch.int64), present)
    return out


class Shards(_IterableDataset):
    """Iterable data set over tar shards (see the module's doc).

    batch=N yields lists of N sample dicts (the last may be shorter);
    with columns=True as well, one columnar dict per batch instead:
    {"__key__": [key, ...], EXT: Column, ...} (see Column), built from
    the shards' bytes with one copy per field and batch.

    scanner: "auto" (default) parses the tar headers of each read with
    libkylix's kylix_tar_scan where libkylix loads, else in Python;
    "libkylix" requires the C scanner (RuntimeError without it); "python"
    uses the Python parser. Both give the same samples. The attribute
    scanner says which one this object uses ("libkylix" or "python"), and
    scanner_why why (where the library came from, or why it is absent).

    readahead: True (default) reads the next window of each shard (and
    opens the next shard and reads its first window) on a thread while
    the current window's members are taken: one thread per iterator,
    started at its first read and stopped when the iterator ends or is
    closed or collected; two window buffers instead of one. False reads
    in the caller's thread. The samples and errors are the same either
    way; the attribute readahead says which mode runs."""

    def __init__(self, root_or_paths, *, shuffle: bool = False, seed: int = 0, shuffle_buffer: int = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 transform: Optional[Callable] = None, on_error="raise", read_size: int = 8 << 20,
                 batch: Optional[int] = None, columns: bool = False, scanner: str = "auto",
                 readahead: bool = True):
        if isinstance(root_or_paths, (str, os.PathLike)):
            root = os.fspath(root_or_paths)
            idx = os.path.join(root, "index.json")
            if os.path.exists(idx):
                with open(idx, "rb") as f:
                    self.index = json.load(f)
                self.paths = [os.path.join(root, s["name"]) for s in self.index["shards"]]
            else:
                self.index = None
                self.paths = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".tar"))
            if not self.paths:
                raise FileNotFoundError(errno.ENOENT, f"no tar shards in {root} (kylix shards SRC {root} makes them)")
        else:
            self.index, self.paths = None, [os.fspath(p) for p in root_or_paths]
        self.shuffle, self.seed, self.shuffle_buffer = shuffle, seed, shuffle_buffer
        self.rank, self.world_size = rank, world_size
        self.transform, self.read_size = transform, read_size
        if batch is not None and batch < 1:
            raise ValueError(f"batch={batch}: give a positive number of samples, or None")
        self.batch = batch
        if columns:
            if not batch:
                raise ValueError("columns=True needs batch=N: a column holds one field of N samples")
            if transform is not None:
                raise ValueError("columns=True does not take transform (it works on one sample dict, and a "
                                 "columnar batch has none): map the batches instead, e.g. "
                                 "DataLoader(ds, batch_size=None, collate_fn=f) runs f on each batch in the worker")
            if torch is None:
                raise ValueError("columns=True needs torch (a column is a uint8 tensor)")
        self.columns = columns
        self.scanner, fn, self.scanner_why = _scanner(scanner)
        self._scanner_choice = scanner
        self.readahead = bool(readahead)
        self._policy = _ErrorPolicy(on_error)
        self.epoch = 0

    @property
    def errors(self):
        return self._policy.errors

    def set_epoch(self, epoch: int):
        """Call before each epoch (as with DistributedSampler) so each
        epoch gets its own order."""
        self.epoch = epoch

    def my_shards(self) -> list[str]:
        """The shards this process (rank, DataLoader worker) reads this epoch."""
        rank, world, wid, nw = _reader_place(self.rank, self.world_size)
        order = list(range(len(self.paths)))
        if self.shuffle:
            random.Random(f"{self.seed}/{self.epoch}").shuffle(order)
        return [self.paths[i] for i in order[rank * nw + wid::world * nw]]

    def _scan(self):
        """The scan function, in this process (a DataLoader worker binds
        the library again): the one self.scanner names, or an error."""
        if self.scanner == "python":
            return _scan_python
        name, fn, why = _scanner("libkylix")  # raises where the library went away
        return _ScanC(fn)

    def _runs(self, paths):
        scan = self._scan()
        # One window for every shard of this pass (its buffers reused from
        # shard to shard) and, with readahead, one reader thread, started
        # at the first read ahead and stopped when the pass ends or its
        # iterator is closed or collected (the finally below).
        w = _Window(self.read_size, self.readahead)
        try:
            for i, p in enumerate(paths):
                yield p, _tar_runs(p, self.read_size, self._policy, scan, w,
                                   paths[i + 1] if i + 1 < len(paths) else None)
        finally:
            w.close()

    def _samples(self, paths):
        # A sample one of whose members was skipped is left out whole:
        # a sample missing a member would fail later, far from the cause.
        for p, runs in self._runs(paths):
            cur, key, bad = None, None, False
            for src, entries in runs:
                for k, ext, a, b in entries:
                    if k != key:
                        if cur is not None and not bad:
                            yield cur
                        cur, key, bad = {"__key__": k, "__shard__": p}, k, False
                    if a < 0:
                        bad = True
                        cur[ext] = None
                    else:
                        cur[ext] = bytes(src[a:b])
            if cur is not None and not bad:
                yield cur

    def _column_batches(self, paths):
        """Columnar batches straight from the windows: each member's bytes
        are copied once, from the window into its batch's column (a
        member of a batch that a window does not finish is copied out of
        the window first, since the next read reuses it)."""
        n = self.batch
        keys, fields = [], []
        for p, runs in self._runs(paths):
            cur, key, bad = None, None, False
            for src, entries in runs:
                for k, ext, a, b in entries:
                    if k != key:
                        if cur is not None and not bad:
                            keys.append(key)
                            fields.append(cur)
                            if len(keys) == n:
                                yield _build_columns(keys, fields)
                                keys, fields = [], []
                        cur, key, bad = {}, k, False
                    if a < 0:
                        bad = True
                    else:
                        cur[ext] = src[a:b]
                if type(src) is memoryview:
                    # The next run may read into this window: keep copies.
                    for f in fields:
                        for e, v in f.items():
                            if type(v) is memoryview:
                                f[e] = bytes(v)
                    if cur is not None:
                        for e, v in cur.items():
                            if type(v) is memoryview:
                                cur[e] = bytes(v)
            if cur is not None and not bad:
                keys.append(key)
                fields.append(cur)
                if len(keys) == n:
                    yield _build_columns(keys, fields)
                    keys, fields = [], []
        if keys:
            yield _build_columns(keys, fields)

    def __iter__(self):
        rank, world, wid, nw = _reader_place(self.rank, self.world_size)
        paths = self.my_shards()
        if self.columns and self.shuffle_buffer <= 0:
            yield from self._column_batches(paths)
            return
        it = self._samples(paths)
        if self.shuffle_buffer > 0:
            it = _buffer_shuffle(it, self.shuffle_buffer, random.Random(f"{self.seed}/{self.epoch}/{rank}/{wid}"))
        if self.transform:
            it = (self.transform(s) for s in it)
        if not self.batch:
            yield from it
            return
        # Lists of samples: a DataLoader worker then hands over one list
        # (one pickle) instead of one sample at a time, which is what
        # bounds loaders with workers (docs/bench.md, "Datasets").
        out = []
        for s in it:
            out.append(s)
            if len(out) == self.batch:
                yield _dict_columns(out) if self.columns else out
                out = []
        if out:
            yield _dict_columns(out) if self.columns else out


def _dict_columns(samples: list) -> dict:
    """The columnar batch of sample dicts (after a shuffle buffer)."""
    return _build_columns([s["__key__"] for s in samples],
                          [{e: v for e, v in s.items() if e != "__key__" and e != "__shard__"} for s in samples])


def _buffer_shuffle(it, n, rng):
    buf = []
    for s in it:
        if len(buf) < n:
            buf.append(s)
            continue
        i = rng.randrange(n)
        buf[i], s = s, buf[i]
        yield s
    rng.shuffle(buf)
    yield from buf


def _map(x, fn):
    if torch is not None and isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, Column):
        return x._apply(fn)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple takes its fields as arguments
        return type(x)(*(_map(v, fn) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    return x


def to_device(batches, device="cuda", *, prefetch: int = 2):
    """Yields each batch of batches on device. For a CUDA device, each
    batch's tensors are copied into pinned memory (torch's pin_memory,
    which copies with several threads; tensors already pinned are used as
    they are) and on to the device on a side stream, up to prefetch
    batches ahead of the consumer, whose stream waits for each copy. For
    the CPU, batches pass through unchanged; a CUDA device without CUDA is
    an error, not a silent CPU fallback. (Measured on the H200: a thread
    pool pinning several batches at once ran slower than this: 34.6 vs
    45 GB/s; docs/bench.md, "Batches to the GPU".)"""
    if torch is None:
        raise RuntimeError("kylix.data.to_device needs torch")
    dev = torch.device(device)
    if dev.type != "cuda":
        yield from (_map(b, lambda t: t.to(dev)) for b in batches)
        return
    if not torch.cuda.is_available():
        raise RuntimeError(f"kylix.data.to_device({device!r}): CUDA is not available here")
    stream = torch.cuda.Stream(device=dev)
    queue = []

    def start(b):
        hb = _map(b, lambda t: t if t.is_pinned() else t.pin_memory())
        with torch.cuda.stream(stream):
            db = _map(hb, lambda t: t.to(dev, non_blocking=True))
            ev = torch.cuda.Event()
            ev.record(stream)
        return db, ev

    def finish(db, ev):
        cur = torch.cuda.current_stream(dev)
        cur.wait_event(ev)
        # Made on the side stream, used on the consumer's: the caching
        # allocator must not hand the memory out again while it is in use.
        _map(db, lambda t: t.record_stream(cur))
        return db

    for b in batches:
        queue.append(start(b))
        if len(queue) > prefetch:
            yield finish(*queue.pop(0))
    for db, ev in queue:
        yield finish(db, ev)
