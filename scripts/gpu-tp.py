#!/usr/bin/env python3
"""N processes, one per GPU, each loading its tensor-parallel share of one
model at once (issue 11). Two ways, side by side in one run:
  kylix:  kylix.torch.load_file(f, device=cuda:r, tp_rank=r, tp_size=N),
          filled by the node through the mount (only the rank's share);
  st:     safetensors.torch.load_file(f, device=cuda:r) of the whole
          checkpoint, then each tensor sliced (what vLLM does by default).
Also one process loading the whole model with kylix on one GPU (the
single-GPU figure). Cold runs drop the page cache first. Every rank's
tensors are checked against the slices of the full tensors (loaded by
safetensors from the source files). Prints a table and JSON lines.

    python3 scripts/gpu-tp.py --mount-files F... --source-files F... [--reps 3]
"""
import argparse, json, os, statistics, sys, time
import multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "contrib", "python"))


def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def pin(cmd):
    import subprocess
    subprocess.run(cmd, check=True)


def rank_main(mode, rank, n, files, barrier, q, check_src):
    import torch
    import kylix.torch as kt
    from kylix import split as ksplit
    import safetensors.torch as st
    dev = f"cuda:{rank}"
    torch.cuda.set_device(rank)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    barrier.wait()
    t0 = time.monotonic()
    out, nbytes, filled = {}, 0, 0
    for f in files:
        if mode == "kylix":
            d = kt.load_file(f, device=dev, tp_rank=rank, tp_size=n) if n > 1 else kt.load_file(f, device=dev)
            filled += kt.last_load_info().get("bytes", {}).get("node-fill", 0)
        else:
            full = st.load_file(f, device=dev)
            d = {}
            for k, t in full.items():
                dim = ksplit.split_dim(k, t.dim())
                d[k] = t if dim is None or n == 1 else t.chunk(n, dim)[rank].contiguous()
            del full
        out.update(d)
    torch.cuda.synchronize()
    t1 = time.monotonic()
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    ok = True
    if check_src:
        for f in check_src:
            full = st.load_file(f, device=dev)
            for k, t in full.items():
                dim = ksplit.split_dim(k, t.dim())
                w = t if dim is None or n == 1 else t.chunk(n, dim)[rank]
                ok &= torch.equal(out[k], w)
            del full
    q.put({"rank": rank, "t0": t0, "t1": t1, "bytes": nbytes, "node_fill": filled, "equal": bool(ok)})


def h2d_main(rank, barrier, q):
    import torch
    torch.cuda.set_device(rank)
    x = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    y = torch.empty(1 << 30, dtype=torch.uint8, device=f"cuda:{rank}")
    y.copy_(x, non_blocking=True)
    torch.cuda.synchronize()
    barrier.wait()
    t0 = time.monotonic()
    for _ in range(8):
        y.copy_(x, non_blocking=True)
    torch.cuda.synchronize()
    q.put({"rank": rank, "t0": t0, "t1": time.monotonic(), "bytes": 8 << 30})


def h2d(n):
    """Pinned host-to-device copies on n GPUs at once: the ceiling for
    ranks that each copy their share from host memory."""
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(n), ctx.Queue()
    ps = [ctx.Process(target=h2d_main, args=(r, barrier, q)) for r in range(n)]
    for p in ps:
        p.start()
    res = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    span = max(r["t1"] for r in res) - min(r["t0"] for r in res)
    return sum(r["bytes"] for r in res) / span / 1e9


def run(mode, n, files, check_src=None):
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(n), ctx.Queue()
    ps = [ctx.Process(target=rank_main, args=(mode, r, n, files, barrier, q, check_src)) for r in range(n)]
    for p in ps:
        p.start()
    res = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    start, end = min(r["t0"] for r in res), max(r["t1"] for r in res)
    return {"mode": mode, "ranks": n, "seconds": end - start, "bytes": sum(r["bytes"] for r in res),
            "node_fill_per_rank": [r["node_fill"] for r in sorted(res, key=lambda r: r["rank"])],
            "equal": all(r["equal"] for r in res)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount-files", nargs="+")
    ap.add_argument("--source-files", nargs="+")
    ap.add_argument("--h2d-only", action="store_true", help="only measure pinned host-to-device copies, 1 GPU and all at once")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pinned", nargs="+", help="after the warm runs, run this command (kylix pin PATH) and measure again")
    a = ap.parse_args()
    import torch
    n = torch.cuda.device_count()
    if a.h2d_only:
        for _ in range(a.reps):
            one, alln = h2d(1), h2d(n)
            print(f"pinned host-to-device: 1 GPU {one:.1f} GB/s, {n} GPUs at once {alln:.1f} GB/s in all ({alln / one:.2f}x)")
        return 0
    if not a.mount_files or not a.source_files:
        ap.error("--mount-files and --source-files are needed")
    model = sum(os.path.getsize(f) for f in a.source_files)
    print(f"{n} GPUs, model {model / 1e9:.2f} GB", flush=True)
    one, alln = h2d(1), h2d(n)
    print(f"pinned host-to-device, 8 x 1 GiB per GPU: 1 GPU {one:.1f} GB/s, {n} GPUs at once {alln:.1f} GB/s in all "
          f"({alln / one:.2f}x): the ceiling for {n} ranks copying from host memory", flush=True)
    rows, ok = {}, True
    # Correctness first (warm): every rank's share equals the slices.
    r = run("kylix", n, a.mount_files, check_src=a.source_files)
    print("check:", json.dumps(r), flush=True)
    ok &= r["equal"]
    states = ["cold", "warm"] + (["pinned"] if a.pinned else [])
    for state in states:
        if state != "cold":
            # Cold loads read with O_DIRECT and leave nothing in the page
            # cache: read the files once, untimed, so "warm" is warm.
            for f in a.mount_files:
                with open(f, "rb") as fh:
                    while fh.read(64 << 20):
                        pass
        if state == "pinned":
            pin(a.pinned)
        for i in range(a.reps):
            for mode, ranks, files in (("kylix", n, a.mount_files), ("st", n, a.mount_files), ("kylix", 1, a.mount_files)):
                if state == "cold":
                    drop()
                r = run(mode, ranks, files)
                r["state"] = state
                print(json.dumps(r), flush=True)
                rows.setdefault((mode, ranks, state), []).append(r["seconds"])
    print("\n| what | ranks | state | median s | runs |\n|---|---|---|---|---|")
    for (mode, ranks, state), v in rows.items():
        print(f"| {mode} | {ranks} | {state} | {statistics.median(v):.3f} | {', '.join(f'{x:.3f}' for x in v)} |")
    for state in states:
        kn, st1 = statistics.median(rows[("kylix", n, state)]), statistics.median(rows[("st", n, state)])
        k1 = statistics.median(rows[("kylix", 1, state)])
        print(f"{state}: {n} ranks kylix {kn:.3f} s = {k1 / kn:.2f}x faster than one GPU whole ({k1:.3f} s; "
              f"goal >= {n}x minus a constant), {st1 / kn:.2f}x faster than safetensors+slice ({st1:.3f} s; goal >= 3x); "
              f"aggregate {model / kn / 1e9:.1f} GB/s vs one GPU {model / k1 / 1e9:.1f}")
    print("TP CHECK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
