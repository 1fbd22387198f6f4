"""The attention backend interface: the engine's only contract with an attention kernel."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from minisgl.core import BaseAttnMetadata, Batch

if TYPE_CHECKING:
    from minisgl.layers.rotary import QKNormRope

__all__ = ["BaseAttnBackend", "BaseAttnMetadata"]  # the metadata base lives with the Batch that carries it


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: "Batch") -> None:
        """Fill `batch.attn_metadata` (called once per batch, before the forward pass)."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: "Batch", qk: "QKNormRope"
    ) -> torch.Tensor:
        """Attention for this step's q, k and v as the projection left them (`[tokens, heads, head_dim]`):
        normalise and rotate q and k (`qk`: the layer's per-head norms, if any, and RoPE), then `attend`.

        This plain sequence is the specification; a backend may override it to run the same
        steps in fewer kernels. Returns `[tokens, q_heads, head_dim]`.
        """
        q, k = qk(batch.positions, q, k)
        return self.attend(q, k, v, layer_id, batch)

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: "Batch") -> torch.Tensor:
        """Store this step's k/v (`[tokens, kv_heads, head_dim]`, already rotated) at `batch.out_loc`,
        then attend: each query sees its request's keys up to its own position.

        q: `[tokens, q_heads, head_dim]`, rotated. Returns `[tokens, q_heads, head_dim]`.
        """
