#!/usr/bin/env python3
"""kylix.data.to_device against the pinned host-to-device limit, side by
side in one run (for docs/bench.md; needs CUDA):

    python3 contrib/python/bench_to_device.py [--batch-mib 64] [--batches 40] [--repeat 3]

Batches are pageable CPU tensors (what a DataLoader without pin_memory
yields), each --batch-mib MiB. Timed, each to the device and synchronised:

  pinned limit         one pinned buffer copied --batches times (no CPU work)
  pin, then copy       pin_memory() then .to(non_blocking) per batch, in turn
                       (what DataLoader(pin_memory=True) and a loop do)
  to_device            kylix.data.to_device(batches): the same, the copy on a
                       side stream, prefetch batches ahead

Prints one JSON line per way: GB/s median of --repeat.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from kylix import data as kd  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-mib", type=int, default=64)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    n = a.batch_mib << 20
    host = [torch.randint(0, 255, (n,), dtype=torch.uint8) for _ in range(a.batches)]
    total = n * a.batches
    dev = torch.device("cuda:0")
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    out = torch.empty(n, dtype=torch.uint8, device=dev)

    def pinned_limit():
        for _ in range(a.batches):
            out.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()

    def pin_one():
        for t in host:
            d = t.pin_memory().to(dev, non_blocking=True)
        torch.cuda.synchronize()
        return d

    def to_device():
        d = None
        for d in kd.to_device(host, "cuda:0"):
            pass
        torch.cuda.synchronize()
        return d

    ways = [("pinned limit", pinned_limit), ("pin, then copy", pin_one), ("to_device", to_device)]
    # Correctness once: the last batch arrives whole.
    last = None
    for last in kd.to_device(host[-3:], "cuda:0"):
        pass
    assert torch.equal(last.cpu(), host[-1]), "to_device delivered wrong bytes"
    print(json.dumps({"setup": {"batch_bytes": n, "batches": a.batches, "gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count()}}), flush=True)
    for name, fn in ways:
        fn()  # warm the allocators
        ts = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        print(json.dumps({"way": name, "GB_per_s": round(total / statistics.median(ts) / 1e9, 2), "runs_s": [round(x, 3) for x in ts]}), flush=True)


if __name__ == "__main__":
    main()
