"""The attention backend interface: the engine's only contract with an attention kernel."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import List, Optional, Tuple

import torch

from minisgl.core import BaseAttnMetadata, Batch
from minisgl.kernel import PendingRope

__all__ = ["BaseAttnBackend", "BaseAttnMetadata"]  # the metadata base lives with the Batch that carries it


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: "Batch") -> None:
        """Fill `batch.attn_metadata` (called once per batch, before the forward pass)."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], layer_id: int, batch: "Batch") -> torch.Tensor:
        """Store this step's k/v (`[tokens, kv_heads, head_dim]`) at `batch.out_loc`, then attend.
        `k = v = None`: the caller already wrote them there (see `kv_destination`).

        q: `[tokens, q_heads, head_dim]`. Returns `[tokens, q_heads, head_dim]`.
        """

    def kv_destination(self, layer_id: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The layer's key and value caches (`[slots, kv_heads, head_dim]`, contiguous) when the
        caller may write this step's k/v into them itself, fused with RoPE, and then call
        `forward(q, None, None, ...)`; None (the default): pass k and v to `forward`."""
        return None

    def forward_rotating(self, q: torch.Tensor, rope: PendingRope, layer_id: int, batch: "Batch") -> Optional[torch.Tensor]:
        """Attention for q and this step's k and v as the projection left them (`rope`: before the
        norms and RoPE), for batches whose kernel applies those and the KV store itself, in the same
        launch. None (the default, and for every other batch): the caller rotates and stores first,
        then calls `forward`."""
        return None

    # CUDA-graph hooks; a backend that cannot be captured keeps these defaults.
    def supports_cuda_graph(self) -> bool:
        return False

    def init_capture_graph(self, max_bs: int, bs_list: List[int]) -> None:
        raise NotImplementedError

    def prepare_for_capture(self, batch: "Batch") -> None:
        raise NotImplementedError

    def prepare_for_replay(self, batch: "Batch") -> None:
        raise NotImplementedError
