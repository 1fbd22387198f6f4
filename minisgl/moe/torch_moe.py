"""Mixture of experts in plain PyTorch: one loop over the experts that received tokens.

Runs anywhere and is the reference for the fused kernel. Each expert gathers its tokens, runs
its MLP on them, scales by the routing weight and adds the result back in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.layers.activation import silu_and_mul


def moe_forward_torch(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor) -> torch.Tensor:
    """x `[tokens, hidden]`, w13 `[experts, 2 * inter, hidden]` (gate rows, then up rows),
    w2 `[experts, hidden, inter]`, topk_* `[tokens, top_k]` -> `[tokens, hidden]`."""
    out = torch.zeros_like(x)
    hit = torch.unique(topk_ids).tolist()  # a host sync; fine on this path
    for e in hit:
        tokens, slots = torch.where(topk_ids == e)
        h = F.linear(silu_and_mul(F.linear(x[tokens], w13[e])), w2[e])
        out.index_add_(0, tokens, (h * topk_weights[tokens, slots, None]).to(out.dtype))
    return out
