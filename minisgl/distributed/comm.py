"""Collectives used by the parallel layers. With one rank they are the identity."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .info import get_tp_info


def all_reduce(x: torch.Tensor) -> torch.Tensor:
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
