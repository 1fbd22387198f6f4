"""Wrong: V is written at the same rows as K (the offset forgets to skip the K block), so the
merged `qkv_proj` ends up with V twice and no K."""

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
    start = layer.kv_head_start(rank)
    offset = nq * d
    return slice(offset, offset + nkv * d), t[start * d : (start + nkv) * d]
