"""kylix.kv_vllm against a real node, driven by a harness that makes vLLM's
calls in vLLM's order (scheduler: get_num_new_matched_tokens,
update_state_after_alloc, build_connector_meta, request_finished; worker:
register_kv_caches, bind_connector_metadata, start_load_kv,
wait_for_layer_load, save_kv_layer, wait_for_save, get_finished,
get_block_ids_with_load_errors) on objects shaped as vLLM's: the paged KV
cache of the flash-attention layout (2, num_blocks, block_size, heads,
head_dim) per layer, CPU tensors. vLLM itself is not installed here."""

import abc
import os
import pickle
import types
import unittest

import torch

import kvnode
from kylix import kv_vllm

from helpers import KYLIX_BIN, needs

NS = types.SimpleNamespace
BS, HEADS, HEAD_DIM, NUM_BLOCKS = 16, 4, 64, 64
PIECE = BS * HEADS * HEAD_DIM * 2  # one block of one layer's K (or V), float16: 8 KiB
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


def vllm_config(mount, model="org/model", use_mla=False):
    return NS(model_config=NS(model=model, dtype="torch.float16", use_mla=use_mla),
              cache_config=NS(block_size=BS, cache_dtype="auto"),
              parallel_config=NS(tensor_parallel_size=1, pipeline_parallel_size=1),
              kv_transfer_config=NS(kv_connector_extra_config={"kylix_mount": mount}))


def kv_cache_config():
    return NS(kv_cache_groups=[NS(layer_names=list(LAYERS))])


