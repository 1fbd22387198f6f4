"""Exercise moe-align (chapter 20): sort routed rows into expert-pure blocks.

Write `moe_align_block_size`. The fused MoE kernel (minisgl/moe/triton_moe.py) calls it before
its two grouped matrix multiplies; `AlignedRows` and `max_padded_rows` are the engine's.
Grade with `python judge.py moe-align`.
"""

import torch

from minisgl.moe.align import AlignedRows, max_padded_rows  # noqa: F401


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int) -> AlignedRows:
    """topk_ids `[tokens, top_k]`: the experts of each token. Row `t * top_k + k` is token t's
    k-th choice; there are `num_rows = tokens * top_k` rows.

    Returns AlignedRows(sorted_ids, expert_ids, num_padded, block_size):
    - sorted_ids `[max_padded_rows(num_rows, num_experts, block_size)]` int32: the rows of expert 0
      (ascending), padded with `num_rows` to a multiple of block_size, then expert 1's, ...; an
      expert with no rows takes no space; everything after the last group is `num_rows` too;
    - expert_ids `[len(sorted_ids) // block_size]` int32: the expert of each block, -1 past the end;
    - num_padded `[1]` int32: how many entries of sorted_ids the groups use.
    All three on topk_ids' device.
    """
    raise NotImplementedError("moe-align: write moe_align_block_size")
