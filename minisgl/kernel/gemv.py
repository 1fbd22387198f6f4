"""`x @ W^T (+ b)` for a single row of `x`: the projections of a decode step at batch 1.

With one token, a projection is a matrix-vector product: it reads the whole weight once and does
two flops per weight. cuBLAS picks GEMM tiles for it (and for some shapes a split over K plus a
second, reducing kernel); a kernel in which every program owns a few output rows, streams their
weights along K and reduces once at the end reads the same bytes in one launch. The result is
accumulated in float32 and rounded once, as cuBLAS does.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn.functional as F

from .util import use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):  # partial products stay in place; one reduction at the end
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < K
            x = tl.load(x_ptr + ks, mask=kmask, other=0.0).to(tl.float32)
            w = tl.load(w_rows + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            acc += w * x[None, :]
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rmask)

except ImportError:  # pragma: no cover
    triton = None


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One contiguous row against a contiguous `[N, K]` weight of the same dtype (and the kernels on)."""
    if os.environ.get("MINISGL_GEMV", "1") != "1":
        return False
    return use_triton(x) and x.dim() == 2 and x.shape[0] == 1 and x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype and x.shape[1] == weight.shape[1]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`; a single row goes through the matrix-vector kernel."""
    if not gemv_applies(x, weight):
        return F.linear(x, weight, bias)
    n, k = weight.shape
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    block_n = 16 if n >= 4096 else 8  # enough programs to occupy the SMs for narrow outputs too
    block_k = min(256, triton.next_power_of_2(k))
    grid = (triton.cdiv(n, block_n),)
    _gemv_kernel[grid](x, weight, bias if bias is not None else weight, out, n, K=k, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k)
    return out
