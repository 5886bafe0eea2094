#!/usr/bin/env python3
"""Measures the two ways to read a rank's dim-1 slice (row-parallel weights):
strided (one pread per row, only the rank's bytes) against block (read the
whole rows, narrow in memory). Warm page cache; prints medians.

    python3 bench_split.py [DIR] [--repeat N]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kylix.torch as kt  # noqa: E402
from tests.helpers import write_st  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="kylix-bench-")
    shapes = {"o_proj (4096x4096)": (4096, 4096), "down_proj (4096x14336)": (4096, 14336)}
    for label, (r, c) in shapes.items():
        p = os.path.join(d, "m.safetensors")
        write_st(p, [("model.layers.0.mlp.down_proj.weight", "BF16", (r, c), os.urandom(2 * r * c))])
        kt.load_file(p)  # warm
        full = []
        for _ in range(a.repeat):
            t0 = time.perf_counter(); kt.load_file(p); full.append(time.perf_counter() - t0)
        print(f"{label}: full load {statistics.median(full) * 1e3:.1f} ms "
              f"({2 * r * c / statistics.median(full) / 1e9:.2f} GB/s)")
        for tp in (2, 4, 8):
            res = {}
            for mode, smr in (("strided", 0), ("block", 1 << 62)):
                kt.STRIDED_MIN_RUN = smr
                ts = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter(); kt.load_file(p, tp_rank=tp - 1, tp_size=tp); ts.append(time.perf_counter() - t0)
                res[mode] = statistics.median(ts)
            run = 2 * c // tp
            print(f"  tp {tp} (run {run} B/row): strided {res['strided'] * 1e3:.1f} ms, "
                  f"block+narrow {res['block'] * 1e3:.1f} ms -> {'strided' if res['strided'] < res['block'] else 'block'} faster "
                  f"({max(res.values()) / min(res.values()):.2f}x)")
        os.unlink(p)
    if not a.dir:
        os.rmdir(d)


if __name__ == "__main__":
    main()
