"""A complete answer to moe-align (the engine's own, vectorised logic)."""

import torch

from minisgl.moe.align import AlignedRows, max_padded_rows


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int) -> AlignedRows:
    dev = topk_ids.device
    flat = topk_ids.flatten().long()  # [rows] expert of each row
    num_rows = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    group_start = counts.cumsum(0) - counts  # where each expert's rows begin once sorted, unpadded
    order = torch.sort(flat, stable=True).indices  # rows grouped by expert, ascending inside
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
