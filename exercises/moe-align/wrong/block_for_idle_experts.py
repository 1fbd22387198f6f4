"""Wrong: an expert that received no rows still gets one block of padding; the kernel then runs
empty tiles and num_padded counts them."""

from typing import List

import torch

from minisgl.moe.align import AlignedRows, max_padded_rows


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int) -> AlignedRows:
    flat: List[int] = topk_ids.flatten().tolist()
    num_rows = len(flat)
    max_padded = max_padded_rows(num_rows, num_experts, block_size)
    sorted_ids: List[int] = []
    expert_ids: List[int] = []
    for e in range(num_experts):
        rows = [i for i, x in enumerate(flat) if x == e]
        while len(rows) % block_size or not rows:
            rows.append(num_rows)
        sorted_ids += rows
        expert_ids += [e] * (len(rows) // block_size)
    used = len(sorted_ids)
    sorted_ids += [num_rows] * (max_padded - used)
    expert_ids += [-1] * (max_padded // block_size - len(expert_ids))
    dev = topk_ids.device
    as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    return AlignedRows(as_i32(sorted_ids), as_i32(expert_ids), as_i32([used]), block_size)
