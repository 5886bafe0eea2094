#!/usr/bin/env python3
"""One transformers from_pretrained of a model directory onto cuda:0, timed,
then its logits on fixed input: saved (--save) or compared with saved ones
(--ref). Prints one JSON line. Used by scripts/gpu-transformers.sh, one
fresh process per measurement (as a user's program would run).

    python3 scripts/hf_load.py DIR (--save F | --ref F)
"""
import json, os, sys, time

import torch
from transformers import AutoModelForCausalLM


def main():
    d, mode, f = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.zeros(1, device="cuda:0")  # CUDA init is not the loader's time
    torch.cuda.synchronize()
    how = "device_map"
    t0 = time.perf_counter()
    try:
        m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16, device_map="cuda:0")
    except (ImportError, ValueError):  # device_map needs accelerate
        how = "to"
        m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16).to("cuda:0")
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d) if x.endswith(".safetensors"))
    ids = torch.arange(1, 33, device="cuda:0").reshape(1, 32)
    with torch.no_grad():
        logits = m(ids).logits.float().cpu()
    out = {"seconds": secs, "gb_per_s": size / secs / 1e9, "how": how}
    if mode == "--save":
        torch.save(logits, f)
    else:
        ref = torch.load(f)
        out["equal"] = bool(torch.equal(ref, logits))
        out["max_abs_diff"] = float((ref - logits).abs().max())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
