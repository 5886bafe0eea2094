"""kylix.kv_lmcache: an LMCache (v1) storage backend over the node's KV
store (kylix.kv, docs/design/kv.md, section "Adapters").

    backend = KylixStorageBackend("/mnt/kylix", allocator=local_cpu_backend)

Written against LMCache's public source, not run inside LMCache: LMCache
cannot be installed where this was written (no PyPI). The interface read
was lmcache/v1/storage_backend/abstract_backend.py (StorageBackendInterface,
commit 00d44c9f) and lmcache/v1/memory_management.py (MemoryObj,
MemoryObjMetadata, MemoryFormat, MemoryAllocatorInterface, commit
004446a0); batched_contains's prefix count, batched_async_contains and
get_allocator_backend as other backends in that tree use them. Tested by
contrib/python/tests/test_kv_lmcache.py, a harness calling the interface's
methods with CacheEngineKey-like keys and tensor-backed memory objects,
against a real node. Not tested: LMCache itself (its storage manager, how
it registers a backend of its own, its allocator), memory objects in GPU
memory, and keys of LMCache versions whose to_string() differs.

How it maps. A key is key("kylix-lmcache", 1, cache_engine_key.to_string())
(to_string() holds the format, model, world size, worker id, chunk hash
and, where the version has them, dtype, tags and layer id). A memory object
is one store block: its bytes from offset 0, and in the block's last 64
bytes a trailer (little-endian: "KYLM", u16 version 1, u8 dtype code, u8
ndim, u32 MemoryFormat value, u32 0, u64 byte length, u64 shape[5]), so a
get rebuilds the object's shape, dtype and format. So the node's --kv-block
must be at least the largest chunk + 64 bytes (a smaller last chunk of a
prompt fits the same block). The bytes go through one staging copy per
block on each side (the trailer must travel with them).

Semantics of the interface's methods here:
- batched_submit_put_task: puts run on one thread, in order; each future
  resolves to True (stored) or False (refused for room: the node's host
  tier is full of blocks not yet on disk; a later get is a miss); the
  object's ref count is held while it is read. exists_in_put_tasks is true
  until then, and a get of such a key waits for its put.
- get_blocking: a miss, a block whose trailer does not parse, or an
  allocator that returns None is None (a miss, never wrong data: the node
  verifies blocks read from disk).
- contains(pin=True), pin, unpin: the node's LRU has no pins, so pin and
  unpin return False and a block may be evicted between contains and get.
- remove: the client socket has no per-key delete; remove returns False
  and batched_remove 0 (kylix kv clear drops a uid's blocks).
- Only memory objects with a tensor (a dtype) are stored; the binary
  formats without one (BytesBufferMemoryObj) are refused with a ValueError
  in their future.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from . import kv as _kv

try:
    from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface as _LMBase
    _LM_ERROR = None
except ImportError as e:
    _LMBase, _LM_ERROR = None, e

KEY_VERSION = 1
TRAILER = 64
_MAGIC = b"KYLM"
_TRAILER_FMT = "<4sHBBIIQ5Q"  # 64 bytes
# dtype codes: the index in this list (0: none). Never reorder; append.
_DTYPES = ["", "float16", "bfloat16", "float32", "float64", "uint8", "int8", "int16", "int32", "int64",
           "float8_e4m3fn", "float8_e5m2", "bool"]


def cache_key(key) -> bytes:
    """The 32-byte store key of an LMCache CacheEngineKey (or any key with
    to_string())."""
    to_string = getattr(key, "to_string", None)
    if to_string is None:
        raise TypeError(f"an LMCache key has to_string(); {type(key).__name__} does not")
    return _kv.key("kylix-lmcache", KEY_VERSION, to_string())


def _dtype_code(dtype) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES[1:]:
        raise ValueError(f"dtype {dtype} has no code in kylix.kv_lmcache")
    return _DTYPES.index(name)


def _fmt_value(fmt) -> int:
    return int(getattr(fmt, "value", fmt or 0))


class KylixMemoryObj:
    """A tensor-backed memory object with LMCache's MemoryObj methods, for a
    get without an allocator (LMCache's own backends use its allocator)."""

    def __init__(self, raw: torch.Tensor, shape, dtype, fmt):
        self.raw_data = raw
        self.meta = type("Meta", (), {})()
        self.meta.shape, self.meta.dtype, self.meta.fmt = torch.Size(shape), dtype, fmt
        self.meta.ref_count, self.meta.is_pin = 1, False
        self.meta.phy_size = raw.numel()
        self.valid = True

    metadata = property(lambda self: self.meta)
    tensor = property(lambda self: self.raw_data.view(self.meta.dtype).view(self.meta.shape))
    byte_array = property(lambda self: memoryview(self.raw_data.numpy()).cast("B"))
    is_pinned = property(lambda self: self.meta.is_pin)

    def get_size(self):
        return self.raw_data.numel()

    def get_shape(self):
        return self.meta.shape

    def get_dtype(self):
        return self.meta.dtype

    def get_memory_format(self):
        return self.meta.fmt

    def get_physical_size(self):
        return self.meta.phy_size

    def ref_count_up(self):
        self.meta.ref_count += 1

    def ref_count_down(self):
        self.meta.ref_count -= 1

    def get_ref_count(self):
        return self.meta.ref_count

    def pin(self):
        self.meta.is_pin = True
        return True

    def unpin(self):
        self.meta.is_pin = False
        return True

    def invalidate(self):
        self.valid = False

    def is_valid(self):
        return self.valid


class KylixBackendCore:
    """The backend's logic. KylixStorageBackend is this on LMCache's
    StorageBackendInterface; the tests call this class's methods as
    LMCache's storage manager calls a backend's."""

    def __init__(self, mount_point=None, allocator=None, dst_device="cpu", store=None, formats=None):
        self.dst_device = dst_device
        self._kv = store if store is not None else _kv.KVStore(mount_point)
        self._alloc = allocator
        self._formats = formats  # MemoryFormat enum (value -> member) for gets without an allocator
        self._mu = threading.Lock()
        self._puts = {}  # store key -> Future of its put
        self._put_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kylix-lmcache-put")
        self._get_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kylix-lmcache-get")
        self.stats = {"puts": 0, "refused": 0, "hits": 0, "misses": 0, "bad_trailers": 0}

    def __str__(self):
        return "KylixStorageBackend"

    # --- lookups ---
    def contains(self, key, pin: bool = False) -> bool:
        return self._kv.contains([cache_key(key)])[0] is not None

    def batched_contains(self, keys, pin: bool = False) -> int:
        """How many keys from the first the node holds (LMCache's prefix hit)."""
        n = 0
        for where in self._kv.contains([cache_key(k) for k in keys]):
            if where is None:
                break
            n += 1
        return n

    async def batched_async_contains(self, lookup_id, keys, pin: bool = False) -> int:
        return await asyncio.get_running_loop().run_in_executor(self._get_pool, self.batched_contains, keys, pin)

    def exists_in_put_tasks(self, key) -> bool:
        with self._mu:
            return cache_key(key) in self._puts

    # --- put ---
    def _encode(self, obj) -> torch.Tensor:
        t = getattr(obj, "tensor", None)
        if t is None:
            raise ValueError("kylix.kv_lmcache stores memory objects with a tensor; this one has none")
        raw = t.contiguous().view(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)
        n, bs = raw.numel(), self._kv.block_size
        if n > bs - TRAILER:
            raise ValueError(f"a memory object of {n} bytes does not fit the node's {bs}-byte KV blocks "
                             f"with kylix.kv_lmcache's {TRAILER}-byte trailer: start the node with --kv-block {n + TRAILER} or more")
        shape = list(t.shape)
        if len(shape) > 5:
            raise ValueError(f"kylix.kv_lmcache stores up to 5 dimensions, this object has {len(shape)}")
        meta = getattr(obj, "metadata", None)
        fmt = _fmt_value(getattr(meta, "fmt", 0))
        block = torch.zeros(bs, dtype=torch.uint8)
        block[:n].copy_(raw)
        trailer = struct.pack(_TRAILER_FMT, _MAGIC, 1, _dtype_code(t.dtype), len(shape), fmt, 0, n,
                              *(shape + [0] * (5 - len(shape))))
        block[bs - TRAILER:] = torch.frombuffer(bytearray(trailer), dtype=torch.uint8)
        return block

    def _put_one(self, sk, obj) -> bool:
        try:
            ok = self._kv.put([sk], [self._encode(obj)])[0]
            self.stats["puts" if ok else "refused"] += 1
            return ok
        finally:
            with self._mu:
                self._puts.pop(sk, None)
            if hasattr(obj, "ref_count_down"):
                obj.ref_count_down()

    def batched_submit_put_task(self, keys, objs, transfer_spec=None):
        futs = []
        for k, obj in zip(keys, objs):
            sk = cache_key(k)
            if hasattr(obj, "ref_count_up"):
                obj.ref_count_up()
            with self._mu:
                f = self._put_pool.submit(self._put_one, sk, obj)
                self._puts[sk] = f
            futs.append(f)
        return futs

    def submit_put_task(self, key, obj):
        return self.batched_submit_put_task([key], [obj])[0]

    # --- get ---
    def _decode(self, block: torch.Tensor):
        bs = block.numel()
        tr = struct.unpack(_TRAILER_FMT, bytes(block[bs - TRAILER:].numpy()))
        magic, ver, code, ndim, fmt, _z, n = tr[:7]
        shape = list(tr[7:7 + ndim]) if ndim <= 5 else None
        dtype = getattr(torch, _DTYPES[code], None) if 0 < code < len(_DTYPES) else None
        if magic != _MAGIC or ver != 1 or shape is None or dtype is None or n > bs - TRAILER:
            return None
        esize = torch.empty(0, dtype=dtype).element_size()
        numel = 1
        for d in shape:
            numel *= d
        if numel * esize != n:
            return None
        return shape, dtype, fmt, n

    def _fmt(self, value):
        if self._formats is not None:
            return self._formats(value)
        try:
            from lmcache.v1.memory_management import MemoryFormat
            return MemoryFormat(value)
        except ImportError:
            return value

    def get_blocking(self, key):
        sk = cache_key(key)
        with self._mu:
            pending = self._puts.get(sk)
        if pending is not None:
            pending.result()
        block = torch.empty(self._kv.block_size, dtype=torch.uint8)
        if not self._kv.get([sk], out=[block])[0]:
            self.stats["misses"] += 1
            return None
        dec = self._decode(block)
        if dec is None:
            self.stats["bad_trailers"] += 1
            return None
        shape, dtype, fmt, n = dec
        fmt = self._fmt(fmt)
        if self._alloc is not None:
            obj = self._alloc.allocate(torch.Size(shape), dtype, fmt)
            if obj is None:
                self.stats["misses"] += 1
                return None
            obj.tensor.view(-1).view(torch.uint8).copy_(block[:n])
        else:
            obj = KylixMemoryObj(block[:n].clone(), shape, dtype, fmt)
        self.stats["hits"] += 1
        return obj

    def batched_get_blocking(self, keys):
        return [self.get_blocking(k) for k in keys]

    def get_non_blocking(self, key):
        """A future of get_blocking's result; None where the node does not
        hold the key now."""
        if not self.contains(key) and not self.exists_in_put_tasks(key):
            return None
        return self._get_pool.submit(self.get_blocking, key)

    async def batched_get_non_blocking(self, lookup_id, keys, transfer_spec=None):
        return await asyncio.get_running_loop().run_in_executor(self._get_pool, self.batched_get_blocking, keys)

    def submit_prefetch_task(self, key) -> bool:
        """Whether the node holds key. Nothing is fetched ahead: the node's
        host tier is the prefetched copy."""
        return self.contains(key)

    # --- no pins, no per-key delete on the client socket ---
    def pin(self, key) -> bool:
        return False

    def unpin(self, key) -> bool:
        return False

    def remove(self, key, force: bool = True) -> bool:
        return False

    def batched_remove(self, keys, force: bool = True) -> int:
        return 0

    def get_allocator_backend(self):
        return self._alloc

    def close(self) -> None:
        self._put_pool.shutdown(wait=True)
        self._get_pool.shutdown(wait=True)
        self._kv.close()


if _LMBase is not None:
    class KylixStorageBackend(KylixBackendCore, _LMBase):
        """LMCache's StorageBackendInterface over the Kylix node's KV store."""

        def __init__(self, mount_point, allocator=None, dst_device="cpu"):
            _LMBase.__init__(self, dst_device)
            KylixBackendCore.__init__(self, mount_point, allocator, dst_device)
else:
    class KylixStorageBackend:
        """Needs LMCache; KylixBackendCore is the same logic without it."""

        def __init__(self, *args, **kwargs):
            raise ImportError("kylix.kv_lmcache.KylixStorageBackend needs LMCache "
                              "(lmcache.v1.storage_backend.abstract_backend), which is not installed: "
                              f"{_LM_ERROR}")


__all__ = ["KylixStorageBackend", "KylixBackendCore", "KylixMemoryObj", "cache_key"]
