"""kylix.data: the shard reader against tar files written by Python's own
tarfile, the share per rank and DataLoader worker, bad input; and through a
live Kylix mount, shards made by `kylix shards` read byte for byte, with a
corrupt chunk named and skipped."""

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import unittest
import warnings

import torch
from torch.utils.data import DataLoader

from kylix import data as kd

from helpers import KYLIX_BIN, needs


def write_tree(root, n, seed=1):
    """n samples: KEY.bin (random, 100-3000 bytes) and KEY.txt, in 2 dirs."""
    rng = torch.Generator().manual_seed(seed)
    files = {}
    for i in range(n):
        key = f"d{i % 2}/{i:05d}"
        size = int(torch.randint(100, 3000, (1,), generator=rng))
        files[key + ".bin"] = bytes(torch.randint(0, 256, (size,), dtype=torch.uint8, generator=rng).tolist())
        files[key + ".txt"] = f"label {i % 7}\n".encode()
    for rel, b in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(b)
    return files


def write_shards(files, out, per_shard):
    """Tar shards written by Python's tarfile (an independent writer),
    per_shard samples each, members in sorted order."""
    os.makedirs(out, exist_ok=True)
    keys = sorted({kd.sample_key(r)[0] for r in files})
    paths = []
    for s in range(0, len(keys), per_shard):
        p = os.path.join(out, f"shard-{s // per_shard:06d}.tar")
        with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as t:
            for k in keys[s:s + per_shard]:
                for rel in sorted(r for r in files if kd.sample_key(r)[0] == k):
                    ti = tarfile.TarInfo(rel)
                    ti.size = len(files[rel])
                    t.addfile(ti, io.BytesIO(files[rel]))
        paths.append(p)
    return paths


def collect(ds):
    """key -> sample over one pass, failing on a key seen twice."""
    out = {}
    for s in ds:
        assert s["__key__"] not in out, s["__key__"]
        out[s["__key__"]] = s
    return out


def check_samples(tc, got, files):
    want = {}
    for rel, b in files.items():
        k, ext = kd.sample_key(rel)
        want.setdefault(k, {})[ext] = b
    tc.assertEqual(sorted(got), sorted(want))
    for k, members in want.items():
        for ext, b in members.items():
            tc.assertTrue(got[k][ext] == b, (k, ext))


class ShardReaderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kylix-data-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.files = write_tree(os.path.join(self.tmp, "src"), 60)
        self.paths = write_shards(self.files, os.path.join(self.tmp, "shards"), 7)

    def test_round_trip_long_names_and_small_windows(self):
        # A long name (PAX) and a read window smaller than one member.
        files = dict(self.files)
        files["d0/" + "n" * 200 + ".bin"] = b"x" * 1000
        paths = write_shards(files, os.path.join(self.tmp, "long"), 9)
        for rs in (512, 4096, 8 << 20):
            check_samples(self, collect(kd.Shards(paths, read_size=rs)), files)

    def test_samples_map_style_equals_shards(self):
        ms = kd.Samples(os.path.join(self.tmp, "src"))
        self.assertEqual(len(ms), 60)
        check_samples(self, {s["__key__"]: s for s in (ms[i] for i in range(len(ms)))}, self.files)

    def test_exactly_once_across_ranks_and_workers(self):
        # 3 ranks x 2 DataLoader workers, shuffled, two epochs: every
        # sample once per epoch, the order changing between epochs and the
        # same for the same seed.
        orders = []
        for epoch in (0, 1, 0):
            seen = []
            for rank in range(3):
                ds = kd.Shards(self.paths, shuffle=True, seed=5, shuffle_buffer=4, rank=rank, world_size=3)
                ds.set_epoch(epoch)
                dl = DataLoader(ds, batch_size=None, num_workers=2)
                seen += [s["__key__"] for s in dl]
            self.assertEqual(sorted(seen), sorted({kd.sample_key(r)[0] for r in self.files}))
            self.assertEqual(len(seen), len(set(seen)))
            orders.append(seen)
        self.assertNotEqual(orders[0], orders[1])
        self.assertEqual(orders[0], orders[2])

    def test_batches_exactly_once(self):
        seen = []
        for rank in range(2):
            ds = kd.Shards(self.paths, shuffle=True, seed=2, rank=rank, world_size=2, batch=8)
            for b in DataLoader(ds, batch_size=None, num_workers=2):
                self.assertLessEqual(len(b), 8)
                seen += [s["__key__"] for s in b]
        self.assertEqual(sorted(seen), sorted({kd.sample_key(r)[0] for r in self.files}))
        with self.assertRaises(ValueError):
            kd.Shards(self.paths, batch=0)

    def test_truncated_and_corrupt_header(self):
        p = self.paths[0]
        with open(p, "rb") as f:
            raw = f.read()
        cut = os.path.join(self.tmp, "cut.tar")
        with open(cut, "wb") as f:
            f.write(raw[:len(raw) // 2 + 100])
        with self.assertRaises(kd.SampleError) as cm:
            list(kd.Shards([cut]))
        self.assertIn("truncated", str(cm.exception))
        self.assertIn("cut.tar", str(cm.exception))
        # A flipped byte in the second header: its checksum fails, the
        # members before it come out, the error says where.
        bad = os.path.join(self.tmp, "bad.tar")
        second = None
        with tarfile.open(p) as t:
            second = t.getmembers()[1].offset
        b = bytearray(raw)
        b[second + 10] ^= 0xFF
        with open(bad, "wb") as f:
            f.write(bytes(b))
        ds = kd.Shards([bad], on_error="skip")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            got = [s["__key__"] for s in ds]
        self.assertEqual(len(ds.errors), 1)
        self.assertIn(f"offset {second}", str(ds.errors[0]))
        self.assertEqual(ds.errors[0].errno, errno.EBADMSG)
        self.assertEqual(len(got), 1)  # the first member's sample, alone

    def test_to_device_cpu(self):
        batches = [{"x": torch.arange(4) + i} for i in range(3)]
        got = list(kd.to_device(batches, "cpu"))
        self.assertTrue(all(torch.equal(a["x"], b["x"]) for a, b in zip(got, batches)))
        if not torch.cuda.is_available():
            with self.assertRaises(RuntimeError):
                list(kd.to_device(batches, "cuda"))


@unittest.skipUnless(os.geteuid() == 0, "needs root (kylix serve mounts with FUSE); CI runs it as root")
@needs(os.path.exists("/dev/fuse") and os.path.exists(KYLIX_BIN), "/dev/fuse (fuse3) and bin/kylix (make build)")
class MountShardsTest(unittest.TestCase):
    """Shards made by `kylix shards` in a live node, read through its mount."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kylix-data-mnt-")
        self.data, self.mnt = os.path.join(self.tmp, "data"), os.path.join(self.tmp, "mnt")
        os.makedirs(self.mnt)
        self.log = open(os.path.join(self.tmp, "serve.log"), "w+")
        self.node = subprocess.Popen([KYLIX_BIN, "serve", "--data", self.data, "--mount", self.mnt],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.addCleanup(self.stop)
        deadline = time.monotonic() + 30
        while not (os.path.ismount(self.mnt) and os.path.exists(os.path.join(self.data, "kylix.sock"))):
            if self.node.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                self.fail("kylix serve did not come up: " + self.log.read()[-2000:])
            time.sleep(0.05)

    def stop(self):
        if self.node.poll() is None:
            self.node.send_signal(signal.SIGTERM)
            try:
                self.node.wait(30)
            except subprocess.TimeoutExpired:
                self.node.kill()
                self.node.wait()
        self.log.close()
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def kylix(self, *args):
        return subprocess.run([KYLIX_BIN, *args, "--data", self.data], check=True, capture_output=True, text=True).stdout

    def test_shards_through_mount(self):
        src = os.path.join(self.tmp, "src")
        files = write_tree(src, 200, seed=4)
        self.kylix("import", src, "ds/d")
        self.kylix("shards", "--shard-size", "64KiB", "ds/d", "ds/d.shards")
        root = os.path.join(self.mnt, "ds", "d.shards")
        ds = kd.Shards(root)
        self.assertIsNotNone(ds.index)
        self.assertGreater(len(ds.paths), 4)
        check_samples(self, collect(ds), files)
        # Two workers over the mount: each sample once.
        keys = [s["__key__"] for s in DataLoader(kd.Shards(root, shuffle=True, seed=1), batch_size=None, num_workers=2)]
        self.assertEqual(sorted(keys), sorted({kd.sample_key(r)[0] for r in files}))

    def test_corrupt_chunk_named_and_left_out(self):
        # One member's chunk corrupt on disk before anything reads it (the
        # node's chunk cache never saw it): the node answers EIO for its
        # bytes; the reader names that member, and with on_error="skip"
        # every other sample still reads, byte for byte.
        src = os.path.join(self.tmp, "src")
        files = write_tree(src, 120, seed=6)
        self.kylix("import", src, "ds/c")
        victim = "d1/00101.bin"
        st = json.loads(self.kylix("stat", "--json", "ds/c/" + victim))
        ext = st["extents"][0]
        with open(ext["pack_path"], "r+b") as f:
            f.seek(ext["pack_offset"] + ext["length"] // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
        self.kylix("shards", "--shard-size", "64KiB", "ds/c", "ds/c.shards")
        root = os.path.join(self.mnt, "ds", "c.shards")
        with self.assertRaises(kd.SampleError) as cm:
            collect(kd.Shards(root))
        self.assertEqual(cm.exception.errno, errno.EIO)
        self.assertIn(repr(victim), str(cm.exception))
        ds = kd.Shards(root, on_error="skip")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            got = collect(ds)
        self.assertEqual(len(ds.errors), 1, [str(e) for e in ds.errors])
        self.assertNotIn("d1/00101", got)  # the whole sample is left out
        del files[victim]
        files.pop("d1/00101.txt")
        check_samples(self, got, files)

if __name__ == "__main__":
    unittest.main()
