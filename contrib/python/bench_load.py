#!/usr/bin/env python3
"""kylix.torch.load_file against safetensors.torch.load_file, side by side,
into a device (for docs/bench.md; written for the H200, runs anywhere).

    python3 bench_load.py [--device cuda:0] [--repeat 3] [--cold] [--tp N] FILE...

--cold drops the page cache before every run (root: /proc/sys/vm/drop_caches);
through a Kylix mount that also needs the node's own caches cold, which this
script does not control. Each run is a fresh call in this process; prints
the median, GB/s, and where kylix's bytes went (last_load_info).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import kylix.torch as kt  # noqa: E402

try:
    import safetensors.torch as st
except ImportError:
    st = None


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--tp", type=int, default=0, help="also time rank 0 of a TP share")
    a = ap.parse_args()
    total = sum(os.path.getsize(f) for f in a.files)
    sync = (lambda: torch.cuda.synchronize()) if a.device.startswith("cuda") else (lambda: None)
    cases = {"kylix.torch.load_file": lambda f: kt.load_file(f, a.device)}
    if st is not None:
        cases["safetensors.torch.load_file"] = lambda f: st.load_file(f, device=a.device)
    if a.device.startswith("cuda"):
        import bench_pinned
        how = "O_DIRECT" if a.cold else "page cache"
        cases[f"python pinned-thread loader ({bench_pinned.THREADS} threads, {how})"] = \
            lambda f: bench_pinned.load_file(f, a.device, direct=a.cold)[0]
        if st is not None:  # the baseline must be right to be a baseline
            for f in a.files:
                got, how = bench_pinned.load_file(f, a.device, direct=a.cold)
                want = st.load_file(f, device=a.device)
                assert all(torch.equal(got[k], want[k]) for k in want), f"pinned-thread loader: {f} differs"
                print(f"  pinned-thread loader equal to safetensors on {os.path.basename(f)} ({how})")
                del got, want
    if a.tp > 1:
        cases[f"kylix tp {a.tp} rank 0"] = lambda f: kt.load_file(f, a.device, tp_rank=0, tp_size=a.tp)
    print(f"{len(a.files)} files, {total / 1e9:.2f} GB, device {a.device}, {'cold' if a.cold else 'warm'}, "
          f"median of {a.repeat}; torch {torch.__version__}")
    if not a.cold:
        for f in a.files:
            kt.load_file(f)  # warm the page cache
    for name, fn in cases.items():
        ts, info = [], {}
        for _ in range(a.repeat):
            if a.cold:
                drop_caches()
            t0 = time.perf_counter()
            for f in a.files:
                d = fn(f)
                if name.startswith("kylix"):
                    for k, v in kt.last_load_info().get("bytes", {}).items():
                        info[k] = info.get(k, 0) + v
                del d
            sync()
            ts.append(time.perf_counter() - t0)
        m = statistics.median(ts)
        print(f"  {name}: {m:.3f} s, {total / m / 1e9:.2f} GB/s (runs {', '.join(f'{t:.3f}' for t in ts)})"
              + (f" paths {info}" if info else ""))


if __name__ == "__main__":
    main()
