#!/usr/bin/env python3
"""kylix.data against plain readers of the same samples, side by side in one
run (for docs/bench.md; root, a Kylix binary, /dev/fuse):

    /usr/bin/python3 contrib/python/bench_data.py [--kylix bin/kylix] [--files 20000]
        [--min 4096] [--max 65536] [--workers 0,2] [--repeat 3] [--dir DIR]

It writes FILES/2 samples (a .bin of MIN..MAX random bytes and a small .cls
each) under DIR (default: a new directory on the disk /var/tmp sits on),
writes the same samples as tar shards of 256 MiB with Python's tarfile
beside them, starts `kylix serve` on a fresh data directory, imports the
tree and makes its shards (`kylix shards`), then reads every sample once
per run, in each of these ways, with a torch DataLoader (batch_size=None,
each worker count given):

  ext4 files     kylix.data.Samples over the source tree (one open+read per file)
  ext4 tarfile   Python's tarfile over the tar shards on the disk ("r|" streams)
  kylix files    kylix.data.Samples through the mount
  kylix shards   kylix.data.Shards through the mount (8 MiB reads)

and batched rows, where a worker hands over one list of 64 samples
(one pickle) instead of one sample: "ext4 files, batch 64" (the
DataLoader batches kylix.data.Samples over the source tree,
batch_size=64) and "kylix shards, batch 64" (kylix.data.Shards(batch=64)),
and "kylix shards, columns 64" (Shards(batch=64, columns=True): one dict
of a key list and one Column, a uint8 tensor plus offsets, per field).
The kylix rows use libkylix's tar scanner where it loads (the setup line
says which: "scanner") and read ahead on a thread ("readahead").

warm: the page cache and the node hold everything (a pass before the
timed ones); cold: page cache dropped, and for the Kylix rows the node
restarted, before each run (the first pass after a node start).

The node makes a whole copy of a file of 16 MiB or more at its second
open served by the node (docs/design/whole.md), so the shards, which the
node serves, get one each during the first Kylix rows: those rows may be
timed while the copies are written, the later ones read them by
passthrough. --settle makes each Kylix shards row wait, after its warm
pass (two passes), until the node has made (or refused) a copy of every
shard of 16 MiB or more, and says how long it waited ("settled_s");
--serve-args passes flags to kylix serve (e.g. "--whole-budget 0": no
copies). Each Kylix row's line gives the node's whole-copy count after
it ("whole_copies").
Prints one JSON line per (way, temperature, workers): samples/s median.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

from kylix import data as kd  # noqa: E402


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class TarfileShards(IterableDataset):
    """What a user without Kylix runs: tarfile over shards, per worker."""

    def __init__(self, paths):
        self.paths = paths

    def __iter__(self):
        import torch.utils.data as tud
        info = tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for p in self.paths[wid::nw]:
            cur = None
            with tarfile.open(p, "r|") as t:
                for m in t:
                    if not m.isfile():
                        continue
                    key, ext = kd.sample_key(m.name)
                    if cur is not None and cur["__key__"] != key:
                        yield cur
                        cur = None
                    if cur is None:
                        cur = {"__key__": key}
                    cur[ext] = t.extractfile(m).read()
            if cur is not None:
                yield cur


class Node:
    def __init__(self, kylix, data, mnt, serve_args=()):
        self.kylix, self.data, self.mnt = kylix, data, mnt
        self.serve_args = list(serve_args)
        self.p = None

    def start(self):
        os.makedirs(self.mnt, exist_ok=True)
        self.p = subprocess.Popen([self.kylix, "serve", "--data", self.data, "--mount", self.mnt, *self.serve_args],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (os.path.ismount(self.mnt) and os.path.exists(os.path.join(self.data, "kylix.sock"))):
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("kylix serve did not come up")
            time.sleep(0.05)

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(60)
        self.p = None

    def run(self, *args):
        subprocess.run([self.kylix, *args, "--data", self.data], check=True, stdout=subprocess.DEVNULL)

    def whole(self):
        """The node's whole-copy status (kylix node --json, "whole")."""
        out = subprocess.run([self.kylix, "node", "--json", "--data", self.data], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out).get("whole") or {}

    def settle(self, want, timeout=120):
        """Waits until the node holds want whole copies, or has made or
        refused that many since its start (or makes none); returns the
        seconds waited. (Its made/not_made counts start again at each node
        start: copies made before a restart are in "copies".)"""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            w = self.whole()
            if (w.get("off") or not w.get("budget_bytes") or w.get("copies", 0) >= want
                    or w.get("made", 0) + w.get("not_made", 0) >= want):
                break
            time.sleep(0.2)
        return time.monotonic() - t0


def as_list(batch):
    return batch


