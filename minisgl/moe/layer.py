"""`FusedMoE`: every expert's MLP weights stacked in two tensors, split over tensor-parallel ranks.

Each rank holds every expert, but only a slice of each expert's inner width (the same cut as a
dense MLP: gate/up rows column-parallel, down columns row-parallel), so the ranks' outputs are
partial sums and one all-reduce finishes the layer. The checkpoint stores one matrix per expert
and projection; `place` says where each lands in the stacked tensors.
"""

from __future__ import annotations

import importlib.util
from typing import Optional, Tuple

import torch

from minisgl.distributed.comm import all_reduce
from minisgl.distributed.info import get_tp_info
from minisgl.layers.base import BaseOP, empty_weight

from .torch_moe import moe_forward_torch

_PROJ = {"gate_proj": 0, "up_proj": 1, "down_proj": 2}


def resolve_moe_backend(name: str, device: torch.device) -> str:
    """"auto": the Triton kernel on CUDA when Triton is installed, else the PyTorch loop."""
    if name != "auto":
        return name
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        return "triton"
    return "torch"


class FusedMoE(BaseOP):
    def __init__(self, num_experts: int, hidden: int, inter: int, *, dtype: torch.dtype, device: torch.device,
                 backend: str = "auto"):
        tp = get_tp_info().size
        assert inter % tp == 0, f"expert width {inter} does not split over {tp} ranks"
        self.num_experts = num_experts
        self.local_inter = inter // tp
        self.gate_up_proj = empty_weight(num_experts, 2 * self.local_inter, hidden, dtype=dtype, device=device)
        self.down_proj = empty_weight(num_experts, hidden, self.local_inter, dtype=dtype, device=device)
        self._backend = resolve_moe_backend(backend, device)
        if self._backend not in ("torch", "triton"):
            raise ValueError(f"unknown MoE backend {backend!r}: choose 'auto', 'torch' or 'triton'")

    def place(self, expert: int, proj: str, tensor: torch.Tensor) -> Tuple[str, Tuple[int, slice], torch.Tensor]:
        """Where checkpoint matrix `experts.<expert>.<proj>.weight` goes on this rank:
        (own weight name, index into it, the slice of `tensor` to copy there)."""
        tp, n = get_tp_info(), self.local_inter
        part = _PROJ[proj]
        if part < 2:  # gate or up: this rank's rows, into the gate half or the up half
            rows = tensor[tp.rank * n : (tp.rank + 1) * n]
            return "gate_up_proj", (expert, slice(part * n, (part + 1) * n)), rows
        return "down_proj", (expert, slice(None)), tensor[:, tp.rank * n : (tp.rank + 1) * n]

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                backend: Optional[str] = None) -> torch.Tensor:
        """x `[tokens, hidden]`, routing `[tokens, top_k]` -> `[tokens, hidden]` (all-reduced)."""
        backend = backend or self._backend
        if backend == "triton" and x.is_cuda:
            from .triton_moe import fused_moe  # imports Triton, which only this path needs

            out = fused_moe(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)
        else:
            out = moe_forward_torch(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)
        return all_reduce(out)
