"""Exercise shard-tensor (chapter 16): cut checkpoint tensors into one rank's slice.

Write `_shard_rows` and `_qkv_part`. The loader (`minisgl.models.weight.load_checkpoint`) calls
them for every tensor it reads; the rest of the loader is the engine's.
Grade with `python judge.py shard-tensor`.
"""

from typing import Optional, Tuple

import torch

from minisgl.distributed.info import get_tp_info
from minisgl.layers.linear import LinearQKVMerged


def _shard_rows(t: torch.Tensor, parts: int, rank: int, pad_to: Optional[int] = None) -> torch.Tensor:
    """Rank `rank`'s block of rows when `t` is cut into `parts` equal blocks along dim 0.

    With `pad_to`, every block has `pad_to` rows (the vocabulary: `div_ceil(vocab, parts)`), and
    a block that runs past the end of `t` is completed with zero rows, so every rank's shard has
    the same shape. Keep `t`'s dtype and trailing dimensions.
    """
    raise NotImplementedError("shard-tensor: write _shard_rows")


def _qkv_part(layer: LinearQKVMerged, part: int, t: torch.Tensor) -> Tuple[slice, torch.Tensor]:
    """Where checkpoint tensor `t` (part 0 = q_proj, 1 = k_proj, 2 = v_proj; a weight
    `[heads * head_dim, hidden]` or a bias `[heads * head_dim]`) goes on this rank.

    Returns `(rows, piece)`: `piece` is this rank's heads of `t`, and `rows` the slice of the
    rank's merged `qkv_proj` (laid out [its q heads | its k heads | its v heads]) it fills.
    Read the rank from `get_tp_info().rank`; `layer.num_q_heads` / `layer.num_kv_heads` are the
    heads per rank, `layer.kv_head_start(rank)` the first KV head this rank holds.
    """
    raise NotImplementedError("shard-tensor: write _qkv_part")
