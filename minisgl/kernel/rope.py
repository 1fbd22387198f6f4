"""Rotary position embedding (rotate-half layout) for queries and keys in one launch.

The PyTorch path takes about a dozen kernels per layer (two gathers, casts, the half rotation
by `cat`, four products, two sums). Rounding follows the reference: `cos`/`sin` are rounded to
the model dtype first, and each product and the sum are rounded as PyTorch rounds them.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .util import next_pow2, use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kernel(x_ptr, out_ptr, pos_ptr, cos_ptr, sin_ptr, stride_t, stride_h, cos_stride, H: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        # one program per token, all heads at once; out is contiguous [tokens, H, 2 * HALF]
        t = tl.program_id(0).to(tl.int64)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < H) & (d < HALF)
        src = x_ptr + t * stride_t + h * stride_h + d
        x1 = tl.load(src, mask=mask, other=0.0)
        x2 = tl.load(src + HALF, mask=mask, other=0.0)
        dt = x1.dtype
        c = tl.load(cos_ptr + pos * cos_stride + d, mask=d < HALF, other=0.0).to(dt)
        s = tl.load(sin_ptr + pos * cos_stride + d, mask=d < HALF, other=0.0).to(dt)
        o1 = (x1 * c).to(dt) + (-x2 * s).to(dt)
        o2 = (x2 * c).to(dt) + (x1 * s).to(dt)
        dst = out_ptr + t * (H * 2 * HALF) + h * (2 * HALF) + d
        tl.store(dst, o1.to(dt), mask=mask)
        tl.store(dst + HALF, o2.to(dt), mask=mask)

except ImportError:  # pragma: no cover
    triton = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """q: `[tokens, q_heads, dim]`, k: `[tokens, kv_heads, dim]`; caches: `[max_pos, dim]` float32."""
    cos = cos_cache[positions].unsqueeze(1).to(q.dtype)
    sin = sin_cache[positions].unsqueeze(1).to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rope_one(x: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor) -> torch.Tensor:
    t, h, d = x.shape
    out = torch.empty(t, h, d, dtype=x.dtype, device=x.device)
    half = d // 2
    _rope_kernel[(t,)](x, out, positions, cos_cache, sin_cache, x.stride(0), x.stride(1), cos_cache.stride(0), H=h, HALF=half, BLOCK_H=next_pow2(h), BLOCK_D=next_pow2(half))
    return out


def apply_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by their token's position; returns new contiguous tensors."""
    ok = use_triton(q) and q.dim() == 3 and k.dim() == 3 and q.stride(-1) == 1 and k.stride(-1) == 1
    ok = ok and q.shape[-1] % 2 == 0 and cos_cache.stride(-1) == 1 and sin_cache.stride() == cos_cache.stride()
    if not ok:
        return apply_rope_ref(positions, q, k, cos_cache, sin_cache)
    if q.shape[0] == 0:
        return q.clone(), k.clone()
    return _rope_one(q, positions, cos_cache, sin_cache), _rope_one(k, positions, cos_cache, sin_cache)