def count(ds, workers, batch=None):
    # batch: the DataLoader batches a map-style data set itself (its
    # workers send one list per batch), as a training loop over files does.
    dl = (DataLoader(ds, batch_size=batch, collate_fn=as_list, num_workers=workers) if batch
          else DataLoader(ds, batch_size=None, num_workers=workers))
    n = 0
    for s in dl:
        if isinstance(s, list):
            n += len(s)
        elif isinstance(s, dict) and isinstance(s.get("__key__"), list):  # a columnar batch
            n += len(s["__key__"])
        else:
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kylix", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bin", "kylix"))
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--min", type=int, default=4096)
    ap.add_argument("--max", type=int, default=65536)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir")
    ap.add_argument("--settle", action="store_true", help="time the Kylix shards rows after the node's whole copies are made")
    ap.add_argument("--serve-args", default="", help="more flags for kylix serve, e.g. '--whole-budget 0'")
    a = ap.parse_args()
    base = a.dir or tempfile.mkdtemp(prefix="kylix-bench-data-", dir="/var/tmp")
    src, tars = os.path.join(base, "src"), os.path.join(base, "tars")
    node = Node(os.path.abspath(a.kylix), os.path.join(base, "data"), os.path.join(base, "mnt"), a.serve_args.split())
    try:
        rnd = open("/dev/urandom", "rb")
        files = {}
        for i in range(a.files // 2):
            key = f"p{i % 16:02d}/{i:07d}"
            size = a.min + (int.from_bytes(rnd.read(4), "little") % (a.max - a.min + 1))
            files[key + ".bin"] = rnd.read(size)
            files[key + ".cls"] = str(i % 1000).encode()
        for rel, b in files.items():
            p = os.path.join(src, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(b)
        total = sum(len(b) for b in files.values())
        del files
        # The same samples as 256 MiB tar shards on the disk, by tarfile.
        os.makedirs(tars)
        paths, t, size, last = [], None, 0, None
        for d in sorted(os.listdir(src)):
            for n in sorted(os.listdir(os.path.join(src, d))):
                key = kd.sample_key(f"{d}/{n}")[0]
                new, last = key != last, key
                if t is None or (new and size >= 256 << 20):
                    if t:
                        t.close()
                    paths.append(os.path.join(tars, f"shard-{len(paths):06d}.tar"))
                    t, size = tarfile.open(paths[-1], "w"), 0
                t.add(os.path.join(src, d, n), arcname=f"{d}/{n}")
                size += os.path.getsize(os.path.join(src, d, n)) + 1024
        t.close()
        node.start()
        node.run("import", src, "ds/d")
        node.run("shards", "ds/d", "ds/d.shards")
        samples = a.files // 2
        ways = {
            "ext4 files": (False, lambda: kd.Samples(src), None),
            "ext4 files, batch 64": (False, lambda: kd.Samples(src), 64),
            "ext4 tarfile": (False, lambda: TarfileShards(paths), None),
            "kylix files": (True, lambda: kd.Samples(os.path.join(node.mnt, "ds", "d")), None),
            "kylix shards": (True, lambda: kd.Shards(os.path.join(node.mnt, "ds", "d.shards")), None),
            "kylix shards, batch 64": (True, lambda: kd.Shards(os.path.join(node.mnt, "ds", "d.shards"), batch=64), None),
            "kylix shards, columns 64": (True, lambda: kd.Shards(os.path.join(node.mnt, "ds", "d.shards"), batch=64, columns=True), None),
        }
        info = {"samples": samples, "files": a.files, "bytes": total, "machine": os.uname().nodename, "cpus": os.cpu_count(),
                "scanner": kd.Shards(os.path.join(node.mnt, "ds", "d.shards")).scanner,
                "readahead": getattr(kd.Shards(os.path.join(node.mnt, "ds", "d.shards")), "readahead", None),
                "serve_args": node.serve_args, "settle": a.settle}
        shard_dir = os.path.join(node.mnt, "ds", "d.shards")
        big = sum(1 for n in os.listdir(shard_dir) if n.endswith(".tar") and os.path.getsize(os.path.join(shard_dir, n)) >= 16 << 20)
        print(json.dumps({"setup": info}), flush=True)
        for workers in [int(w) for w in a.workers.split(",")]:
            for temp in ("warm", "cold"):
                for name, (on_kylix, make, batch) in ways.items():
                    times = []
                    settled = None
                    if temp == "warm":
                        count(make(), workers, batch)  # fill the caches
                        if a.settle and on_kylix and "shards" in name:
                            count(make(), workers, batch)  # a second open: the node copies the shards
                            settled = round(node.settle(big), 2)
                    for _ in range(a.repeat):
                        if temp == "cold":
                            if on_kylix:
                                node.stop()
                            drop_caches()
                            if on_kylix:
                                node.start()
                        t0 = time.perf_counter()
                        n = count(make(), workers, batch)
                        times.append(time.perf_counter() - t0)
                        if n != samples:
                            raise SystemExit(f"{name}: {n} samples, want {samples}")
                    med = statistics.median(times)
                    line = {"way": name, "temp": temp, "workers": workers, "samples_per_s": round(samples / med),
                            "MB_per_s": round(total / med / 1e6, 1), "runs_s": [round(x, 3) for x in times]}
                    if on_kylix:
                        line["whole_copies"] = node.whole().get("copies")
                    if settled is not None:
                        line["settled_s"] = settled
                    print(json.dumps(line), flush=True)
    finally:
        node.stop()
        if os.path.ismount(node.mnt):
            subprocess.run(["umount", "-l", node.mnt])
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
