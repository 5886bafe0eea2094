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

to_device(batches, device) moves batches (tensors, or dicts/lists/tuples
of them) to a device, staging through pinned memory with copies on a
side stream prefetch batches ahead, so the copy overlaps the consumer.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import random
import tarfile
import warnings
import zlib
from typing import Callable, Iterator, Optional

try:
    import torch
    from torch.utils.data import Dataset as _Dataset, IterableDataset as _IterableDataset
except ImportError:  # the readers work without torch; DataLoader needs it
    torch = None
    _Dataset = _IterableDataset = object

__all__ = ["SampleError", "Samples", "Shards", "sample_key", "to_device"]

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


class _Window:
    """Reads a file front to back in large reads, handing out byte ranges.
    A large read that fails part way (the kernel returns what it read,
    then the next read fails: a chunk the node refused) leaves the rest of
    that window to exact reads of each range asked for, so an error is
    charged to the member whose bytes hold it, and the members around it
    still read."""

    def __init__(self, path: str, fd: int, size: int, read_size: int):
        self.path, self.fd, self.size, self.read_size = path, fd, size, read_size
        self.off, self.buf = 0, b""
        self.view = memoryview(self.buf)
        self.exact_until = 0
        self.direct = None  # an O_DIRECT descriptor, opened at the first error

    def close(self):
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None

    def _read(self, off: int, n: int, keep_partial: bool, into: Optional[bytearray] = None):
        """n bytes at off (fewer at the end of the file), read straight into
        one buffer (no copy per read): into when given (at least n long,
        cut to what was read), else a new one. keep_partial: a failing read
        returns what came before it (raises if nothing did); else the range
        is read again exactly (_direct), which raises for a range that
        fails."""
        buf = into if into is not None else bytearray(n)
        if len(buf) > n:
            del buf[n:]
        mv = memoryview(buf)
        got = 0
        try:
            while got < n:
                try:
                    k = os.preadv(self.fd, [mv[got:]], off + got)
                except OSError:
                    if keep_partial and got:
                        break
                    if keep_partial:
                        raise
                    return self._direct(off, n)
                if k == 0:
                    break
                got += k
        finally:
            mv.release()
        if got < n:
            del buf[got:]
        return buf

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
        if self.off <= off and end <= self.off + len(self.buf):
            return bytes(self.view[off - self.off:end - self.off])
        if off < self.exact_until:
            return bytes(self._read(off, end - off, False))
        want = min(max(n, self.read_size), self.size - off)
        # The window's buffer is reused: get hands out copies, so only
        # self.view holds it (a new one when it is too short; bytearray(n)
        # zeroes n bytes, which cost as much as the read).
        self.view.release()
        spare = self.buf if isinstance(self.buf, bytearray) and len(self.buf) >= want else None
        self.buf, self.view = b"", memoryview(b"")
        try:
            buf = self._read(off, want, True, into=spare)
        except OSError:
            buf = b""
        if len(buf) < want:
            self.exact_until = off + want
            if len(buf) < end - off:
                return bytes(self._read(off, end - off, False))  # raises for this range
        self.buf, self.off = buf, off
        self.view = memoryview(buf)
        return bytes(self.view[:end - off])


def _ustar(blk: bytes):
    """(name, size, type) of a plain ustar header whose checksum holds, or
    None for anything else (tarfile.TarInfo.frombuf then parses it, and
    refuses what is not a header): the common case without tarfile's
    cost of about 25 us a header."""
    if blk[257:263] != b"ustar\0" and blk[257:265] != b"ustar  \0":
        return None
    try:
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


def read_tar(path: str, *, read_size: int = 8 << 20, policy: Optional[_ErrorPolicy] = None) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each regular member of the tar file at path, in
    order. ustar, PAX ('x', 'g') and GNU long names ('L') are understood;
    other member types are passed over. Errors go to policy (default: raise
    SampleError); a member policy skips comes as (name, None)."""
    policy = policy or _ErrorPolicy("raise")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    w = None
    try:
        size = os.fstat(fd).st_size
        w = _Window(path, fd, size, read_size)
        off, pax, longname = 0, {}, None
        while off + BLOCK <= size:
            where = f"{path} at offset {off}"
            try:
                blk = w.get(off, BLOCK)
            except OSError as e:
                policy.handle(SampleError(e.errno or errno.EIO, where, f"tar header unreadable ({e.strerror}); the rest of this shard is lost"))
                return
            if blk == bytes(BLOCK):
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
            if htype in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME):
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
            try:
                data = w.get(data_off, n)
            except OSError as e:
                policy.handle(SampleError(e.errno or errno.EIO, f"{path}: member {name!r} at offset {data_off}", e.strerror or str(e)))
                data = None  # skipped: the caller drops the member's sample
            yield name, data
        if off < size:
            policy.handle(SampleError(errno.EBADMSG, f"{path} at offset {off}", f"truncated: {size - off} bytes where a tar header or trailer belongs"))
    finally:
        if w is not None:
            w.close()
        os.close(fd)


class Shards(_IterableDataset):
    """Iterable data set over tar shards (see the module's doc)."""

    def __init__(self, root_or_paths, *, shuffle: bool = False, seed: int = 0, shuffle_buffer: int = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 transform: Optional[Callable] = None, on_error="raise", read_size: int = 8 << 20,
                 batch: Optional[int] = None):
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

    def _samples(self, paths):
        # A sample one of whose members was skipped is left out whole:
        # a sample missing a member would fail later, far from the cause.
        for p in paths:
            cur, bad = None, False
            for name, data in read_tar(p, read_size=self.read_size, policy=self._policy):
                key, ext = sample_key(name)
                if cur is not None and cur["__key__"] != key:
                    if not bad:
                        yield cur
                    cur, bad = None, False
                if cur is None:
                    cur = {"__key__": key, "__shard__": p}
                if data is None:
                    bad = True
                cur[ext] = data
            if cur is not None and not bad:
                yield cur

    def __iter__(self):
        rank, world, wid, nw = _reader_place(self.rank, self.world_size)
        it = self._samples(self.my_shards())
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
                yield out
                out = []
        if out:
            yield out


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
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
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