def true_kv(layer, piece, prompt, b):
    """What the model computes for block b of prompt in one layer: a function
    of the prefix up to the block's end, as real KV is."""
    seed = hash((layer, piece, tuple(prompt[:(b + 1) * BS]))) & 0x7FFFFFFF
    return torch.randn(BS, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


def byte_equal(a, b):
    return torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


class Engine:
    """One vLLM engine: a scheduler-side and a worker-side connector, a
    paged KV cache per layer, and a block pool that hands out block ids in
    its own order (so a reload lands in other blocks than the save)."""

    def __init__(self, test, mount, order, hnd=False, **cfg):
        self.test = test
        conf = vllm_config(mount, **cfg)
        self.sched = kv_vllm.KylixConnectorCore(conf, NS(name="SCHEDULER"), kv_cache_config())
        self.worker = kv_vllm.KylixConnectorCore(conf, NS(name="WORKER"), kv_cache_config())
        test.addCleanup(self.sched.shutdown)
        test.addCleanup(self.worker.shutdown)
        if hnd:  # heads before tokens in memory, seen through a permuted view: a block is not contiguous
            self.caches = {n: torch.zeros(2, NUM_BLOCKS, HEADS, BS, HEAD_DIM, dtype=torch.float16).permute(0, 1, 3, 2, 4)
                           for n in LAYERS}
        else:
            self.caches = {n: torch.zeros(2, NUM_BLOCKS, BS, HEADS, HEAD_DIM, dtype=torch.float16) for n in LAYERS}
        self.worker.register_kv_caches(self.caches)
        self.free = list(order)

    def schedule(self, req_id, prompt, local=0, chunk=None, **req):
        """Scheduler side for a new request with `local` tokens from vLLM's
        own prefix cache; returns (external tokens, block ids, metadata)."""
        request = NS(request_id=req_id, prompt_token_ids=prompt, mm_features=req.get("mm_features", []),
                     lora_request=None, cache_salt=None, prompt_embeds=None)
        ext, is_async = self.sched.get_num_new_matched_tokens(request, local)
        self.test.assertFalse(is_async)
        n_blocks = -(-len(prompt) // BS)
        ids, self.free = self.free[:n_blocks], self.free[n_blocks:]
        self.sched.update_state_after_alloc(request, NS(get_block_ids=lambda: (ids,)), ext)
        todo = len(prompt) - local - ext if chunk is None else chunk
        new = NS(req_id=req_id, prompt_token_ids=prompt, mm_features=request.mm_features, block_ids=(ids,),
                 num_computed_tokens=local + ext, lora_request=None)
        out = NS(scheduled_new_reqs=[new], num_scheduled_tokens={req_id: todo}, finished_req_ids=set(),
                 scheduled_cached_reqs=NS(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]))
        return request, ext, ids, self.sched.build_connector_meta(out)

    def forward(self, meta, prompt, ids, start, end):
        """Worker side of one step: loads, then per layer the attention's
        writes of tokens [start, end) and the connector's save."""
        self.worker.bind_connector_metadata(pickle.loads(pickle.dumps(meta)))  # to another process
        self.worker.start_load_kv(NS(attn_metadata={}))
        for name in LAYERS:
            self.worker.wait_for_layer_load(name)
            for t in range(start, end):
                b = t // BS
                for p in range(2):
                    self.caches[name][p, ids[b], t % BS] = true_kv(name, p, prompt, b)[t % BS]
            self.worker.save_kv_layer(name, self.caches[name], None)
        self.worker.wait_for_save()
        self.test.assertEqual(self.worker.get_finished(set()), (None, None))
        self.worker.clear_connector_metadata()
        return self.worker.get_block_ids_with_load_errors()

    def run(self, req_id, prompt, local=0):
        """A whole prompt in one step; returns (external tokens, ids, meta, load errors)."""
        request, ext, ids, meta = self.schedule(req_id, prompt, local)
        for b in range(local // BS):  # vLLM's own prefix cache had these
            for name in LAYERS:
                for p in range(2):
                    self.caches[name][p, ids[b]] = true_kv(name, p, prompt, b)
        errors = self.forward(meta, prompt, ids, local + ext, len(prompt))
        self.test.assertEqual(self.sched.request_finished(request, ids), (False, None))
        return ext, ids, meta, errors

    def check_blocks(self, prompt, ids, n_blocks):
        for b in range(n_blocks):
            for name in LAYERS:
                for p in range(2):
                    self.test.assertTrue(byte_equal(self.caches[name][p, ids[b]], true_kv(name, p, prompt, b)),
                                         f"block {b} of {name} piece {p} (vLLM block {ids[b]})")


def tokens(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (n,), generator=g).tolist()


@unittest.skipUnless(os.geteuid() == 0, "needs root (kylix serve mounts with FUSE); CI runs it as root")
@needs(os.path.exists("/dev/fuse") and os.path.exists(KYLIX_BIN), "/dev/fuse (fuse3) and bin/kylix (make build)")
class VLLMConnectorTest(kvnode.KVNodeCase):
    NODE_ARGS = ("--kv-block", str(PIECE), "--kv-mem", "4MiB")

    def test_save_then_reload_into_other_blocks(self):
        prompt = tokens(1, 5 * BS + 3)  # 5 full blocks and a partial one
        a = Engine(self, self.mnt, range(NUM_BLOCKS))
        ext, ids_a, meta, errors = a.run("a", prompt)
        self.assertEqual((ext, errors, meta.requests[0].loads), (0, set(), []), "a first prompt is a miss")
        self.assertEqual([bid for bid, _ in meta.requests[0].saves], ids_a[:5], "full blocks saved, not the partial one")
        self.assertEqual(a.worker.stats["saved_pieces"], 5 * len(LAYERS) * 2)
        self.assertEqual(self.kv.stats()["my_mem_blocks"], 5 * len(LAYERS) * 2)

        b = Engine(self, self.mnt, reversed(range(NUM_BLOCKS)))  # a second engine, other block ids
        ext, ids_b, meta, errors = b.run("b", prompt)
        self.assertEqual(ext, 5 * BS, "every full block from the node")
        self.assertEqual(errors, set())
        self.assertTrue(set(ids_a).isdisjoint(ids_b[:5]))
        self.assertEqual([bid for bid, _ in meta.requests[0].loads], ids_b[:5])
        self.assertEqual(meta.requests[0].saves, [], "what the node holds is not saved again")
        b.check_blocks(prompt, ids_b, 5)  # byte-equal, and the harness computed none of these tokens
        self.assertEqual(b.worker.stats["loaded_blocks"], 5)

    def test_non_contiguous_layout(self):
        # Blocks that are strided views of vLLM's tensor go through a staging
        # copy both ways; an engine of the plain layout reads them back.
        prompt = tokens(13, 3 * BS + 1)
        a = Engine(self, self.mnt, range(NUM_BLOCKS), hnd=True)
        self.assertFalse(a.caches[LAYERS[0]][0][0].is_contiguous())
        a.run("a", prompt)
        self.assertEqual(a.worker.stats["saved_pieces"], 3 * len(LAYERS) * 2)
        for hnd in (True, False):
            b = Engine(self, self.mnt, reversed(range(NUM_BLOCKS)), hnd=hnd)
            ext, ids, _meta, errors = b.run("b", prompt)
            self.assertEqual((ext, errors), (3 * BS, set()))
            b.check_blocks(prompt, ids, 3)

    def test_whole_blocks_leave_one_token(self):
        prompt = tokens(2, 3 * BS)  # exactly 3 blocks: the last must be computed
        Engine(self, self.mnt, range(NUM_BLOCKS)).run("a", prompt)
        b = Engine(self, self.mnt, reversed(range(NUM_BLOCKS)))
        ext, ids, _meta, errors = b.run("b", prompt)
        self.assertEqual((ext, errors), (2 * BS, set()))
        b.check_blocks(prompt, ids, 3)

    def test_miss(self):
        e = Engine(self, self.mnt, range(NUM_BLOCKS))
        e.run("a", tokens(3, 4 * BS))
        other = tokens(4, 4 * BS)  # another prompt: its first block differs, so every block
        ext, _ids, meta, errors = e.run("b", other)
        self.assertEqual((ext, errors), (0, set()))
        self.assertEqual(len(meta.requests[0].saves), 4)
        self.assertEqual(len(meta.requests[0].loads), 0)
        # A's blocks 1.. at the start of another prompt: other prefixes, so a miss.
        ext, _ids, _meta, _errors = Engine(self, self.mnt, range(NUM_BLOCKS)).run("s", tokens(3, 4 * BS)[BS:] + [1])
        self.assertEqual(ext, 0, "a block's key is its whole prefix, not its own tokens")
        # Another model's engine misses the same tokens.
        m = Engine(self, self.mnt, range(NUM_BLOCKS), model="org/other")
        request = NS(request_id="c", prompt_token_ids=other, mm_features=[], lora_request=None, cache_salt=None)
        self.assertEqual(m.sched.get_num_new_matched_tokens(request, 0), (0, False))

    def test_partial_prefix_hit(self):
        base = tokens(5, 6 * BS)
        Engine(self, self.mnt, range(NUM_BLOCKS)).run("a", base)
        prompt = base[:3 * BS] + tokens(6, 2 * BS + 5)  # shares 3 blocks, then diverges
        b = Engine(self, self.mnt, reversed(range(NUM_BLOCKS)))
        ext, ids, meta, errors = b.run("b", prompt)
        self.assertEqual((ext, errors), (3 * BS, set()))
        self.assertEqual([bid for bid, _ in meta.requests[0].loads], ids[:3])
        self.assertEqual([bid for bid, _ in meta.requests[0].saves], ids[3:5], "the new full blocks are saved")
        b.check_blocks(prompt, ids, 5)
        # A change inside block 1 makes blocks 1.. a miss (the chain hash).
        changed = list(base)
        changed[BS + 2] ^= 1
        c = Engine(self, self.mnt, range(NUM_BLOCKS))
        ext, ids, _meta, _errors = c.run("c", changed)
        self.assertEqual(ext, BS)
        c.check_blocks(changed, ids, 6)

    def test_local_prefix_then_node(self):
        prompt = tokens(7, 4 * BS + 1)
        Engine(self, self.mnt, range(NUM_BLOCKS)).run("a", prompt)
        b = Engine(self, self.mnt, reversed(range(NUM_BLOCKS)))
        ext, ids, meta, _errors = b.run("b", prompt, local=2 * BS)  # vLLM's prefix cache had 2
        self.assertEqual(ext, 2 * BS, "blocks 2 and 3 from the node")
        self.assertEqual([bid for bid, _ in meta.requests[0].loads], ids[2:4])
        b.check_blocks(prompt, ids, 4)

    def test_evicted_after_match_is_a_load_error(self):
        prompt = tokens(8, 3 * BS + 1)
        Engine(self, self.mnt, range(NUM_BLOCKS)).run("a", prompt)
        b = Engine(self, self.mnt, reversed(range(NUM_BLOCKS)))
        _request, ext, ids, meta = b.schedule("b", prompt)
        self.assertEqual(ext, 3 * BS)
        self.assertEqual(self.kv.clear(), 3 * len(LAYERS) * 2)  # gone between the contains and the get
        errors = b.forward(meta, prompt, ids, ext, len(prompt))
        self.assertEqual(errors, set(ids[:3]), "vLLM is told which blocks to recompute")
        self.assertEqual(b.worker.stats["load_misses"], 3)
        self.assertEqual(b.worker.get_block_ids_with_load_errors(), set(), "reported once")

    def test_chunked_prefill_saves_as_blocks_fill(self):
        prompt = tokens(9, 4 * BS + 4)
        e = Engine(self, self.mnt, range(NUM_BLOCKS))
        _request, ext, ids, meta = e.schedule("a", prompt, chunk=BS + 8)  # step 1: 24 tokens
        self.assertEqual([bid for bid, _ in meta.requests[0].saves], ids[:1])
        e.forward(meta, prompt, ids, 0, BS + 8)
        step2 = NS(scheduled_new_reqs=[], num_scheduled_tokens={"a": len(prompt) - BS - 8}, finished_req_ids=set(),
                   scheduled_cached_reqs=NS(req_ids=["a"], resumed_req_ids=set(), new_block_ids=[None],
                                            num_computed_tokens=[BS + 8]))
        meta = e.sched.build_connector_meta(step2)
        self.assertEqual([bid for bid, _ in meta.requests[0].saves], ids[1:4])
        e.forward(meta, prompt, ids, BS + 8, len(prompt))
        b = Engine(self, self.mnt, reversed(range(NUM_BLOCKS)))
        ext, ids_b, _meta, errors = b.run("b", prompt)
        self.assertEqual((ext, errors), (4 * BS, set()))
        b.check_blocks(prompt, ids_b, 4)

    def test_preempted_then_resumed(self):
        # A request computes 2 of its 4 blocks, is preempted (its blocks
        # freed), and resumes with other blocks: its 2 saved blocks come
        # from the node, the rest is computed and saved.
        prompt = tokens(12, 4 * BS + 2)
        e = Engine(self, self.mnt, range(NUM_BLOCKS))
        request, _ext, ids, meta = e.schedule("a", prompt, chunk=2 * BS)
        e.forward(meta, prompt, ids, 0, 2 * BS)
        ext, _ = e.sched.get_num_new_matched_tokens(request, 0)  # back in the waiting queue
        self.assertEqual(ext, 2 * BS)
        new_ids = list(range(40, 45))
        e.sched.update_state_after_alloc(request, NS(get_block_ids=lambda: (new_ids,)), ext)
        step = NS(scheduled_new_reqs=[], num_scheduled_tokens={"a": len(prompt) - ext}, finished_req_ids=set(),
                  scheduled_cached_reqs=NS(req_ids=["a"], resumed_req_ids={"a"}, new_block_ids=[(new_ids,)],
                                           num_computed_tokens=[ext]))
        meta = e.sched.build_connector_meta(step)
        self.assertEqual([bid for bid, _ in meta.requests[0].loads], new_ids[:2])
        self.assertEqual([bid for bid, _ in meta.requests[0].saves], new_ids[2:4])
        for b in new_ids:  # the old contents are gone with the preemption
            for name in LAYERS:
                e.caches[name][:, b] = 0
        self.assertEqual(e.forward(meta, prompt, new_ids, ext, len(prompt)), set())
        e.check_blocks(prompt, new_ids, 4)
        step = NS(scheduled_new_reqs=[], num_scheduled_tokens={}, finished_req_ids={"a"},
                  scheduled_cached_reqs=NS(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]))
        e.sched.build_connector_meta(step)
        self.assertNotIn("a", e.sched._reqs, "a finished request's state is dropped")

    def test_multimodal_prompts_are_not_cached(self):
        e = Engine(self, self.mnt, range(NUM_BLOCKS))
        _r, ext, _ids, meta = e.schedule("a", tokens(10, 3 * BS), mm_features=[NS(identifier="img")])
        self.assertEqual((ext, meta.requests), (0, []))

    def test_layout_checks(self):
        w = kv_vllm.KylixConnectorCore(vllm_config(self.mnt), NS(name="WORKER"), kv_cache_config())
        self.addCleanup(w.shutdown)
        with self.assertRaisesRegex(ValueError, r"--kv-block 4096"):
            w.register_kv_caches({n: torch.zeros(2, 8, BS, 2, HEAD_DIM, dtype=torch.float16) for n in LAYERS})
        with self.assertRaisesRegex(ValueError, "kylix_kv_pieces"):  # MLA-like: one piece, the scheduler keys two
            w.register_kv_caches({n: torch.zeros(8, BS, HEADS * HEAD_DIM, dtype=torch.float16) for n in LAYERS})
        with self.assertRaisesRegex(ValueError, "not the layers of kv_cache_config"):
            w.register_kv_caches({"other.layer": torch.zeros(2, 8, BS, HEADS, HEAD_DIM, dtype=torch.float16)})
        with self.assertRaisesRegex(ValueError, "needs vLLM's kv_cache_config"):
            kv_vllm.KylixConnectorCore(vllm_config(self.mnt), NS(name="SCHEDULER"), None)
        with self.assertRaisesRegex(NotImplementedError, "parallel size 1"):
            conf = vllm_config(self.mnt)
            conf.parallel_config.tensor_parallel_size = 2
            kv_vllm.KylixConnectorCore(conf, NS(name="WORKER"), kv_cache_config())

    def test_mla_layout_one_piece(self):
        # MLA's (num_blocks, block_size, head_size): one store block per (block, layer).
        conf = vllm_config(self.mnt, use_mla=True)
        s = kv_vllm.KylixConnectorCore(conf, NS(name="SCHEDULER"), kv_cache_config())
        w = kv_vllm.KylixConnectorCore(conf, NS(name="WORKER"), kv_cache_config())
        self.addCleanup(s.shutdown)
        self.addCleanup(w.shutdown)
        caches = {n: torch.randn(NUM_BLOCKS, BS, HEADS * HEAD_DIM).to(torch.float16) for n in LAYERS}
        w.register_kv_caches(caches)
        prompt = tokens(11, 2 * BS + 1)
        req = NS(request_id="a", prompt_token_ids=prompt, mm_features=[], lora_request=None, cache_salt=None)
        s.update_state_after_alloc(req, None, s.get_num_new_matched_tokens(req, 0)[0])
        new = NS(req_id="a", prompt_token_ids=prompt, mm_features=[], block_ids=([5, 9, 2],), num_computed_tokens=0,
                 lora_request=None)
        out = NS(scheduled_new_reqs=[new], num_scheduled_tokens={"a": len(prompt)}, finished_req_ids=set(),
                 scheduled_cached_reqs=NS(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]))
        w.bind_connector_metadata(s.build_connector_meta(out))
        for n in LAYERS:
            w.save_kv_layer(n, caches[n], None)
        self.assertEqual(w.stats["saved_pieces"], 2 * len(LAYERS))
        req.request_id = new.req_id = "b"
        s.update_state_after_alloc(req, None, s.get_num_new_matched_tokens(req, 0)[0])
        new.block_ids = ([30, 31, 32],)
        out.num_scheduled_tokens = {"b": 1}
        new.num_computed_tokens = 2 * BS
        w.bind_connector_metadata(s.build_connector_meta(out))
        w.start_load_kv(NS())
        for n in LAYERS:
            self.assertTrue(byte_equal(caches[n][30], caches[n][5]))
            self.assertTrue(byte_equal(caches[n][31], caches[n][9]))


    def test_on_vllms_base_class(self):
        # With vLLM's base class (a stand-in with base.py's abstract methods
        # and __init__'s checks), KylixKVConnector is concrete, runs the
        # base's __init__ and ours, and its metadata is vLLM's kind.
        class Base(abc.ABC):
            def __init__(self, vllm_config, role, kv_cache_config):
                if vllm_config.kv_transfer_config is None:
                    raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
                self._connector_metadata, self._role, self.base_init = None, role, True

            @property
            def role(self):
                return self._role
        for m in ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                  "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"):
            setattr(Base, m, abc.abstractmethod(lambda self, *a, **k: None))
        Base.__abstractmethods__ = frozenset(m for m in dir(Base) if getattr(getattr(Base, m), "__isabstractmethod__", False))

        class Meta(abc.ABC):
            pass
        fake = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")
        fake.KVConnectorBase_V1, fake.KVConnectorMetadata = Base, Meta
        mod = kvnode.load_with_fake_base(self, "kv_vllm.py", {fake.__name__: fake})
        c = mod.KylixKVConnector(vllm_config(self.mnt), NS(name="SCHEDULER"), kv_cache_config())
        self.addCleanup(c.shutdown)
        self.assertIsInstance(c, Base)
        self.assertTrue(c.base_init)
        self.assertEqual(c.role.name, "SCHEDULER")
        self.assertIsInstance(mod.KylixConnectorMetadata(), Meta)
        req = NS(request_id="a", prompt_token_ids=tokens(14, 2 * BS), mm_features=[], lora_request=None, cache_salt=None)
        self.assertEqual(c.get_num_new_matched_tokens(req, 0), (0, False))
        with self.assertRaisesRegex(ValueError, "kv_transfer_config"):
            conf = vllm_config(self.mnt)
            conf.kv_transfer_config = None
            mod.KylixKVConnector(conf, NS(name="WORKER"), kv_cache_config())


class WithoutVLLMTest(unittest.TestCase):
    def test_connector_says_vllm_is_missing(self):
        try:
            import vllm  # noqa: F401
            self.skipTest("vLLM is installed here")
        except ImportError:
            pass
        with self.assertRaisesRegex(ImportError, "needs vLLM"):
            kv_vllm.KylixKVConnector(NS(), NS(name="WORKER"), NS())
