"""Token embedding and LM head, each holding a slice of the vocabulary per rank."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from minisgl.distributed.comm import all_gather_last_dim, all_reduce
from minisgl.distributed.info import get_tp_info
from minisgl.utils import div_ceil

from .base import BaseOP, empty_weight


class VocabParallelEmbedding(BaseOP):
    def __init__(self, vocab_size: int, hidden: int, *, dtype: torch.dtype, device: torch.device):
        tp = get_tp_info()
        self.vocab_size = vocab_size
        self.shard = div_ceil(vocab_size, tp.size)  # rows per rank; the last rank is zero-padded
        self.start = tp.rank * self.shard
        self.weight = empty_weight(self.shard, hidden, dtype=dtype, device=device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if get_tp_info().size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mask = (local < 0) | (local >= self.shard)
        out = F.embedding(local.masked_fill(mask, 0), self.weight)
        out.masked_fill_(mask.unsqueeze(-1), 0)
        return all_reduce(out)


class ParallelLMHead(BaseOP):
    """Logits for the last position of every request. Tied to the embedding when the model says so."""

    def __init__(self, vocab_size: int, hidden: int, *, tie_to: Optional[VocabParallelEmbedding], dtype: torch.dtype,
                 device: torch.device):
        self.vocab_size = vocab_size
        self._tied = tie_to
        if tie_to is None:
            self.weight = empty_weight(div_ceil(vocab_size, get_tp_info().size), hidden, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._tied.weight if self._tied is not None else self.weight
        logits = all_gather_last_dim(F.linear(x, weight))
        return logits[..., : self.vocab_size]
