"""RMSNorm, alone (also per attention head, for qk-norm) and fused with the residual add.

`RMSNorm`'s PyTorch forward takes about nine kernels per norm (casts, square, mean, rsqrt, products);
these take one. Rounding follows the layer: normalise in float32, round to the model dtype, then
multiply by the weight in the model dtype.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .util import next_pow2, use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, stride_t, stride_h, eps, H: tl.constexpr, D: tl.constexpr,
                        BLOCK: tl.constexpr):
        # one program per row; row r is (token r // H, head r % H); the output is contiguous
        r = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < D
        x = tl.load(x_ptr + (r // H) * stride_t + (r % H) * stride_h + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        normed = (x * inv).to(w.dtype)
        tl.store(out_ptr + r * D + offs, normed * w, mask=mask)

    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, x_stride, res_stride, eps, D: tl.constexpr,
                            BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < D
        x = tl.load(x_ptr + r * x_stride + offs, mask=mask, other=0.0)
        res = tl.load(res_ptr + r * res_stride + offs, mask=mask, other=0.0)
        s = x + res  # rounded to the model dtype, as the layer's `x + residual`
        tl.store(sum_ptr + r * D + offs, s, mask=mask)
        sf = s.to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        inv = tl.rsqrt(tl.sum(sf * sf, axis=0) / D + eps)
        tl.store(out_ptr + r * D + offs, (sf * inv).to(w.dtype) * w, mask=mask)

except ImportError:  # pragma: no cover
    triton = None


def rmsnorm_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `rmsnorm` takes `x`: Triton on its device, `[tokens, dim]` or `[tokens, heads, dim]` with the
    last dimension contiguous, in the weight's dtype."""
    return use_triton(x) and x.dim() in (2, 3) and x.stride(-1) == 1 and x.dtype == weight.dtype


def add_rmsnorm_fits(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `fused_add_rmsnorm` takes `x` and `residual`: two `[tokens, dim]` rows of one shape and dtype."""
    ok = use_triton(x) and x.dim() == 2 and x.shape == residual.shape and x.stride(-1) == 1 and residual.stride(-1) == 1
    return ok and x.dtype == weight.dtype == residual.dtype


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm.forward` in one launch, over the last dimension of a `[tokens, dim]` or `[tokens, heads, dim]`
    tensor (tokens and heads may be strided); the input must pass `rmsnorm_fits`."""
    assert rmsnorm_fits(x, weight)
    d = x.shape[-1]
    t, h = x.shape[0], (x.shape[1] if x.dim() == 3 else 1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if t * h == 0:
        return out
    stride_h = x.stride(1) if x.dim() == 3 else 0
    _rmsnorm_kernel[(t * h,)](x, weight, out, x.stride(0), stride_h, eps, H=h, D=d, BLOCK=next_pow2(d))
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """`RMSNorm.forward_residual` in one launch: `s = x + residual`, then `(rmsnorm(s), s)`; the inputs must
    pass `add_rmsnorm_fits`."""
    assert add_rmsnorm_fits(x, residual, weight)
    t, d = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    s = torch.empty_like(out)
    if t == 0:
        return out, s
    _add_rmsnorm_kernel[(t,)](x, residual, weight, out, s, x.stride(0), residual.stride(0), eps, D=d,
                              BLOCK=next_pow2(d))
    return out, s
