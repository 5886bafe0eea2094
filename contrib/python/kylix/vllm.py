"""vLLM integration: the "kylix" load format (--load-format kylix).

Registered through the `vllm.general_plugins` entry point (pyproject.toml:
kylix = "kylix.vllm:register"), which vLLM calls in every process it starts.

NOT RUN INSIDE vLLM: vLLM cannot be installed on the machines this was built
on. It is written against vLLM's source (model_executor/model_loader/
base_loader.py, default_loader.py, __init__.py register_model_loader; layers/
linear.py for how QKV/merged/row-parallel layers lay out a rank's shard), and
its pieces that do not need vLLM are tested with a stand-in model
(tests/test_vllm.py). Every vLLM import stays inside functions, so importing
this module never needs vLLM.

How a rank loads:
  - tensors whose target parameter is a plain, unquantized tensor-parallel
    linear weight (q/k/v into qkv_proj, gate/up into gate_up_proj, o_proj,
    down_proj, or unfused column layers) are read as only this rank's slice
    (kylix.torch.load_file with tp_rank/tp_size) and copied straight into the
    rank's part of the parameter, at the offset vLLM's own weight loaders use
    (q, k, v and gate, up stacked along dim 0 in that order);
  - every other tensor (embeddings and lm_head, whose vocab shard vLLM pads;
    norms; anything quantized, renamed, or whose shape does not fit the
    plain rule, e.g. more ranks than KV heads) is read whole and handed to
    the model's own load_weights, exactly as vLLM's default loader would.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Iterator

import torch

from . import split as _split
from . import torch as _kt
from .safetensors import parse_file

log = logging.getLogger("kylix.vllm")

# (fused param suffix, checkpoint suffix, shard index): vLLM's Llama mapping.
STACKED = (
    (".qkv_proj.", ".q_proj.", 0), (".qkv_proj.", ".k_proj.", 1), (".qkv_proj.", ".v_proj.", 2),
    (".gate_up_proj.", ".gate_proj.", 0), (".gate_up_proj.", ".up_proj.", 1),
)
ROW = (".o_proj.weight", ".down_proj.weight")
COLUMN = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".gate_proj.weight", ".up_proj.weight")


def model_files(model_dir: str) -> list[str]:
    """The safetensors files of a model directory: those its index names
    (model.safetensors.index.json), else every *.safetensors in it."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f).get("weight_map", {})
        return sorted({os.path.join(model_dir, v) for v in wm.values()})
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    return files


