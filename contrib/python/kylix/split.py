"""Tensor-parallel split rules: which dimension of a tensor each rank keeps a
chunk of.

The default rules are the ones kylix load --tp-size uses: one table, kept in
Go (gpuio/tprules.go) and generated into kylix._tp_rules, so the Go loader
and this package give every rank the same share. They follow how vLLM shards
each layer kind: column-parallel layers (q/k/v, gate/up, Mixtral's w1/w3)
split their weight and bias along dim 0 (output features); row-parallel
layers (o_proj, down_proj, w2, out_proj, dense_4h_to_h) split their weight
along dim 1 (input features) and replicate their bias; embed_tokens and
lm_head split along dim 0 (the vocabulary); everything else (norms, rotary
tables, ...) is replicated. Tensors fused on disk (Phi-3's qkv_proj and
gate_up_proj, GPT-2's Conv1D c_attn, Falcon's query_key_value,
dense_h_to_4h) are replicated on purpose: vLLM cuts each fused part on its
own, so no single chunk of the whole is a rank's share. A rank keeps
full[...].chunk(tp_size, dim)[tp_rank].

Overrides: split={regex: dim or None}; the first regex that re.search()es the
name wins before the default rules. None means replicate. split may also be
a callable (name, ndim) -> dim or None, which replaces the rules entirely.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional, Union

from ._tp_rules import RULES as _RULES

SplitSpec = Union[Mapping[str, Optional[int]], Callable[[str, int], Optional[int]], None]

# (compiled regex, dim or None), in the order tried: the generated table.
DEFAULT_RULES: tuple[tuple[re.Pattern, Optional[int]], ...] = tuple(
    (re.compile(pattern), dim) for _layer, pattern, dim in _RULES)


def split_dim(name: str, ndim: int, split: SplitSpec = None) -> Optional[int]:
    """The dim along which `name` is split, or None if every rank keeps it whole."""
    if callable(split):
        return _check(name, split(name, ndim), ndim)
    if split:
        for pat, dim in split.items():
            if re.search(pat, name):
                return _check(name, dim, ndim)
    for pat, dim in DEFAULT_RULES:
        if pat.search(name):
            return _check(name, dim, ndim, strict=False)
    return None


def _check(name: str, dim, ndim: int, strict: bool = True) -> Optional[int]:
    if dim is None:
        return None
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ValueError(f"split rule for {name!r}: dim {dim!r} is not an int or None")
    if dim < 0:
        dim += ndim
    if not 0 <= dim < ndim:
        if strict:
            raise ValueError(f"split rule for {name!r}: dim {dim} out of range for a {ndim}-d tensor")
        return None  # a default rule that does not fit (a 1-d tensor): replicate
    return dim


def chunk_range(n: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """[start, end) of rank's part of a dimension of length n, as torch.chunk
    cuts it: chunks of ceil(n/tp_size), the last ones shorter. torch.chunk
    returns fewer than tp_size chunks when n is small; the ranks past the end
    get an empty range here (chunk would have no element for them)."""
    if tp_size <= 0 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is not in [0, {tp_size})")
    cs = -(-n // tp_size) if n else 0
    start = min(tp_rank * cs, n)
    return start, min(start + cs, n)
