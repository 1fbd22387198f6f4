from __future__ import annotations

from typing import Optional, Tuple

import torch

from .base import BaseOP, empty_weight


class RMSNorm(BaseOP):
    """`x / rms(x) * weight`, computed in float32 like the reference implementation."""

    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: torch.device):
        self.eps = eps
        self.weight = empty_weight(size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def forward_residual(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Add the residual first, normalise the sum; return (normed, new residual)."""
        if residual is not None:
            x = x + residual
        return self.forward(x), x
