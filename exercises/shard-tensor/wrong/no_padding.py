"""Wrong: the last vocabulary shard is not padded with zeros, so it is shorter than the others
(and the loader's shapes no longer match when the vocabulary does not divide)."""

from typing import Optional, Tuple

import torch

from minisgl.distributed.info import get_tp_info
from minisgl.layers.linear import LinearQKVMerged


def _shard_rows(t: torch.Tensor, parts: int, rank: int, pad_to: Optional[int] = None) -> torch.Tensor:
    size = pad_to if pad_to is not None else t.shape[0] // parts
    return t[rank * size : (rank + 1) * size]


def _qkv_part(layer: LinearQKVMerged, part: int, t: torch.Tensor) -> Tuple[slice, torch.Tensor]:
    rank, d = get_tp_info().rank, layer.head_dim
    nq, nkv = layer.num_q_heads, layer.num_kv_heads
    if part == 0:
        return slice(0, nq * d), t[rank * nq * d : (rank + 1) * nq * d]
    start = layer.kv_head_start(rank)
    offset = nq * d + (part - 1) * nkv * d
    return slice(offset, offset + nkv * d), t[start * d : (start + nkv) * d]
