"""Wrong: query heads dealt round-robin (rank r takes heads r, r + tp, ...) instead of one
contiguous block. Each rank still gets the right number of heads, but no longer the heads its
KV heads serve, and `o_proj`'s column block no longer lines up with them."""

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
    info = get_tp_info()
    rank, d = info.rank, layer.head_dim
    nq, nkv = layer.num_q_heads, layer.num_kv_heads
    if part == 0:
        heads = t.reshape(-1, d, *t.shape[1:])[rank :: info.size]
        return slice(0, nq * d), heads.reshape(nq * d, *t.shape[1:])
    start = layer.kv_head_start(rank)
    offset = nq * d + (part - 1) * nkv * d
    return slice(offset, offset + nkv * d), t[start * d : (start + nkv) * d]
