#!/usr/bin/env python3
"""safetensors.torch.load_file(f, device="cuda:0") of every FILE, timed
(CUDA initialised first), as one JSON line: bytes, seconds, gb_per_s. The
baseline the GPU benchmark scripts compare against.

    python3 scripts/st_load.py FILE...
"""
import json
import sys
import time

import torch
from safetensors.torch import load_file

torch.cuda.init()
torch.zeros(1, device="cuda:0")
torch.cuda.synchronize()
n = 0
t = time.perf_counter()
for f in sys.argv[1:]:
    d = load_file(f, device="cuda:0")
    n += sum(v.numel() * v.element_size() for v in d.values())
    torch.cuda.synchronize()
    del d
el = time.perf_counter() - t
print(json.dumps({"bytes": n, "seconds": el, "gb_per_s": n / el / 1e9}))
