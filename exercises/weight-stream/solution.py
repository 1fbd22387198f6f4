"""A complete answer to weight-stream (the engine's own logic)."""

import re
from typing import Optional, Tuple

import torch

from minisgl.models.weight import _MERGED, _ROW_PARALLEL, _VOCAB, _find, _shard_rows


def _qkv_part(layer, part: int, t: torch.Tensor, rank: int) -> Tuple[slice, torch.Tensor]:
    """Rows of the merged QKV weight that checkpoint part `part` (0=q, 1=k, 2=v) fills on `rank`."""
    d, nq, nkv = layer.head_dim, layer.num_q_heads, layer.num_kv_heads
    if part == 0:
        return slice(0, nq * d), t[rank * nq * d : (rank + 1) * nq * d]
    start = layer.kv_head_start(rank)  # KV heads are shared (replicated) when fewer than ranks
    offset = nq * d + (part - 1) * nkv * d
    return slice(offset, offset + nkv * d), t[start * d : (start + nkv) * d]


def _place(model, params, name: str, tensor: torch.Tensor, tp) -> Tuple[Optional[str], Optional[slice], torch.Tensor]:
    m = re.match(r"(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$", name)
    if m:
        prefix, proj, kind = m.groups()
        merged, part = _MERGED[proj]
        target = f"{prefix}.{merged}.{kind}"
        if target not in params:
            return None, None, tensor
        layer = _find(model, f"{prefix}.{merged}")
        if merged == "qkv_proj":
            rows, piece = _qkv_part(layer, part, tensor, tp.rank)
            return target, rows, piece
        size = layer.local_sizes[part]
        start = sum(layer.local_sizes[:part])
        return target, slice(start, start + size), _shard_rows(tensor, tp.size, tp.rank)
    if name.endswith(_ROW_PARALLEL):  # input features split: cut columns
        return (name if name in params else None), None, tensor.chunk(tp.size, dim=1)[tp.rank] if tp.size > 1 else tensor
    if name.endswith(_VOCAB):
        if name not in params:
            return None, None, tensor
        return name, None, _shard_rows(tensor, tp.size, tp.rank, pad_to=params[name].shape[0]) if tp.size > 1 else tensor
    return (name if name in params else None), None, tensor
