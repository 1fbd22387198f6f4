"""Top-k routing: which experts each token visits, and with what weight."""

from __future__ import annotations

from typing import Tuple

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """router_logits `[tokens, experts]` -> (weights `[tokens, top_k]` in the logits' dtype,
    expert ids `[tokens, top_k]` int64).

    The softmax runs over all experts in float32; with `renormalize` (Qwen3-MoE's
    `norm_topk_prob`) the k kept probabilities are rescaled to sum to one.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids
