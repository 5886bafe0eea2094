"""kylix.kv_lmcache against a real node, called as LMCache's storage manager
calls a storage backend (StorageBackendInterface's methods: contains,
batched_contains, exists_in_put_tasks, batched_submit_put_task,
get_blocking, get_non_blocking, submit_prefetch_task, pin, unpin, remove,
close), with CacheEngineKey-like keys and tensor memory objects from an
allocator shaped as LMCache's. LMCache itself is not installed here."""

import abc
import asyncio
import enum
import os
import threading
import types
import unittest
from dataclasses import dataclass

import torch

import kvnode
from kylix import kv_lmcache

from helpers import KYLIX_BIN, needs

BLOCK = 20 << 10
SHAPE = (2, 2, 16, 128)  # KV_2LTD: [2, layers, tokens, hidden], 16 KiB in float16


class Fmt(enum.Enum):  # LMCache's MemoryFormat values
    UNDEFINED = 0
    KV_2LTD = 1
    KV_T2D = 2


@dataclass
class Key:  # as LMCache's CacheEngineKey
    fmt: str
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int

    def to_string(self):
        return f"{self.fmt}@{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash}"


@dataclass
class LayerKey(Key):  # as LMCache's LayerCacheEngineKey
    layer_id: int = 0

    def to_string(self):
        return super().to_string() + f"@{self.layer_id}"


class Obj:
    """As LMCache's TensorMemoryObj: a flat raw tensor, metadata, a ref
    count that frees the object at zero."""

    def __init__(self, alloc, shape, dtype, fmt):
        self.alloc = alloc
        n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        self.raw_data = torch.zeros(n, dtype=torch.uint8)
        self.metadata = types.SimpleNamespace(shape=torch.Size(shape), dtype=dtype, fmt=fmt, ref_count=1)

    @property
    def tensor(self):
        return self.raw_data.view(self.metadata.dtype).view(self.metadata.shape)

    def ref_count_up(self):
        self.metadata.ref_count += 1

    def ref_count_down(self):
        self.metadata.ref_count -= 1
        if self.metadata.ref_count == 0:
            self.alloc.freed.append(self)


class Allocator:  # as MemoryAllocatorInterface.allocate(shape, dtype, fmt)
    def __init__(self):
        self.calls, self.freed, self.full = [], [], False

    def allocate(self, shape, dtype, fmt=Fmt.UNDEFINED):
        self.calls.append((tuple(shape), dtype, fmt))
        return None if self.full else Obj(self, shape, dtype, fmt)


def chunk(alloc, seed, shape=SHAPE, dtype=torch.float16, fmt=Fmt.KV_2LTD):
    o = Obj(alloc, shape, dtype, fmt)
    o.tensor.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype))
    return o


def byte_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


