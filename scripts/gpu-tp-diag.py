#!/usr/bin/env python3
"""Where does a tensor-parallel node fill lose its time? (issue 11)
Runs kylix.torch.load_file in spawned processes, one per listed GPU, started
together, for: each rank alone, all ranks at once, and the whole model alone
on each GPU; prints per-file seconds, bytes and the node's path per process.

    python3 scripts/gpu-tp-diag.py --files F... [--reps 2]
"""
import argparse, json, os, statistics, sys, time
import multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "contrib", "python"))


def worker(mode, rank, n, files, barrier, q):
    import torch
    import kylix.torch as kt
    dev = f"cuda:{rank}"
    torch.cuda.set_device(rank)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    barrier.wait()
    t0 = time.monotonic()
    per = []
    for f in files:
        a = time.monotonic()
        if mode == "tp":
            d = kt.load_file(f, device=dev, tp_rank=rank, tp_size=n)
        else:
            d = kt.load_file(f, device=dev)
        torch.cuda.synchronize()
        info = kt.last_load_info()
        per.append({"s": round(time.monotonic() - a, 4), "in_s": round(info.get("seconds", 0), 4),
                    "bytes": info.get("bytes"), "node": info.get("node_path"), "err": info.get("node_error")})
        del d
    q.put({"rank": rank, "t0": t0, "t1": time.monotonic(), "files": per})


def run(mode, ranks, n, files):
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(len(ranks)), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(mode, r, n, files, barrier, q)) for r in ranks]
    for p in ps:
        p.start()
    res = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    return max(r["t1"] for r in res) - min(r["t0"] for r in res), res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", nargs="+", required=True)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    import torch
    n = torch.cuda.device_count()
    cases = [("tp", [r]) for r in range(n)] + [("tp", list(range(n)))] + [("whole", [r]) for r in range(n)] + [("whole", list(range(n)))]
    for rep in range(a.reps):
        for mode, ranks in cases:
            s, res = run(mode, ranks, n, a.files)
            print(json.dumps({"rep": rep, "mode": mode, "ranks": ranks, "seconds": round(s, 4), "procs": res}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
