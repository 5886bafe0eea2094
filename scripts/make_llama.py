#!/usr/bin/env python3
"""Write a transformers Llama checkpoint for the GPU benchmarks: about 1.9 B
parameters in bf16, save_pretrained's safetensors shards of 2 GB, random
weights (seed 7) with the norm weights at 1.0 as a fresh model has them.

    python3 scripts/make_llama.py DIR
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=8,
                  num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                  torch_dtype="bfloat16")
with torch.device("meta"):
    m = LlamaForCausalLM(cfg)
g = torch.Generator(device="cuda:0").manual_seed(7)
sd = {}
for name, p in m.state_dict().items():
    if name.endswith("norm.weight"):
        sd[name] = torch.ones(p.shape, dtype=torch.bfloat16)
    else:
        sd[name] = (torch.randn(p.shape, generator=g, device="cuda:0", dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()
m.save_pretrained(sys.argv[1], state_dict=sd, max_shard_size="2GB", safe_serialization=True)
print("checkpoint: %.2f GB of tensors" % (sum(t.numel() * t.element_size() for t in sd.values()) / 1e9))
