"""kylix.kv against a real node (bin/kylix serve --kv-mem --kv-disk, as root:
/dev/fuse): CPU tensors and bytes-like blocks round-trip byte-equal through
the host and disk tiers; misses leave the output alone; contains, stats,
clear; refusals raise."""

import errno
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import torch

from kylix import kv as kkv

from helpers import KYLIX_BIN, needs

BLOCK = 64 << 10


@unittest.skipUnless(os.geteuid() == 0, "needs root (kylix serve mounts with FUSE); CI runs it as root")
@needs(os.path.exists("/dev/fuse") and os.path.exists(KYLIX_BIN), "/dev/fuse (fuse3) and bin/kylix (make build)")
class KVTest(unittest.TestCase):
    @classmethod
    def start(cls, *extra):
        cls.log = open(os.path.join(cls.tmp, "serve.log"), "a+")
        args = [KYLIX_BIN, "serve", "--data", cls.data, "--mount", cls.mnt, "--client-socket",
                os.path.join(cls.tmp, "client.sock"), "--kv-block", "64KiB", *extra]
        cls.node = subprocess.Popen(args, stdout=cls.log, stderr=subprocess.STDOUT)
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


if __name__ == "__main__":
    unittest.main()