def rank_weights_iterator(files, tp_rank: int, tp_size: int, split: _split.SplitSpec = None,
                          device="cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the files, each one this rank's
    chunk under the split rules (kylix.split; by default the table kylix
    load --tp-size uses), whole where the rules do not split it. Only the
    rank's bytes are read."""
    for f in files:
        yield from _kt.load_file(f, device, tp_rank=tp_rank, tp_size=tp_size, split=split).items()


def plan_direct(params: dict, headers: dict, tp_rank: int, tp_size: int) -> dict:
    """{checkpoint name: (param name, split dim, offset along dim 0 in the
    param)} for tensors that can be sliced and copied straight into a
    parameter; everything absent goes through the model's load_weights."""
    if tp_size <= 1:
        return {}
    infos = {}
    for h in headers.values():
        infos.update(h.tensors)
    direct = {}

    def fits(p, dtype_name):
        return (isinstance(p, torch.Tensor) and p.device.type != "meta"
                and type(p) in (torch.nn.Parameter, torch.Tensor)  # not a vLLM parameter subclass (quantized)
                and p.dtype == _kt.torch_dtype(dtype_name))

    # Stacked (fused) column-parallel params.
    groups = {}
    for name, t in infos.items():
        for fused, part, idx in STACKED:
            if part in name:
                groups.setdefault(name.replace(part, fused), {})[idx] = name
    for pname, members in groups.items():
        p = params.get(pname)
        n = max(members) + 1
        if p is None or len(members) != n:
            continue
        ts = [infos[members[i]] for i in range(n)]
        if not all(fits(p, t.dtype) and len(t.shape) == p.dim() and t.shape[1:] == tuple(p.shape[1:])
                   and t.shape[0] % tp_size == 0 for t in ts):
            continue
        rows = [t.shape[0] // tp_size for t in ts]
        if sum(rows) != p.shape[0]:
            continue  # e.g. KV heads replicated across more ranks than heads
        off = 0
        for t, r in zip(ts, rows):
            direct[t.name] = (pname, 0, off)
            off += r
    # Row-parallel weights and unfused column-parallel weights.
    for name, t in infos.items():
        if name in direct or name not in params:
            continue
        p = params[name]
        if not fits(p, t.dtype) or len(t.shape) != 2 or p.dim() != 2:
            continue
        if name.endswith(ROW) and t.shape[1] % tp_size == 0 and tuple(p.shape) == (t.shape[0], t.shape[1] // tp_size):
            direct[name] = (name, 1, 0)
        elif name.endswith(COLUMN) and t.shape[0] % tp_size == 0 and tuple(p.shape) == (t.shape[0] // tp_size, t.shape[1]):
            direct[name] = (name, 0, 0)
    return direct


@torch.no_grad()
def load_into(model: torch.nn.Module, files, tp_rank: int, tp_size: int, device=None):
    """Loads the files into a vLLM-style model for one rank. Returns (names of
    params loaded directly, whatever model.load_weights returned, stats)."""
    params = dict(model.named_parameters())
    headers = {f: parse_file(f) for f in files}
    direct = plan_direct(params, headers, tp_rank, tp_size)
    if device is None:
        p0 = next(iter(params.values()), None)
        device = p0.device if p0 is not None and p0.device.type == "cuda" else "cpu"
    done, stats = set(), {"direct_tensors": 0, "full_tensors": 0, "bytes": {}}

    def split(name, ndim):
        d = direct.get(name)
        return d[1] if d else None

    def rest():
        for f in files:
            for name, t in _kt.load_file(f, device, tp_rank=tp_rank, tp_size=tp_size, split=split).items():
                d = direct.get(name)
                if d is None:
                    stats["full_tensors"] += 1
                    yield name, t
                    continue
                pname, _dim, off = d
                dst = params[pname].data
                if off or dst.shape[0] != t.shape[0]:
                    dst = dst.narrow(0, off, t.shape[0])
                dst.copy_(t)
                done.add(pname)
                stats["direct_tensors"] += 1
            for k, v in _kt.last_load_info().get("bytes", {}).items():
                stats["bytes"][k] = stats["bytes"].get(k, 0) + v

    ret = model.load_weights(rest())
    return done, ret, stats


def _make_loader_class():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class KylixModelLoader(BaseModelLoader):
        """--load-format kylix: each rank reads only the slices it keeps."""

        def download_model(self, model_config) -> None:
            if not os.path.isdir(model_config.model):
                raise ValueError(f"load format kylix reads a local directory (a Kylix mount); "
                                 f"{model_config.model!r} is not one")

        def load_weights(self, model, model_config) -> None:
            from vllm.distributed import (get_tensor_model_parallel_rank,
                                          get_tensor_model_parallel_world_size)
            self.download_model(model_config)
            files = model_files(model_config.model)
            rank, size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
            extra = getattr(self.load_config, "model_loader_extra_config", None) or {}
            if model_config.quantization is not None or not extra.get("direct", True):
                # quantized layouts, or direct copies turned off
                # (--model-loader-extra-config '{"direct": false}'): vLLM's own
                # weight loaders shard everything, from full tensors.
                size_for_split = 1
            else:
                size_for_split = size
            if size_for_split == size:
                done, ret, stats = load_into(model, files, rank, size, extra.get("device"))
            else:
                ret = model.load_weights(rank_weights_iterator(files, 0, 1, device=extra.get("device", "cpu")))
                done, stats = set(), {}
            log.info("kylix: rank %d/%d loaded %d params directly; %s", rank, size, len(done), stats)
            if ret is not None:
                missing = {n for n, _ in model.named_parameters()} - set(ret) - done
                if missing and model_config.quantization is None:
                    raise ValueError(f"weights not initialized from the checkpoint: {sorted(missing)[:10]}")

    return KylixModelLoader


def register():
    """The vllm.general_plugins entry point: registers load format "kylix"."""
    from vllm.model_executor.model_loader import register_model_loader
    register_model_loader("kylix")(_make_loader_class())
