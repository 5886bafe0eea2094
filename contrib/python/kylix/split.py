"""Tensor-parallel split rules: which dimension of a tensor each rank keeps a
chunk of.

The default follows vLLM's Llama (and most decoder models laid out like it):
column-parallel layers (q/k/v/gate/up projections, and the fused qkv/gate_up
forms) split their weight and bias along dim 0 (output features);
row-parallel layers (o/down projections) split their weight along dim 1
(input features) and replicate their bias; embeddings and lm_head split along
dim 0 (the vocabulary); everything else (norms, rotary tables, ...) is
replicated. Layouts that fuse heads in another order (GPT-2's Conv1D c_attn,
Falcon's query_key_value) are deliberately not in the defaults: a plain
chunk of them is not what their model code expects. A rank keeps full[...].chunk(tp_size, dim)[tp_rank].

Overrides: split={regex: dim or None}; the first regex that re.search()es the
name wins before the default rules. None means replicate. split may also be
a callable (name, ndim) -> dim or None, which replaces the rules entirely.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional, Union

SplitSpec = Union[Mapping[str, Optional[int]], Callable[[str, int], Optional[int]], None]

_COLUMN = re.compile(r"(^|\.)(q_proj|k_proj|v_proj|qkv_proj|gate_proj|up_proj|gate_up_proj|"
                     r"w1|w3)\.(weight|bias)$")
_ROW_W = re.compile(r"(^|\.)(o_proj|down_proj|w2|out_proj)\.weight$")
_VOCAB = re.compile(r"(^|\.)(embed_tokens|lm_head)\.weight$")

DEFAULT_RULES: tuple[tuple[re.Pattern, Optional[int]], ...] = (
    (_COLUMN, 0),
    (_ROW_W, 1),
    (_VOCAB, 0),
)


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
