"""Collectives used by the parallel layers. With one rank they are the identity."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .info import get_tp_info


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over ranks, in place; every rank ends with the same tensor."""
    if get_tp_info().size == 1:
        return x
    dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate each rank's shard along the last dimension (used by the sharded LM head)."""
    size = get_tp_info().size
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def min_over_ranks(value: int, device: torch.device) -> int:
    """The smallest `value` any rank holds. Ranks size their KV pools from their own free memory;
    they must agree on one size or their schedulers would admit different requests."""
    if get_tp_info().size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over ranks, in place (for agreement checks: max(v, -v) gives max and min)."""
    if get_tp_info().size > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x
