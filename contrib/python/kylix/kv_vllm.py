"""kylix.kv_vllm: a vLLM KV connector (v1) over the node's KV store
(kylix.kv, docs/design/kv.md, section "Adapters").

    --kv-transfer-config '{"kv_connector": "KylixKVConnector",
                           "kv_connector_module_path": "kylix.kv_vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"kylix_mount": "/mnt/kylix"}}'

Written against vLLM's public source, not run inside vLLM: vLLM cannot be
installed where this was written (no PyPI). The interface read was
vllm/distributed/kv_transfer/kv_connector/v1/base.py (commit 003df296),
example_connector.py (00231834) for how a connector maps blocks, and
vllm/v1/core/sched/output.py (00e8f1fd) for the scheduler's output. It is
tested by contrib/python/tests/test_kv_vllm.py, a harness that makes the
scheduler's and the worker's calls in vLLM's order on objects shaped as
vLLM's, against a real node. Not tested: vLLM itself, CUDA KV caches
(kylix.kv's CUDA path is, on an H200, but not through this adapter),
vLLM's transport of the metadata (the harness pickles it), and vLLM's
handling of the load errors this reports.

How blocks map. The scheduler keys each full block of a prompt by a chain
hash of its tokens, as vLLM's prefix cache does: h0 = key(model, dtype,
block size, LoRA, cache salt), h(i) = key(h(i-1), the block's token ids).
Each (block, layer, piece) is one KV-store block under key(h(i), layer
name, piece): piece 0 and 1 are K and V of the flash-attention layout
(2, num_blocks, block_size, heads, head_dim); a layout with the block
first (MLA's (num_blocks, block_size, head_dim), or any other) is one
piece. So the node's --kv-block is one block of one layer's K (or V):
block_size x heads x head_dim x the element size; register_kv_caches says
which size it needs when they differ. One store block per piece means no
copy: each piece is a contiguous slice of vLLM's own tensor (a layout whose
slices are not contiguous goes through a staging tensor).

What it does, step by step:
- get_num_new_matched_tokens: the longest run of full prompt blocks after
  the locally computed ones whose every key the node holds (one batched
  contains), leaving at least one prompt token to compute.
- update_state_after_alloc, build_connector_meta: the blocks to load (the
  hit) and to save (full prompt blocks computed by this step that the node
  does not hold), as (vLLM block id, chain hash) pairs in the metadata.
- start_load_kv: every layer's loads in one synchronous batched get
  (wait_for_layer_load has nothing to wait for). A block of which any
  piece is now a miss (evicted since the contains) is reported by
  get_block_ids_with_load_errors, so vLLM recomputes it.
- save_kv_layer: the layer's saves in one synchronous put (wait_for_save
  has nothing to wait for). A put refused for room is a block not cached.
- request_finished: nothing is held past the request (False, None).

Limits: one KV cache group (no hybrid models), tensor and pipeline
parallel size 1 (keys carry no rank yet), prompts with multimodal inputs or
prompt embeddings are neither matched nor saved (their token ids do not
name their content), only prompt tokens are saved, and blocks a request
got from vLLM's own prefix cache are not saved from it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from . import kv as _kv

try:  # vLLM's base classes where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1 as _VLLMBase,
        KVConnectorMetadata as _VLLMMeta,
    )
    _VLLM_ERROR = None
except ImportError as e:  # not installed: the logic still imports (and is tested)
    _VLLMBase, _VLLMMeta, _VLLM_ERROR = None, object, e

KEY_VERSION = 1


def _get(obj, path, default=None):
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return default
    return obj


def root_hash(vllm_config, lora_name=None, cache_salt=None) -> bytes:
    """The chain's start: what makes the same tokens mean other KV (the
    model, its dtype and KV dtype, the block size, a LoRA, a cache salt)."""
    return _kv.key("kylix-vllm", KEY_VERSION,
                   str(_get(vllm_config, "model_config.model", "")),
                   str(_get(vllm_config, "model_config.dtype", "")),
                   str(_get(vllm_config, "cache_config.cache_dtype", "")),
                   int(_get(vllm_config, "cache_config.block_size", 0)),
                   lora_name or "", cache_salt or "")


def block_hashes(root: bytes, token_ids, block_size: int, n_blocks: int) -> list:
    """The chain hashes of the first n_blocks full blocks of token_ids."""
    out, h = [], root
    for i in range(n_blocks):
        toks = token_ids[i * block_size:(i + 1) * block_size]
        h = _kv.key(h, struct.pack(f"<{len(toks)}q", *toks))
        out.append(h)
    return out


def piece_key(block_hash: bytes, layer_name: str, piece: int) -> bytes:
    return _kv.key(block_hash, layer_name, piece)


def layer_pieces(kv_layer) -> list:
    """A layer's KV cache as a list of tensors with the block first: K and
    V of (2, num_blocks, ...), else the tensor itself."""
    if kv_layer.dim() == 5 and kv_layer.shape[0] == 2:
        return [kv_layer[0], kv_layer[1]]
    return [kv_layer]


@dataclass
class ReqMeta:
    req_id: str
    loads: list = field(default_factory=list)  # [(vLLM block id, chain hash)]
    saves: list = field(default_factory=list)


@dataclass
class KylixConnectorMetadata(_VLLMMeta):
    requests: list = field(default_factory=list)  # [ReqMeta]


@dataclass
class _ReqState:
    prompt: list
    hashes: list          # chain hashes of the prompt's full blocks
    block_ids: list       # vLLM block ids, group 0
    next_save: int        # first block not yet saved or known held


class KylixConnectorCore:
    """The connector's logic. KylixKVConnector is this on vLLM's base class;
    the tests drive this class directly, as vLLM drives the connector."""

    def __init__(self, vllm_config, role, kv_cache_config=None, store=None):
        self._vllm_config = vllm_config
        self._role_name = getattr(role, "name", str(role))
        self._connector_metadata = None
        tp = int(_get(vllm_config, "parallel_config.tensor_parallel_size", 1))
        pp = int(_get(vllm_config, "parallel_config.pipeline_parallel_size", 1))
        if tp != 1 or pp != 1:
            raise NotImplementedError(
                f"KylixKVConnector supports tensor and pipeline parallel size 1 (got {tp} and {pp}): its keys carry no rank yet")
        self._block_size = int(_get(vllm_config, "cache_config.block_size", 0))
        if self._block_size <= 0:
            raise ValueError("vllm_config.cache_config.block_size is not set")
        extra = _get(vllm_config, "kv_transfer_config.kv_connector_extra_config", None) or {}
        mount = extra.get("kylix_mount")
        self._pieces = int(extra.get("kylix_kv_pieces", 1 if _get(vllm_config, "model_config.use_mla", False) else 2))
        groups = list(_get(kv_cache_config, "kv_cache_groups", None) or [])
        if len(groups) > 1:
            raise NotImplementedError(f"KylixKVConnector supports one KV cache group, this model has {len(groups)}")
        self._layer_names = list(groups[0].layer_names) if groups else []
        if self._role_name == "SCHEDULER" and not self._layer_names:
            raise ValueError("KylixKVConnector's scheduler side keys blocks per layer and needs vLLM's kv_cache_config "
                             "with the layer names (vLLM versions that pass it to connectors)")
        if store is None:
            if not mount:
                raise ValueError('kv_connector_extra_config needs "kylix_mount": the Kylix mount point whose node keeps the blocks')
            store = _kv.KVStore(mount)
        self._kv = store
        # scheduler side
        self._matched = {}    # req_id -> (num_computed_tokens, hashes of the hit blocks)
        self._to_load = {}    # req_id -> (first block, hashes)
        self._reqs = {}       # req_id -> _ReqState
        # worker side
        self._layers = {}     # layer name -> [piece tensors, block first]
        self._load_errors = set()
        self.stats = {"matched_blocks": 0, "loaded_blocks": 0, "load_misses": 0,
                      "saved_pieces": 0, "refused_pieces": 0}

    # --- metadata, as vLLM's base class does it ---
    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    # --- scheduler side ---
    def _root_of(self, request):
        return root_hash(self._vllm_config, _get(request, "lora_request.lora_name", None),
                         getattr(request, "cache_salt", None))

    def _cacheable(self, prompt, mm_features, prompt_embeds=None) -> bool:
        return bool(prompt) and not mm_features and prompt_embeds is None

    def _keys(self, hashes) -> list:
        return [piece_key(h, name, p) for h in hashes for name in self._layer_names for p in range(self._pieces)]

    def _held(self, hashes) -> list:
        """Per hash: whether the node holds every piece of every layer."""
        per = len(self._layer_names) * self._pieces
        if not hashes or per == 0:
            return [False] * len(hashes)
        where = self._kv.contains(self._keys(hashes))
        return [all(w is not None for w in where[i * per:(i + 1) * per]) for i in range(len(hashes))]

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        prompt = list(getattr(request, "prompt_token_ids", None) or [])
        if not self._cacheable(prompt, getattr(request, "mm_features", None), getattr(request, "prompt_embeds", None)):
            return 0, False
        bs = self._block_size
        first, last = num_computed_tokens // bs, (len(prompt) - 1) // bs  # one token left to compute
        if last <= first:
            return 0, False
        hashes = block_hashes(self._root_of(request), prompt, bs, last)[first:]
        n = 0
        for held in self._held(hashes):
            if not held:
                break
            n += 1
        if n == 0:
            return 0, False
        self._matched[request.request_id] = (num_computed_tokens, hashes[:n])
        return first * bs + n * bs - num_computed_tokens, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        m = self._matched.pop(request.request_id, None)
        if num_external_tokens <= 0 or m is None:
            return
        computed, hashes = m
        n = num_external_tokens // self._block_size
        self._to_load[request.request_id] = (computed // self._block_size, hashes[:n])
        self.stats["matched_blocks"] += n

    def build_connector_meta(self, scheduler_output):
        meta = KylixConnectorMetadata()
        steps = []  # (req_id, state, tokens computed after this step)
        for new in scheduler_output.scheduled_new_reqs:
            prompt = list(new.prompt_token_ids or [])
            cacheable = self._cacheable(prompt, new.mm_features, getattr(new, "prompt_embeds", None))
            rm = ReqMeta(new.req_id)
            start = new.num_computed_tokens // self._block_size
            if new.req_id in self._to_load:
                first, hashes = self._to_load.pop(new.req_id)
                rm.loads = [(new.block_ids[0][first + i], h) for i, h in enumerate(hashes)]
            if not cacheable:  # never matched, so nothing to load either
                continue
            root = root_hash(self._vllm_config, _get(new, "lora_request.lora_name", None),
                             getattr(new, "cache_salt", None))
            st = _ReqState(prompt, block_hashes(root, prompt, self._block_size, len(prompt) // self._block_size),
                           list(new.block_ids[0]), start)
            self._reqs[new.req_id] = st
            steps.append((rm, st, new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            rm = ReqMeta(req_id)
            new_ids = cached.new_block_ids[i]
            if st is not None and new_ids is not None:
                st.block_ids = list(new_ids[0]) if req_id in resumed else st.block_ids + list(new_ids[0])
            if req_id in self._to_load and st is not None:  # a resumed request's hit
                first, hashes = self._to_load.pop(req_id)
                rm.loads = [(st.block_ids[first + j], h) for j, h in enumerate(hashes)]
            if st is None:
                continue
            steps.append((rm, st, cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)))
        cands = []
        for rm, st, done in steps:
            full = min(done, len(st.prompt)) // self._block_size
            for b in range(st.next_save, full):
                cands.append((rm, st.block_ids[b], st.hashes[b]))
            st.next_save = max(st.next_save, full)
        held = self._held([h for _, _, h in cands])
        for (rm, bid, h), have in zip(cands, held):
            if not have:
                rm.saves.append((bid, h))
        for rm, _, _ in steps:
            if rm.loads or rm.saves:
                meta.requests.append(rm)
        for req_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self._reqs.pop(req_id, None)
        return meta

    def request_finished(self, request, block_ids):
        for d in (self._reqs, self._to_load, self._matched):
            d.pop(request.request_id, None)
        return False, None

    # --- worker side ---
    def register_kv_caches(self, kv_caches: dict):
        if self._layer_names and set(self._layer_names) != set(kv_caches):
            raise ValueError(f"the KV caches registered ({sorted(kv_caches)}) are not the layers of kv_cache_config "
                             f"({sorted(self._layer_names)}), which the scheduler keys")
        layers = {}
        for name, t in kv_caches.items():
            pieces = layer_pieces(t)
            if len(pieces) != self._pieces:
                raise ValueError(f"layer {name}: its KV cache {tuple(t.shape)} has {len(pieces)} piece(s) per block, "
                                 f"the scheduler keys {self._pieces} (set kv_connector_extra_config kylix_kv_pieces)")
            n = pieces[0][0].numel() * pieces[0].element_size()
            if n != self._kv.block_size:
                raise ValueError(f"layer {name}: one block of its KV cache is {n} bytes, the node's KV blocks are "
                                 f"{self._kv.block_size}: start the node with --kv-block {n}")
            layers[name] = pieces
        self._layers, self._layer_names = layers, list(kv_caches)

    def _pairs(self, pieces_of, layer_names, items):
        """(keys, block views, vLLM block id per key) for items [(block id, hash)]."""
        keys, views, bids = [], [], []
        for bid, h in items:
            for name in layer_names:
                for p, piece in enumerate(pieces_of(name)):
                    keys.append(piece_key(h, name, p))
                    views.append(piece[bid])
                    bids.append(bid)
        return keys, views, bids

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        items = [it for r in meta.requests for it in r.loads]
        if not items:
            return
        keys, views, bids = self._pairs(lambda n: self._layers[n], list(self._layers), items)
        outs = [v if v.is_contiguous() else v.new_empty(v.shape) for v in views]  # staging where not contiguous
        hits = self._kv.get(keys, out=outs)
        failed = set()
        for v, o, hit, bid in zip(views, outs, hits, bids):
            if not hit:
                failed.add(bid)
            elif o is not v:
                v.copy_(o)
        self._load_errors |= failed
        self.stats["loaded_blocks"] += len({bid for bid, _ in items} - failed)
        self.stats["load_misses"] += len(failed)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loaded every layer before returning

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        items = [it for r in meta.requests for it in r.saves]
        if not items:
            return
        pieces = layer_pieces(kv_layer)
        keys, views, _ = self._pairs(lambda n: pieces, [layer_name], items)
        ok = self._kv.put(keys, [v if v.is_contiguous() else v.contiguous() for v in views])
        self.stats["saved_pieces"] += sum(ok)
        self.stats["refused_pieces"] += len(ok) - sum(ok)

    def wait_for_save(self):
        return  # save_kv_layer's put returned after the node had copied the blocks

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self):
        self._kv.close()


if _VLLMBase is not None:
    class KylixKVConnector(KylixConnectorCore, _VLLMBase):
        """vLLM's KVConnectorBase_V1 over the Kylix node's KV store."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            _VLLMBase.__init__(self, vllm_config, role, kv_cache_config)
            KylixConnectorCore.__init__(self, vllm_config, role, kv_cache_config)
else:
    class KylixKVConnector:
        """Needs vLLM; KylixConnectorCore is the same logic without it."""

        def __init__(self, *args, **kwargs):
            raise ImportError("kylix.kv_vllm.KylixKVConnector needs vLLM "
                              "(vllm.distributed.kv_transfer.kv_connector.v1.base), which is not installed: "
                              f"{_VLLM_ERROR}")
