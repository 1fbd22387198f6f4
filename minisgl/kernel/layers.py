"""The layers of `minisgl.layers` with their forward sent to kernels, for `swap_in_kernels` to put in place.

Each class subclasses the layer it replaces and adds no state: the pass changes a loaded layer's class,
and the layer keeps its weights. A forward runs the kernel where the kernel takes the inputs and the
layer's own (plain PyTorch) forward everywhere else, so each computes what the layer computes.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from minisgl.distributed.comm import all_gather_last_dim, all_reduce
from minisgl.layers.embedding import ParallelLMHead
from minisgl.layers.linear import LinearColParallelMerged, LinearQKVMerged, LinearReplicated, LinearRowParallel, _Linear
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding

from .cpu_gemm import cpu_linear
from .gemv import linear, linear_silu_and_mul
from .norm import add_rmsnorm_fits, fused_add_rmsnorm, rmsnorm, rmsnorm_fits
from .rope import apply_rope, rope_fits


class KernelRMSNorm(RMSNorm):
    """One launch a norm, and one for the residual add with the norm after it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rmsnorm_fits(x, self.weight):
            return rmsnorm(x, self.weight, self.eps)
        return super().forward(x)

    def forward_residual(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is not None and add_rmsnorm_fits(x, residual, self.weight):
            return fused_add_rmsnorm(x, residual, self.weight, self.eps)
        return super().forward_residual(x, residual)  # without a residual: `forward`, the kernel above


class KernelRotaryEmbedding(RotaryEmbedding):
    """q and k rotated in one launch."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if rope_fits(q, k, self.cos, self.sin):
            return apply_rope(positions, q, k, self.cos, self.sin)
        return super().forward(positions, q, k)


def _project(layer: _Linear, x: torch.Tensor) -> torch.Tensor:
    # `linear` picks the kernel: the matrix-vector one for few rows on a GPU, oneDNN on the CPU, else F.linear
    return linear(x, layer.weight, layer._bias())


class KernelLinearReplicated(LinearReplicated):
    forward = _project


class KernelLinearQKVMerged(LinearQKVMerged):
    forward = _project


class KernelLinearColParallelMerged(LinearColParallelMerged):
    """The gate/up projection: for few rows one kernel also applies the activation."""

    forward = _project

    def forward_silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        assert len(self.local_sizes) == 2 and self.local_sizes[0] == self.local_sizes[1] and self._bias() is None
        return linear_silu_and_mul(x, self.weight)


class KernelLinearRowParallel(LinearRowParallel):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(linear(x, self.weight))
        bias = self._bias()
        return y if bias is None else y + bias


class KernelParallelLMHead(ParallelLMHead):
    """The LM head through oneDNN on the CPU (the tied embedding's weight converted once, on first use)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._tied.weight if self._tied is not None else self.weight
        return all_gather_last_dim(cpu_linear(x, weight))[..., : self.vocab_size]


# the layer classes the pass replaces on a GPU, with their replacements (the LM head keeps cuBLAS)
GPU_LAYERS = {
    RMSNorm: KernelRMSNorm,
    RotaryEmbedding: KernelRotaryEmbedding,
    LinearReplicated: KernelLinearReplicated,
    LinearQKVMerged: KernelLinearQKVMerged,
    LinearColParallelMerged: KernelLinearColParallelMerged,
    LinearRowParallel: KernelLinearRowParallel,
}
# ... and on the CPU, where only the products change library
CPU_LAYERS = {
    LinearReplicated: KernelLinearReplicated,
    LinearQKVMerged: KernelLinearQKVMerged,
    LinearColParallelMerged: KernelLinearColParallelMerged,
    LinearRowParallel: KernelLinearRowParallel,
    ParallelLMHead: KernelParallelLMHead,
}
