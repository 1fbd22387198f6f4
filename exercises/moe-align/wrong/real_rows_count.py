"""Wrong: num_padded counts the real rows, not the entries the padded groups use, so the kernel
stops before the last blocks."""

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
        while len(rows) % block_size:
            rows.append(num_rows)
        sorted_ids += rows
        expert_ids += [e] * (len(rows) // block_size)
    used = len(sorted_ids)
    sorted_ids += [num_rows] * (max_padded - used)
    expert_ids += [-1] * (max_padded // block_size - len(expert_ids))
    dev = topk_ids.device
    as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    return AlignedRows(as_i32(sorted_ids), as_i32(expert_ids), as_i32([num_rows]), block_size)
