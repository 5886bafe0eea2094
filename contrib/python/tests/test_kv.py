"""kylix.kv against a real node (bin/kylix serve --kv-mem --kv-disk, as root:
/dev/fuse): CPU tensors and bytes-like blocks round-trip byte-equal through
the host and disk tiers; misses leave the output alone; contains, stats,
clear; refusals raise. The CUDA path against a node on the stub CUDA
driver."""

import errno
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import types
import unittest

import torch

from kylix import kv as kkv

from helpers import KYLIX_BIN, REPO, needs

BLOCK = 64 << 10


@unittest.skipUnless(os.geteuid() == 0, "needs root (kylix serve mounts with FUSE); CI runs it as root")
@needs(os.path.exists("/dev/fuse") and os.path.exists(KYLIX_BIN), "/dev/fuse (fuse3) and bin/kylix (make build)")
class KVTest(unittest.TestCase):
    @classmethod
    def start(cls, *extra, env=None):
        cls.log = open(os.path.join(cls.tmp, "serve.log"), "a+")
        args = [KYLIX_BIN, "serve", "--data", cls.data, "--mount", cls.mnt, "--client-socket",
                os.path.join(cls.tmp, "client.sock"), "--kv-block", "64KiB", *extra]
        cls.node = subprocess.Popen(args, stdout=cls.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while not (os.path.ismount(cls.mnt) and os.path.exists(os.path.join(cls.tmp, "client.sock"))):
            if cls.node.poll() is not None or time.monotonic() > deadline:
                cls.log.seek(0)
                out = cls.log.read()[-2000:]
                cls.stop()
                raise AssertionError("kylix serve did not come up: " + out)
            time.sleep(0.05)

    @classmethod
    def stop(cls):
        if cls.node.poll() is None:
            cls.node.send_signal(signal.SIGTERM)
            try:
                cls.node.wait(30)
            except subprocess.TimeoutExpired:
                cls.node.kill()
                cls.node.wait()
        cls.log.close()
        if os.path.ismount(cls.mnt):
            subprocess.run(["umount", "-l", cls.mnt], capture_output=True)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kylix-py-kv-")
        cls.data, cls.mnt = os.path.join(cls.tmp, "data"), os.path.join(cls.tmp, "mnt")
        os.makedirs(cls.data)
        os.makedirs(cls.mnt)
        cls.start("--kv-mem", "256KiB", "--kv-disk", "4MiB")  # 4 blocks in memory, 60 on disk

    @classmethod
    def tearDownClass(cls):
        cls.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.kv = kkv.KVStore(self.mnt)
        self.addCleanup(self.kv.close)
        self.kv.clear()

    def blocks(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(BLOCK // 2, generator=g).to(torch.float16) for _ in range(n)]

    def put_all(self, keys, ts):
        """Puts, retrying what is refused for room (the disk writer catches up)."""
        for _ in range(10000):
            todo = [i for i, k in enumerate(keys) if not self.kv.contains([k])[0]]
            if not todo:
                return
            self.kv.put([keys[i] for i in todo], [ts[i] for i in todo])
        self.fail("the host tier never made room")

    def test_round_trip_memory_and_disk(self):
        self.assertEqual(self.kv.block_size, BLOCK)
        keys = [kkv.key("prompt", i) for i in range(12)]
        ts = self.blocks(12, 1)
        self.assertEqual(self.kv.put(keys[:4], ts[:4]), [True] * 4)
        self.assertEqual(self.kv.contains(keys[:4]), ["memory"] * 4)
        self.put_all(keys, ts)  # 12 blocks: 8 only on disk by now
        self.assertIn("disk", self.kv.contains(keys), "some blocks only on disk")
        out = [torch.zeros(BLOCK // 2, dtype=torch.float16) for _ in keys]
        self.assertEqual(self.kv.get(keys, out=out), [True] * 12)
        for a, b in zip(ts, out):
            self.assertTrue(torch.equal(a.view(torch.uint8), b.view(torch.uint8)), "byte-equal round trip")
        st = self.kv.stats()
        self.assertEqual(st["block_size"], BLOCK)
        self.assertTrue(st["disk_tier"])
        self.assertGreaterEqual(st["my_disk_blocks"], 8, "at most 4 of the 12 fit in memory")
        self.assertNotIn(None, self.kv.contains(keys))

    def test_miss_leaves_output(self):
        out = torch.full((BLOCK,), 7, dtype=torch.uint8)
        self.assertEqual(self.kv.get([kkv.key("never put")], out=[out]), [False])
        self.assertTrue(bool((out == 7).all()), "a miss writes nothing")
        self.assertEqual(self.kv.contains([kkv.key("never put")]), [None])

    def test_bytes_like_blocks(self):
        k = kkv.key(b"raw")
        data = os.urandom(BLOCK)
        self.assertEqual(self.kv.put([k], [data]), [True])
        out = bytearray(BLOCK)
        self.assertEqual(self.kv.get([k], out=[out]), [True])
        self.assertEqual(bytes(out), data)
        self.assertEqual(self.kv.clear(), 1)
        self.assertEqual(self.kv.contains([k]), [None])

    def test_refusals(self):
        with self.assertRaises(ValueError):
            self.kv.put([b"short"], [bytes(BLOCK)])
        with self.assertRaises(ValueError):
            self.kv.put([kkv.key(1)], [bytes(BLOCK - 1)])
        with self.assertRaises(ValueError):
            self.kv.get([kkv.key(1)], out=[bytes(BLOCK)])  # not writable
        with self.assertRaises(ValueError):
            self.kv.put([kkv.key(1)], [torch.zeros(2 * BLOCK, dtype=torch.uint8)[::2]])  # not contiguous
        with self.assertRaises(kkv.KVError) as cm:
            kkv.KVStore(self.tmp)
        self.assertEqual(cm.exception.errno, errno.ENODEV)

    def test_many_batches(self):
        # More keys than one request takes at this block size is split.
        old = self.kv._batch
        self.kv._batch = 3
        try:
            keys = [kkv.key("batch", i) for i in range(4)]
            ts = self.blocks(4, 2)
            self.put_all(keys, ts)
            out = [torch.empty_like(t) for t in ts]
            self.assertEqual(self.kv.get(keys, out=out), [True] * 4)
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(ts, out)))
        finally:
            self.kv._batch = old

    def test_many_clients_same_keys(self):
        # Four connections put and get the same keys at once; every hit is
        # the key's own block (its bytes are a function of the key).
        import threading
        keys = [kkv.key("shared", i) for i in range(8)]
        want = {k: bytes([i + 1]) * BLOCK for i, k in enumerate(keys)}
        errors, hits = [], []

        def client(n):
            try:
                with kkv.KVStore(self.mnt) as c:
                    for r in range(25):
                        ks = [keys[(n + r + j) % len(keys)] for j in range(3)]
                        c.put(ks, [want[k] for k in ks])
                        out = [bytearray(BLOCK) for _ in ks]
                        for k, o, hit in zip(ks, out, c.get(ks, out=out)):
                            hits.append(hit)
                            if hit and bytes(o) != want[k]:
                                errors.append(f"client {n}: wrong bytes for key {k.hex()[:8]}")
            except Exception as e:  # reported below, in the test's thread
                errors.append(f"client {n}: {e!r}")

        ts = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(len(hits), 4 * 25 * 3)
        self.assertIn(True, hits)


class FakeCudaTensor:
    """Quacks like a contiguous CUDA tensor of one KV block for kylix.kv:
    "device memory" of the stub CUDA driver (cuda/testdata/stub), a /dev/shm
    file that its IPC handle names and the node maps."""

    def __init__(self, alloc, offset):
        self.alloc, self.offset = alloc, offset
        self.device = types.SimpleNamespace(type="cuda", index=0)

    def data_ptr(self):
        return self.alloc.base + self.offset

    def get_device(self):
        return 0

    def is_contiguous(self):
        return True

    def numel(self):
        return BLOCK

    def element_size(self):
        return 1


class ShmAlloc:
    _next = 1 << 40

    def __init__(self, test, size):
        fd, self.path = tempfile.mkstemp(prefix="kyk", dir="/dev/shm")
        test.addCleanup(os.remove, self.path)
        os.ftruncate(fd, size)
        os.close(fd)
        self.size = size
        self.base, ShmAlloc._next = ShmAlloc._next, ShmAlloc._next + (1 << 32)
        p = self.path.encode()
        assert len(p) <= 47
        self.handle = b"KYLXSHM\0" + struct.pack("<Q", size) + p + bytes(48 - len(p))

    def read(self):
        with open(self.path, "rb") as f:
            return f.read()

    def write(self, off, b):
        with open(self.path, "r+b") as f:
            f.seek(off)
            f.write(b)


@unittest.skipUnless(os.geteuid() == 0, "needs root (kylix serve mounts with FUSE); CI runs it as root")
@unittest.skipIf(os.path.exists("/dev/nvidiactl"), "a real GPU is here: the stub driver is for machines without one")
@needs(os.path.exists("/dev/fuse") and os.path.exists(KYLIX_BIN) and shutil.which("cc") is not None,
       "/dev/fuse (fuse3), bin/kylix (make build) and cc (gcc libc6-dev) for the stub CUDA driver")
class KVStubGPUTest(unittest.TestCase):
    """kylix.kv's CUDA path against a real node on the stub CUDA driver: the
    requests it builds (one per allocation, each block at its offset), the
    node's IPC reads and writes. Only kylix.kv's two torch.cuda calls
    (_cuda_ipc, _cuda_sync) are replaced: they need a GPU."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kylix-py-kvgpu-")
        lib = os.path.join(cls.tmp, "lib")
        os.makedirs(lib)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", os.path.join(lib, "libcuda.so.1"),
                        os.path.join(REPO, "cuda", "testdata", "stub", "libcuda.c")], check=True)
        cls.data, cls.mnt = os.path.join(cls.tmp, "data"), os.path.join(cls.tmp, "mnt")
        os.makedirs(cls.data)
        os.makedirs(cls.mnt)
        env = dict(os.environ, LD_LIBRARY_PATH=lib, CUFILE_ENV_PATH_JSON=os.path.join(lib, "none.json"))
        KVTest.start.__func__(cls, "--kv-mem", "1MiB", env=env)

    @classmethod
    def tearDownClass(cls):
        KVTest.stop.__func__(cls)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.kv = kkv.KVStore(self.mnt)
        self.addCleanup(self.kv.close)
        self.synced = []
        saved = kkv._cuda_ipc, kkv._cuda_sync
        self.ipc_asked = []

        def ipc(t):
            self.ipc_asked.append(t.alloc.path)
            return 0, t.alloc.handle, t.alloc.base, t.alloc.size
        kkv._cuda_ipc = ipc
        kkv._cuda_sync = self.synced.append
        self.addCleanup(lambda: setattr(kkv, "_cuda_ipc", saved[0]) or setattr(kkv, "_cuda_sync", saved[1]))

    def test_put_and_get_gpu_memory(self):
        keys = [kkv.key("gpu", i) for i in range(4)]
        blocks = [os.urandom(BLOCK) for _ in keys]
        a, b = ShmAlloc(self, 4 * BLOCK), ShmAlloc(self, 2 * BLOCK)
        a.write(3 * BLOCK, blocks[0])
        a.write(100, blocks[1])
        b.write(BLOCK, blocks[2])
        src = [FakeCudaTensor(a, 3 * BLOCK), FakeCudaTensor(a, 100), FakeCudaTensor(b, BLOCK), bytes(blocks[3])]
        self.assertEqual(self.kv.put(keys, src), [True] * 4, "two allocations and a host block")
        self.assertEqual(self.synced, [0], "the device was synchronised before the node read it")
        self.assertEqual(sorted(self.ipc_asked), sorted([a.path, b.path]), "one IPC handle per allocation, not per block")

        c = ShmAlloc(self, 4 * BLOCK)
        host = bytearray(BLOCK)
        out = [FakeCudaTensor(c, 3 * BLOCK), host, FakeCudaTensor(c, 7), FakeCudaTensor(c, BLOCK + 9)]
        hits = self.kv.get([keys[0], keys[1], kkv.key("never"), keys[3]], out=out)
        self.assertEqual(hits, [True, True, False, True])
        self.assertEqual(bytes(host), blocks[1])
        want = bytearray(4 * BLOCK)
        want[BLOCK + 9:2 * BLOCK + 9] = blocks[3]
        want[3 * BLOCK:4 * BLOCK] = blocks[0]
        self.assertEqual(c.read(), bytes(want), "each block at its offset, nothing for the miss")

    def test_block_past_the_allocation(self):
        a = ShmAlloc(self, BLOCK)
        with self.assertRaises(kkv.KVError) as cm:
            self.kv.get([kkv.key("x")], out=[FakeCudaTensor(a, 1)])
        self.assertEqual(cm.exception.errno, errno.EFAULT)


if __name__ == "__main__":
    unittest.main()
