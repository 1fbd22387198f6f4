"""`moe_align_block_size`: group the (token, slot) pairs of a routed batch by expert, in blocks.

A fused MoE kernel computes one tile of `block_size` rows at a time and loads one expert's weight
per tile, so every tile must hold rows of a single expert. Rows are numbered `t * top_k + k` (token
t's k-th choice). We sort them by expert and pad each expert's group up to a multiple of
`block_size` with the index `num_rows` (one past the last real row), which the kernel skips.

Example (block_size 4, 3 experts, top_k 1): ids [[2],[0],[2],[2],[2]] give
    sorted_ids  [1, 5, 5, 5,  0, 2, 3, 4]    expert 0's block, then expert 2's
    expert_ids  [0, 2]                       one entry per block
    num_padded  8

Outputs have a fixed size (the worst case: every expert's group needs `block_size - 1` pads), so
no step waits for the host to learn the real size; blocks past `num_padded` have expert -1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.utils import div_ceil


@dataclass
class AlignedRows:
    sorted_ids: torch.Tensor  # [max_padded] int32: row index t*top_k+k, or num_rows as padding
    expert_ids: torch.Tensor  # [max_padded // block_size] int32: the expert of each block, -1 unused
    num_padded: torch.Tensor  # [1] int32: rows actually used (a multiple of block_size)
    block_size: int

    @property
    def max_blocks(self) -> int:
        return len(self.expert_ids)


def max_padded_rows(num_rows: int, num_experts: int, block_size: int) -> int:
    """Rows needed in the worst case, rounded to whole blocks."""
    return div_ceil(num_rows + num_experts * (block_size - 1), block_size) * block_size


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int) -> AlignedRows:
    """Vectorised: a handful of tensor ops, no host synchronisation (runs on CPU or GPU)."""
    dev = topk_ids.device
    flat = topk_ids.flatten().long()  # [rows] expert of each row
    num_rows = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    group_start = counts.cumsum(0) - counts  # where each expert's rows begin once sorted, unpadded
    order = torch.sort(flat, stable=True).indices  # rows grouped by expert, in row order inside
    expert_of = flat[order]
    rank_in_group = torch.arange(num_rows, device=dev) - group_start[expert_of]
    max_padded = max_padded_rows(num_rows, num_experts, block_size)
    sorted_ids = torch.full((max_padded,), num_rows, dtype=torch.int32, device=dev)
    sorted_ids[padded_start[expert_of] + rank_in_group] = order.to(torch.int32)
    block_start = torch.arange(0, max_padded, block_size, device=dev)
    expert_ids = torch.searchsorted(padded_end, block_start, right=True)  # the group a block falls in
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    num_padded = padded_end[-1:].to(torch.int32)
    return AlignedRows(sorted_ids, expert_ids, num_padded, block_size)


def moe_align_block_size_ref(topk_ids: torch.Tensor, block_size: int, num_experts: int) -> AlignedRows:
    """The same with plain Python loops: the reference the vectorised version is tested against."""
    flat: List[int] = topk_ids.flatten().tolist()
    num_rows = len(flat)
    max_padded = max_padded_rows(num_rows, num_experts, block_size)
    sorted_ids: List[int] = []
    expert_ids: List[int] = []
    for e in range(num_experts):
        rows = [i for i, x in enumerate(flat) if x == e]
        while len(rows) % block_size:
            rows.append(num_rows)
        sorted_ids += rows
        expert_ids += [e] * (len(rows) // block_size)
    used = len(sorted_ids)
    sorted_ids += [num_rows] * (max_padded - used)
    expert_ids += [-1] * (max_padded // block_size - len(expert_ids))
    as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return AlignedRows(as_i32(sorted_ids), as_i32(expert_ids), as_i32([used]), block_size)
