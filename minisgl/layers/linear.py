"""Linear layers, each knowing how it is split across tensor-parallel ranks.

Each layer sizes its weight for its rank's share; the loader (`models/weight.py`) cuts each
checkpoint tensor to that share, and the layer itself only multiplies.
- replicated: every rank holds the whole matrix.
- column-parallel (merged): output features split; several checkpoint matrices stacked (gate|up).
- QKV: heads split; KV heads replicated when there are fewer KV heads than ranks.
- row-parallel: input features split; partial sums all-reduced.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F

from minisgl.distributed.comm import all_reduce
from minisgl.distributed.info import get_tp_info
from minisgl.utils import div_ceil

from .activation import silu_and_mul
from .base import BaseOP, empty_weight


class _Linear(BaseOP):
    def __init__(self, out_features: int, in_features: int, bias: bool, dtype: torch.dtype, device: torch.device):
        self.weight = empty_weight(out_features, in_features, dtype=dtype, device=device)
        if bias:
            self.bias = empty_weight(out_features, dtype=dtype, device=device)

    def _bias(self) -> Optional[torch.Tensor]:
        return getattr(self, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self._bias())


class LinearReplicated(_Linear):
    def __init__(self, in_features: int, out_features: int, *, bias: bool = False, dtype: torch.dtype,
                 device: torch.device):
        super().__init__(out_features, in_features, bias, dtype, device)


class LinearColParallelMerged(_Linear):
    """`[x @ A_0^T | x @ A_1^T | ...]` with each `A_i`'s rows split evenly across ranks."""

    def __init__(self, in_features: int, out_sizes: List[int], *, bias: bool = False, dtype: torch.dtype,
                 device: torch.device):
        tp = get_tp_info().size
        for s in out_sizes:
            if s % tp:
                raise ValueError(f"output size {s} does not split over {tp} ranks")
        self.local_sizes = [s // tp for s in out_sizes]
        super().__init__(sum(self.local_sizes), in_features, bias, dtype, device)

    def forward_silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """`silu(x @ gate.T) * (x @ up.T)` for a gate|up pair: the projection and the activation as one op."""
        assert len(self.local_sizes) == 2 and self.local_sizes[0] == self.local_sizes[1] and self._bias() is None
        return silu_and_mul(self(x))


class LinearQKVMerged(_Linear):
    """Q, K and V projections in one matrix. Rank r holds query heads `[r*hq, (r+1)*hq)` and the
    KV heads they attend to; with fewer KV heads than ranks, ranks share (replicate) KV heads."""

    def __init__(self, hidden: int, head_dim: int, num_q_heads: int, num_kv_heads: int, *, bias: bool = False,
                 dtype: torch.dtype, device: torch.device):
        tp = get_tp_info().size
        if num_q_heads % tp != 0:
            raise ValueError(f"{num_q_heads} attention heads cannot be split over {tp} ranks")
        if num_kv_heads % tp and tp % num_kv_heads:
            raise ValueError(f"{num_kv_heads} KV heads neither split over nor replicate evenly onto {tp} ranks")
        self.head_dim = head_dim
        self.num_q_heads = num_q_heads // tp
        self.num_kv_heads = div_ceil(num_kv_heads, tp)
        self.total_kv_heads = num_kv_heads
        out = (self.num_q_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(out, hidden, bias, dtype, device)

    def kv_head_start(self, rank: int) -> int:
        tp = get_tp_info().size
        if self.total_kv_heads >= tp:
            return rank * self.num_kv_heads
        # replicated: ranks_per_kv ranks share one KV head
        return rank // (tp // self.total_kv_heads)


class LinearRowParallel(_Linear):
    def __init__(self, in_features: int, out_features: int, *, bias: bool = False, dtype: torch.dtype,
                 device: torch.device):
        tp = get_tp_info().size
        if in_features % tp:
            raise ValueError(f"input size {in_features} does not split over {tp} ranks")
        super().__init__(out_features, in_features // tp, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(F.linear(x, self.weight))  # partial sums, added over the ranks
        bias = self._bias()
        return y if bias is None else y + bias