@unittest.skipUnless(os.geteuid() == 0, "needs root (kylix serve mounts with FUSE); CI runs it as root")
@needs(os.path.exists("/dev/fuse") and os.path.exists(KYLIX_BIN), "/dev/fuse (fuse3) and bin/kylix (make build)")
class LMCacheBackendTest(kvnode.KVNodeCase):
    NODE_ARGS = ("--kv-block", str(BLOCK), "--kv-mem", "2MiB")

    def setUp(self):
        super().setUp()
        self.alloc = Allocator()
        self.b = kv_lmcache.KylixBackendCore(self.mnt, allocator=self.alloc, formats=Fmt)
        self.addCleanup(self.b.close)

    def keys(self, n, worker=0):
        return [Key("vllm", "org/model", 1, worker, 1000 + i) for i in range(n)]

    def test_put_then_get_byte_equal(self):
        ks = self.keys(4)
        objs = [chunk(self.alloc, i) for i in range(3)] + [chunk(self.alloc, 9, shape=(2, 2, 5, 128))]  # a last, shorter chunk
        futs = self.b.batched_submit_put_task(ks, objs)
        self.assertEqual([f.result(10) for f in futs], [True] * 4)
        self.assertFalse(any(self.b.exists_in_put_tasks(k) for k in ks))
        self.assertEqual([o.metadata.ref_count for o in objs], [1] * 4, "the backend gave back the ref it took")
        self.assertEqual(self.alloc.freed, [])
        self.assertTrue(all(self.b.contains(k) for k in ks))
        self.assertEqual(self.b.batched_contains(ks[:2] + [Key("vllm", "org/model", 1, 0, 1)] + ks[2:]), 2,
                         "the prefix hit stops at the first miss")
        for k, o in zip(ks, objs):
            got = self.b.get_blocking(k)
            self.assertIsNotNone(got)
            self.assertTrue(byte_equal(got.tensor, o.tensor))
            self.assertIs(got.metadata.fmt, Fmt.KV_2LTD)
        self.assertEqual(self.alloc.calls[-1], ((2, 2, 5, 128), torch.float16, Fmt.KV_2LTD))
        got = self.b.get_non_blocking(ks[1]).result(10)
        self.assertTrue(byte_equal(got.tensor, objs[1].tensor))
        self.assertTrue(self.b.submit_prefetch_task(ks[0]))

    def test_other_dtypes_and_no_allocator(self):
        b = kv_lmcache.KylixBackendCore(self.mnt, formats=Fmt)
        self.addCleanup(b.close)
        k = Key("vllm", "org/model", 1, 0, 7)
        o = chunk(self.alloc, 3, shape=(2, 16, 256), dtype=torch.bfloat16, fmt=Fmt.KV_T2D)
        self.assertTrue(b.batched_submit_put_task([k], [o])[0].result(10))
        got = b.get_blocking(k)
        self.assertTrue(byte_equal(got.tensor, o.tensor))
        self.assertEqual((got.get_shape(), got.get_dtype(), got.get_memory_format()),
                         (torch.Size((2, 16, 256)), torch.bfloat16, Fmt.KV_T2D))

    def test_misses(self):
        k = Key("vllm", "org/model", 1, 0, 42)
        self.assertFalse(self.b.contains(k))
        self.assertIsNone(self.b.get_blocking(k))
        self.assertIsNone(self.b.get_non_blocking(k))
        self.assertFalse(self.b.submit_prefetch_task(k))
        self.assertEqual(self.b.batched_contains([k]), 0)
        # The allocator out of memory: a miss, not an error.
        self.assertTrue(self.b.submit_put_task(k, chunk(self.alloc, 1)).result(10))
        self.alloc.full = True
        self.assertIsNone(self.b.get_blocking(k))

    def test_keys_apart(self):
        # Same chunk hash, other worker, other model, other layer: other blocks.
        ks = [Key("vllm", "org/model", 2, 0, 5), Key("vllm", "org/model", 2, 1, 5), Key("vllm", "org/other", 2, 0, 5),
              LayerKey("vllm", "org/model", 2, 0, 5, 0), LayerKey("vllm", "org/model", 2, 0, 5, 1)]
        self.assertEqual(len({kv_lmcache.cache_key(k) for k in ks}), len(ks))
        objs = [chunk(self.alloc, 20 + i) for i in range(len(ks))]
        self.assertEqual([f.result(10) for f in self.b.batched_submit_put_task(ks, objs)], [True] * len(ks))
        for k, o in zip(ks, objs):
            self.assertTrue(byte_equal(self.b.get_blocking(k).tensor, o.tensor))
        with self.assertRaises(TypeError):
            kv_lmcache.cache_key(("not", "a", "key"))

    def test_refusals(self):
        k = Key("vllm", "org/model", 1, 0, 1)
        big = chunk(self.alloc, 1, shape=(2, 2, 40, 128))  # 40 KiB: more than a block
        f = self.b.submit_put_task(k, big)
        with self.assertRaisesRegex(ValueError, "--kv-block"):
            f.result(10)
        self.assertEqual(big.metadata.ref_count, 1, "the ref is given back after a failed put too")
        self.assertFalse(self.b.contains(k))
        f = self.b.submit_put_task(k, types.SimpleNamespace(tensor=None, metadata=None))
        with self.assertRaisesRegex(ValueError, "with a tensor"):
            f.result(10)

    def test_damaged_trailer_is_a_miss(self):
        k = Key("vllm", "org/model", 1, 0, 3)
        self.assertTrue(self.b.submit_put_task(k, chunk(self.alloc, 3)).result(10))
        block = bytearray(BLOCK)
        self.assertEqual(self.kv.get([kv_lmcache.cache_key(k)], out=[block]), [True])
        for off, val in ((BLOCK - 64, 0), (BLOCK - 64 + 6, 99), (BLOCK - 64 + 16, 1)):  # magic, dtype code, length
            bad = bytearray(block)
            bad[off] = val
            self.assertEqual(self.kv.put([kv_lmcache.cache_key(k)], [bytes(bad)]), [True])
            self.assertIsNone(self.b.get_blocking(k), f"trailer byte {off - BLOCK + 64} changed")
        self.assertEqual(self.b.stats["bad_trailers"], 3)

    def test_get_waits_for_its_put(self):
        k = Key("vllm", "org/model", 1, 0, 77)
        o = chunk(self.alloc, 77)
        gate = threading.Event()
        self.b._put_pool.submit(gate.wait, 10)  # the put thread is busy
        f = self.b.submit_put_task(k, o)
        self.assertTrue(self.b.exists_in_put_tasks(k))
        self.assertFalse(self.b.contains(k), "not on the node yet")
        self.assertEqual(o.metadata.ref_count, 2, "held while the put is pending")
        # The getter either waits on the put's future or reads the node at
        # once; the gate opens only after it did one of the two.
        sk, reached, early = kv_lmcache.cache_key(k), threading.Event(), []
        pending = self.b._puts[sk]

        class Watched:
            def result(self, timeout=None):
                reached.set()
                return pending.result(timeout)
        self.b._puts[sk] = Watched()
        node_get = self.b._kv.get

        def get(keys, out):
            if sk in self.b._puts:
                early.append("read the node while the put was pending")
            reached.set()
            return node_get(keys, out=out)
        self.b._kv.get = get
        got = []
        t = threading.Thread(target=lambda: got.append(self.b.get_blocking(k)))
        t.start()
        self.assertTrue(reached.wait(10))
        gate.set()
        t.join(10)
        self.assertEqual(early, [])
        self.assertTrue(f.result(10))
        self.assertTrue(byte_equal(got[0].tensor, o.tensor))
        self.assertFalse(self.b.exists_in_put_tasks(k))

    def test_async_methods(self):
        ks = self.keys(3, worker=3)
        objs = [chunk(self.alloc, 50 + i) for i in range(3)]
        [f.result(10) for f in self.b.batched_submit_put_task(ks[:2], objs[:2])]
        self.assertEqual(asyncio.run(self.b.batched_async_contains("lookup-1", ks)), 2)
        got = asyncio.run(self.b.batched_get_non_blocking("lookup-1", ks[:2]))
        self.assertTrue(all(byte_equal(g.tensor, o.tensor) for g, o in zip(got, objs)))

    def test_no_pins_no_remove(self):
        k = Key("vllm", "org/model", 1, 0, 8)
        self.assertTrue(self.b.submit_put_task(k, chunk(self.alloc, 8)).result(10))
        self.assertEqual((self.b.pin(k), self.b.unpin(k), self.b.remove(k), self.b.batched_remove([k])),
                         (False, False, False, 0))
        self.assertTrue(self.b.contains(k, pin=True), "remove said False: still there")


    def test_on_lmcaches_interface(self):
        # With LMCache's StorageBackendInterface (a stand-in with
        # abstract_backend.py's abstract methods and its __init__),
        # KylixStorageBackend is concrete and runs both __init__s.
        class Interface(abc.ABC):
            def __init__(self, dst_device="cuda"):
                torch.device(dst_device)
                self.dst_device, self.base_init = dst_device, True
        names = ("contains", "exists_in_put_tasks", "batched_submit_put_task", "submit_prefetch_task", "get_blocking",
                 "get_non_blocking", "pin", "unpin", "remove", "close")
        for m in names:
            setattr(Interface, m, abc.abstractmethod(lambda self, *a, **k: None))
        Interface.__abstractmethods__ = frozenset(names)
        fake = types.ModuleType("lmcache.v1.storage_backend.abstract_backend")
        fake.StorageBackendInterface = Interface
        mod = kvnode.load_with_fake_base(self, "kv_lmcache.py", {fake.__name__: fake})
        b = mod.KylixStorageBackend(self.mnt, allocator=self.alloc)
        self.addCleanup(b.close)
        self.assertIsInstance(b, Interface)
        self.assertEqual((b.base_init, b.dst_device), (True, "cpu"))
        k = Key("vllm", "org/model", 1, 0, 99)
        o = chunk(self.alloc, 99)
        self.assertTrue(b.batched_submit_put_task([k], [o])[0].result(10))
        self.assertTrue(byte_equal(b.get_blocking(k).tensor, o.tensor))


class WithoutLMCacheTest(unittest.TestCase):
    def test_backend_says_lmcache_is_missing(self):
        try:
            import lmcache  # noqa: F401
            self.skipTest("LMCache is installed here")
        except ImportError:
            pass
        with self.assertRaisesRegex(ImportError, "needs LMCache"):
            kv_lmcache.KylixStorageBackend("/nonexistent")
