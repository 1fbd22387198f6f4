"""Wrong: the first KV head is always `rank * num_kv_heads`. Right while there are at least as many
KV heads as ranks; with fewer, ranks past the last KV head get an empty slice instead of sharing."""

from typing import Optional, Tuple

import torch

from minisgl.distributed.info import get_tp_info
from minisgl.layers.linear import LinearQKVMerged


def _shard_rows(t: torch.Tensor, parts: int, rank: int, pad_to: Optional[int] = None) -> torch.Tensor:
    size = pad_to if pad_to is not None else t.shape[0] // parts
    piece = t[rank * size : (rank + 1) * size]
    if len(piece) < size:
        piece = torch.cat([piece, piece.new_zeros(size - len(piece), *piece.shape[1:])])
    return piece


def _qkv_part(layer: LinearQKVMerged, part: int, t: torch.Tensor) -> Tuple[slice, torch.Tensor]:
    rank, d = get_tp_info().rank, layer.head_dim
    nq, nkv = layer.num_q_heads, layer.num_kv_heads
    if part == 0:
        return slice(0, nq * d), t[rank * nq * d : (rank + 1) * nq * d]
    start = rank * nkv
    offset = nq * d + (part - 1) * nkv * d
    return slice(offset, offset + nkv * d), t[start * d : (start + nkv) * d]
