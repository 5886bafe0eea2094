import os
import random
import shutil
import tempfile
import unittest

import numpy as np
import torch

import kylix.torch as kt
from kylix import split as ksplit

from helpers import SIZES, demo_model, numpy_parse, shards, st_torch, tbytes, write_st


def rnd(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def available_dtypes():
    return [d for d in SIZES if getattr(torch, kt._DTYPE_ATTRS[d], None) is not None]


class LoadFileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.demo = demo_model("24MiB")
        cls.dir = tempfile.mkdtemp(prefix="kylix-py-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.demo)
        shutil.rmtree(cls.dir)

    def check_equal_to_numpy(self, path, got):
        ref = numpy_parse(path)
        self.assertEqual(sorted(ref), list(got), "names (sorted, as safetensors returns them)")
        for name, (dt, shape, raw) in ref.items():
            t = got[name]
            self.assertEqual(tuple(t.shape), shape, name)
            self.assertEqual(t.dtype, kt.torch_dtype(dt), name)
            self.assertTrue(tbytes(t) == raw, f"{name}: bytes differ from the file")

    def test_go_writer_files_equal_numpy(self):
        for p in shards(self.demo):
            got = kt.load_file(p)
            self.check_equal_to_numpy(p, got)
            info = kt.last_load_info()
            self.assertEqual(sum(info["bytes"].values()), sum(t.numel() * t.element_size() for t in got.values()))

    def test_every_dtype_and_odd_shapes(self):
        p = os.path.join(self.dir, "dtypes.safetensors")
        ts = []
        for i, dt in enumerate(available_dtypes()):
            for j, shape in enumerate([(), (0,), (3,), (5, 7), (2, 3, 4), (1, 0, 3)]):
                n = SIZES[dt]
                for d in shape:
                    n *= d
                raw = rnd(n, i * 10 + j)
                if dt == "BOOL":
                    raw = bytes(b & 1 for b in raw)  # torch bools are 0/1
                ts.append((f"{dt}.{j}", dt, shape, raw))
        random.Random(3).shuffle(ts)
        write_st(p, ts, metadata={"format": "pt", "k": "v"})
        got = kt.load_file(p)
        self.check_equal_to_numpy(p, got)
        with kt.safe_open(p, framework="pt") as f:
            self.assertEqual(f.metadata(), {"format": "pt", "k": "v"})
            self.assertEqual(f.keys(), sorted(n for n, *_ in ts))
            for n in f.keys():
                t = f.get_tensor(n)
                self.assertEqual((t.dtype, t.shape), (got[n].dtype, got[n].shape), n)
                self.assertTrue(tbytes(t) == tbytes(got[n]), n)

    def test_big_file_threads(self):
        # Over PARALLEL_MIN and with a tensor larger than PIECE: the threaded,
        # split path must land every byte in the right place.
        p = os.path.join(self.dir, "big.safetensors")
        ts = [("a", "U8", (kt.PIECE + 12345,), rnd(kt.PIECE + 12345, 1)),
              ("b", "F32", (1000, 1001), rnd(4004000, 2)), ("c", "U8", (7,), rnd(7, 3))]
        write_st(p, ts)
        for threads in (1, 4):
            got = kt.load_file(p, threads=threads)
            self.check_equal_to_numpy(p, got)

    def test_safe_open_slices(self):
        p = shards(self.demo)[0]
        full = kt.load_file(p)
        with kt.safe_open(p, framework="pt", device="cpu") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                self.assertEqual(sl.get_shape(), list(full[name].shape))
                self.assertEqual(sl.get_dtype(), numpy_parse(p)[name][0])
                t = full[name]
                idxs = [slice(None), slice(1, 3), slice(None, None, 2), -1, 0, (slice(2, 5), slice(1, 4)),
                        (Ellipsis,), (slice(3, 1),)]
                for idx in idxs:
                    if t.dim() < (len(idx) if isinstance(idx, tuple) else 1):
                        continue
                    want = t[idx]
                    self.assertTrue(tbytes(sl[idx]) == tbytes(want) and sl[idx].shape == want.shape, (name, idx))
            with self.assertRaises(KeyError):
                f.get_tensor("nope")
        with self.assertRaises(RuntimeError):
            f.get_tensor(name)

    def test_tp_equals_chunk(self):
        for p in shards(self.demo):
            full = kt.load_file(p)
            for tp in (2, 3, 4):
                for rank in range(tp):
                    for smr in (0, 1 << 30):  # strided rows, and block-then-narrow
                        kt.STRIDED_MIN_RUN = smr
                        try:
                            part = kt.load_file(p, tp_rank=rank, tp_size=tp)
                        finally:
                            kt.STRIDED_MIN_RUN = 1024
                        read = sum(kt.last_load_info()["bytes"].values())
                        self.check_tp(full, part, rank, tp)
                        if smr == 0:  # strided: only the rank's bytes were read
                            self.assertEqual(read, sum(t.numel() * t.element_size() for t in part.values()))

    def check_tp(self, full, part, rank, tp, split=None):
        self.assertEqual(list(full), list(part))
        nsplit = 0
        for name, t in full.items():
            dim = ksplit.split_dim(name, t.dim(), split)
            if dim is None:
                want = t
            else:
                nsplit += 1
                want = t.chunk(tp, dim)[rank]
            self.assertEqual(part[name].shape, want.shape, name)
            self.assertTrue(tbytes(part[name]) == tbytes(want), f"{name} rank {rank}/{tp}")
        self.assertGreater(nsplit, 0)

    def test_default_rules(self):
        d = ksplit.split_dim
        self.assertEqual(d("model.layers.0.self_attn.q_proj.weight", 2), 0)
        self.assertEqual(d("model.layers.0.self_attn.q_proj.bias", 1), 0)
        self.assertEqual(d("model.layers.0.self_attn.v_proj.bias", 1), 0)
        # Fused on disk: vLLM cuts each of q, k, v on its own, so no single
        # chunk of the whole is a rank's share; every rank keeps it whole.
        self.assertIsNone(d("model.layers.0.self_attn.qkv_proj.bias", 1))
        self.assertIsNone(d("model.layers.0.mlp.gate_up_proj.weight", 2))
        self.assertEqual(d("model.layers.0.block_sparse_moe.experts.3.w2.weight", 2), 1)
        self.assertEqual(d("gpt_neox.layers.0.mlp.dense_4h_to_h.weight", 2), 1)
        self.assertIsNone(d("model.layers.0.self_attn.q_proj.weight_scale", 2))
        self.assertEqual(d("model.layers.0.mlp.down_proj.weight", 2), 1)
        self.assertIsNone(d("model.layers.0.self_attn.o_proj.bias", 1))
        self.assertEqual(d("model.embed_tokens.weight", 2), 0)
        self.assertEqual(d("lm_head.weight", 2), 0)
        self.assertIsNone(d("model.norm.weight", 1))
        self.assertIsNone(d("model.layers.0.input_layernorm.weight", 1))
        self.assertIsNone(d("model.layers.0.mlp.down_proj.weight", 2, {r"down_proj": None}))
        self.assertEqual(d("model.norm.weight", 1, {r"\.norm\.": 0}), 0)
        with self.assertRaises(ValueError):
            d("x.weight", 1, {"x": 1})

    def test_tp_override_and_uneven(self):
        p = os.path.join(self.dir, "uneven.safetensors")
        write_st(p, [("m.q_proj.weight", "BF16", (7, 5), rnd(70, 1)), ("m.o_proj.weight", "F32", (3, 10, 3), rnd(360, 2)),
                     ("m.norm.weight", "F16", (9,), rnd(18, 3)), ("m.mystery", "I32", (4, 6), rnd(96, 4))])
        full = kt.load_file(p)
        split = {r"mystery$": 1, r"norm": 0}
        for tp in (2, 3):
            for rank in range(tp):
                for smr in (0, 1 << 30):
                    kt.STRIDED_MIN_RUN = smr
                    try:
                        part = kt.load_file(p, tp_rank=rank, tp_size=tp, split=split)
                    finally:
                        kt.STRIDED_MIN_RUN = 1024
                    self.check_tp(full, part, rank, tp, split)
        with self.assertRaises(ValueError):
            kt.load_file(p, tp_rank=2, tp_size=2)
        with self.assertRaises(ValueError):
            kt.load_file(p, tp_rank=0)

    def test_without_lib_by_default_here(self):
        # No libkylix in this tree (or KYLIX_NO_LIB): the plain path, and it says so.
        kt.load_file(shards(self.demo)[0], use_lib=False)
        info = kt.last_load_info()
        self.assertEqual(set(info["bytes"]), {"pread"})

    @unittest.skipIf(st_torch is None, "the safetensors package is not installed (it is on the GPU machine)")
    def test_equal_to_safetensors(self):
        for p in shards(self.demo) + [os.path.join(self.dir, "dtypes.safetensors")]:
            if not os.path.exists(p):
                continue
            want = st_torch.load_file(p)
            got = kt.load_file(p)
            self.assertEqual(list(want), list(got))
            for k in want:
                self.assertEqual((want[k].dtype, want[k].shape), (got[k].dtype, got[k].shape), k)
                self.assertTrue(tbytes(want[k]) == tbytes(got[k]), k)
        # and a file written by safetensors itself
        p = os.path.join(self.dir, "st.safetensors")
        src = {"a": torch.randn(33, 17).to(torch.bfloat16), "b": torch.arange(10, dtype=torch.int64)}
        st_torch.save_file(src, p, metadata={"m": "1"})
        got = kt.load_file(p)
        for k in src:
            self.assertTrue(tbytes(src[k]) == tbytes(got[k]), k)


if __name__ == "__main__":
    unittest.main()
