"""kylix.data: the shard reader against tar files written by Python's own
tarfile, the share per rank and DataLoader worker, bad input; and through a
live Kylix mount, shards made by `kylix shards` read byte for byte, with a
corrupt chunk named and skipped."""

import collections
import errno
import hashlib
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest
import warnings

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_convert

from kylix import _lib
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


HAVE_SCAN = _lib.tar_scan() is not None


def unbatch(batches):
    """Sample dicts (without __shard__) of dict batches or columnar ones."""
    out = []
    for b in batches:
        if isinstance(b, dict):
            keys = b["__key__"]
            cols = {e: c for e, c in b.items() if e != "__key__"}
            for i, k in enumerate(keys):
                s = {"__key__": k}
                for e, c in cols.items():
                    if c.present is None or bool(c.present[i]):
                        s[e] = c.bytes(i)
                out.append(s)
        else:
            out += [{e: v for e, v in s.items() if e != "__shard__"} for s in b]
    return out


def digest(ds):
    """One line per sample: key, then each field's length and sha256."""
    lines = []
    for s in unbatch(ds if ds.batch else ([x] for x in ds)):
        lines.append(s["__key__"] + " " + " ".join(f"{e}:{len(v)}:{hashlib.sha256(v).hexdigest()[:16]}" for e, v in sorted(s.items()) if e != "__key__"))
    return lines


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


