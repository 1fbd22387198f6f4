import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `x = [gate | up]` along the last dimension."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
