#!/usr/bin/env python3
"""The GPU machine's check of the Python package (torch 2.x with CUDA and the
real safetensors package installed):
  1. the unit tests (now also comparing with safetensors.torch.load_file);
  2. load_file(device="cuda:0") bitwise equal to safetensors' on the GPU,
     whole and per TP rank, and which path the bytes took;
  3. the IPC handle the node fill sends (cuIpcGetMemHandle through ctypes),
     and the shape of torch's own UntypedStorage._share_cuda_() for reference.
Run from the repository root with bin/kylix built:
    python3 contrib/python/gpu_check.py
"""

import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tests"))

import torch  # noqa: E402
import safetensors.torch as st  # noqa: E402

import kylix.torch as kt  # noqa: E402
from kylix import split as ksplit  # noqa: E402
from helpers import demo_model, shards, tbytes  # noqa: E402


def check_node_fill(d):
    """load_file(device="cuda:0") through a live mount whose node answers
    op FILL: the bytes must come from the node's GPU fill and equal
    safetensors' load of the source file."""
    import signal
    import tempfile
    import time
    from helpers import KYLIX_BIN
    tmp = tempfile.mkdtemp(prefix="kylix-gpucheck-")
    data, mnt, sock = (os.path.join(tmp, x) for x in ("data", "mnt", "client.sock"))
    os.makedirs(data)
    os.makedirs(mnt)
    subprocess.run([KYLIX_BIN, "import", "--data", data, os.path.join(d, "base"), "m"], check=True, capture_output=True)
    node = subprocess.Popen([KYLIX_BIN, "serve", "--data", data, "--mount", mnt, "--client-socket", sock],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ok = True
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(mnt, "m", "config.json")):
            if node.poll() is not None or time.monotonic() > deadline:
                print("node fill: the node did not come up")
                return False
            time.sleep(0.05)
        for p in shards(d):
            want = st.load_file(p, device="cuda:0")
            got = kt.load_file(os.path.join(mnt, "m", os.path.basename(p)), device="cuda:0")
            info = kt.last_load_info()
            same = all(tbytes(got[k]) == tbytes(want[k]) for k in want) and set(got) == set(want)
            filled = info.get("bytes", {}).get("node-fill", 0)
            print("node fill:", os.path.basename(p), "equal" if same else "DIFFERENT",
                  {k: v for k, v in info.items() if k != "path"})
            ok &= same and filled > 0
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print("node fill through the mount:", "ok" if ok else "FAILED")
    return ok


def main():
    print("torch", torch.__version__, "cuda", torch.cuda.is_available())
    r = unittest.TextTestRunner(verbosity=1).run(unittest.defaultTestLoader.discover(os.path.join(HERE, "tests")))
    ok = r.wasSuccessful()
    d = demo_model("512MiB")
    try:
        for p in shards(d):
            want = st.load_file(p, device="cuda:0")
            got = kt.load_file(p, device="cuda:0")
            info = kt.last_load_info()
            print(os.path.basename(p), {k: v for k, v in info.items() if k != "path"})
            for k in want:
                ok &= got[k].device == want[k].device and tbytes(got[k]) == tbytes(want[k])
            for tp in (2, 4):
                for rank in range(tp):
                    part = kt.load_file(p, device="cuda:0", tp_rank=rank, tp_size=tp)
                    for k, t in want.items():
                        dim = ksplit.split_dim(k, t.dim())
                        w = t if dim is None else t.chunk(tp, dim)[rank]
                        ok &= tbytes(part[k]) == tbytes(w)
        ok &= check_node_fill(d)
        t = torch.empty(1000, device="cuda:0")
        sh = t.untyped_storage()._share_cuda_()
        # For reference only (we do not use it): torch >= 2.2 prefixes the
        # 64-byte handle with a version byte and a type byte ('c').
        print("_share_cuda_ tuple:", len(sh), [type(x).__name__ for x in sh], "handle bytes", len(sh[1]))
        from kylix import _node
        h, base, size = _node.ipc_handle(t.data_ptr())
        print("cuIpcGetMemHandle:", len(h), "bytes; allocation", hex(base), size, "tensor at +", t.data_ptr() - base)
        ok &= len(h) == 64 and base <= t.data_ptr() < base + size
    finally:
        shutil.rmtree(d)
    print("GPU CHECK", "PASSED" if ok else "FAILED")
    subprocess.run([sys.executable, os.path.join(HERE, "bench_split.py")])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