class _StopEarly(torch.utils.data.IterableDataset):
    """In a DataLoader worker: (threads, fds) before a Shards iterator, while
    it reads, and after a loop over it left early."""

    def __init__(self, paths):
        self.paths = paths

    def __iter__(self):
        def counts():
            return threading.active_count(), len(os.listdir("/proc/self/fd"))
        before = counts()
        during = None
        for n, _ in enumerate(kd.Shards(self.paths, batch=2, columns=True, read_size=4096)):
            during = counts()
            if n == 3:
                break
        yield before, during, counts()


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

    def odd_tars(self):
        """Tar files that take every path of the reader: GNU long names,
        directories, links and empty files; ustar names split into a
        prefix; PAX headers (non-ASCII and long names); a base-256 size;
        a checksum only as a signed sum (tarfile takes it, the scanner
        does not); a member larger than small windows; a truncated file."""
        out = os.path.join(self.tmp, "odd")
        os.makedirs(out)
        members = []
        for i in range(40):
            d = "deep/" * (i % 25) if i % 3 == 0 else ""
            members.append((f"{d}s{i:03d}.bin", bytes([i]) * (i * 97 % 1500)))
            members.append((f"{d}s{i:03d}.txt", f"label {i}".encode()))
        members.append(("big.bin", os.urandom(20000)))
        members.append(("caf\u00e9/n\u00e9.txt", b"utf-8 name"))
        members.append((".hidden", b"h"))
        members.append(("noext", b""))
        members.append(("a.b/c.d.e", b"dots"))
        paths = []
        for fmt, name in ((tarfile.GNU_FORMAT, "gnu"), (tarfile.USTAR_FORMAT, "ustar"), (tarfile.PAX_FORMAT, "pax")):
            p = os.path.join(out, name + ".tar")
            with tarfile.open(p, "w", format=fmt) as t:
                for n, b in members:
                    if fmt == tarfile.USTAR_FORMAT and (len(n.encode()) > 250 or not n.isascii()):
                        continue
                    if n.startswith("deep/deep/deep/") and n.endswith(".txt"):
                        di = tarfile.TarInfo(n.rsplit("/", 1)[0] + "/dir")
                        di.type = tarfile.DIRTYPE
                        t.addfile(di)
                        li = tarfile.TarInfo(n + ".lnk")
                        li.type, li.linkname = tarfile.SYMTYPE, n.rsplit("/", 1)[1]
                        t.addfile(li)
                    ti = tarfile.TarInfo(n)
                    ti.size = len(b)
                    t.addfile(ti, io.BytesIO(b))
            paths.append(p)
        with open(paths[1], "rb") as f:
            raw = bytearray(f.read())
        with tarfile.open(paths[1]) as t:
            ms = t.getmembers()
        # Base-256 size in one header, a signed checksum in another.
        h = ms[3].offset
        raw[h + 124:h + 136] = b"\x80" + ms[3].size.to_bytes(11, "big")
        raw[h + 148:h + 156] = b" " * 8
        raw[h + 148:h + 156] = b"%06o\0 " % sum(raw[h:h + 512])
        h = ms[5].offset
        raw[h + 90] = 0xE9  # a byte >= 0x80 where the name field's NULs are
        raw[h + 148:h + 156] = b" " * 8
        signed = sum(x - 256 if x > 127 else x for x in raw[h:h + 512])
        raw[h + 148:h + 156] = b"%06o\0 " % signed
        p = os.path.join(out, "odd-fields.tar")
        with open(p, "wb") as f:
            f.write(raw)
        paths.append(p)
        p = os.path.join(out, "truncated.tar")
        with open(p, "wb") as f:
            f.write(raw[:len(raw) // 2 + 700])
        paths.append(p)
        return paths

    @unittest.skipUnless(HAVE_SCAN, "libkylix with kylix_tar_scan (make build): " + _lib.tar_scan_why())
    def test_scanners_agree(self):
        # The C scanner and the Python parser: the same members, bytes and
        # errors, whatever the window size.
        odd = self.odd_tars()
        paths = odd + self.paths
        for p in paths:
            for rs in (512, 4096, 8 << 20):
                got = {}
                for scanner in ("python", "libkylix"):
                    pol = kd._ErrorPolicy(lambda e: None)
                    members = list(kd.read_tar(p, read_size=rs, policy=pol, scanner=scanner))
                    got[scanner] = (members, [str(e) for e in pol.errors])
                self.assertEqual(got["python"], got["libkylix"], (p, rs))
                self.assertGreater(len(got["python"][0]), 0, p)
        with tarfile.open(paths[0]) as t:  # the GNU one: tarfile's own view
            want = [(kd.sample_key(m.name), t.extractfile(m).read()) for m in t if m.isreg()]
        self.assertEqual([((k, e), b) for k, e, b in kd.read_tar(paths[0], scanner="libkylix")], want)
        pol = kd._ErrorPolicy(lambda e: None)
        list(kd.read_tar(odd[-1], policy=pol, scanner="libkylix"))
        self.assertIn("truncated", str(pol.errors[0]))
        # Shards say which scanner they use; "libkylix" is never silently Python.
        self.assertEqual(kd.Shards(paths).scanner, "libkylix")
        self.assertEqual(kd.Shards(paths, scanner="python").scanner, "python")
        with self.assertRaises(ValueError):
            kd.Shards(paths, scanner="fast")

    def test_no_lib_same_samples(self):
        # KYLIX_NO_LIB=1: the Python parser, said so, and every sample the
        # same as with the library (if it loads here), batches of dicts and
        # columns alike.
        paths = self.odd_tars()[:4] + self.paths
        code = ("import json, sys; sys.path[:0] = sys.argv[1:3]; import test_data as td; from kylix import data as kd; "
                "ps = json.loads(sys.argv[3]); ds = kd.Shards(ps, batch=5, columns=True); "
                "print(json.dumps([ds.scanner, ds.scanner_why, td.digest(ds), td.digest(kd.Shards(ps, read_size=4096))]))")
        here = os.path.dirname(os.path.abspath(__file__))
        pkg = os.path.dirname(here)
        env = dict(os.environ, KYLIX_NO_LIB="1")
        out = subprocess.run([sys.executable, "-c", code, here, pkg, json.dumps(paths)], env=env,
                             capture_output=True, text=True, check=True).stdout
        scanner, why, cols, dicts = json.loads(out)
        self.assertEqual(scanner, "python")
        self.assertIn("KYLIX_NO_LIB", why)
        self.assertEqual(cols, dicts)
        self.assertGreater(len(cols), 200)
        ds = kd.Shards(paths, batch=5, columns=True)
        self.assertEqual(ds.scanner, "libkylix" if HAVE_SCAN else "python")
        self.assertEqual(digest(ds), cols)
        self.assertEqual(digest(kd.Shards(paths, batch=7)), cols)

    def test_columns_equal_dict_batches(self):
        # Columnar batches against dict batches of the same samples, with
        # windows smaller than members (copies out of the window) and
        # PAX headers (the parser's own path) in between.
        files = dict(self.files)
        files["d0/" + "n" * 200 + ".bin"] = b"x" * 1000
        paths = write_shards(files, os.path.join(self.tmp, "long"), 9)
        for scanner in ("python", "libkylix") if HAVE_SCAN else ("python",):
            for rs in (512, 4096, 8 << 20):
                cols = list(kd.Shards(paths, batch=8, columns=True, read_size=rs, scanner=scanner))
                dicts = list(kd.Shards(paths, batch=8, read_size=rs, scanner=scanner))
                self.assertEqual(len(cols), len(dicts))
                for c, d in zip(cols, dicts):
                    self.assertEqual(c["__key__"], [s["__key__"] for s in d])
                    self.assertEqual(sorted(c), sorted(set(d[0]) - {"__shard__"}))
                    for e in ("bin", "txt"):
                        col = c[e]
                        self.assertIsInstance(col, kd.Column)
                        self.assertEqual(col.data.dtype, torch.uint8)
                        self.assertEqual(col.offsets.dtype, torch.int64)
                        self.assertEqual(len(col.offsets), len(d) + 1)
                        has = [e in s for s in d]
                        if all(has):
                            self.assertIsNone(col.present)
                        else:
                            self.assertEqual(col.present.tolist(), has)
                        self.assertEqual(col.tolist(), [s.get(e, b"") for s in d])
                        self.assertEqual(col.data.numel(), sum(len(s.get(e, b"")) for s in d))
                check_samples(self, {s["__key__"]: s for s in unbatch(cols)}, files)
        # Shuffled with a shuffle buffer: the same batches as dicts.
        a = list(kd.Shards(paths, batch=6, columns=True, shuffle=True, seed=3, shuffle_buffer=10))
        b = list(kd.Shards(paths, batch=6, shuffle=True, seed=3, shuffle_buffer=10))
        self.assertEqual(unbatch(a), unbatch(b))
        self.assertNotEqual([s["__key__"] for s in unbatch(a)], sorted(s["__key__"] for s in unbatch(a)))

    def test_columns_missing_fields_and_api(self):
        files = {f"k{i:02d}.bin": bytes([i]) * i for i in range(10)}
        files.update({f"k{i:02d}.txt": b"t" for i in range(0, 10, 3)})
        files["k05.txt"] = b""  # empty, not missing
        p = write_shards(files, os.path.join(self.tmp, "miss"), 100)
        (b,) = list(kd.Shards(p, batch=10, columns=True))
        txt = b["txt"]
        self.assertEqual(txt.present.tolist(), [i % 3 == 0 or i == 5 for i in range(10)])
        self.assertEqual(txt.tolist(), [b"t" if i % 3 == 0 else b"" for i in range(10)])
        self.assertIsNone(b["bin"].present)
        col = b["bin"]
        self.assertEqual(len(col), 10)
        self.assertEqual(col[3].tolist(), [3, 3, 3])
        self.assertEqual(col.bytes(-1), bytes([9]) * 9)
        self.assertEqual([t.numel() for t in col], list(range(10)))
        self.assertEqual(len(col[2:5]), 3)
        with self.assertRaises(IndexError):
            col[10]
        self.assertEqual(col.offsets.tolist(), [sum(range(i)) for i in range(11)])
        # torch's default_convert (what DataLoader(batch_size=None) runs)
        # leaves a column as it is; pickling carries its tensors.
        conv = default_convert(b)
        self.assertIs(conv["bin"], col)
        c2 = pickle.loads(pickle.dumps(col))
        self.assertEqual(c2.tolist(), col.tolist())
        self.assertTrue(torch.equal(pickle.loads(pickle.dumps(txt)).present, txt.present))
        # to_device: columns, namedtuples, lists.
        P = collections.namedtuple("P", "col x")
        (moved,) = list(kd.to_device([{"b": [P(col, torch.arange(3))], "k": b["__key__"]}], "cpu"))
        self.assertIsInstance(moved["b"][0], P)
        self.assertEqual(moved["b"][0].col.tolist(), col.tolist())
        self.assertEqual(moved["k"], b["__key__"])
        self.assertEqual(col.to("cpu").tolist(), col.tolist())
        if torch.cuda.is_available():
            self.assertTrue(col.pin_memory().data.is_pinned())
        with self.assertRaises(ValueError):
            kd.Shards(p, columns=True)  # no batch
        with self.assertRaises(ValueError):
            kd.Shards(p, batch=4, columns=True, transform=lambda s: s)

    def test_columns_workers_exactly_once_and_errors(self):
        seen = []
        for rank in range(2):
            ds = kd.Shards(self.paths, shuffle=True, seed=2, rank=rank, world_size=2, batch=8, columns=True)
            for b in DataLoader(ds, batch_size=None, num_workers=2):
                self.assertIsInstance(b["bin"], kd.Column)
                seen += b["__key__"]
        self.assertEqual(sorted(seen), sorted({kd.sample_key(r)[0] for r in self.files}))
        # A truncated shard and a bad header: the same errors as dict batches.
        with open(self.paths[0], "rb") as f:
            raw = f.read()
        cut = os.path.join(self.tmp, "cut.tar")
        with open(cut, "wb") as f:
            f.write(raw[:len(raw) // 2 + 100])
        with self.assertRaises(kd.SampleError) as cm:
            list(kd.Shards([cut], batch=4, columns=True))
        self.assertIn("truncated", str(cm.exception))
        ds = kd.Shards([cut] + self.paths[1:], batch=4, columns=True, on_error="skip")
        dd = kd.Shards([cut] + self.paths[1:], batch=4, on_error="skip")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            self.assertEqual(unbatch(ds), unbatch(dd))
        self.assertEqual([str(e) for e in ds.errors], [str(e) for e in dd.errors])
        self.assertEqual(len(ds.errors), 1)

    def test_readahead_same_samples_and_errors(self):
        # The reader thread (readahead=True, the default) against reads in
        # the caller's thread: the same samples, bytes and errors, for
        # every window size and both scanners, odd tar files included.
        self.assertTrue(kd.Shards(self.paths).readahead)
        self.assertFalse(kd.Shards(self.paths, readahead=False).readahead)
        paths = self.odd_tars()[:4] + self.paths
        for scanner in ("python", "libkylix") if HAVE_SCAN else ("python",):
            for rs in (512, 4096, 8 << 20):
                got = {}
                for ra in (True, False):
                    got[ra] = (digest(kd.Shards(paths, batch=5, columns=True, read_size=rs, scanner=scanner, readahead=ra)),
                               digest(kd.Shards(paths, read_size=rs, scanner=scanner, readahead=ra)))
                self.assertEqual(got[True], got[False], (scanner, rs))
                self.assertEqual(got[True][0], got[True][1])
        # A truncated shard and a corrupt header among good ones.
        with open(self.paths[0], "rb") as f:
            raw = f.read()
        cut = os.path.join(self.tmp, "cut.tar")
        with open(cut, "wb") as f:
            f.write(raw[:len(raw) // 2 + 100])
        with tarfile.open(self.paths[1]) as t:
            second = t.getmembers()[1].offset
        with open(self.paths[1], "rb") as f:
            b = bytearray(f.read())
        b[second + 10] ^= 0xFF
        bad = os.path.join(self.tmp, "bad.tar")
        with open(bad, "wb") as f:
            f.write(bytes(b))
        mixed = [cut, self.paths[2], bad] + self.paths[3:]
        out = {}
        for ra in (True, False):
            ds = kd.Shards(mixed, batch=4, columns=True, on_error="skip", read_size=4096, readahead=ra)
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                out[ra] = (unbatch(ds), [str(e) for e in ds.errors])
            with self.assertRaises(kd.SampleError):
                list(kd.Shards(mixed, readahead=ra))
        self.assertEqual(out[True], out[False])
        self.assertEqual(len(out[True][1]), 2)

    def test_readahead_stops_clean(self):
        # The threads start at the first read and are gone, with every
        # descriptor they opened, when the iterator ends, is closed, or is
        # dropped after a loop left early.
        def fds():
            return len(os.listdir("/proc/self/fd"))
        before_t, before_f = threading.active_count(), fds()
        ds = kd.Shards(self.paths, batch=2, columns=True, read_size=4096)
        it = iter(ds)
        self.assertEqual(threading.active_count(), before_t)  # nothing before the first batch
        next(it)
        self.assertGreater(threading.active_count(), before_t)  # the reader runs
        it.close()
        self.assertEqual((threading.active_count(), fds()), (before_t, before_f))
        for n, b in enumerate(kd.Shards(self.paths, read_size=4096)):
            if n == 9:
                break
        self.assertEqual((threading.active_count(), fds()), (before_t, before_f))
        for ra in (True, False):  # dropped without close, mid-shard
            it = iter(kd.Shards(self.paths, batch=3, read_size=1024, readahead=ra))
            next(it)
            next(it)
            del it
            self.assertEqual((threading.active_count(), fds()), (before_t, before_f))
        self.assertEqual(len(list(kd.Shards(self.paths, batch=3, columns=True))), 20)
        self.assertEqual((threading.active_count(), fds()), (before_t, before_f))
        # In a DataLoader worker: the same, counted inside the worker.
        got = list(DataLoader(_StopEarly(self.paths), batch_size=None, num_workers=1))
        (before, during, after), = got
        self.assertGreater(during[0], before[0])
        self.assertEqual(after, before)

    def test_readahead_without_threads_says_so(self):
        # Where no thread can start, the pass reads in the caller's thread
        # (the same samples) and warns that it does.
        want = digest(kd.Shards(self.paths, read_size=4096, readahead=False))
        real = threading.Thread.start

        def refuse(self):
            raise RuntimeError("can't start new thread")
        threading.Thread.start = refuse
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                got = digest(kd.Shards(self.paths, read_size=4096))
        finally:
            threading.Thread.start = real
        self.assertEqual(want, got)
        self.assertTrue(any("no thread for" in str(x.message) for x in w), [str(x.message) for x in w])

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
        # Columnar batches through the mount, both scanners, 2 workers:
        # every sample once, every byte its source file's; and the same
        # batches as dict batches.
        for scanner in ("python", "libkylix") if HAVE_SCAN else ("python",):
            ds = kd.Shards(root, shuffle=True, seed=1, batch=16, columns=True, scanner=scanner)
            self.assertEqual(ds.scanner, scanner)
            got = unbatch(DataLoader(ds, batch_size=None, num_workers=2))
            self.assertEqual(len(got), 200)
            check_samples(self, collect(got), files)
            self.assertEqual(unbatch(kd.Shards(root, batch=16, columns=True, scanner=scanner, read_size=65536)),
                             unbatch(kd.Shards(root, batch=16, scanner=scanner)))

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
        # Columnar batches, both scanners: the same error, the same
        # sample left out whole, every other byte equal to its source.
        # With the reader thread and without it (readahead), too.
        for scanner, ra in [(sc, ra) for sc in (("python", "libkylix") if HAVE_SCAN else ("python",)) for ra in (True, False)]:
            with self.assertRaises(kd.SampleError) as cm:
                list(kd.Shards(root, batch=8, columns=True, scanner=scanner, readahead=ra))
            self.assertEqual(cm.exception.errno, errno.EIO)
            ds = kd.Shards(root, batch=8, columns=True, on_error="skip", scanner=scanner, readahead=ra)
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                got = collect(unbatch(ds))
            self.assertEqual(len(ds.errors), 1, [str(e) for e in ds.errors])
            self.assertIn(repr(victim), str(ds.errors[0]))
            self.assertNotIn("d1/00101", got)
            check_samples(self, got, files)

if __name__ == "__main__":
    unittest.main()
