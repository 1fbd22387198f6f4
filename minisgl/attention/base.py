"""The attention backend interface: the engine's only contract with an attention kernel."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import List

import torch

from minisgl.core import BaseAttnMetadata, Batch

__all__ = ["BaseAttnBackend", "BaseAttnMetadata"]  # the metadata base lives with the Batch that carries it


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: "Batch") -> None:
        """Fill `batch.attn_metadata` (called once per batch, before the forward pass)."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: "Batch") -> torch.Tensor:
        """Store this step's k/v (`[tokens, kv_heads, head_dim]`) at `batch.out_loc`, then attend.

        q: `[tokens, q_heads, head_dim]`. Returns `[tokens, q_heads, head_dim]`.
        """

    # CUDA-graph hooks; a backend that cannot be captured keeps these defaults.
    def supports_cuda_graph(self) -> bool:
        return False

    def init_capture_graph(self, max_bs: int, bs_list: List[int]) -> None:
        raise NotImplementedError

    def prepare_for_capture(self, batch: "Batch") -> None:
        raise NotImplementedError

    def prepare_for_replay(self, batch: "Batch") -> None:
        raise NotImplementedError
