"""Each layer's two RMSNorms folded into the projections that read them, for a decode step of one request.

A pre-norm layer computes `h = rmsnorm(x + residual)` twice and hands each `h` to one projection only:
the attention's QKV projection, or the MLP's gate/up projection. For one row, norm and projection are
short kernels in a chain. The matrix-vector kernel already reads each whole input row, so it can do
the norm on the way (`gemv(..., norm=PendingNorm)`): the norm's own launch goes, two a layer.

The model code is not told. `fold_norms`, a pass after loading that runs after the kernel pass
(`engine/kernel_pass.py`), finds each norm whose output only one projection reads, from the structure
of the model classes (`fold_pairs`), and gives the two their folded classes. `FoldedRMSNorm`, for a row
the kernel takes, leaves a `PendingNorm` with its projection and returns the tensors that projection's
launch fills; the projection takes it and runs the folded kernel. Any other input runs the norm and the
projection as before.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from minisgl.layers.base import BaseOP
from minisgl.models.llama import MLP, Attention, DecoderLayer

from .gemv import PendingNorm, gemv, gemv_applies
from .layers import KernelLinearColParallelMerged, KernelLinearQKVMerged, KernelRMSNorm
from .norm import add_rmsnorm_fits, rmsnorm_fits
from .swap import layers_of


# the norm goes into the projection's launch for one row; at two the folded kernel was slower than the
# norm's own launch and the plain kernel (minisgl/benchmark/RESULTS.md)
FOLD_MAX_ROWS = 1


class _ReadsFoldedNorm:
    """A projection that may be handed its norm's work: `_pending` is set by the norm, taken by the next call."""

    _pending: Optional[Tuple["FoldedRMSNorm", PendingNorm]] = None

    def _take(self, h: torch.Tensor) -> Optional[PendingNorm]:
        """The pending norm if `h` is its output; any other pending norm is run now, by its own kernel, so that
        no tensor it returned is left unwritten (a forward that failed before this projection, or a view of `h`)."""
        left, self._pending = self._pending, None
        if left is None:
            return None
        norm, pending = left
        if pending.out is h:
            return pending
        out, summed = KernelRMSNorm.forward_residual(norm, pending.x, pending.residual)
        pending.out.copy_(out)
        pending.summed.copy_(summed)
        return None


class FoldedQKV(_ReadsFoldedNorm, KernelLinearQKVMerged):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pending = self._take(x)
        return super().forward(x) if pending is None else gemv(x, self.weight, self._bias(), norm=pending)


class FoldedGateUp(_ReadsFoldedNorm, KernelLinearColParallelMerged):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pending = self._take(x)
        return super().forward(x) if pending is None else gemv(x, self.weight, self._bias(), norm=pending)

    def forward_silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        pending = self._take(x)
        if pending is None:
            return super().forward_silu_and_mul(x)
        assert self.local_sizes[0] == self.local_sizes[1] and self._bias() is None, "a gate|up pair without bias"
        return gemv(x, self.weight, silu_mul=True, norm=pending)


class FoldedRMSNorm(KernelRMSNorm):
    """A norm whose output only `_into` reads: for a row that projection's kernel takes, the norm is left
    to that kernel, and the tensors it will fill are returned."""

    _into: _ReadsFoldedNorm

    def forward_residual(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        if not _folds(x, residual, self.weight, self._into.weight):
            return super().forward_residual(x, residual)
        out = torch.empty_like(x)
        summed = x if residual is None else torch.empty_like(x)
        self._into._pending = (self, PendingNorm(x, residual, self.weight, self.eps, out, summed))
        return out, summed


def _folds(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the projection's kernel takes `x` with the norm inside: a row it takes, and a norm the norm's own
    kernel takes, its weight and residual whole (the projection's kernel reads them as it reads `x`)."""
    if not gemv_applies(x, weight) or x.shape[0] > FOLD_MAX_ROWS or not norm_weight.is_contiguous():
        return False
    if residual is None:
        return rmsnorm_fits(x, norm_weight)
    return add_rmsnorm_fits(x, residual, norm_weight) and residual.is_contiguous()


def fold_pairs(model: BaseOP) -> Iterator[Tuple[BaseOP, BaseOP]]:
    """(norm, projection) for each norm of `model` whose output that projection alone reads. A fact of the
    model classes' forward, so only those exact classes: a subclass may read the norm's output elsewhere."""
    for layer in layers_of(model):
        if type(layer) is not DecoderLayer:
            continue
        if type(layer.self_attn) is Attention:  # the input norm's output goes to qkv_proj, and only there
            yield layer.input_layernorm, layer.self_attn.qkv_proj
        if type(layer.mlp) is MLP:  # the post-attention norm's to gate_up_proj; another block may read it twice
            yield layer.post_attention_layernorm, layer.mlp.gate_up_proj


_FOLDED = {KernelLinearQKVMerged: FoldedQKV, KernelLinearColParallelMerged: FoldedGateUp}


def fold_norms(model: BaseOP) -> int:
    """Fold each norm into its projection where the kernel pass gave both their kernels (a GPU, kernels on).
    Returns how many norms it folded; running it again folds none."""
    folded = 0
    for norm, proj in fold_pairs(model):
        if type(norm) is KernelRMSNorm and type(proj) in _FOLDED:
            norm.__class__, proj.__class__ = FoldedRMSNorm, _FOLDED[type(proj)]
            norm._into = proj
            folded += 1
    return folded
