"""The vLLM loader without vLLM: a stand-in model with vLLM's Llama parameter
layout per rank (qkv_proj and gate_up_proj fused along dim 0, row-parallel
o_proj/down_proj split along dim 1, KV heads replicated when there are more
ranks than KV heads) and a load_weights that, like vLLM's, takes FULL
checkpoint tensors and narrows them itself. kylix.vllm.load_into must leave
every parameter bitwise equal to what that full load gives, while reading
only the rank's bytes of the tensors it slices."""

import os
import shutil
import tempfile
import unittest

import numpy as np
import torch

import kylix.torch as kt
from kylix import vllm as kv

from helpers import demo_model, tbytes, write_st


class StandInLlama(torch.nn.Module):
    def __init__(self, cfg, tp_rank, tp_size, dtype=torch.bfloat16):
        super().__init__()
        self.r, self.tp = tp_rank, tp_size
        h, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        inter, vocab, L = cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
        self.q_rows = nh // tp_size * hd
        self.kv_heads_here = max(1, nkv // tp_size)
        self.kv_rows = self.kv_heads_here * hd
        self.kv_replicas = max(1, tp_size // nkv)
        self.inter = inter // tp_size
        P = lambda *s: torch.nn.Parameter(torch.zeros(*s, dtype=dtype), requires_grad=False)
        self.p = {"model.embed_tokens.weight": P(vocab // tp_size, h), "lm_head.weight": P(vocab // tp_size, h),
                  "model.norm.weight": P(h)}
        for i in range(L):
            pre = f"model.layers.{i}."
            self.p[pre + "self_attn.qkv_proj.weight"] = P(self.q_rows + 2 * self.kv_rows, h)
            self.p[pre + "self_attn.o_proj.weight"] = P(h, nh * hd // tp_size)
            self.p[pre + "mlp.gate_up_proj.weight"] = P(2 * self.inter, h)
            self.p[pre + "mlp.down_proj.weight"] = P(h, self.inter)
            self.p[pre + "input_layernorm.weight"] = P(h)
            self.p[pre + "post_attention_layernorm.weight"] = P(h)
        for k, v in self.p.items():
            self.register_parameter(k.replace(".", "__"), v)

    def named_parameters(self, *a, **kw):
        return iter(self.p.items())

    def load_weights(self, weights):
        """vLLM-like: full tensors in, each narrowed to this rank."""
        loaded = set()
        for name, w in weights:
            for fused, part, idx in kv.STACKED:
                if part in name:
                    pname = name.replace(part, fused)
                    dst = self.p[pname].data
                    if fused == ".qkv_proj.":
                        if idx == 0:
                            dst, src = dst[:self.q_rows], w.narrow(0, self.r * self.q_rows, self.q_rows)
                        else:
                            start = (self.r // self.kv_replicas) * self.kv_rows
                            o = self.q_rows + (idx - 1) * self.kv_rows
                            dst, src = dst[o:o + self.kv_rows], w.narrow(0, start, self.kv_rows)
                    else:
                        dst, src = dst[idx * self.inter:(idx + 1) * self.inter], w.narrow(0, self.r * self.inter, self.inter)
                    dst.copy_(src)
                    loaded.add(pname)
                    break
            else:
                dst = self.p[name].data
                if dst.shape != w.shape:
                    dim = 1 if name.endswith(kv.ROW) else 0
                    n = dst.shape[dim]
                    w = w.narrow(dim, self.r * n, n)
                dst.copy_(w)
                loaded.add(name)
        return loaded


def rnd(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def small_llama(path, cfg):
    h, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    ts = [("model.embed_tokens.weight", (vocab, h)), ("lm_head.weight", (vocab, h)), ("model.norm.weight", (h,))]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        ts += [(pre + "self_attn.q_proj.weight", (nh * hd, h)), (pre + "self_attn.k_proj.weight", (nkv * hd, h)),
               (pre + "self_attn.v_proj.weight", (nkv * hd, h)), (pre + "self_attn.o_proj.weight", (h, nh * hd)),
               (pre + "mlp.gate_proj.weight", (inter, h)), (pre + "mlp.up_proj.weight", (inter, h)),
               (pre + "mlp.down_proj.weight", (h, inter)), (pre + "input_layernorm.weight", (h,)),
               (pre + "post_attention_layernorm.weight", (h,))]
    write_st(path, [(n, "BF16", s, rnd(2 * int(np.prod(s)), i)) for i, (n, s) in enumerate(ts)])


class VllmLoaderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.demo = demo_model("24MiB", seed=2)
        cls.dir = tempfile.mkdtemp(prefix="kylix-py-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.demo)
        shutil.rmtree(cls.dir)

    def compare(self, cfg, files, tp, want_direct):
        full = {}
        for f in files:
            full.update(kt.load_file(f))
        full_bytes = sum(t.numel() * t.element_size() for t in full.values())
        for rank in range(tp):
            ref = StandInLlama(cfg, rank, tp)
            ref.load_weights(iter(full.items()))
            m = StandInLlama(cfg, rank, tp)
            done, ret, stats = kv.load_into(m, files, rank, tp)
            self.assertEqual(stats["direct_tensors"] > 0, want_direct)
            self.assertEqual(set(ret) | done, set(m.p), "every parameter loaded")
            for name in m.p:
                self.assertTrue(tbytes(m.p[name]) == tbytes(ref.p[name]), f"{name} rank {rank}/{tp}")
            read = sum(stats["bytes"].values())
            if want_direct:
                self.assertLess(read, full_bytes, "a rank reads less than the checkpoint")
            else:
                self.assertEqual(read, full_bytes)

    def test_demo_model_tp2(self):
        import json
        with open(os.path.join(self.demo, "base", "config.json")) as f:
            cfg = json.load(f)
        files = kv.model_files(os.path.join(self.demo, "base"))
        self.assertEqual(len(files), 2)
        self.compare(cfg, files, 2, True)
        self.compare(cfg, files, 1, False)

    def test_more_ranks_than_kv_heads(self):
        cfg = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8,
               "intermediate_size": 96, "vocab_size": 128, "num_hidden_layers": 2}
        p = os.path.join(self.dir, "model.safetensors")
        small_llama(p, cfg)
        files = kv.model_files(self.dir)
        self.compare(cfg, files, 2, True)
        # tp 4 > 2 KV heads: vLLM replicates KV heads, so q/k/v fall back to
        # full reads; o/gate/up/down are still sliced.
        m = StandInLlama(cfg, 1, 4)
        direct = kv.plan_direct(dict(m.named_parameters()), {p: kv.parse_file(p)}, 1, 4)
        self.assertNotIn("model.layers.0.self_attn.k_proj.weight", direct)
        self.assertIn("model.layers.0.mlp.down_proj.weight", direct)
        self.assertEqual(direct["model.layers.0.mlp.up_proj.weight"], ("model.layers.0.mlp.gate_up_proj.weight", 0, 24))
        self.compare(cfg, files, 4, True)

    def test_rank_weights_iterator_is_chunks(self):
        files = kv.model_files(os.path.join(self.demo, "base"))
        full = dict(kv.rank_weights_iterator(files, 0, 1))
        for rank in range(2):
            for name, t in kv.rank_weights_iterator(files, rank, 2):
                dim = kv._split.split_dim(name, t.dim())
                want = full[name] if dim is None else full[name].chunk(2, dim)[rank]
                self.assertTrue(tbytes(t) == tbytes(want), name)

    def test_import_without_vllm(self):
        # importing kylix.vllm never needs vLLM; register() does.
        try:
            import vllm  # noqa: F401
        except ImportError:
            with self.assertRaises(ImportError):
                kv.register()
        else:
            self.skipTest("vLLM is installed here")


if __name__ == "__main__":
    unittest.main()
