"""RMSNorm, alone (also per attention head, for qk-norm) and fused with the residual add.

The PyTorch path takes about nine kernels per norm (casts, square, mean, rsqrt, products); the
Triton path one. Rounding follows the reference: normalise in float32, round to the model
dtype, then multiply by the weight in the model dtype.
"""

from __future__ import annotations

from typing import Optional, Tuple

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
        s = x + res  # rounded to the model dtype, as the reference's `x + residual`
        tl.store(sum_ptr + r * D + offs, s, mask=mask)
        sf = s.to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        inv = tl.rsqrt(tl.sum(sf * sf, axis=0) / D + eps)
        tl.store(out_ptr + r * D + offs, (sf * inv).to(w.dtype) * w, mask=mask)

except ImportError:  # pragma: no cover
    triton = None


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def fused_add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return rmsnorm_ref(s, weight, eps), s


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of a `[tokens, dim]` or `[tokens, heads, dim]` tensor
    (the last dimension contiguous; tokens and heads may be strided)."""
    if not use_triton(x) or x.dim() not in (2, 3) or x.stride(-1) != 1 or x.dtype != weight.dtype:
        return rmsnorm_ref(x, weight, eps)
    d = x.shape[-1]
    t, h = x.shape[0], (x.shape[1] if x.dim() == 3 else 1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if t * h == 0:
        return out
    stride_h = x.stride(1) if x.dim() == 3 else 0
    _rmsnorm_kernel[(t * h,)](x, weight, out, x.stride(0), stride_h, eps, H=h, D=d, BLOCK=next_pow2(d))
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                      eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """`s = x + residual` (or `x` when there is none), then `(rmsnorm(s), s)`."""
    if residual is None:
        return rmsnorm(x, weight, eps), x
    ok = use_triton(x) and x.dim() == 2 and x.shape == residual.shape and x.stride(-1) == 1 and residual.stride(-1) == 1
    if not ok or x.dtype != weight.dtype or residual.dtype != x.dtype:
        return fused_add_rmsnorm_ref(x, residual, weight, eps)
    t, d = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    s = torch.empty_like(out)
    if t == 0:
        return out, s
    _add_rmsnorm_kernel[(t,)](x, residual, weight, out, s, x.stride(0), residual.stride(0), eps, D=d,
                              BLOCK=next_pow2(d))
    return out, s
